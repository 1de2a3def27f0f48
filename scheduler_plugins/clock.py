"""The time the queue keeps: leases, their expiry, long polls, the online rescue, a worker's renewals.

Each reads the time and arms its timers through one `Clock`, never the
wall clock directly, so a test drives them with a clock of its own
(tests/support/clock.py: `ManualClock`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    """What arming a timer returns (an asyncio.TimerHandle)."""

    def cancel(self) -> None: ...


class Clock:
    """Monotonic seconds, and timers on the running event loop."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer:
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback, *args)

    def call_at(self, when: float, callback: Callable[..., Any], *args: Any) -> Timer:
        """At `when` on this clock."""
        return self.call_later(when - self.now(), callback, *args)


class Deadlines(Generic[T]):
    """Things due at a time (leases, waiting pulls), in one heap, handed to `on_due(when, thing)` by one
    timer armed for the earliest, at most `late` seconds after the last check.

    A timer per thing (``call_later``, then its cancel) was the largest cost of a pull cycle with thousands of
    workers waiting; here a thing costs a heap push, and one done early stays until it is due (`on_due` tells).
    """

    def __init__(self, clock: Clock, on_due: Callable[[float, T], object], late: float = 0.0) -> None:
        self.clock = clock
        self._on_due = on_due
        self._late = late
        self._heap: list[tuple[float, int, T]] = []
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._armed_for = float("inf")

    def push(self, when: float, thing: T) -> None:
        heapq.heappush(self._heap, (when, next(self._order), thing))
        if when < self._armed_for:
            self._arm(when)

    def replace(self, entries: Iterable[tuple[float, T]]) -> None:
        """Only `entries` are due now (the rest were done early): the heap is rebuilt from them."""
        self._heap = [(when, next(self._order), thing) for when, thing in entries]
        heapq.heapify(self._heap)

    def check(self) -> None:
        """Hand every thing due by now to `on_due`, earliest first; O(1) when none is."""
        if self._timer is not None:
            self._timer.cancel()  # when called before its time (tests)
        self._timer, self._armed_for = None, float("inf")
        now = self.clock.now()
        while self._heap and self._heap[0][0] <= now:
            when, _, thing = heapq.heappop(self._heap)
            self._on_due(when, thing)
        if self._heap:
            self._arm(self._heap[0][0])

    def close(self) -> list[T]:
        """Stop the timer; the things that were waiting."""
        if self._timer is not None:
            self._timer.cancel()
        things, self._heap = [thing for _, _, thing in self._heap], []
        return things

    def __len__(self) -> int:
        return len(self._heap)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_for = max(when, self.clock.now() + self._late)
        self._timer = self.clock.call_at(self._armed_for, self.check)
