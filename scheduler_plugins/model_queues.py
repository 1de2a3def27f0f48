"""Waiting items: one queue per (model, lane), taken in fair shares across flows.

A flow is whose share an item counts in: a batch job, or an online request
(a large one's parts share one, gateway/request_parts). Each queue orders
its items by start-time fair queuing over their rows: an item's tag is its
flow's last tag, or the queue's virtual time (the tag of the last item
taken) if that is later, plus its rows, and items are taken lowest tag
first. A flow that queued many rows thus waits behind one that queued few,
whenever each came: the parts of a 2,048-input request interleave with
one-text requests instead of going first in a block, and a large job cannot
starve a small one submitted after it. A push `front` (an item put back:
retried, handed back, its worker lost) goes ahead of every tag. Each push
and take costs O(log n).

Items are removed lazily: an item that finished or died while queued (a late
ack from a worker thought lost, a cancelled request) is skipped when it
surfaces, and `forget` keeps the counts true meanwhile.

Models of one family (a base and its LoRA adapters: one forward pass serves
them all on a worker) are indexed together, so a pull takes the waiting work
of several of them at once (`take_family`) at a cost of the models it takes
from.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator

from .protocol import Lane
from .work_items import ItemState, WorkItem


class FairQueue:
    """One (model, lane) queue: a heap of (tag, order, item)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, WorkItem]] = []
        self._last: dict[str, float] = {}  # flow -> the tag of its last item queued
        self._virtual = 0.0
        self._order = itertools.count()
        self._fronts = itertools.count(-1, -1)  # a later push to the front goes ahead of an earlier one

    def push(self, item: WorkItem, front: bool = False) -> None:
        if front:
            heapq.heappush(self._heap, (self._virtual, next(self._fronts), item))
            return
        tag = max(self._last.get(item.flow, 0.0), self._virtual) + max(1, item.rows)
        self._last[item.flow] = tag
        heapq.heappush(self._heap, (tag, next(self._order), item))

    def head(self) -> WorkItem | None:
        """The next item to take."""
        while self._heap and self._heap[0][2].state is not ItemState.QUEUED:
            self._pop()
        return self._heap[0][2] if self._heap else None

    def take(self, limit: int, rows: int | None = None) -> list[WorkItem]:
        """Up to `limit` items, and with `rows`, no more rows than that in all (but at least one item)."""
        taken: list[WorkItem] = []
        taken_rows = 0
        while len(taken) < limit and (item := self.head()) is not None:
            if taken and rows is not None and taken_rows + item.rows > rows:
                break
            taken.append(self._pop())
            taken_rows += item.rows
        return taken

    def queued(self) -> Iterator[WorkItem]:
        """Every item waiting, in no order."""
        return (item for _, _, item in self._heap if item.state is ItemState.QUEUED)

    def _pop(self) -> WorkItem:
        tag, _, item = heapq.heappop(self._heap)
        self._virtual = max(self._virtual, tag)
        if self._last.get(item.flow) == tag:
            del self._last[item.flow]  # nothing of its flow waits: it starts afresh from the virtual time
        return item

    def __len__(self) -> int:
        return len(self._heap)


class ModelQueues:
    """Waiting items per model and lane, with counts kept as items come and go.

    `on_change`: called with a model whose waiting batch work changed (the
    steal index orders models by it).
    """

    def __init__(
        self, on_change: Callable[[str], None] = lambda model: None, family: Callable[[str], str] = lambda m: m
    ) -> None:
        """`family(model)`: the models that may share a pull (a LoRA adapter's: its base's name)."""
        self._queues: dict[str, dict[Lane, FairQueue]] = defaultdict(lambda: defaultdict(FairQueue))
        self._rows: Counter[tuple[str, Lane]] = Counter()
        self._items: Counter[tuple[str, Lane]] = Counter()
        self._backlog: dict[Lane, dict[str, None]] = defaultdict(dict)  # lane -> models with items waiting
        self._families: dict[tuple[Lane, str], dict[str, None]] = {}  # (lane, family) -> its models with work
        self._family_of: dict[str, str] = {}  # model -> its family, as first seen (one entry per model)
        self._family = family
        self._on_change = on_change

    def push(self, item: WorkItem, front: bool = False) -> None:
        self._queues[item.model][item.lane].push(item, front)
        self._count(item, +1)

    def head(self, model: str, lane: Lane) -> WorkItem | None:
        """The next item of a model in one lane."""
        queue = self._queues.get(model, {}).get(lane)
        return queue.head() if queue is not None else None

    def take(self, model: str, lane: Lane, limit: int, rows: int | None = None) -> list[WorkItem]:
        """The next items of `model` in `lane`, in fair shares: at most `limit`, and `rows` rows (at least one)."""
        queue = self._queues.get(model, {}).get(lane)
        taken = queue.take(limit, rows) if queue is not None else []
        for item in taken:
            self._count(item, -1)
        return taken

    def take_family(self, model: str, lane: Lane, limit: int, rows: int | None = None) -> list[WorkItem]:
        """As `take`, then, while room is left, the next items of the other models of `model`'s family."""
        taken = self.take(model, lane, limit, rows)
        used = sum(item.rows for item in taken)
        family = self._families.get((lane, self._family_of.get(model, self._family(model))), {})
        for sibling in list(family):
            if len(taken) >= limit or (rows is not None and used >= rows):
                break
            head = self.head(sibling, lane)
            if sibling == model or head is None or (rows is not None and used + head.rows > rows):
                continue
            more = self.take(sibling, lane, limit - len(taken), None if rows is None else rows - used)
            taken += more
            used += sum(item.rows for item in more)
        return taken

    def queued(self, model: str, lane: Lane) -> list[WorkItem]:
        queue = self._queues.get(model, {}).get(lane)
        return list(queue.queued()) if queue is not None else []

    def forget(self, item: WorkItem) -> None:
        """A queued item left the queue by another way (late ack, job released, buried, cancelled)."""
        self._count(item, -1)

    def _count(self, item: WorkItem, delta: int) -> None:
        key = (item.model, item.lane)
        self._rows[key] += delta * item.rows
        self._items[key] += delta
        if self._items[key] > 0:
            self._backlog[item.lane][item.model] = None
            family = self._family_of.setdefault(item.model, self._family(item.model))
            self._families.setdefault((item.lane, family), {})[item.model] = None
        else:
            del self._items[key], self._rows[key]
            self._backlog[item.lane].pop(item.model, None)
            family = self._family_of.get(item.model, item.model)
            members = self._families.get((item.lane, family), {})
            members.pop(item.model, None)
            if not members:
                self._families.pop((item.lane, family), None)
            queue = self._queues.get(item.model, {}).get(item.lane)
            if queue is not None and not queue.head():
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
