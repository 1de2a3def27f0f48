"""A clock the test drives: leases, their expiry, long polls and timers run on it without sleeping."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from shoal.scheduler_plugins.clock import Clock


class ManualTimer:
    def __init__(self, when: float, callback: Callable[..., Any], args: tuple) -> None:
        self.when, self.callback, self.args, self.cancelled = when, callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock(Clock):
    """Time stands still until `advance`, which runs the timers that come due, in order, each at its time."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, ManualTimer]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> ManualTimer:
        timer = ManualTimer(self._now + max(0.0, delay), callback, args)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move on by `seconds`, running each timer due meanwhile (and those it arms) when its time comes."""
        end = self._now + seconds
        while self._timers and self._timers[0][0] <= end:
            when, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self._now = max(self._now, when)
                timer.callback(*timer.args)
        self._now = end
