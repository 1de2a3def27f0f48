"""Online requests as queue items: one owner per model, a future per request.

An online request is an item in its model's online lane, so it goes
through the same leases, retries and worker-loss handling as a batch item.
What it does not need is a job's result bookkeeping: each model has one
long-lived `OnlineRequests` whose items resolve an asyncio future when acked
(or buried) and are forgotten at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ..configs import UNPLACEABLE_SECONDS, GatewaySettings
from .protocol import Lane, OnlinePayload, OnlineResult
from .work_items import ItemState, WorkItem


class OnlineFailure(RuntimeError):
    """A request the workers could not answer (its item died), with the reason."""


class OnlineRequests:
    """A model's online requests: the owner of their items (work_items.ItemOwner)."""

    unplaceable_seconds = UNPLACEABLE_SECONDS  # as a batch job's default; a request's own deadline comes first

    def __init__(self, model: str, settings: GatewaySettings, forget: Callable[[WorkItem], object]) -> None:
        self.id = f"online-{model}"
        self.model = model
        self.futures: dict[str, asyncio.Future[OnlineResult]] = {}
        self._forget = forget
        self._next = 0
        self.configure(settings)

    def configure(self, settings: GatewaySettings) -> None:
        """The gateway's settings for the requests from now on (they change only with a new gateway)."""
        self.settings = settings
        self.lease_seconds = settings.online_lease_seconds
        self.max_attempts = settings.max_attempts

    def new_item(
        self, op: str, payload: OnlinePayload, rows: int, flow: str | None = None
    ) -> tuple[WorkItem, asyncio.Future[OnlineResult]]:
        """A request's item and the future of its answer; `flow`: the request it is a part of (its own id
        by default): the parts of one request share a fair share (model_queues)."""
        self._next += 1
        item_id = f"{self.id}/{self._next}"
        item = WorkItem(item_id, self, self.model, op, payload, Lane.ONLINE, rows, flow or item_id)
        future = self.futures[item.id] = asyncio.get_running_loop().create_future()
        return item, future

    def __len__(self) -> int:
        """Requests not answered yet: queued, or leased and waiting on a worker."""
        return len(self.futures)

    def record_done(self, item: WorkItem, worker: str, result: OnlineResult) -> None:
        self._resolve(item, result)

    def record_dead(self, item: WorkItem) -> None:
        self._resolve(item, OnlineFailure(item.errors[-1] if item.errors else "the request failed"))

    def cancel(self, item: WorkItem) -> None:
        """The request gave up (deadline, client gone): a late ack is refused."""
        self._resolve(item, None)

    def moved(self, item: WorkItem, old: ItemState) -> None:
        """Requests are not counted by state: each is answered, and forgotten, on its own."""

    def _resolve(self, item: WorkItem, outcome: OnlineResult | OnlineFailure | None) -> None:
        item.move(ItemState.DEAD if outcome is None or isinstance(outcome, OnlineFailure) else ItemState.DONE)
        item.worker = None
        future = self.futures.pop(item.id, None)
        self._forget(item)
        if future is None or future.done() or outcome is None:
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
