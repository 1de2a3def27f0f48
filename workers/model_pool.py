"""Models loaded on one worker's device, under a memory budget.

Pinned models load at start and stay. Others load on demand and are evicted
least-recently-used, never while a batch is using them. Loading runs in a
thread so the worker's event loop keeps answering the scheduler meanwhile.
Sizes are the catalog's estimate until a model has been loaded once, then
what the runtime measured.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from shoal.configs import ModelSpec

logger = logging.getLogger("shoal.worker.pool")


class ModelTooLarge(RuntimeError):
    """A model that can never fit in this worker's budget."""


@dataclass
class LoadedModel:
    runtime: Any
    size: int
    pinned: bool = False
    in_use: int = 0


class ModelPool:
    def __init__(
        self,
        budget_bytes: int,
        load: Callable[[ModelSpec], Any],
        executor: Executor,
    ) -> None:
        self.budget = budget_bytes
        self._load = load
        self._executor = executor
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._loading: dict[str, asyncio.Task] = {}
        self._reserved: dict[str, int] = {}
        self._awaited: Counter[str] = Counter()  # waiters of each load in flight
        self._wakers: set[asyncio.Task] = set()
        self._sizes: dict[str, int] = {}
        self._changed = asyncio.Condition()
        self.loads = 0
        self.evictions: list[str] = []
        self.load_seconds: dict[str, float] = {}  # measured, told to the scheduler
        # From the scheduler with each pull: {model: [waiting items, workers holding it]}.
        self.demand: dict[str, list[int]] = {}

    # -- what the scheduler is told ----------------------------------------

    def loaded(self) -> list[str]:
        return list(self._loaded)

    def pinned(self) -> list[str]:
        """Loaded and never evicted: scale-down keeps a holder of each (scheduler_plugins/elastic.py)."""
        return [name for name, entry in self._loaded.items() if entry.pinned]

    def held(self) -> list[str]:
        """Loaded models and those loading: what the scheduler counts as held here.

        A model counts from the start of its load, so other workers do not
        load it too, and its requests come here rather than to a second load.
        """
        return [*self._loaded, *(name for name in self._loading if name not in self._loaded)]

    def used_bytes(self) -> int:
        return sum(entry.size for entry in self._loaded.values())

    def free_bytes(self) -> int:
        return self.budget - self.used_bytes()

    def can_ever_fit(self, spec: ModelSpec) -> bool:
        pinned = sum(e.size for name, e in self._loaded.items() if e.pinned and name != spec.name)
        return self.size_of(spec) <= self.budget - pinned

    def size_of(self, spec: ModelSpec) -> int:
        return self._sizes.get(spec.name, spec.memory_bytes)

    # -- use ----------------------------------------------------------------

    async def pin(self, spec: ModelSpec) -> None:
        async with self.use(spec):
            self._loaded[spec.name].pinned = True

    async def warm(self, spec: ModelSpec) -> bool:
        """Load `spec` now if it fits without evicting anything; it stays evictable.

        A job's model loads while its cluster starts instead of on the job's
        first item. False when it does not fit in what is free.
        """
        if spec.name in self._loaded:
            return True
        if self.size_of(spec) > self.free_bytes() - self._loading_bytes():
            return False
        async with self.use(spec):
            return True

    @asynccontextmanager
    async def use(self, spec: ModelSpec) -> AsyncIterator[Any]:
        """The loaded runtime for `spec`, kept loaded while the block runs."""
        entry = await self._acquire(spec)
        try:
            yield entry.runtime
        finally:
            entry.in_use -= 1
            await self._wake()

    async def _acquire(self, spec: ModelSpec) -> LoadedModel:
        while True:
            entry = self._loaded.get(spec.name)
            if entry is not None:
                self._loaded.move_to_end(spec.name)
                entry.in_use += 1
                return entry
            pending = self._loading.get(spec.name)
            if pending is None:
                if not self.can_ever_fit(spec):
                    raise ModelTooLarge(
                        f"model {spec.name!r} needs {self.size_of(spec) / 1e9:.2f} GB but this "
                        f"worker's budget is {self.budget / 1e9:.2f} GB "
                        f"({self._pinned_bytes() / 1e9:.2f} GB pinned)"
                    )
                await self._make_room(self.size_of(spec))
                if spec.name in self._loaded or spec.name in self._loading:
                    continue
                pending = self._start_load(spec)
            # Shielded: a waiter that is cancelled (its item taken back) leaves
            # the load running for the others, and for the next user. Counted:
            # until its waiters resume, the loaded model is not idle, so no
            # other load evicts it first.
            self._awaited[spec.name] += 1
            try:
                await asyncio.shield(pending)
            finally:
                self._awaited[spec.name] -= 1
                if not self._awaited[spec.name] and spec.name in self._loaded:
                    self._wake_soon()  # a cancelled waiter leaves it idle: room for others

    def _start_load(self, spec: ModelSpec) -> asyncio.Task:
        """The load of `spec` as a task of its own, its memory reserved from now."""
        self._reserved[spec.name] = self.size_of(spec)
        task = asyncio.create_task(self._load_now(spec), name=f"load {spec.name}")
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # waiters re-raise it
        self._loading[spec.name] = task
        return task

    async def _load_now(self, spec: ModelSpec) -> None:
        try:
            began = time.perf_counter()
            runtime = await asyncio.get_running_loop().run_in_executor(self._executor, self._load, spec)
            self.load_seconds[spec.name] = round(time.perf_counter() - began, 3)
            size = int(getattr(runtime, "memory_bytes", lambda: spec.memory_bytes)())
            self._sizes[spec.name] = size
            self._loaded[spec.name] = LoadedModel(runtime, size)
            self.loads += 1
            logger.info("loaded %s (%.1f MB)", spec.name, size / 1e6)
        finally:
            del self._loading[spec.name]
            del self._reserved[spec.name]
            await self._wake()

    async def _wake(self) -> None:
        """Residency changed: loads waiting for room look again."""
        async with self._changed:
            self._changed.notify_all()

    def _wake_soon(self) -> None:
        task = asyncio.create_task(self._wake())
        self._wakers.add(task)
        task.add_done_callback(self._wakers.discard)

    async def _make_room(self, needed: int) -> None:
        """Evict idle unpinned models until `needed` fits (see `_victim`)."""
        async with self._changed:
            while self.free_bytes() - self._loading_bytes() < needed:
                victim = self._victim()
                if victim is None:
                    await self._changed.wait()  # everything left is busy: wait for a release
                    continue
                self._evict(victim)

    def _victim(self) -> str | None:
        """The idle model whose eviction costs the cluster least.

        Models without waiting work go first, then those other workers also
        hold, and only then the last copy of a model with work waiting (its
        requests would all pay a load); least recently used within each.
        """
        idle = [
            (i, n)
            for i, (n, e) in enumerate(self._loaded.items())
            if not e.pinned and e.in_use == 0 and not self._awaited[n]
        ]
        if not idle:
            return None

        def cost(entry: tuple[int, str]) -> tuple[bool, bool, int]:
            waiting, holders = self.demand.get(entry[1], (0, 0))
            return waiting > 0 and holders <= 1, waiting > 0, entry[0]

        return min(idle, key=cost)[1]

    def _evict(self, name: str) -> None:
        entry = self._loaded.pop(name)
        close = getattr(entry.runtime, "close", None)
        if close is not None:
            close()
        self.evictions.append(name)
        logger.info("evicted %s", name)

    def _pinned_bytes(self) -> int:
        return sum(e.size for e in self._loaded.values() if e.pinned)

    def _loading_bytes(self) -> int:
        return sum(self._reserved.values())
