"""Leased items: by worker, and by deadline.

A worker's items are found without a scan when it leaves or asks to extend;
the lease checker pops expired deadlines off a heap instead of visiting
every leased item twice a second. Batch items and rows leased per model are
counted as they come and go, for the scaling count (scaling.py). Extending a lease pushes its new deadline;
the old entry is skipped when it surfaces, and the heap is rebuilt when
skipped entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter

from .protocol import Lane
from .work_items import ItemState, WorkItem


class Leases:
    def __init__(self) -> None:
        self.by_worker: dict[str, dict[str, WorkItem]] = {}
        self._deadlines: list[tuple[float, int, WorkItem]] = []
        self._order = itertools.count()
        self._count = 0
        self.batch_items: Counter[str] = Counter()  # model -> batch items leased
        self.batch_rows: Counter[str] = Counter()  # model -> their rows

    def add(self, item: WorkItem) -> None:
        """`item` was just leased (its worker and deadline set)."""
        assert item.worker is not None
        self.by_worker.setdefault(item.worker, {})[item.id] = item
        self._count += 1
        self._count_batch(item, +1)
        self._push(item)

    def extended(self, item: WorkItem) -> None:
        self._push(item)

    def remove(self, item: WorkItem) -> None:
        held = self.by_worker.get(item.worker or "")
        if held is not None and held.pop(item.id, None) is not None:
            self._count -= 1
            self._count_batch(item, -1)
            if not held:
                del self.by_worker[item.worker or ""]

    def of_worker(self, worker: str) -> dict[str, WorkItem]:
        return self.by_worker.get(worker, {})

    def expired(self, now: float) -> list[WorkItem]:
        """Leased items whose deadline passed, oldest first."""
        out = []
        while self._deadlines and self._deadlines[0][0] < now:
            deadline, _, item = heapq.heappop(self._deadlines)
            if (
                item.state is ItemState.LEASED
                and item.deadline == deadline
                and item.id in self.of_worker(item.worker or "")
            ):
                out.append(item)
        return out

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
