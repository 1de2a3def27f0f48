"""The time the queue keeps: leases, their expiry, long polls, the online rescue, a worker's renewals.

Each reads the time and arms its timers through one `Clock`, never the
wall clock directly, so a test drives them with a clock of its own
(tests/support/clock.py: `ManualClock`) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol


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
