"""A batch job's record: what a client needs to follow a job and write its manifest."""

from __future__ import annotations

import time
from collections import Counter
from typing import cast

from ..configs import LEASE_SECONDS, MAX_ATTEMPTS, UNPLACEABLE_SECONDS
from .protocol import DeadLetter, ItemResult, JobContext, JobOptions, JobStatus, Lane, SlicePayload, SubmittedItem
from .work_items import ItemState, WorkItem


class Job:
    """A batch job: the owner of its items (work_items.ItemOwner), their results and dead letters."""

    def __init__(self, job_id: str, submitted: list[SubmittedItem], options: JobOptions) -> None:
        self.id = job_id
        self.lease_seconds: float = float(options.get("lease_seconds", LEASE_SECONDS))
        self.max_attempts: int = int(options.get("max_attempts", MAX_ATTEMPTS))
        self.unplaceable_seconds: float = float(options.get("unplaceable_seconds", UNPLACEABLE_SECONDS))
        # Shared by every item of the job (storage credentials among them):
        # sent to workers with what they pull, never echoed in job status.
        self.context: JobContext = options.get("context") or {}
        self.client: str | None = options.get("client")
        lane = Lane(options.get("lane", Lane.BATCH))
        self.items: dict[str, WorkItem] = {}
        for entry in submitted:  # the job is the flow of all its items: they share its fair share
            item_id = f"{job_id}/{entry['key']}"
            payload, rows = entry["payload"], int(entry.get("rows", 0))
            self.items[item_id] = WorkItem(item_id, self, entry["model"], entry["op"], payload, lane, rows, job_id)
        # Items per (model, state), kept as they move: status is polled while
        # the job runs, and must not cost a pass over its items.
        self.state_counts: Counter[tuple[str, ItemState]] = Counter(
            (item.model, item.state) for item in self.items.values()
        )
        self.started = time.time()
        self.finished: float | None = None
        self.rows_total = sum(item.rows for item in self.items.values())
        self.rows_done = 0
        self.rows_by_worker: Counter[str] = Counter()
        self.results: dict[str, ItemResult] = {}
        self.dead_letters: dict[str, DeadLetter] = {}

    @property
    def complete(self) -> bool:
        return len(self.results) + len(self.dead_letters) == len(self.items)

    def record_done(self, item: WorkItem, worker: str, result: ItemResult) -> None:
        """Also a late ack of an item already in dead letters: it leaves them."""
        self.dead_letters.pop(item.id, None)
        item.move(ItemState.DONE)
        item.worker = None
        self.results[item.id] = result
        rows = int(result.get("rows", item.rows))
        self.rows_done += rows
        self.rows_by_worker[worker] += rows
        self._maybe_finish()

    def record_dead(self, item: WorkItem) -> None:
        item.move(ItemState.DEAD)
        item.worker = None
        self.dead_letters[item.id] = {
            "id": item.id,
            "model": item.model,
            "payload": cast("SlicePayload", item.payload),  # what its readers (pipeline/jobs) plan; a sim job's too
            "attempts": item.attempts,
            "errors": list(item.errors),
            "rows": item.rows,
        }
        self._maybe_finish()

    def moved(self, item: WorkItem, old: ItemState) -> None:
        self.state_counts[item.model, old] -= 1
        self.state_counts[item.model, item.state] += 1

    def counts_by_model(self) -> dict[str, dict[str, int]]:
        """Its items per model and state (queued, leased, done, dead), for `shoal status`."""
        by_model: dict[str, dict[str, int]] = {}
        for (model, state), count in self.state_counts.items():
            if count:
                by_model.setdefault(model, {})[state.value] = count
        return by_model

    def _in_state(self, state: ItemState) -> int:
        return sum(count for (_, in_state), count in self.state_counts.items() if in_state is state)

    def _maybe_finish(self) -> None:
        if self.complete and self.finished is None:
            self.finished = time.time()

    def status(self, with_results: bool = False) -> JobStatus:
        status: JobStatus = {
            "job": self.id,
            "items": len(self.items),
            "queued": self._in_state(ItemState.QUEUED),
            "leased": self._in_state(ItemState.LEASED),
            "done": len(self.results),
            "failed": len(self.dead_letters),
            "rows_total": self.rows_total,
            "rows_done": self.rows_done,
            "rows_by_worker": dict(self.rows_by_worker),
            "complete": self.complete,
            "elapsed": (self.finished or time.time()) - self.started,
            "dead_letters": list(self.dead_letters.values()),
        }
        if with_results:
            status["results"] = list(self.results.values())
        return status
