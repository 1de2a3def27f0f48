"""Timing candidates against fp32: a speed near the bar a choice turns on is timed over more rounds."""

from __future__ import annotations

import time

from shoal.pipeline.tuning.runtimes import PAIRS, speedups


def sleeper(seconds_by_runtime: dict[str, float], calls: list[str]):
    def work(runtime: str, texts: list[str]) -> None:
        calls.append(runtime)
        time.sleep(seconds_by_runtime[runtime])

    return work


def test_a_speed_near_the_bar_is_timed_again_over_twice_as_many_rounds():
    calls: list[str] = []
    (speed,) = speedups(["same"], "fp32", ["t"] * 4, work=sleeper({"fp32": 0.01, "same": 0.01}, calls), bars=[1.05])
    assert 0.5 < speed < 2.0
    assert calls.count("same") == 1 + 3 * PAIRS  # the warm-up, then PAIRS rounds and 2 * PAIRS more


def test_a_speed_far_from_the_bar_or_without_one_is_timed_once():
    far: list[str] = []
    speedups(["fast"], "fp32", ["t"] * 4, work=sleeper({"fp32": 0.03, "fast": 0.001}, far), bars=[1.05])
    unbarred: list[str] = []
    speedups(["same"], "fp32", ["t"] * 4, work=sleeper({"fp32": 0.01, "same": 0.01}, unbarred))
    assert far.count("fast") == unbarred.count("same") == 1 + PAIRS
