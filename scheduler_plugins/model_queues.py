"""One FIFO per (model, priority): online items of a model before its batch items.

Items are removed lazily: an item that finished or died while queued (a late
ack from a worker thought lost) is skipped when it reaches the head.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator

from .work_items import ItemState, WorkItem


class ModelQueues:
    def __init__(self) -> None:
        self._queues: dict[str, dict[int, deque[WorkItem]]] = defaultdict(
            lambda: defaultdict(deque)
        )

    def push(self, item: WorkItem, front: bool = False) -> None:
        queue = self._queues[item.model][item.priority]
        if front:
            queue.appendleft(item)
        else:
            queue.append(item)

    def _drop_stale_heads(self, queue: deque[WorkItem]) -> None:
        while queue and queue[0].state is not ItemState.QUEUED:
            queue.popleft()

    def head(self, model: str, priority: int) -> WorkItem | None:
        """The oldest waiting item of a model at one priority."""
        queue = self._queues.get(model, {}).get(priority)
        if not queue:
            return None
        self._drop_stale_heads(queue)
        return queue[0] if queue else None

    def take(self, model: str, priority: int, limit: int) -> list[WorkItem]:
        queue = self._queues.get(model, {}).get(priority)
        taken: list[WorkItem] = []
        while queue and len(taken) < limit:
            item = queue.popleft()
            if item.state is ItemState.QUEUED:
                taken.append(item)
        return taken

    def depth(self, model: str, priority: int | None = None) -> int:
        """Waiting items (counting stale entries until they reach the head)."""
        per_priority = self._queues.get(model, {})
        if priority is not None:
            return len(per_priority.get(priority, ()))
        return sum(len(q) for q in per_priority.values())

    def waiting_rows(self, model: str) -> int:
        return sum(
            item.rows
            for queue in self._queues.get(model, {}).values()
            for item in queue
            if item.state is ItemState.QUEUED
        )

    def models(self) -> Iterator[str]:
        return iter(list(self._queues))
