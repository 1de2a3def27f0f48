"""What a pull leases: the one lease decision, for batch and online pulls alike.

Workers pull, so a model's work goes to whichever worker has room, not to
where a router guessed. `Placement.decide` answers a pull with a
`LeaseDecision` (model, lane, items, rows, and the grace each lease gets
for a load: leases.load_grace), which the queue carries out the same way
for both routes (QueueState.carry_out). In order: online requests (never
paying a load a holder could spare them), batch items of held models (at
most a fair share among holders), a steal when a backlog outweighs the
load, a take-back when an item would start sooner here. The rules in full:
docs/ARCHITECTURE.md, "Placement".

Every choice is made from indexes kept as events happen, never from a scan
of all workers or all leased items: the cost of one pull must not grow with
the cluster, nor with the models in it. Both searches rank models by the
gain a worker would get at the catalog's load time (drain time, or the
longest wait on a holder, less that load), which holds for every worker
except on the few models it has loaded or measured loading faster: those
are read directly, and the heap is scanned from the top only until no later
model can win. So an idle pull with nothing worth taking stops at once.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ..configs import ModelSpec
from .leases import load_grace
from .model_queues import ModelQueues
from .protocol import Lane
from .waiting_pulls import WaitingPulls
from .work_items import WorkItem
from .worker_views import WorkerView, WorkerViews, can_host

DEFAULT_ROWS_PER_SECOND = 100.0
DEFAULT_LOAD_SECONDS = 5.0
DEFAULT_ADAPTER_LOAD_SECONDS = 0.05  # a LoRA adapter added to its loaded base: read and placed (workers/runtimes/lora)


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


@dataclass(slots=True)
class LeaseDecision:
    """What a pull leases: up to `count` items of `model` waiting in `lane`, and no more than `rows` rows (but
    one item at least), each lease with `grace` seconds on top for a load; or `take_back`, one item leased
    to another worker that would start it later."""

    model: str
    lane: Lane
    count: int
    rows: int | None
    grace: float
    take_back: WorkItem | None = None


def online_rank(view: WorkerView, model: str, busy: bool) -> int:
    """How soon a waiting online pull would answer a request of `model`: 0 (best) to 3.

    Loaded and idle, loaded and busy (one forward batch to wait), loading and
    idle, loading and busy.
    """
    return (0 if model in view.loaded else 2) + (1 if busy else 0)


class TakeBacks:
    """Take-back candidates: batch items leased but not started, and how long they would wait on their holder.

    All of a holder's candidates of one model wait as long (the items started
    there, and the model's load if it lacks it), so they form one group with
    one wait: a start redoes a few groups, not every item behind it. Each
    model's groups sit in a heap by wait, and the models in one heap keyed by
    their longest wait less `base_load(model)` (steal factor times the
    catalog's load): the most any idle worker gains from the model unless it
    has it loaded or measured loading it faster. A search reads those few
    models' tops directly, then pops models until no key beats the best gain
    found, so it ends at once when nothing would gain. Entries are not
    removed: a group's newest entry is its live one, and a model's key may
    overestimate its longest wait until it surfaces and is redone. The heaps
    are rebuilt when stale entries outnumber live ones.
    """

    def __init__(self, base_load: Callable[[str], float]) -> None:
        self.base_load = base_load
        self.by_holder: dict[str, dict[str, dict[str, WorkItem]]] = {}  # holder -> model -> item id -> item
        self.touched = 0  # heap entries searches examined: their cost, counted for tests and benchmarks
        self._order = itertools.count()
        self._waits: dict[tuple[str, str], tuple[float, int]] = {}  # (holder, model) -> (wait, order of its entry)
        self._groups: dict[str, list[tuple[float, int, str]]] = {}  # model -> heap of (-wait, order, holder)
        self._entries = 0  # group entries in all heaps, live and stale
        self._tops: dict[str, tuple[float, int]] = {}  # model -> (longest wait or more, order of its live entry)
        self._models: list[tuple[float, int, str]] = []  # heap of (-(longest wait - base load), order, model)

    def add(self, item: WorkItem, wait: float) -> None:
        """`item` is a candidate, in a group that would wait `wait` seconds on its holder."""
        holder = item.worker or ""
        self.by_holder.setdefault(holder, {}).setdefault(item.model, {})[item.id] = item
        self.set_wait(holder, item.model, wait)

    def set_wait(self, holder: str, model: str, wait: float) -> None:
        live = self._waits.get((holder, model))
        if live is not None and live[0] == wait:
            return
        order = next(self._order)
        self._waits[holder, model] = (wait, order)
        heapq.heappush(self._groups.setdefault(model, []), (-wait, order, holder))
        self._entries += 1
        top = self._tops.get(model)
        if top is None or wait > top[0]:
            self._push_model(model, wait)
        if self._entries > 4 * len(self._waits) + 1024:
            self._rebuild()
        elif len(self._models) > 4 * len(self._tops) + 1024:
            self._models = [(-(w - self.base_load(m)), o, m) for m, (w, o) in self._tops.items()]
            heapq.heapify(self._models)

    def remove(self, holder: str, item: WorkItem) -> bool:
        """`item` is no candidate now: True if it was one."""
        models = self.by_holder.get(holder, {})
        group = models.get(item.model, {})
        if group.pop(item.id, None) is None:
            return False
        if not group:
            del models[item.model], self._waits[holder, item.model]
            if not models:
                del self.by_holder[holder]
        return True

    def remove_holder(self, holder: str) -> None:
        for model in self.by_holder.pop(holder, {}):
            del self._waits[holder, model]

    def holders_of(self, model: str) -> list[str]:
        """The holders with candidates of `model`."""
        heap = self._groups.get(model, [])
        return [holder for _, order, holder in heap if self._waits.get((holder, model), (0.0, -1))[1] == order]

    def base_load_changed(self, model: str) -> None:
        if model in self._tops:
            self._push_model(model, self._tops[model][0])

    def best(self, thief: WorkerView, cost: Callable[[str], float], hostable: Callable[[str], bool]) -> WorkItem | None:
        """The candidate of another holder with the largest positive gain: its wait less `cost(model)` on `thief`."""
        gain, chosen = 0.0, None
        # Models the thief loads for less than their key assumes: their gains may exceed their keys.
        direct = {
            model
            for model in itertools.chain(thief.loaded, thief.load_seconds)
            if model in self._groups and cost(model) < self.base_load(model) and hostable(model)
        }
        for model in direct:
            top = self._top(model, skip=thief.address)
            if top is not None and top[0] - cost(model) > gain:
                gain, chosen = top[0] - cost(model), (top[1], model)
        popped = []
        while self._models:
            self.touched += 1
            negative_key, order, model = self._models[0]
            recorded = self._tops.get(model)
            if recorded is None or recorded[1] != order:
                heapq.heappop(self._models)  # stale: redone, or no candidates left
                continue
            if -negative_key <= gain:
                break
            entry = heapq.heappop(self._models)
            top = self._top(model)
            if top is None:
                continue
            if top[0] < recorded[0]:
                self._push_model(model, top[0])  # its key overestimated: redone, to surface where it belongs
                continue
            popped.append(entry)
            if model in direct or not hostable(model):
                continue
            if top[1] == thief.address:
                top = self._top(model, skip=thief.address)
            if top is not None and top[0] - cost(model) > gain:
                gain, chosen = top[0] - cost(model), (top[1], model)
        for entry in popped:
            heapq.heappush(self._models, entry)
        if chosen is None:
            return None
        holder, model = chosen
        return next(iter(self.by_holder[holder][model].values()))  # the group's first leased

    def _top(self, model: str, skip: str | None = None) -> tuple[float, str] | None:
        """(wait, holder): the group of `model` that waits longest, of a holder other than `skip`."""
        heap = self._groups[model]
        skipped = []
        found = None
        while heap:
            self.touched += 1
            _, order, holder = heap[0]
            live = self._waits.get((holder, model))
            if live is None or live[1] != order:
                heapq.heappop(heap)
                self._entries -= 1
            elif holder == skip:
                skipped.append(heapq.heappop(heap))
            else:
                found = (live[0], holder)
                break
        for entry in skipped:
            heapq.heappush(heap, entry)
        if not heap:
            del self._groups[model], self._tops[model]
        return found

    def _push_model(self, model: str, longest: float) -> None:
        order = next(self._order)
        self._tops[model] = (longest, order)
        heapq.heappush(self._models, (-(longest - self.base_load(model)), order, model))

    def _rebuild(self) -> None:
        self._groups, self._tops, self._models = {}, {}, []
        for (holder, model), (wait, order) in self._waits.items():
            self._groups.setdefault(model, []).append((-wait, order, holder))
        for model, heap in self._groups.items():
            heapq.heapify(heap)
            self._push_model(model, -heap[0][0])
        self._entries = len(self._waits)


class Placement:
    def __init__(
        self, queues: ModelQueues, views: WorkerViews, specs: Mapping[str, ModelSpec], steal_factor: float = 1.0
    ) -> None:
        self.queues = queues
        self.views = views
        self.specs = specs
        self.steal_factor = steal_factor
        self.stats = ModelStats()
        self._order = itertools.count()
        self._base_loads: dict[str, float] = {}  # model -> steal factor x the catalog's load: the keys' load
        # Steal index: models with batch work waiting, by (unheld, backlog) or (held, drain less base load).
        self._drains: list[tuple[int, float, int, str, tuple[int, float, float]]] = []
        self._drain_keys: dict[str, tuple[int, float, float]] = {}  # model -> (tier, rank, backlog or drain)
        self._dirty: set[str] = set()
        self._steal_touched = 0
        self.take_backs = TakeBacks(self._base_load)
        self._ahead: dict[str, float] = defaultdict(float)  # worker -> expected compute of the items it started

    @property
    def touched(self) -> int:
        """Heap entries the steal and take-back searches examined so far: what an idle pull costs."""
        return self._steal_touched + self.take_backs.touched

    # -- the decision ------------------------------------------------------------------

    def decide(
        self,
        view: WorkerView,
        route: Lane,
        *,
        room: int = 1,
        idle: bool = False,
        busy: bool = False,
        claim: str | None = None,
        waiting: WaitingPulls | None = None,
        claimed: Collection[str] = (),
    ) -> LeaseDecision | None:
        """What a pull of `view`'s worker leases now, or None: a batch pull (`room` for items, none in hand
        when `idle`), or an online pull (`busy`: batch work computes there), which takes `claim`'s requests
        (the model whose requests woke it) while any wait, else those online_model_for picks.

        A batch pull takes batch work only. A worker sends its online pull whenever no round of its computes,
        and requests that come during a round wait here for the next (or for an idle worker): a batch pull
        that took them too would start a second round beside it, and a small request would wait for both.
        """
        if route is Lane.ONLINE:
            if claim and self.queues.waiting_items(claim, Lane.ONLINE):
                return self._decision(view, claim, Lane.ONLINE)
            model = self.online_model_for(view, busy, waiting, claimed)
            return self._decision(view, model, Lane.ONLINE) if model is not None else None
        heads = [(head.enqueued_at, m) for m in view.held if (head := self.queues.head(m, Lane.BATCH)) is not None]
        model = min(heads)[1] if heads else self._steal(view)
        if model is not None:
            return self._decision(view, model, Lane.BATCH, room)
        item = self.take_back(view) if idle else None
        return LeaseDecision(item.model, Lane.BATCH, 1, None, load_grace(view, item.model), item) if item else None

    def _decision(self, view: WorkerView, model: str, lane: Lane, room: int = 1) -> LeaseDecision:
        if lane is Lane.ONLINE:  # a round's worth: the parts of a large request go to as many pulls
            most = self.specs[model].online_batch
            count = rows = max(1, min(most, view.online_rows.get(model, most)))
            return LeaseDecision(model, lane, count, rows, load_grace(view, model))
        count = min(room, self.fair_share(model)) if model in view.held else 1  # a steal: one item
        return LeaseDecision(model, lane, max(1, count), None, load_grace(view, model))

    def fair_share(self, model: str) -> int:
        """Of `model`'s waiting batch items, one pull's share among its holders (at least one)."""
        holders = max(1, self.views.holders.get(model, 0))
        return max(1, math.ceil(self.queues.waiting_items(model, Lane.BATCH) / holders))

    def online_model_for(
        self, view: WorkerView, busy: bool = False, waiting: WaitingPulls | None = None, claimed: Collection[str] = ()
    ) -> str | None:
        """The model whose online requests this pull takes: one the worker holds (oldest head first), else one
        nobody holds that it may host (online requests of a model another worker holds wait for it: a load
        here would cost them far more). An online pull leaves a model to a `waiting` pull that ranks better
        for it (online_rank), and to one already woken for it (`claimed`)."""
        best: tuple[bool, float, str] | None = None
        for model in self.queues.models(Lane.ONLINE):
            if model in claimed:
                continue
            here = model in view.held
            held = bool(self.views.holders.get(model))
            if not here and (held or not can_host(self.specs[model], view)):
                continue
            other = waiting.best_rank(model, held) if waiting is not None else None
            if other is not None and other < online_rank(view, model, busy):
                continue
            head = self.queues.head(model, Lane.ONLINE)
            if head is not None and (best is None or (not here, head.enqueued_at, model) < best):
                best = (not here, head.enqueued_at, model)
        return best[2] if best is not None else None

    def model_changed(self, model: str) -> None:
        """Its waiting batch work, holders or rate changed: its steal entry is redone before the next steal."""
        self._dirty.add(model)

    def specs_changed(self) -> None:
        """Catalog load times may have changed: the waits and keys built on them are redone."""
        for model, old in list(self._base_loads.items()):
            del self._base_loads[model]
            if self._base_load(model) != old:
                self._dirty.add(model)
                for holder in self.take_backs.holders_of(model):
                    self.take_backs.set_wait(holder, model, self._wait_on(holder, model))
                self.take_backs.base_load_changed(model)

    def _steal(self, view: WorkerView) -> str | None:
        """Unheld models first (largest backlog), then the largest positive gain.

        Held models come off the heap by drain time less their catalog load,
        their gain on any worker that did not measure loading them faster:
        those few are read first, and the scan stops once no later entry can
        beat the best found.
        """
        self._refresh_drains()
        best: tuple[float, str] | None = None
        for model, seconds in view.load_seconds.items():
            key = self._drain_keys.get(model)
            if key is None or key[0] != 0 or not seconds or self.steal_factor * seconds >= self._base_load(model):
                continue
            self._steal_touched += 1
            gain = key[2] - self.steal_factor * seconds
            if gain > 0 and (best is None or gain > best[0]) and self._may_steal(view, model):
                best = (gain, model)
        popped = []
        seen: set[str] = set()
        while self._drains:
            self._steal_touched += 1
            entry = self._drains[0]
            model, key = entry[3], entry[4]
            if self._drain_keys.get(model) != key or model in seen:
                heapq.heappop(self._drains)
                continue
            tier, rank, amount = key
            if tier == 0 and rank <= (best[0] if best is not None else 0.0):
                break
            popped.append(heapq.heappop(self._drains))
            seen.add(model)
            if not self._may_steal(view, model):
                continue
            if tier == 1:
                best = (float("inf"), model)
                break
            gain = amount - self.steal_factor * self.load_seconds(view, model)
            if gain > 0 and (best is None or gain > best[0]):
                best = (gain, model)
        for entry in popped:
            heapq.heappush(self._drains, entry)
        return best[1] if best is not None else None

    def _may_steal(self, view: WorkerView, model: str) -> bool:
        return model not in view.held and can_host(self.specs[model], view)

    def _refresh_drains(self) -> None:
        for model in self._dirty:
            items = self.queues.waiting_items(model, Lane.BATCH)
            if not items:
                self._drain_keys.pop(model, None)
                continue
            rows = self.queues.waiting_rows(model, Lane.BATCH)
            holders = self.views.holders.get(model, 0)
            if holders == 0:
                key = (1, float(rows), float(rows))
            else:
                drain = rows / (self.stats.rows_per_second(model) * holders)
                key = (0, drain - self._base_load(model), drain)
            if self._drain_keys.get(model) != key:
                self._drain_keys[model] = key
                heapq.heappush(self._drains, (-key[0], -key[1], next(self._order), model, key))
        self._dirty.clear()
        if len(self._drains) > 4 * len(self._drain_keys) + 1024:
            self._drains = [(-k[0], -k[1], next(self._order), m, k) for m, k in self._drain_keys.items()]
            heapq.heapify(self._drains)

    def _base_load(self, model: str) -> float:
        """Steal factor times the catalog's load time: every worker's, unless it measured its own."""
        base = self._base_loads.get(model)
        if base is None:
            base = self._base_loads[model] = self.steal_factor * self._catalog_load(model)
        return base

    def load_seconds(self, view: WorkerView, model: str) -> float:
        """Measured on this worker, else the catalog's figure, else a default. A LoRA adapter costs its own load
        (milliseconds) where its base is loaded, and its base's load too elsewhere."""
        measured = view.load_seconds.get(model)
        if measured:
            return measured
        spec = self.specs[model]
        if spec.adapter is None or spec.adapter.merged or spec.adapter.base not in self.specs:
            return self._catalog_load(model)
        base = spec.adapter.base
        return self._catalog_load(model) + (0.0 if base in view.loaded else self.load_seconds(view, base))

    def _catalog_load(self, model: str) -> float:
        spec = self.specs[model]
        if spec.adapter is not None and not spec.adapter.merged:  # on a worker holding its base: all it costs
            return DEFAULT_ADAPTER_LOAD_SECONDS  # (its spec's load_seconds are its base's)
        return spec.load_seconds or DEFAULT_LOAD_SECONDS

    # -- take-back -------------------------------------------------------------------

    def leased(self, item: WorkItem) -> None:
        """A batch item was leased: a take-back candidate until it starts."""
        if item.lane is Lane.BATCH and item.worker is not None:
            self.take_backs.add(item, self._wait_on(item.worker, item.model))

    def started(self, item: WorkItem) -> None:
        """The holder began `item`: the items behind it there now wait longer."""
        holder = item.worker or ""
        if self.take_backs.remove(holder, item):
            item.expected_seconds = item.rows / self.stats.rows_per_second(item.model)
            self._ahead[holder] += item.expected_seconds
            self.holder_changed(holder)

    def unleased(self, item: WorkItem) -> None:
        """`item` left its holder (acked, failed, lost, taken back): called before its lease is cleared."""
        holder = item.worker or ""
        if not self.take_backs.remove(holder, item) and item.started and holder in self._ahead:
            self._ahead[holder] = max(0.0, self._ahead[holder] - item.expected_seconds)
            self.holder_changed(holder)

    def worker_removed(self, address: str) -> None:
        self.take_backs.remove_holder(address)
        self._ahead.pop(address, None)

    def holder_changed(self, address: str) -> None:
        """What its waiting items would wait for there changed (items started or done, models loaded)."""
        for model in self.take_backs.by_holder.get(address, {}):
            self.take_backs.set_wait(address, model, self._wait_on(address, model))

    def take_back(self, thief: WorkerView) -> WorkItem | None:
        """The leased, not started batch item an idle `thief` would start soonest, ahead of its holder.

        The gain is the wait on the holder less the load on the thief (none if
        it has the model loaded); only models the thief may host count.
        """
        return self.take_backs.best(
            thief,
            cost=lambda model: 0.0 if model in thief.loaded else self.steal_factor * self.load_seconds(thief, model),
            hostable=lambda model: model in thief.held or can_host(self.specs[model], thief),
        )

    def _wait_on(self, holder: str, model: str) -> float:
        """Seconds an item of `model` leased to `holder` waits there to start: the items started there, and a load."""
        wait = self._ahead.get(holder, 0.0)
        view = self.views.get(holder)
        if view is not None and model not in view.loaded:
            wait += self.load_seconds(view, model)
        return wait
