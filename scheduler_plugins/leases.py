"""Leases, in one place: their terms, their index, their renewal and their expiry.

A leased item is its worker's until its deadline, renewed while the worker
holds it (workers/scheduler_stream). Its duration is its owner's
`lease_seconds` (a batch job's, 60 s by default, or the gateway's
`online_lease_seconds`, 0.5 s); a worker that must load the model first gets
a grace on top, once (`load_grace`); a renewal sets the deadline to now +
the duration, never earlier than the grace left; a lease that runs out puts
the item back as a spent attempt (queue_state).

Expiry pops deadlines off a heap, checked by one timer armed for the
earliest at most `CHECK_SECONDS` late, never by a pass over every lease; a
renewal pushes the new deadline and the old entry is skipped when it
surfaces. Batch items and rows leased per model are counted for scaling.py.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence

from .clock import Clock, Timer
from .protocol import Lane
from .work_items import ItemState, WorkItem
from .worker_views import WorkerView

CHECK_SECONDS = 0.1  # how late an expired lease may be noticed: online leases last half a second
FIRST_LOAD_GRACE_SECONDS = 30.0  # a model's first load on a worker, whose time nobody measured yet


def load_grace(view: WorkerView, model: str) -> float:
    """Seconds added to a lease on a worker that must load `model` first: none when it has it loaded.

    A load can hold the worker's loop for seconds (a first load imports torch,
    whose native initialisation keeps the GIL), so no renewal leaves meanwhile:
    twice the load this worker measured, else FIRST_LOAD_GRACE_SECONDS.
    """
    if model in view.loaded:
        return 0.0
    measured = view.load_seconds.get(model)
    return 2 * measured + 1.0 if measured is not None else FIRST_LOAD_GRACE_SECONDS


class Leases:
    """Leased items by worker and by deadline; `on_expired` gets each item whose lease ran out."""

    def __init__(self, clock: Clock, on_expired: Callable[[WorkItem], None]) -> None:
        self.clock = clock
        self.by_worker: dict[str, dict[str, WorkItem]] = {}
        self.batch_items: Counter[str] = Counter()  # model -> batch items leased
        self.batch_rows: Counter[str] = Counter()  # model -> their rows
        self._on_expired = on_expired
        self._deadlines: list[tuple[float, int, WorkItem]] = []
        self._order = itertools.count()
        self._count = 0
        self._timer: Timer | None = None
        self._armed_for = float("inf")

    def grant(self, item: WorkItem, worker: str, grace: float = 0.0, counts_as_attempt: bool = True) -> None:
        """`item` is `worker`'s until its owner's lease (plus `grace`, this once) runs out."""
        item.move(ItemState.LEASED)
        item.worker, item.started = worker, False
        item.attempts += counts_as_attempt
        item.leased_at = self.clock.now()
        item.deadline = item.leased_at + item.owner.lease_seconds + grace
        self.by_worker.setdefault(worker, {})[item.id] = item
        self._count += 1
        self._count_batch(item, +1)
        self._push(item)

    def renew(self, worker: str, item_ids: Sequence[str]) -> list[str]:
        """Renew `worker`'s leases of `item_ids`; the ids it no longer holds."""
        held, lost = self.by_worker.get(worker, {}), []
        now = self.clock.now()
        for item_id in item_ids:
            item = held.get(item_id)
            if item is None or item.state is not ItemState.LEASED:
                lost.append(item_id)
                continue
            item.deadline = max(item.deadline, now + item.owner.lease_seconds)  # a grace stays
            self._push(item)
        return lost

    def remove(self, item: WorkItem) -> bool:
        """`item` is no longer leased (its state is the caller's); True if it was."""
        held = self.by_worker.get(item.worker or "")
        if held is None or held.pop(item.id, None) is None:
            return False
        self._count -= 1
        self._count_batch(item, -1)
        if not held:
            del self.by_worker[item.worker or ""]
        return True

    def of_worker(self, worker: str) -> dict[str, WorkItem]:
        return self.by_worker.get(worker, {})

    def expire(self) -> None:
        """Hand every item whose deadline passed to `on_expired`, oldest first; O(1) when none did."""
        self._timer, self._armed_for = None, float("inf")
        now = self.clock.now()
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, _, item = heapq.heappop(self._deadlines)
            if item.deadline == deadline and item.id in self.of_worker(item.worker or ""):
                self._on_expired(item)
        if self._deadlines:
            self._arm(self._deadlines[0][0])

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def __len__(self) -> int:
        return self._count

    def _count_batch(self, item: WorkItem, delta: int) -> None:
        if item.lane is Lane.BATCH:
            self.batch_items[item.model] += delta
            self.batch_rows[item.model] += delta * item.rows
            if self.batch_items[item.model] <= 0:
                del self.batch_items[item.model], self.batch_rows[item.model]

    def _push(self, item: WorkItem) -> None:
        heapq.heappush(self._deadlines, (item.deadline, next(self._order), item))
        if len(self._deadlines) > 4 * self._count + 1024:
            self._deadlines = [
                (w.deadline, next(self._order), w) for held in self.by_worker.values() for w in held.values()
            ]
            heapq.heapify(self._deadlines)
        if item.deadline < self._armed_for:
            self._arm(item.deadline)

    def _arm(self, deadline: float) -> None:
        """Check at `deadline`, or CHECK_SECONDS after the last check if later: one timer, rarely moved."""
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = max(deadline, self.clock.now() + CHECK_SECONDS)
        self._timer = self.clock.call_at(self._armed_for, self.expire)
