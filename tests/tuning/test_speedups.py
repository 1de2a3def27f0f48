"""Timing candidates against fp32: a speed near the bar a choice turns on is timed over more rounds.

The work is timed on a clock the test drives: each call of a runtime advances it by that runtime's seconds, so the
speeds are exact and the rounds counted do not depend on how busy the machine is.
"""

from __future__ import annotations

import pytest

from shoal.pipeline.tuning import runtimes
from shoal.pipeline.tuning.runtimes import PAIRS, speedups


class Clock:
    """The seconds of work done so far, read by the meter in place of the wall clock."""

    now = 0.0


class ClockMeter:
    """MachineMeter's interface on the test's clock: the seconds the work inside it advanced the clock."""

    seconds = 0.0
    other_share = None

    def __enter__(self) -> ClockMeter:
        self._began = Clock.now
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = Clock.now - self._began


@pytest.fixture(autouse=True)
def driven_clock(monkeypatch):
    monkeypatch.setattr(runtimes, "MachineMeter", ClockMeter)


def worker(seconds_by_runtime: dict[str, float], calls: list[str]):
    def work(runtime: str, texts: list[str]) -> None:
        calls.append(runtime)
        Clock.now += seconds_by_runtime[runtime]

    return work


def test_a_speed_near_the_bar_is_timed_again_over_twice_as_many_rounds():
    calls: list[str] = []
    (speed,) = speedups(["same"], "fp32", ["t"] * 4, work=worker({"fp32": 0.01, "same": 0.01}, calls), bars=[1.05])
    assert speed == pytest.approx(1.0)
    assert calls.count("same") == 1 + 3 * PAIRS  # the warm-up, then PAIRS rounds and 2 * PAIRS more


def test_a_speed_far_from_the_bar_or_without_one_is_timed_once():
    far: list[str] = []
    (speed,) = speedups(["fast"], "fp32", ["t"] * 4, work=worker({"fp32": 0.03, "fast": 0.001}, far), bars=[1.05])
    unbarred: list[str] = []
    speedups(["same"], "fp32", ["t"] * 4, work=worker({"fp32": 0.01, "same": 0.01}, unbarred))
    assert speed == pytest.approx(30.0)
    assert far.count("fast") == unbarred.count("same") == 1 + PAIRS
