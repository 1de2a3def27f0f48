"""The batch route: jobs in (``shoal_submit``), batch pulls (``shoal_pull``), job status and release.

A pull that finds nothing waits, filed under the models its worker holds,
so that k new items of a model wake at most k pulls (waiting_pulls).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .jobs import Job
from .protocol import JobOptions, JobStatus, Lane, PullReply, ReleaseReply, SubmitReply, SubmittedItem, WorkerEvents
from .queue_state import QueueState
from .waiting_pulls import LongPolls, WaitingPull, WaitingPulls
from .work_items import ItemState, WorkItem
from .worker_views import WorkerView, may_take

logger = logging.getLogger("shoal.scheduler")


class BatchRoute:
    """Batch jobs and batch pulls over the queue's state; `events` handles what rides on a pull."""

    def __init__(self, state: QueueState, long_polls: LongPolls, events: Callable[..., None]) -> None:
        self.state = state
        self.jobs: dict[str, Job] = {}
        self.pulls = WaitingPulls()
        self.long_polls = long_polls
        self._events = events
        state.queued.subscribe(self._wake)

    def submit(self, job: str, items: list[SubmittedItem], options: JobOptions | None = None) -> SubmitReply:
        if job in self.jobs:
            raise ValueError(f"job {job!r} already exists")
        options = options or {}
        unknown = {s["model"] for s in items} - set(self.state.model_specs) - set(options.get("models", {}))
        if unknown:
            raise ValueError(f"job {job!r}: no model spec for {sorted(unknown)}")
        self.state.add_specs(options.get("models", {}), f"job {job!r}")
        record = self.jobs[job] = Job(job, items, options)
        self.state.enqueue(list(record.items.values()))
        return {"job": job, "items": len(record.items)}

    async def pull(
        self,
        worker: str,
        held: list[str] | None = None,
        room: int = 1,
        timeout: float = 2.0,
        in_hand: int = 0,
        budget: int | None = None,
        free_bytes: int | None = None,
        load_seconds: dict[str, float] | None = None,
        loaded: list[str] | None = None,
        pinned: list[str] | None = None,
        events: WorkerEvents | None = None,
    ) -> PullReply:
        """Lease work to `worker`, waiting up to `timeout` seconds for some.

        The worker reports the models it holds (`held`: loaded, loading or
        named by work in hand), those loaded now (`loaded`) and pinned, its
        model budget and measured load times with every pull, so placement
        and scaling always see its present state. `events`: what it had
        gathered for its next events message, riding on the pull instead (one
        message fewer), handled first. A retiring worker gets nothing.
        """
        if events:
            self._events(worker, **events)
        state = self.state
        view = state.reported(
            worker,
            held,
            loaded,
            budget=budget,
            free_bytes=free_bytes,
            load_seconds=load_seconds or {},
            resources=dict(getattr(state.scheduler.workers.get(worker), "resources", None) or {}),
            pinned=pinned or [],
        )
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        if view.retiring:
            return {"items": [], "reason": "retiring"}

        def take() -> PullReply | None:
            if worker not in state.scheduler.workers:
                return {"items": [], "reason": "unknown worker"}
            decision = None if view.silent else state.placement.decide(view, Lane.BATCH, room=room, idle=not in_hand)
            items = state.carry_out(decision, view) if decision is not None else []
            return self._reply(items, view) if items else None

        def park() -> WaitingPull:
            waiting = WaitingPull(view)
            self.pulls.add(waiting)
            return waiting

        reply = await self.long_polls.long_poll(take, park, self.pulls.discard, timeout)
        return reply or {"items": []}

    def job_status(self, job: str, results: bool = False) -> JobStatus:
        if job not in self.jobs:
            raise KeyError(f"unknown job {job!r}")
        return self.jobs[job].status(with_results=results)

    def job_release(self, job: str) -> ReleaseReply:
        """Forget the job: its items leave the queue and their leases (workers learn it when they renew)."""
        record = self.jobs.pop(job, None)
        if record is None:
            return {"released": False}
        for item_id, item in record.items.items():
            if item.state is ItemState.QUEUED:
                self.state.queues.forget(item)
            self.state.unlease(item)
            item.move(ItemState.DEAD)
            self.state.items.pop(item_id, None)
        return {"released": True}

    def client_left(self, client: str) -> None:
        """A client that went away without releasing its jobs: their queued work is dropped.

        Parts already written stay; a re-run of the same command picks up from them.
        """
        for job_id in [j for j, job in self.jobs.items() if job.client == client and not job.complete]:
            logger.warning("client %s left; dropping its job %s", client, job_id)
            self.job_release(job_id)

    def _wake(self, model: str, lane: Lane, count: int) -> None:
        """Wake the batch pulls that may take `count` new items of `model`, and no others."""
        if lane is not Lane.BATCH:
            return
        spec, woken = self.state.model_specs[model], 0
        while woken < count and (
            pulls := self.pulls.take(model, count - woken, lambda v: may_take(v, model, spec), False)
        ):
            woken += sum(pull.wake() for pull in pulls)  # one whose timeout woke it counts for nothing

    def _reply(self, items: list[WorkItem], view: WorkerView) -> PullReply:
        """A batch pull's reply: the items, their jobs' contexts, and demand for the worker's evictions.

        Demand (waiting items and holders) is sent for the models the worker
        holds, the only ones it may evict: per pull, not per model in the cluster.
        """
        queues, holders = self.state.queues, self.state.views.holders
        return {
            **self.state.items_reply(items),
            "contexts": {item.owner.id: item.owner.context for item in items if isinstance(item.owner, Job)},
            "demand": {m: [queues.waiting_items(m), holders.get(m, 0)] for m in view.held},
        }
