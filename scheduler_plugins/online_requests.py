"""Online requests as queue items: one standing job per model, a future per request.

An online request is an ONLINE-priority item on its model's queue, so it goes
through the same leases, retries and worker-loss handling as a batch item.
What it does not need is a job's result bookkeeping: each model has one
long-lived `OnlineJob` whose items resolve an asyncio future when acked (or
buried) and are forgotten at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from .jobs import Job
from .work_items import ItemState, WorkItem


class OnlineFailure(RuntimeError):
    """A request the workers could not answer (its item died), with the reason."""


class OnlineJob(Job):
    def __init__(self, model: str, lease_seconds: float, max_attempts: int, forget: Callable[[WorkItem], None]) -> None:
        super().__init__(f"online-{model}", [], {"lease_seconds": lease_seconds, "max_attempts": max_attempts})
        self.model = model
        self.futures: dict[str, asyncio.Future] = {}
        self._forget = forget
        self._next = 0

    @property
    def complete(self) -> bool:
        return False  # it stands for as long as the plugin does

    def new_item(self, op: str, payload: dict[str, Any], rows: int, priority: int) -> tuple[WorkItem, asyncio.Future]:
        self._next += 1
        item = WorkItem(
            id=f"{self.id}/{self._next}",
            job=self.id,
            model=self.model,
            op=op,
            payload=payload,
            priority=priority,
            rows=rows,
        )
        future = asyncio.get_running_loop().create_future()
        self.items[item.id] = item
        self.futures[item.id] = future
        return item, future

    def record_done(self, item: WorkItem, worker: str, result: dict[str, Any]) -> None:
        item.state = ItemState.DONE
        item.worker = None
        self._resolve(item, result)

    def record_dead(self, item: WorkItem) -> None:
        item.state = ItemState.DEAD
        item.worker = None
        self._resolve(item, OnlineFailure(item.errors[-1] if item.errors else "the request failed"))

    def cancel(self, item: WorkItem) -> None:
        """The request gave up (deadline, client gone): a late ack is refused."""
        item.state = ItemState.DEAD
        item.worker = None
        self._resolve(item, None)

    def _resolve(self, item: WorkItem, outcome: Any) -> None:
        self.items.pop(item.id, None)
        future = self.futures.pop(item.id, None)
        self._forget(item)
        if future is None or future.done() or outcome is None:
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def leased_at(item: WorkItem, lease_seconds: float) -> float:
    """When a worker leased an online item (monotonic).

    Online leases are never extended (a request lives shorter than its lease),
    so the lease began exactly `lease_seconds` before its deadline.
    """
    return item.deadline - lease_seconds if item.deadline else time.monotonic()
