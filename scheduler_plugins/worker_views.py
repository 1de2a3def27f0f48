"""What the scheduler knows of its workers, kept as indexes as pulls report.

Every pull reports the models a worker holds (loaded, loading, or named by
work in hand) and those loaded now. Placement asks, per event, how many
workers hold a model, how many have it loaded, and whether any worker could
host it at all: counting those over every worker on each pull would make
the scheduler's cost grow with the cluster, so the counts are updated from
the difference each report makes, and when a worker leaves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..configs import ModelSpec


@dataclass
class WorkerView:
    """What placement knows of one worker: reported on each pull."""

    address: str
    held: set[str] = field(default_factory=set)  # loaded, loading, or named by work in hand
    loaded: set[str] = field(default_factory=set)  # weights in memory now
    resources: dict[str, float] = field(default_factory=dict)
    budget: int | None = None
    free_bytes: int | None = None
    load_seconds: dict[str, float] = field(default_factory=dict)
    # A lease of its lapsed and it has not spoken since (frozen, paused): pulls it left waiting take
    # nothing until a message of its own says it is back (they would hold more work it cannot start),
    # and it counts as no model's holder, so other workers take its models' requests meanwhile.
    silent: bool = False
    pinned: frozenset[str] = frozenset()  # models it keeps loaded, never evicted
    # Being retired (scale-down, retire_workers, SIGTERM): silent for good, so it takes no new work and
    # holds no model for placement, while what it started finishes (elastic.py).
    retiring: bool = False
    # Per model it has measured: the inputs it computes within its online round time (its online pulls say):
    # what an online pull of it leases, at most the model's online batch.
    online_rows: dict[str, int] = field(default_factory=dict)

    @property
    def capability(self) -> tuple[int | None, frozenset[tuple[str, float]]]:
        """What decides which models it may host: budget and Dask resources."""
        return self.budget, frozenset(self.resources.items())


def can_host(spec: ModelSpec, view: WorkerView) -> bool:
    """The worker's Dask resources cover what the model `requires`, and its model budget the model's memory."""
    for resource, amount in spec.requires.items():
        if view.resources.get(resource, 0) < amount:
            return False
    return view.budget is None or spec.memory_bytes <= view.budget


def may_take(view: WorkerView, model: str, spec: ModelSpec) -> bool:
    """Whether a waiting pull of `view`'s worker may be woken for `model`'s work: it answers, and it
    holds the model or could host it."""
    return not view.silent and (model in view.held or can_host(spec, view))


class WorkerViews:
    """Each worker's view, with holder counts per model and the distinct capabilities.

    `on_holders`: called with a model whose holder count changed (placement's
    steal index depends on it).
    """

    def __init__(self, on_holders: Callable[[str], None] = lambda model: None) -> None:
        self.views: dict[str, WorkerView] = {}
        self.holders: Counter[str] = Counter()  # workers holding each model, silent ones not counted
        self.loaded: Counter[str] = Counter()  # workers with each model loaded now
        self._capabilities: dict[tuple, list[Any]] = {}  # capability -> [workers with it, a view of it]
        # Of the workers not retiring: how many pin each distinct set of models, and each model.
        self.pinned_sets: Counter[frozenset[str]] = Counter()
        self.pinned_holders: Counter[str] = Counter()
        self._on_holders = on_holders

    def get(self, address: str) -> WorkerView | None:
        return self.views.get(address)

    def __contains__(self, address: str) -> bool:
        return address in self.views

    def __len__(self) -> int:
        return len(self.views)

    def values(self) -> Iterable[WorkerView]:
        return self.views.values()

    def report(
        self, address: str, held: list[str] | None, loaded: list[str] | None, **capability: Any
    ) -> tuple[WorkerView, bool]:
        """A pull's report, and whether its held or loaded models changed.

        A worker that does not say what is loaded counts all it holds.
        `capability`: budget, free_bytes, resources, load_seconds and pinned, where the pull sent them;
        `online_rows`, where an online pull sent them.
        """
        view = self.views.get(address)
        if view is None:
            view = self.views[address] = WorkerView(address)
            self._count_capability(view, +1)
        online_rows = capability.pop("online_rows", None)
        if online_rows is not None:
            view.online_rows = dict(online_rows)
        now_held = set(held or [])
        now_loaded = set(loaded) if loaded is not None else now_held
        changed = now_held != view.held or now_loaded != view.loaded
        if changed:
            if not view.silent:
                for model in now_held - view.held:
                    self._hold(model, +1)
                for model in view.held - now_held:
                    self._hold(model, -1)
            for model in now_loaded - view.loaded:
                _count(self.loaded, model, +1)
            for model in view.loaded - now_loaded:
                _count(self.loaded, model, -1)
            view.held, view.loaded = now_held, set(now_loaded)
        if capability:
            resources = capability.get("resources", view.resources)
            budget = capability.get("budget", view.budget)
            if budget != view.budget or resources != view.resources:
                self._count_capability(view, -1)
                view.budget, view.resources = budget, dict(resources)
                self._count_capability(view, +1)
            view.free_bytes = capability.get("free_bytes", view.free_bytes)
            pinned = frozenset(capability.get("pinned") or ())
            if pinned != view.pinned:
                self._count_pinned(view, -1)
                view.pinned = pinned
                self._count_pinned(view, +1)
            loads = capability.get("load_seconds") or {}
            if any(view.load_seconds.get(model) != seconds for model, seconds in loads.items()):
                view.load_seconds.update(loads)
                changed = True  # what a take-back would wait for there changed
        return view, changed

    def hold(self, view: WorkerView, model: str) -> None:
        """`view`'s worker was given `model`'s work: a holder from now, before its next pull says so."""
        if model not in view.held:
            view.held.add(model)
            if not view.silent:
                self._hold(model, +1)

    def silence(self, view: WorkerView) -> None:
        """A lease of its lapsed: until it speaks again it holds nothing, so its models' requests
        and backlog go to other workers instead of waiting for a holder that does not answer."""
        if not view.silent:
            view.silent = True
            for model in view.held:
                self._hold(model, -1)

    def speak(self, view: WorkerView) -> None:
        """A message of its own came: it is back, and holds its models again (unless it is retiring)."""
        if view.silent and not view.retiring:
            view.silent = False
            for model in view.held:
                self._hold(model, +1)

    def retire(self, view: WorkerView) -> None:
        """It is leaving: silent for good, and no longer one of its pinned models' holders."""
        if not view.retiring:
            self.silence(view)
            self._count_pinned(view, -1)
            view.retiring = True

    def unretire(self, view: WorkerView) -> None:
        """Its retirement was called off (Dask could not retire it): it takes work and holds its models again."""
        if view.retiring:
            view.retiring = False
            self._count_pinned(view, +1)
            self.speak(view)

    def remove(self, address: str) -> WorkerView | None:
        view = self.views.pop(address, None)
        if view is not None:
            self._count_pinned(view, -1)
            if not view.silent:
                for model in view.held:
                    self._hold(model, -1)
            for model in view.loaded:
                _count(self.loaded, model, -1)
            self._count_capability(view, -1)
        return view

    def anyone_can_host(self, spec: ModelSpec) -> bool:
        """Some worker's budget and resources admit the model: one check per distinct capability."""
        return any(can_host(spec, view) for _, view in self._capabilities.values())

    def largest_budget(self) -> int | None:
        budgets = [view.budget for _, view in self._capabilities.values() if view.budget is not None]
        return max(budgets) if budgets else None

    def _hold(self, model: str, delta: int) -> None:
        _count(self.holders, model, delta)
        self._on_holders(model)

    def _count_pinned(self, view: WorkerView, delta: int) -> None:
        if view.pinned and not view.retiring:
            _count(self.pinned_sets, view.pinned, delta)
            for model in view.pinned:
                _count(self.pinned_holders, model, delta)

    def _count_capability(self, view: WorkerView, delta: int) -> None:
        budget, resources = key = view.capability
        entry = self._capabilities.setdefault(key, [0, WorkerView("", resources=dict(resources), budget=budget)])
        entry[0] += delta
        if entry[0] <= 0:
            del self._capabilities[key]


def _count(counter: Counter[Any], key: Any, delta: int) -> None:
    """Add `delta`, dropping keys that reach zero so the counter lists only what is there."""
    counter[key] += delta
    if counter[key] <= 0:
        del counter[key]
