"""The device runs one batch at a time; online groups go before waiting batch items.

A plain asyncio.Lock is first come, first served, so an online request would
wait for every batch item already queued for the device. Here an online turn
(`async with lock.first():`) is handed the device as soon as the running batch
ends, ahead of waiting batch turns (`async with lock:`); nothing is preempted.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ComputeLock:
    def __init__(self) -> None:
        self._held = False
        self._online: deque[asyncio.Future] = deque()
        self._batch: deque[asyncio.Future] = deque()

    async def __aenter__(self) -> None:
        await self._acquire(self._batch)

    async def __aexit__(self, *exc) -> None:
        self._release()

    @asynccontextmanager
    async def first(self) -> AsyncIterator[None]:
        await self._acquire(self._online)
        try:
            yield
        finally:
            self._release()

    def locked(self) -> bool:
        return self._held

    async def _acquire(self, queue: deque[asyncio.Future]) -> None:
        if not self._held:
            self._held = True
            return
        turn = asyncio.get_running_loop().create_future()
        queue.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # handed the device just as we were cancelled: pass it on
            raise

    def _release(self) -> None:
        for queue in (self._online, self._batch):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # the device passes straight to this waiter
                    return
        self._held = False
