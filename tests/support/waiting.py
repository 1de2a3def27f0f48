"""Waiting for a condition instead of sleeping a fixed time (tests/conftest.py, "Waiting")."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float = 60, what: str = "", step: float = 0.02) -> T:
    """Poll `condition` until it is true; its value. Fails with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(step)
    return value


async def async_wait_for(condition: Callable[[], T], timeout: float = 10, what: str = "", step: float = 0.005) -> T:
    """`wait_for` inside a coroutine: the event loop runs on while it waits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(step)
    return value
