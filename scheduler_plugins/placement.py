"""Which model a pulling worker should serve next, and which worker takes a request.

Workers pull, so a model's work goes to whichever worker has room, not to
where a router guessed. A batch pull is answered, in order, with:

1. online items of models the worker holds, or of models no worker
   holds (online requests never pay a load a holder could spare them);
2. batch items of models the worker holds, oldest head first;
3. stealing: a model the worker does not hold, when its backlog is worth the
   load: expected drain time (waiting rows over the measured rate of the
   workers already holding it) longer than its load time on this worker
   times `steal_factor`. A model that no worker holds is always worth it.

An idle worker may also take back an item another worker leased but has not
started, when it would start it sooner: the holder first finishes the items
it started (and loads the model, if it lacks it); the idle worker only has to
load the model, if it lacks it. Without that comparison idle workers pass a
lone model's last items around, each paying a load, while its holder waits.

An online request goes to a waiting online pull of a worker holding its
model: one with the model loaded before one still loading it, an idle one
before a busy one (`online_rank`); when no worker holds the model, to an
idle worker. A request then waits for a running forward batch rather than a
load, and for neither when it need not.

Only models the worker may host are considered: the catalog's `requires`
against the worker's Dask resources, and the model's size against its budget.

Every choice is made from indexes kept as events happen, never from a scan
of all workers or all leased items: the cost of one pull must not grow with
the cluster. Steal candidates sit in a heap ordered by drain time, and
take-back candidates in a heap ordered by how long they would wait on their
holder; both are scanned from the top only until no later entry can win.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Collection
from typing import Any

from .model_queues import ModelQueues
from .waiting_pulls import WaitingOnlinePulls
from .work_items import BATCH, ONLINE, WorkItem
from .worker_views import WorkerView, WorkerViews, can_host

DEFAULT_ROWS_PER_SECOND = 100.0
DEFAULT_LOAD_SECONDS = 5.0


class ModelStats:
    """Measured throughput per model (rows per compute second), from acks."""

    def __init__(self) -> None:
        self.rows: dict[str, float] = defaultdict(float)
        self.seconds: dict[str, float] = defaultdict(float)

    def record(self, model: str, rows: int, seconds: float) -> None:
        if seconds > 0:
            self.rows[model] += rows
            self.seconds[model] += seconds

    def rows_per_second(self, model: str) -> float:
        seconds = self.seconds.get(model, 0.0)
        return self.rows[model] / seconds if seconds else DEFAULT_ROWS_PER_SECOND


def online_rank(view: WorkerView, model: str, busy: bool) -> int:
    """How soon a waiting online pull would answer a request of `model`: 0 (best) to 3.

    Loaded and idle, loaded and busy (one forward batch to wait), loading and
    idle, loading and busy.
    """
    return (0 if model in view.loaded else 2) + (1 if busy else 0)


class Placement:
    def __init__(
        self, queues: ModelQueues, views: WorkerViews, specs: dict[str, dict[str, Any]], steal_factor: float = 1.0
    ) -> None:
        self.queues = queues
        self.views = views
        self.specs = specs
        self.steal_factor = steal_factor
        self.stats = ModelStats()
        self._order = itertools.count()
        # Steal index: models with batch work waiting, by (unheld, drain or backlog); stale entries skipped.
        self._drains: list[tuple[int, float, int, str, tuple[int, float]]] = []
        self._drain_keys: dict[str, tuple[int, float]] = {}
        self._dirty: set[str] = set()
        self._min_spec_load: tuple[int, float] | None = None  # (specs known, their cheapest load)
        # Take-back index: batch items leased but not started, by how long they would wait on their holder.
        self._waits: list[tuple[float, int, WorkItem, float]] = []
        self._unstarted: dict[str, dict[str, WorkItem]] = defaultdict(dict)
        self._pushed_waits: dict[str, float] = {}  # item id -> the wait of its newest heap entry
        self._ahead: dict[str, float] = defaultdict(float)  # worker -> expected compute of the items it started

    # -- choosing for a batch pull ----------------------------------------------------

    def choose(self, worker: WorkerView) -> tuple[str, int] | None:
        """(model, priority) for this pull, or None when nothing fits the worker."""
        heads = [
            (head.enqueued_at, model)
            for model in self.queues.models(ONLINE)
            if (model in worker.held or can_host(self.specs.get(model, {}), worker))
            and (head := self.queues.head(model, ONLINE)) is not None
        ]
        held = [h for h in heads if h[1] in worker.held]
        if held:
            return min(held)[1], ONLINE
        # Online requests of a model another worker holds wait for it (at most
        # its running batch): a load here would cost them far more.
        unheld = [h for h in heads if not self.views.holders.get(h[1])]
        if unheld:
            return min(unheld)[1], ONLINE
        held = [
            (head.enqueued_at, model) for model in worker.held if (head := self.queues.head(model, BATCH)) is not None
        ]
        if held:
            return min(held)[1], BATCH
        steal = self._steal(worker)
        return (steal, BATCH) if steal is not None else None

    def online_model_for(
        self, view: WorkerView, busy: bool, waiting: WaitingOnlinePulls, claimed: Collection[str]
    ) -> str | None:
        """The model whose online requests this online pull takes, oldest head first.

        A request goes to a worker holding its model, or to any that may host
        it when none does. A model is left to another waiting pull that ranks
        better for it (online_rank), and to one already woken for it.
        """
        best: tuple[bool, float, str] | None = None
        for model in self.queues.models(ONLINE):
            if model in claimed:
                continue
            here = model in view.held
            held = bool(self.views.holders.get(model))
            if not here and (held or not can_host(self.specs.get(model, {}), view)):
                continue
            other = waiting.best_rank(model, held)
            if other is not None and other < online_rank(view, model, busy):
                continue
            head = self.queues.head(model, ONLINE)
            if head is not None and (best is None or (not here, head.enqueued_at, model) < best):
                best = (not here, head.enqueued_at, model)
        return best[2] if best is not None else None

    def model_changed(self, model: str) -> None:
        """Its waiting batch work, holders or rate changed: its steal entry is redone before the next steal."""
        self._dirty.add(model)

    def specs_changed(self) -> None:
        self._min_spec_load = None

    def _steal(self, worker: WorkerView) -> str | None:
        """Unheld models first (largest backlog), then the largest positive gain.

        Entries come off the heap in order of drain time, an upper bound of
        the gain (a load costs at least the worker's cheapest one), so the
        scan stops once no later entry can beat the best found.
        """
        self._refresh_drains()
        cheapest_load = self.steal_factor * self._cheapest_load(worker)
        best: tuple[float, str] | None = None
        popped = []
        seen: set[str] = set()
        while self._drains:
            entry = self._drains[0]
            model, key = entry[3], entry[4]
            if self._drain_keys.get(model) != key or model in seen:
                heapq.heappop(self._drains)
                continue
            tier, value = key
            if tier == 0 and value - cheapest_load <= (best[0] if best is not None else 0.0):
                break
            popped.append(heapq.heappop(self._drains))
            seen.add(model)
            if model in worker.held or not can_host(self.specs.get(model, {}), worker):
                continue
            if tier == 1:
                best = (float("inf"), model)
                break
            gain = value - self.steal_factor * self._load_seconds(worker, model)
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, model)
        for entry in popped:
            heapq.heappush(self._drains, entry)
        return best[1] if best is not None else None

    def _refresh_drains(self) -> None:
        for model in self._dirty:
            items = self.queues.waiting_items(model, BATCH)
            if not items:
                self._drain_keys.pop(model, None)
                continue
            rows = self.queues.waiting_rows(model, BATCH)
            holders = self.views.holders.get(model, 0)
            key = (1, float(rows)) if holders == 0 else (0, rows / (self.stats.rows_per_second(model) * holders))
            if self._drain_keys.get(model) != key:
                self._drain_keys[model] = key
                heapq.heappush(self._drains, (-key[0], -key[1], next(self._order), model, key))
        self._dirty.clear()
        if len(self._drains) > 4 * len(self._drain_keys) + 1024:
            self._drains = [(-k[0], -k[1], next(self._order), m, k) for m, k in self._drain_keys.items()]
            heapq.heapify(self._drains)

    def _cheapest_load(self, worker: WorkerView) -> float:
        """A lower bound of any model's load on `worker`."""
        if self._min_spec_load is None or self._min_spec_load[0] != len(self.specs):
            cheapest = min(
                (s.get("load_seconds") or DEFAULT_LOAD_SECONDS for s in self.specs.values()),
                default=DEFAULT_LOAD_SECONDS,
            )
            self._min_spec_load = (len(self.specs), cheapest)
        measured = [s for s in worker.load_seconds.values() if s]
        return min([self._min_spec_load[1], *measured])

    def _load_seconds(self, worker: WorkerView, model: str) -> float:
        """Measured on this worker, else the catalog's figure, else a default."""
        return worker.load_seconds.get(model) or self.specs.get(model, {}).get("load_seconds") or DEFAULT_LOAD_SECONDS

    # -- take-back -------------------------------------------------------------------

    def leased(self, work: WorkItem) -> None:
        """A batch item was leased: a take-back candidate until it starts."""
        if work.priority == BATCH and work.worker is not None:
            self._unstarted[work.worker][work.id] = work
            self._push_wait(work)

    def started(self, work: WorkItem) -> None:
        """The holder began `work`: the items behind it there now wait longer."""
        holder = work.worker or ""
        if self._forget_candidate(holder, work):
            work.expected_seconds = work.rows / self.stats.rows_per_second(work.model)
            self._ahead[holder] += work.expected_seconds
            self.holder_changed(holder)

    def unleased(self, work: WorkItem) -> None:
        """`work` left its holder (acked, failed, lost, taken back): called before its lease is cleared."""
        holder = work.worker or ""
        if not self._forget_candidate(holder, work) and work.started and holder in self._ahead:
            self._ahead[holder] = max(0.0, self._ahead[holder] - work.expected_seconds)
            self.holder_changed(holder)

    def worker_removed(self, address: str) -> None:
        for work in list(self._unstarted.get(address, {}).values()):
            self._forget_candidate(address, work)
        self._unstarted.pop(address, None)
        self._ahead.pop(address, None)

    def holder_changed(self, address: str) -> None:
        """What its waiting items would wait for there changed (items started or done, models loaded)."""
        for work in self._unstarted.get(address, {}).values():
            self._push_wait(work)

    def take_back(self, thief: WorkerView) -> WorkItem | None:
        """The leased, not started batch item an idle `thief` would start soonest, ahead of its holder.

        Entries come off the heap by how long they would wait on their holder,
        an upper bound of the gain, so the scan stops once no later one can win.
        """
        best: tuple[float, WorkItem] | None = None
        popped = []
        while self._waits:
            key, _, work, wait = self._waits[0]
            if self._pushed_waits.get(work.id) != wait:
                heapq.heappop(self._waits)  # stale: a newer entry exists, or it is no candidate now
                continue
            if wait <= (best[0] if best is not None else 0.0):
                break
            popped.append(heapq.heappop(self._waits))
            if work.worker == thief.address:
                continue
            if work.model not in thief.held and not can_host(self.specs.get(work.model, {}), thief):
                continue
            on_thief = 0.0 if work.model in thief.loaded else self.steal_factor * self._load_seconds(thief, work.model)
            gain = wait - on_thief
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, work)
        for entry in popped:  # the chosen one too: it stops being a candidate when it is unleased
            heapq.heappush(self._waits, entry)
        return best[1] if best is not None else None

    def _wait_on_holder(self, work: WorkItem) -> float:
        """Seconds `work` waits on its holder before it starts: the items started there, and a load."""
        holder = work.worker or ""
        wait = self._ahead.get(holder, 0.0)
        view = self.views.get(holder)
        if view is not None and work.model not in view.loaded:
            wait += self._load_seconds(view, work.model)
        return wait

    def _push_wait(self, work: WorkItem) -> None:
        wait = self._wait_on_holder(work)
        if self._pushed_waits.get(work.id) == wait:
            return
        self._pushed_waits[work.id] = wait
        heapq.heappush(self._waits, (-wait, next(self._order), work, wait))
        if len(self._waits) > 4 * len(self._pushed_waits) + 1024:
            self._waits = [(-w, next(self._order), item, w) for item, w in self._candidates()]
            heapq.heapify(self._waits)

    def _candidates(self) -> list[tuple[WorkItem, float]]:
        return [(item, self._pushed_waits[item.id]) for items in self._unstarted.values() for item in items.values()]

    def _forget_candidate(self, holder: str, work: WorkItem) -> bool:
        """Drop `work` from the take-back candidates: True if it was one."""
        if self._unstarted.get(holder, {}).pop(work.id, None) is None:
            return False
        self._pushed_waits.pop(work.id, None)
        return True
