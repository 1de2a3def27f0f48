"""Models loaded on one worker's device, under a memory budget.

Pinned models load at start and stay. Others load on demand and are evicted
least-recently-used, never while a batch is using them. Loading runs in a
thread so the worker's event loop keeps answering the scheduler meanwhile.
Sizes are the catalog's estimate until a model has been loaded once, then
what the runtime measured.

A LoRA adapter (a spec with `adapter`, configs/adapters.py) is an entry of
its own over its base's entry: the base loads once, as a model of its own,
and each adapter is added to it (milliseconds: workers/runtimes/lora.py),
costing its own measured bytes under the same budget and evicted in the same
LRU. Using an adapter uses its base too, so a base is never evicted while any
of its adapters is in use, and it is the more recently used of the two;
evicting a base drops its adapters with it.
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
from typing import Any, Protocol

from ..configs import ModelSpec
from ..configs.adapters import base_of

logger = logging.getLogger("shoal.worker.pool")


class ModelTooLarge(RuntimeError):
    """A model that can never fit in this worker's budget."""


@dataclass
class LoadedModel:
    runtime: Any
    size: int
    pinned: bool = False
    in_use: int = 0
    base: str | None = None  # an adapter's: the entry of the base it is loaded over
    adapter: str | None = None  # an adapter's own name within its base


class AdapterLoader(Protocol):
    """How the pool adds adapters to a loaded base and removes them (workers/runtimes/lora.AdapterLoader)."""

    async def attach(self, base: Any, spec: ModelSpec) -> tuple[Any, int, float]: ...

    def takes(self, base: Any) -> bool:
        """Whether adapters can be added to this loaded runtime (a torch model: LoRA layers live there)."""

    def detach(self, base: Any, name: str) -> None: ...


