"""Coordinate search over a small discrete grid: far fewer trials than the grid.

As in Triton Model Analyzer's quick mode: start from a known configuration,
move one knob at a time to a neighbouring value while that helps, and cycle
through the knobs until a whole pass changes nothing. Trials are expensive
(seconds to a minute) and noisy, so a move must beat the incumbent by
`min_gain`, no configuration is measured twice, and a configuration that
breaks a constraint (a latency target) never beats one that keeps it; among
those that all break it, the one closest to keeping it wins.

Pure: the objective is any callable, so the search is tested with fakes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

Config = dict[str, Any]
"""Knob name -> value. Values are hashable (a configuration measured once is looked up by its items);
their types are the objective's business: `int` for a token budget, a (workers, threads) pair for a layout."""

Figures = dict[str, float | None]
"""What a trial measured, by name (rows/s, p99 ms, ...; None: not measured), for the objective's own report."""


@dataclass(frozen=True)
class Dimension:
    """One knob and its values, in order: neighbours are adjacent values."""

    name: str
    values: tuple[Hashable, ...]

    def with_value(self, value: Hashable) -> Dimension:
        """This dimension, holding `value` too (a start taken from an existing profile)."""
        if value in self.values:
            return self
        try:
            return Dimension(self.name, tuple(sorted((*self.values, value))))  # type: ignore[type-var]
        except TypeError:
            return Dimension(self.name, (*self.values, value))


@dataclass
class Outcome:
    """What one trial measured. `violation` > 0: by how much a constraint was broken."""

    score: float
    violation: float = 0.0
    figures: Figures = field(default_factory=dict)  # the search never reads them
    note: str = ""

    @property
    def feasible(self) -> bool:
        return self.violation <= 0


@dataclass
class Trial:
    index: int
    config: Config
    outcome: Outcome
    seconds: float


@dataclass
class SearchResult:
    best: Trial
    trials: list[Trial]
    grid_size: int
    stopped: str  # "converged", "out of time" or "trial limit"


def beats(new: Outcome, old: Outcome, min_gain: float) -> bool:
    """Feasible before infeasible; then closer to feasible; then throughput by a margin."""
    if new.feasible != old.feasible:
        return new.feasible
    if not new.feasible:
        return new.violation < old.violation * (1 - min_gain)
    return new.score > old.score * (1 + min_gain)


class CoordinateSearch:
    def __init__(
        self,
        dimensions: Sequence[Dimension],
        start: Config,
        objective: Callable[[Config], Outcome],
        min_gain: float = 0.03,
        deadline: float | None = None,
        max_trials: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_trial: Callable[[Trial], None] | None = None,
    ) -> None:
        """`deadline` is a `clock()` time: no trial starts that would likely end after it."""
        self.dimensions = [d.with_value(start[d.name]) for d in dimensions]
        self.start = dict(start)
        self.objective = objective
        self.min_gain = min_gain
        self.deadline = deadline
        self.max_trials = max_trials
        self.clock = clock
        self.on_trial = on_trial
        self.trials: list[Trial] = []
        self._seen: dict[tuple, Trial] = {}

    def run(self) -> SearchResult:
        try:
            best = self._measure(self.start)
        except _Stop as stop:
            raise ValueError(f"no trial allowed ({stop})") from None
        moved = True
        while moved:
            moved = False
            for dimension in self.dimensions:
                try:
                    best, changed = self._climb(best, dimension)
                except _Stop as stop:
                    return self._result(stop.best or best, str(stop))
                moved = moved or changed
        return self._result(best, "converged")

    def _climb(self, best: Trial, dimension: Dimension) -> tuple[Trial, bool]:
        """Walk along one dimension, up first, then down, while each step wins."""
        for step in (1, -1):
            changed = False
            while True:
                config = self._neighbour(best.config, dimension, step)
                if config is None:
                    break
                trial = self._measure(config, best)
                if not beats(trial.outcome, best.outcome, self.min_gain):
                    break
                best, changed = trial, True
            if changed:
                return best, True
        return best, False

    def _neighbour(self, config: Config, dimension: Dimension, step: int) -> Config | None:
        index = dimension.values.index(config[dimension.name]) + step
        if not 0 <= index < len(dimension.values):
            return None
        return {**config, dimension.name: dimension.values[index]}

    def _measure(self, config: Config, best: Trial | None = None) -> Trial:
        key = tuple(sorted(config.items()))
        if key in self._seen:
            return self._seen[key]
        if self.max_trials is not None and len(self.trials) >= self.max_trials:
            raise _Stop("trial limit", best)
        if self.deadline is not None and self.trials:
            typical = sum(t.seconds for t in self.trials) / len(self.trials)
            if self.clock() + typical > self.deadline:
                raise _Stop("out of time", best)
        began = self.clock()
        outcome = self.objective(dict(config))
        trial = Trial(len(self.trials) + 1, dict(config), outcome, self.clock() - began)
        self.trials.append(trial)
        self._seen[key] = trial
        if self.on_trial is not None:
            self.on_trial(trial)
        return trial

    def _result(self, best: Trial, stopped: str) -> SearchResult:
        grid = math.prod(len(d.values) for d in self.dimensions)
        return SearchResult(best, list(self.trials), grid, stopped)


class _Stop(Exception):
    """Out of time or trials: the search ends with the best trial so far."""

    def __init__(self, reason: str, best: Trial | None) -> None:  # None: stopped before the first trial
        super().__init__(reason)
        self.best = best
