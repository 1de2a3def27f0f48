"""Waiting items: one FIFO per (model, lane), shared fairly between jobs.

Within a model and lane each job has its own FIFO and takes are served
round-robin across jobs, so a large job cannot starve a small one submitted
after it. Items are removed lazily: an item that finished or died while
queued (a late ack from a worker thought lost) is skipped at the head, and
`forget` keeps the waiting-rows count true meanwhile.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Callable

from .protocol import Lane
from .work_items import ItemState, WorkItem


class _JobFifos:
    """One (model, lane) queue: a FIFO per job, served in rotation."""

    def __init__(self) -> None:
        self.fifos: OrderedDict[str, deque[WorkItem]] = OrderedDict()

    def push(self, item: WorkItem, front: bool) -> None:
        fifo = self.fifos.setdefault(item.job, deque())
        fifo.appendleft(item) if front else fifo.append(item)

    def head(self) -> WorkItem | None:
        oldest = None
        for job in list(self.fifos):
            fifo = self.fifos[job]
            while fifo and fifo[0].state is not ItemState.QUEUED:
                fifo.popleft()
            if not fifo:
                del self.fifos[job]
            elif oldest is None or fifo[0].enqueued_at < oldest.enqueued_at:
                oldest = fifo[0]
        return oldest

    def take(self, limit: int, rows: int | None = None) -> list[WorkItem]:
        """Up to `limit` items, and with `rows`, no more rows than that in all (but at least one item)."""
        taken: list[WorkItem] = []
        taken_rows = 0
        while self.fifos and len(taken) < limit:
            job, fifo = next(iter(self.fifos.items()))
            if not fifo:
                del self.fifos[job]
                continue
            item = fifo[0]
            queued = item.state is ItemState.QUEUED
            if queued and taken and rows is not None and taken_rows + item.rows > rows:
                break
            fifo.popleft()
            if fifo:
                self.fifos.move_to_end(job)
            else:
                del self.fifos[job]
            if queued:
                taken.append(item)
                taken_rows += item.rows
        return taken

    def __len__(self) -> int:
        return sum(len(f) for f in self.fifos.values())


class ModelQueues:
    """Waiting items per model and lane, with counts kept as items come and go.

    `on_change`: called with a model whose waiting batch work changed (the
    steal index orders models by it).
    """

    def __init__(self, on_change: Callable[[str], None] = lambda model: None) -> None:
        self._queues: dict[str, dict[Lane, _JobFifos]] = defaultdict(lambda: defaultdict(_JobFifos))
        self._rows: Counter[tuple[str, Lane]] = Counter()
        self._items: Counter[tuple[str, Lane]] = Counter()
        self._backlog: dict[Lane, dict[str, None]] = defaultdict(dict)  # lane -> models with items waiting
        self._on_change = on_change

    def push(self, item: WorkItem, front: bool = False) -> None:
        self._queues[item.model][item.lane].push(item, front)
        self._count(item, +1)

    def head(self, model: str, lane: Lane) -> WorkItem | None:
        """The oldest waiting item of a model in one lane."""
        queue = self._queues.get(model, {}).get(lane)
        return queue.head() if queue is not None else None

    def take(self, model: str, lane: Lane, limit: int, rows: int | None = None) -> list[WorkItem]:
        """The next items of `model` in `lane`, jobs in rotation: at most `limit`, and `rows` rows (at least one)."""
        queue = self._queues.get(model, {}).get(lane)
        taken = queue.take(limit, rows) if queue is not None else []
        for item in taken:
            self._count(item, -1)
        return taken

    def forget(self, item: WorkItem) -> None:
        """A queued item left the queue by another way (late ack, job released)."""
        self._count(item, -1)

    def _count(self, item: WorkItem, delta: int) -> None:
        key = (item.model, item.lane)
        self._rows[key] += delta * item.rows
        self._items[key] += delta
        if self._items[key] > 0:
            self._backlog[item.lane][item.model] = None
        else:
            del self._items[key], self._rows[key]
            self._backlog[item.lane].pop(item.model, None)
            queue = self._queues.get(item.model, {}).get(item.lane)
            if queue is not None and not len(queue):
                del self._queues[item.model][item.lane]
                if not self._queues[item.model]:
                    del self._queues[item.model]
        if item.lane is not Lane.ONLINE:
            self._on_change(item.model)

    def depth(self, model: str, lane: Lane | None = None) -> int:
        """Entries waiting (stale ones count until they reach a head)."""
        per_lane = self._queues.get(model, {})
        if lane is not None:
            queue = per_lane.get(lane)
            return len(queue) if queue is not None else 0
        return sum(len(q) for q in per_lane.values())

    def waiting_items(self, model: str, lane: Lane | None = None) -> int:
        if lane is not None:
            return self._items.get((model, lane), 0)
        return self._items.get((model, Lane.ONLINE), 0) + self._items.get((model, Lane.BATCH), 0)

    def waiting_rows(self, model: str, lane: Lane | None = None) -> int:
        if lane is not None:
            return self._rows.get((model, lane), 0)
        return self._rows.get((model, Lane.ONLINE), 0) + self._rows.get((model, Lane.BATCH), 0)

    def models(self, lane: Lane | None = None) -> list[str]:
        """Models with items waiting (in `lane`, or in either)."""
        if lane is not None:
            return list(self._backlog[lane])
        return list(dict.fromkeys([*self._backlog[Lane.ONLINE], *self._backlog[Lane.BATCH]]))