class ModelPool:
    def __init__(
        self,
        budget_bytes: int,
        load: Callable[[ModelSpec], Any],
        executor: Executor,
        adapters: AdapterLoader | None = None,
    ) -> None:
        self.budget = budget_bytes
        self._load = load
        self._executor = executor
        self._adapters = adapters
        self._loaded: OrderedDict[str, LoadedModel] = OrderedDict()
        self._loading: dict[str, asyncio.Task] = {}
        self._reserved: dict[str, int] = {}
        self._awaited: Counter[str] = Counter()  # waiters of each load in flight
        self._wakers: set[asyncio.Task] = set()
        self._sizes: dict[str, int] = {}
        self._bases: dict[str, str] = {}  # adapter -> the entry of its base (see _base_for)
        self._changed = asyncio.Condition()
        self.loads = 0
        self.load_counts: Counter[str] = Counter()  # loads per model: an adapter loaded again was evicted between
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
        """Measured, else the spec's estimate: an adapter's own bytes, not its base's."""
        estimate = (
            spec.adapter.memory_bytes if spec.adapter is not None and not spec.adapter.merged else spec.memory_bytes
        )
        return self._sizes.get(spec.name, estimate)

    # -- use ----------------------------------------------------------------

    async def pin(self, spec: ModelSpec) -> None:
        """Load `spec` now and keep it (an adapter keeps its base too)."""
        async with self.use(spec):
            entry = self._loaded[spec.name]
            entry.pinned = True
            if entry.base is not None:
                self._loaded[entry.base].pinned = True

    async def warm(self, spec: ModelSpec) -> bool:
        """Load `spec` now if it fits without evicting anything; it stays evictable.

        A job's model loads while its cluster starts instead of on the job's
        first item. False when it does not fit in what is free.
        """
        if spec.name in self._loaded:
            return True
        base = self._base_for(spec) if spec.adapter is not None and not spec.adapter.merged else None
        needed = self.size_of(spec) + (self.size_of(base) if base and base.name not in self._loaded else 0)
        if needed > self.free_bytes() - self._loading_bytes():
            return False
        async with self.use(spec):
            return True

    @asynccontextmanager
    async def use(self, spec: ModelSpec) -> AsyncIterator[Any]:
        """The loaded runtime for `spec`, kept loaded while the block runs (an adapter's base with it)."""
        entry = await self._acquire(spec)
        try:
            yield entry.runtime
        finally:
            self._release(entry)
            await self._wake()

    def _release(self, entry: LoadedModel) -> None:
        entry.in_use -= 1
        if entry.base is not None:
            self._loaded[entry.base].in_use -= 1

    async def _acquire(self, spec: ModelSpec) -> LoadedModel:
        if spec.adapter is None or spec.adapter.merged:  # a merged adapter is a base copy of its own
            return await self._acquire_one(spec)
        base = await self._acquire_one(self._base_for(spec))  # held while the adapter loads, and while it is used
        try:
            return await self._acquire_one(spec)
        except BaseException:
            base.in_use -= 1
            self._wake_soon()
            raise

    async def _acquire_one(self, spec: ModelSpec) -> LoadedModel:
        while True:
            entry = self._loaded.get(spec.name)
            if entry is not None:
                self._loaded.move_to_end(spec.name)
                if entry.base is not None:
                    self._loaded.move_to_end(entry.base)  # the base is used whenever an adapter is
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

    def _base_for(self, spec: ModelSpec) -> ModelSpec:
        """The base entry `spec`'s adapter goes on: its base's own name, unless the base alone is loaded here on a
        runtime without LoRA layers (chosen for it by this worker: ONNX), then a torch copy beside it."""
        base = base_of(spec)
        loaded = self._loaded.get(base.name)
        if loaded is not None and loaded.base is None and self._adapters and not self._adapters.takes(loaded.runtime):
            base = base.model_copy(update={"name": f"{base.name} (torch)"})
        self._bases[spec.name] = base.name
        return base

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
            if spec.adapter is None or spec.adapter.merged:
                runtime = await asyncio.get_running_loop().run_in_executor(self._executor, self._load, spec)
                size = int(getattr(runtime, "memory_bytes", lambda: spec.memory_bytes)())
                entry = LoadedModel(runtime, size)
                seconds = round(time.perf_counter() - began, 3)
            else:
                if self._adapters is None:
                    raise RuntimeError(f"model {spec.name!r} is a LoRA adapter; this worker loads no adapters")
                base = self._bases[spec.name]  # held by the adapter's _acquire
                runtime, size, own = await self._adapters.attach(self._loaded[base].runtime, spec)
                entry = LoadedModel(runtime, size, base=base, adapter=spec.adapter.name)
                # Its own work, in milliseconds: to the microsecond, or placement would read 0 as unmeasured.
                seconds = max(round(own, 6), 1e-6)
            self.load_seconds[spec.name] = seconds
            self._sizes[spec.name] = size
            self._loaded[spec.name] = entry
            self.loads += 1
            self.load_counts[spec.name] += 1
            logger.info("loaded %s (%.3f MB)", spec.name, size / 1e6)
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

        # A base's work is its adapters' too: their requests would pay its load.
        demand = dict(self.demand)
        for name, entry in self._loaded.items():
            if entry.base is not None and name in self.demand:
                waiting, holders = self.demand[name]
                base_waiting, base_holders = demand.get(entry.base, (0, holders))
                demand[entry.base] = [base_waiting + waiting, min(base_holders, holders)]

        def cost(entry: tuple[int, str]) -> tuple[bool, bool, int]:
            waiting, holders = demand.get(entry[1], (0, 0))
            return waiting > 0 and holders <= 1, waiting > 0, entry[0]

        return min(idle, key=cost)[1]

    def replace_idle(self, name: str, runtime: Any, size: int) -> bool:
        """Put `runtime` in place of the loaded `name` if nothing uses or waits for it now and no adapter rides on
        it, closing the one it replaces (its runtime choice changed: workers/runtime_choice.py); else False."""
        entry = self._loaded.get(name)
        if entry is None or entry.in_use or self._awaited[name] or entry.base is not None:
            return False
        if any(other.base == name for other in self._loaded.values()):
            return False
        old, entry.runtime, entry.size = entry.runtime, runtime, size
        self._sizes[name] = size
        close = getattr(old, "close", None)
        if close is not None:
            close()
        logger.info("%s now runs on its verdict's runtime", name)
        return True

    def _evict(self, name: str) -> None:
        """Evict an idle entry: an adapter leaves its base's model; a base goes with its adapters."""
        entry = self._loaded.pop(name)
        self.evictions.append(name)
        logger.info("evicted %s", name)
        if entry.base is not None:
            assert self._adapters is not None and entry.adapter is not None
            self._adapters.detach(self._loaded[entry.base].runtime, entry.adapter)
            return
        for adapter in [n for n, e in self._loaded.items() if e.base == name]:
            del self._loaded[adapter]
            self.evictions.append(adapter)
        close = getattr(entry.runtime, "close", None)
        if close is not None:
            close()

    def _pinned_bytes(self) -> int:
        return sum(e.size for e in self._loaded.values() if e.pinned)

    def _loading_bytes(self) -> int:
        return sum(self._reserved.values())
