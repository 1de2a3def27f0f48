"""Waiting items: one FIFO per (model, priority), shared fairly between jobs.

Within a model and priority each job has its own FIFO and takes are served
round-robin across jobs, so a large job cannot starve a small one submitted
after it. Items are removed lazily: an item that finished or died while
queued (a late ack from a worker thought lost) is skipped at the head, and
`forget` keeps the waiting-rows count true meanwhile.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque

from .work_items import ItemState, WorkItem


class _JobFifos:
    """One (model, priority) queue: a FIFO per job, served in rotation."""

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

    def take(self, limit: int) -> list[WorkItem]:
        taken: list[WorkItem] = []
        while self.fifos and len(taken) < limit:
            job, fifo = next(iter(self.fifos.items()))
            item = fifo.popleft() if fifo else None
            if not fifo:
                del self.fifos[job]
            else:
                self.fifos.move_to_end(job)
            if item is not None and item.state is ItemState.QUEUED:
                taken.append(item)
        return taken

    def __len__(self) -> int:
        return sum(len(f) for f in self.fifos.values())


class ModelQueues:
    def __init__(self) -> None:
        self._queues: dict[str, dict[int, _JobFifos]] = defaultdict(lambda: defaultdict(_JobFifos))
        self._waiting_rows: dict[str, int] = defaultdict(int)
        self._waiting_items: dict[str, int] = defaultdict(int)

    def push(self, item: WorkItem, front: bool = False) -> None:
        self._queues[item.model][item.priority].push(item, front)
        self._waiting_rows[item.model] += item.rows
        self._waiting_items[item.model] += 1

    def head(self, model: str, priority: int) -> WorkItem | None:
        """The oldest waiting item of a model at one priority."""
        queue = self._queues.get(model, {}).get(priority)
        return queue.head() if queue is not None else None

    def take(self, model: str, priority: int, limit: int) -> list[WorkItem]:
        queue = self._queues.get(model, {}).get(priority)
        taken = queue.take(limit) if queue is not None else []
        for item in taken:
            self._count_out(item)
        return taken

    def forget(self, item: WorkItem) -> None:
        """A queued item left the queue by another way (late ack, job released)."""
        self._count_out(item)

    def _count_out(self, item: WorkItem) -> None:
        self._waiting_rows[item.model] -= item.rows
        self._waiting_items[item.model] -= 1

    def depth(self, model: str, priority: int | None = None) -> int:
        """Entries waiting (stale ones count until they reach a head)."""
        per_priority = self._queues.get(model, {})
        if priority is not None:
            queue = per_priority.get(priority)
            return len(queue) if queue is not None else 0
        return sum(len(q) for q in per_priority.values())

    def waiting_items(self, model: str) -> int:
        return self._waiting_items.get(model, 0)

    def waiting_rows(self, model: str) -> int:
        return self._waiting_rows.get(model, 0)

    def models(self) -> list[str]:
        return [m for m, n in self._waiting_items.items() if n > 0]
