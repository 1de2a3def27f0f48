"""Leased items: by worker, and by deadline.

A worker's items are found without a scan when it leaves or asks to extend;
the lease checker pops expired deadlines off a heap instead of visiting
every leased item twice a second. Extending a lease pushes its new deadline;
the old entry is skipped when it surfaces, and the heap is rebuilt when
skipped entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import itertools

from .work_items import ItemState, WorkItem


class Leases:
    def __init__(self) -> None:
        self.by_worker: dict[str, dict[str, WorkItem]] = {}
        self._deadlines: list[tuple[float, int, WorkItem]] = []
        self._order = itertools.count()
        self._count = 0

    def add(self, work: WorkItem) -> None:
        """`work` was just leased (its worker and deadline set)."""
        assert work.worker is not None
        self.by_worker.setdefault(work.worker, {})[work.id] = work
        self._count += 1
        self._push(work)

    def extended(self, work: WorkItem) -> None:
        self._push(work)

    def remove(self, work: WorkItem) -> None:
        held = self.by_worker.get(work.worker or "")
        if held is not None and held.pop(work.id, None) is not None:
            self._count -= 1
            if not held:
                del self.by_worker[work.worker or ""]

    def of_worker(self, worker: str) -> dict[str, WorkItem]:
        return self.by_worker.get(worker, {})

    def expired(self, now: float) -> list[WorkItem]:
        """Leased items whose deadline passed, oldest first."""
        out = []
        while self._deadlines and self._deadlines[0][0] < now:
            deadline, _, work = heapq.heappop(self._deadlines)
            if (
                work.state is ItemState.LEASED
                and work.deadline == deadline
                and work.id in self.of_worker(work.worker or "")
            ):
                out.append(work)
        return out

    def __len__(self) -> int:
        return self._count

    def _push(self, work: WorkItem) -> None:
        heapq.heappush(self._deadlines, (work.deadline, next(self._order), work))
        if len(self._deadlines) > 4 * self._count + 1024:
            self._deadlines = [
                (w.deadline, next(self._order), w) for held in self.by_worker.values() for w in held.values()
            ]
            heapq.heapify(self._deadlines)
