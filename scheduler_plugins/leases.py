"""Leases, in one place: their terms, their index, their renewal and their expiry.

A leased item is its worker's until its deadline, renewed while the worker
holds it (workers/scheduler_stream). Its duration is its owner's
`lease_seconds` (a batch job's, 60 s by default, or the gateway's
`online_lease_seconds`, 0.5 s); a worker that must load the model first gets
a grace on top, once (`load_grace`); a renewal sets the deadline to now +
the duration, never earlier than the grace left; a lease that runs out puts
the item back as a spent attempt (queue_state).

Expiry pops deadlines off a heap, checked by one timer armed for the
earliest at most `CHECK_SECONDS` late (clock.Deadlines), never by a pass over
every lease; a renewal pushes the new deadline and the old entry is skipped
when it surfaces. Batch items and rows leased per model are counted for scaling.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from .clock import Clock, Deadlines
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
        self._deadlines: Deadlines[WorkItem] = Deadlines(clock, self._due, late=CHECK_SECONDS)
        self._count = 0

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
        self._deadlines.check()

    def _due(self, deadline: float, item: WorkItem) -> None:
        if item.deadline == deadline and item.id in self.of_worker(item.worker or ""):  # else renewed or gone
            self._on_expired(item)

    def close(self) -> None:
        self._deadlines.close()

    def __len__(self) -> int:
        return self._count

    def _count_batch(self, item: WorkItem, delta: int) -> None:
        if item.lane is Lane.BATCH:
            self.batch_items[item.model] += delta
            self.batch_rows[item.model] += delta * item.rows
            if self.batch_items[item.model] <= 0:
                del self.batch_items[item.model], self.batch_rows[item.model]

    def _push(self, item: WorkItem) -> None:
        self._deadlines.push(item.deadline, item)
        if len(self._deadlines) > 4 * self._count + 1024:  # mostly renewed entries: rebuilt from the live ones
            self._deadlines.replace((w.deadline, w) for held in self.by_worker.values() for w in held.values())
