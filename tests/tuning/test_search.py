"""The tuner's coordinate search, with fake objectives: no model, no cluster."""

from __future__ import annotations

import itertools

import pytest

from shoal.pipeline.tuning.search import CoordinateSearch, Dimension, Outcome, beats

BUDGETS = Dimension("budget", (1024, 2048, 4096, 8192, 16384, 32768))
BATCH = Dimension("batch", (16, 32, 64, 128, 256))
PREFETCH = Dimension("prefetch", (1, 2, 3, 4))


def bowl(config) -> Outcome:
    """A smooth hill: best at budget 8192, batch 64, prefetch 3."""
    distance = (
        abs(BUDGETS.values.index(config["budget"]) - 3)
        + abs(BATCH.values.index(config["batch"]) - 2)
        + abs(PREFETCH.values.index(config["prefetch"]) - 2)
    )
    return Outcome(score=100.0 - 10 * distance)


def test_finds_the_top_of_a_hill_with_far_fewer_trials_than_the_grid():
    calls = []
    search = CoordinateSearch(
        [BUDGETS, BATCH, PREFETCH],
        {"budget": 1024, "batch": 256, "prefetch": 1},
        lambda c: calls.append(c) or bowl(c),
    )
    result = search.run()
    assert result.best.config == {"budget": 8192, "batch": 64, "prefetch": 3}
    assert result.stopped == "converged"
    assert result.grid_size == 6 * 5 * 4
    assert len(result.trials) < result.grid_size / 4
    assert len({tuple(sorted(c.items())) for c in calls}) == len(calls)  # nothing measured twice


def test_a_gain_under_min_gain_is_noise_and_does_not_move():
    flat = lambda c: Outcome(score=100.0 + (1.0 if c["prefetch"] == 3 else 0.0))  # noqa: E731
    result = CoordinateSearch([PREFETCH], {"prefetch": 2}, flat, min_gain=0.03).run()
    assert result.best.config == {"prefetch": 2}


def test_infeasible_never_beats_feasible_and_the_closest_infeasible_leads_out():
    def latency_bound(config):
        # bigger items: more throughput, but p99 over target above 256 rows
        rows = config["rows"]
        return Outcome(score=float(rows), violation=max(0.0, rows / 256 - 1))

    rows = Dimension("rows", (128, 256, 512, 1024, 2048))
    result = CoordinateSearch([rows], {"rows": 2048}, latency_bound).run()
    assert result.best.config == {"rows": 256}
    assert result.best.outcome.feasible


def test_beats_orders_feasibility_then_violation_then_score():
    assert beats(Outcome(1.0), Outcome(100.0, violation=0.5), 0.03)
    assert not beats(Outcome(100.0, violation=0.5), Outcome(1.0), 0.03)
    assert beats(Outcome(1.0, violation=0.2), Outcome(100.0, violation=0.5), 0.03)
    assert beats(Outcome(110.0), Outcome(100.0), 0.03)
    assert not beats(Outcome(102.0), Outcome(100.0), 0.03)


def test_deadline_stops_with_the_best_so_far():
    clock = itertools.count()  # every clock() call advances one "second"
    search = CoordinateSearch(
        [BUDGETS, BATCH, PREFETCH],
        {"budget": 1024, "batch": 256, "prefetch": 1},
        bowl,
        deadline=12,
        clock=lambda: next(clock),
    )
    result = search.run()
    assert result.stopped == "out of time"
    assert 1 <= len(result.trials) < 8
    assert result.best.outcome.score == max(t.outcome.score for t in result.trials)


def test_trial_limit_and_a_start_value_off_the_grid():
    result = CoordinateSearch([BUDGETS], {"budget": 6000}, lambda c: Outcome(float(c["budget"])), max_trials=3).run()
    assert result.stopped == "trial limit"
    assert [t.config["budget"] for t in result.trials] == [6000, 8192, 16384]
    with pytest.raises(ValueError):
        CoordinateSearch([BUDGETS], {"budget": 1024}, bowl, max_trials=0).run()
