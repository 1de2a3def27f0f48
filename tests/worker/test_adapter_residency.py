"""Adapters in the model pool (issue 42): a base loaded once, its adapters in the same LRU under the same budget,
each costing its measured bytes; an adapter's load never reloads the base; a base is never evicted while one of
its adapters is in use, and takes its adapters with it when it goes.

Unit tests: the pool's loaders are fakes (no model, no torch); the real ones are tests/kinds/test_adapters.py's.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from shoal.configs import AdapterSpec, ModelSpec
from shoal.workers.model_pool import ModelPool
from tests.support.waiting import async_wait_for

BASE = ModelSpec(name="base", kind="embedder", dim=4, max_seq_length=8, memory_bytes=50)


def adapter(name: str, size: int = 10, base: ModelSpec = BASE) -> tuple[ModelSpec, int]:
    """An adapter's spec over `base`, and its bytes."""
    spec = base.model_copy(
        update={
            "name": f"{base.name}+{name}",
            "adapter": AdapterSpec(base=base.name, name=name, source="/x", memory_bytes=size),
        }
    )
    return spec, size


class FakeBase:
    def __init__(self, spec: ModelSpec, closed: list[str]) -> None:
        self.spec, self.closed = spec, closed
        self.adapters: set[str] = set()

    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    def close(self) -> None:
        self.closed.append(self.spec.name)


class FakeAdapters:
    """Records attaches and detaches; an adapter's measured bytes are those its test gave it."""

    def __init__(self) -> None:
        self.sizes: dict[str, int] = {}
        self.attached: list[str] = []
        self.detached: list[str] = []

    async def attach(self, base: Any, spec: ModelSpec) -> tuple[Any, int, float]:
        assert spec.adapter is not None and spec.adapter.name not in base.adapters
        base.adapters.add(spec.adapter.name)
        self.attached.append(spec.name)
        return (base, spec.adapter.name), self.sizes[spec.name], 0.002

    def takes(self, base: Any) -> bool:
        return not getattr(base, "onnx", False)

    def detach(self, base: Any, name: str) -> None:
        base.adapters.discard(name)
        self.detached.append(name)


def make_pool(budget: int):
    closed: list[str] = []
    bases: list[str] = []
    adapters = FakeAdapters()

    def load(spec: ModelSpec) -> FakeBase:
        assert spec.adapter is None or spec.adapter.merged
        bases.append(spec.name)
        return FakeBase(spec, closed)

    return ModelPool(budget, load, ThreadPoolExecutor(1), adapters), bases, adapters, closed


def specs(adapters: FakeAdapters, count: int, size: int = 10) -> list[ModelSpec]:
    out = []
    for i in range(count):
        spec, adapters.sizes[f"base+a{i}"] = adapter(f"a{i}", size)
        out.append(spec)
    return out


async def test_a_base_loads_once_for_all_its_adapters_each_sized_by_its_measured_bytes():
    pool, bases, adapters, _ = make_pool(1000)
    fleet = specs(adapters, 20, size=7)
    for spec in [*fleet, *fleet]:
        async with pool.use(spec) as (runtime, name):
            assert name == spec.adapter.name and runtime.spec.name == "base"
    assert bases == ["base"] and adapters.attached == [s.name for s in fleet]
    assert pool.used_bytes() == 50 + 20 * 7
    assert set(pool.loaded()) == {"base", *(s.name for s in fleet)}
    assert all(pool.load_counts[s.name] == 1 for s in fleet)
    assert pool.load_seconds["base+a0"] == 0.002  # its own work, as measured: what placement reads


async def test_adapters_are_evicted_least_recently_used_and_the_base_stays():
    pool, bases, adapters, closed = make_pool(100)  # the base (50) and five adapters of 10
    fleet = specs(adapters, 8)
    for spec in fleet:
        async with pool.use(spec):
            pass
    assert bases == ["base"] and closed == []
    assert adapters.detached == ["a0", "a1", "a2"]  # the oldest went, never the base they all use
    assert pool.free_bytes() >= 0 and pool.used_bytes() == 100


async def test_a_base_is_not_evicted_while_an_adapter_is_in_use():
    pool, bases, adapters, closed = make_pool(100)
    (first,) = specs(adapters, 1)
    other = ModelSpec(name="other", kind="embedder", dim=4, max_seq_length=8, memory_bytes=60)
    order: list[str] = []

    async def hold_adapter(release: asyncio.Event) -> None:
        async with pool.use(first):
            order.append("adapter in use")
            await release.wait()
        order.append("adapter released")

    release = asyncio.Event()
    holder = asyncio.create_task(hold_adapter(release))
    await async_wait_for(lambda: order == ["adapter in use"], what="the adapter in use")

    async def load_other() -> None:
        async with pool.use(other):
            order.append("other loaded")

    loader = asyncio.create_task(load_other())
    await asyncio.sleep(0.05)  # room for `other` needs the base out: it must wait for the adapter's release
    assert order == ["adapter in use"] and "base" in pool.loaded()
    release.set()
    await asyncio.gather(holder, loader)
    assert order == ["adapter in use", "adapter released", "other loaded"]
    # The adapter went first (the least recently used: its base was used with it, after it), then the base.
    assert adapters.detached == ["a0"] and closed == ["base"] and pool.evictions == ["base+a0", "base"]


async def test_evicting_a_base_takes_its_idle_adapters_with_it():
    pool, bases, adapters, closed = make_pool(100)
    fleet = specs(adapters, 2)
    for spec in fleet:
        async with pool.use(spec):
            pass
    pool._evict("base")  # what _make_room does when the base is the least recently used
    assert closed == ["base"] and pool.loaded() == [] and pool.used_bytes() == 0
    assert adapters.detached == []  # their layers were in the base's model, closed with it


async def test_an_adapter_loads_its_base_first_and_a_pinned_adapter_keeps_its_base():
    pool, bases, adapters, closed = make_pool(100)
    (kept,) = specs(adapters, 1)
    await pool.pin(kept)
    assert set(pool.pinned()) == {"base", "base+a0"}
    other = ModelSpec(name="other", kind="embedder", dim=4, max_seq_length=8, memory_bytes=40)
    async with pool.use(other):
        pass
    assert closed == [] and bases == ["base", "other"]


async def test_an_adapter_goes_on_a_torch_copy_when_its_base_alone_runs_without_lora_layers():
    pool, bases, adapters, closed = make_pool(1000)
    async with pool.use(BASE) as plain:
        plain.onnx = True  # as the worker's runtime choice may load the base alone (ONNX has no LoRA layers)
    (first,) = specs(adapters, 1)
    async with pool.use(first) as (runtime, _):
        assert runtime is not plain
    assert bases == ["base", "base (torch)"] and set(pool.loaded()) == {"base", "base (torch)", "base+a0"}


async def test_a_merged_adapter_loads_as_a_model_of_its_own():
    pool, bases, adapters, closed = make_pool(1000)
    spec, _ = adapter("hot")
    assert spec.adapter is not None
    merged = spec.model_copy(update={"adapter": spec.adapter.model_copy(update={"merged": True})})

    async with pool.use(merged):
        pass
    assert bases == ["base+hot"] and adapters.attached == [] and pool.loaded() == ["base+hot"]
