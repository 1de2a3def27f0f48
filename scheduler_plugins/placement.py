"""Which model a pulling worker should serve next.

Workers pull, so a model's work goes to whichever worker has room, not to
where a router guessed. A pull is answered, in order, with:

1. online items of models resident on the worker, or of models no worker
   holds (online requests never pay a load a holder could spare them);
2. batch items of models resident on the worker, oldest head first;
3. stealing: a model the worker does not hold, when its backlog is worth the
   load: expected drain time (waiting rows over the measured rate of the
   workers already holding it) longer than its load time on this worker
   times `steal_factor`. A model that no worker holds is always worth it.

An idle worker may also take back an item another worker leased but has not
started, when it would start it sooner: the holder first finishes the items
it started (and loads the model, if it lacks it); the idle worker only has to
load the model, if it lacks it. Without that comparison idle workers pass a
lone model's last items around, each paying a load, while its holder waits.

Only models the worker may host are considered: the catalog's `requires`
against the worker's Dask resources, and the model's size against its budget.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .model_queues import ModelQueues
from .work_items import BATCH, ONLINE, WorkItem

DEFAULT_ROWS_PER_SECOND = 100.0
DEFAULT_LOAD_SECONDS = 5.0


@dataclass
class WorkerView:
    """What placement knows of one worker: reported on each pull."""

    address: str
    resident: set[str] = field(default_factory=set)  # held: loaded, loading, or named by work in hand
    ready: set[str] = field(default_factory=set)  # loaded now
    resources: dict[str, float] = field(default_factory=dict)
    budget: int | None = None
    free_bytes: int | None = None
    load_seconds: dict[str, float] = field(default_factory=dict)

    def report(self, resident: list[str] | None, ready: list[str] | None) -> None:
        """A pull's report; a worker that does not say what is loaded counts all it holds."""
        self.resident = set(resident or [])
        self.ready = set(ready) if ready is not None else set(self.resident)


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


def can_host(spec: dict[str, Any], worker: WorkerView) -> bool:
    for resource, amount in (spec.get("requires") or {}).items():
        if worker.resources.get(resource, 0) < amount:
            return False
    return worker.budget is None or spec.get("memory_bytes", 0) <= worker.budget


class Placement:
    def __init__(self, steal_factor: float = 1.0) -> None:
        self.steal_factor = steal_factor
        self.stats = ModelStats()

    def choose(
        self,
        queues: ModelQueues,
        worker: WorkerView,
        specs: dict[str, dict[str, Any]],
        holders: dict[str, int],
    ) -> tuple[str, int] | None:
        """(model, priority) for this pull, or None when nothing fits the worker."""
        hostable = [
            m for m in queues.models() if m in worker.resident or can_host(specs.get(m, {}), worker)
        ]
        for priority in (ONLINE, BATCH):
            heads = [(m, h) for m in hostable if (h := queues.head(m, priority)) is not None]
            if not heads:
                continue
            resident = [(h.enqueued_at, m) for m, h in heads if m in worker.resident]
            if resident:
                return min(resident)[1], priority
            if priority == ONLINE:
                # Online requests of a model another worker holds wait for it (at
                # most its running batch): a load here would cost them far more.
                unheld = [(h.enqueued_at, m) for m, h in heads if holders.get(m, 0) == 0]
                if unheld:
                    return min(unheld)[1], ONLINE
                continue
            steal = self._steal(queues, worker, specs, holders, [m for m, _ in heads])
            if steal is not None:
                return steal, BATCH
        return None

    def _steal(
        self,
        queues: ModelQueues,
        worker: WorkerView,
        specs: dict[str, dict[str, Any]],
        holders: dict[str, int],
        models: list[str],
    ) -> str | None:
        """Unheld models first (largest backlog), then the largest positive gain."""
        candidates: list[tuple[int, float, str]] = []
        for model in models:
            waiting = queues.waiting_rows(model)
            held_by = holders.get(model, 0)
            if held_by == 0:
                candidates.append((1, waiting, model))
                continue
            load = self._load_seconds(worker, specs, model)
            drain = waiting / (self.stats.rows_per_second(model) * held_by)
            gain = drain - self.steal_factor * load
            if gain > 0:
                candidates.append((0, gain, model))
        return max(candidates)[2] if candidates else None

    def take_back_gain(
        self,
        work: WorkItem,
        thief: WorkerView,
        holder: WorkerView | None,
        ahead: list[WorkItem],
        specs: dict[str, dict[str, Any]],
    ) -> float:
        """Seconds sooner `work` would start on the idle `thief` than on its holder.

        `ahead` are the items the holder has started: `work` waits for their
        expected compute there. Worth taking back when positive.
        """
        on_holder = sum(w.rows / self.stats.rows_per_second(w.model) for w in ahead)
        if holder is not None and work.model not in holder.ready:
            on_holder += self._load_seconds(holder, specs, work.model)
        on_thief = 0.0
        if work.model not in thief.ready:
            on_thief = self.steal_factor * self._load_seconds(thief, specs, work.model)
        return on_holder - on_thief

    @staticmethod
    def _load_seconds(worker: WorkerView, specs: dict[str, dict[str, Any]], model: str) -> float:
        """Measured on this worker, else the catalog's figure, else a default."""
        return worker.load_seconds.get(model) or specs.get(model, {}).get("load_seconds") or DEFAULT_LOAD_SECONDS
