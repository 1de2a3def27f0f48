"""Residency under a budget: LRU eviction, pinned models, never evicting a model in use."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from shoal.configs import ModelSpec
from shoal.workers.model_pool import ModelPool, ModelTooLarge
from tests.support.waiting import async_wait_for


def spec(name: str, size: int) -> ModelSpec:
    return ModelSpec(name=name, kind="sim", dim=4, max_seq_length=8, memory_bytes=size)


class FakeRuntime:
    def __init__(self, s: ModelSpec, closed: list[str]) -> None:
        self.spec, self.closed = s, closed

    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    def close(self) -> None:
        self.closed.append(self.spec.name)


def make_pool(budget: int):
    closed: list[str] = []
    loaded: list[str] = []

    def load(s: ModelSpec):
        loaded.append(s.name)
        return FakeRuntime(s, closed)

    return ModelPool(budget, load, ThreadPoolExecutor(1)), loaded, closed


async def test_lru_eviction_under_budget():
    pool, loaded, closed = make_pool(100)
    a, b, c = spec("a", 40), spec("b", 40), spec("c", 40)
    for s in (a, b, a, c, a, b):
        async with pool.use(s) as runtime:
            assert runtime.spec.name == s.name
    # c evicts b (a was used more recently); b then evicts c
    assert loaded == ["a", "b", "c", "b"]
    assert closed == ["b", "c"] == pool.evictions
    assert sorted(pool.loaded()) == ["a", "b"] and pool.free_bytes() == 20


async def test_pinned_model_is_never_evicted_and_too_large_is_rejected():
    pool, loaded, _ = make_pool(100)
    await pool.pin(spec("p", 60))
    for name in ("x", "y", "x"):
        async with pool.use(spec(name, 40)):
            pass
    assert "p" in pool.loaded()
    with pytest.raises(ModelTooLarge, match="model 'big' needs .* budget"):
        async with pool.use(spec("big", 50)):
            pass
    assert loaded == ["p", "x", "y", "x"] and "p" not in pool.evictions


async def test_warm_loads_only_what_fits_and_stays_evictable():
    pool, loaded, closed = make_pool(100)
    assert await pool.warm(spec("a", 60)) is True
    assert await pool.warm(spec("a", 60)) is True  # already loaded: no second load
    assert await pool.warm(spec("b", 60)) is False  # would need an eviction: left for its first item
    async with pool.use(spec("c", 60)):  # a warmed model is evicted like any other
        pass
    assert loaded == ["a", "c"] and closed == ["a"] and pool.loaded() == ["c"]


async def test_model_in_use_is_not_evicted_until_released():
    pool, loaded, _ = make_pool(100)
    order = []
    a, b = spec("a", 60), spec("b", 60)
    a_in_use = asyncio.Event()

    async def hold_a():
        async with pool.use(a):
            order.append("a in use")
            a_in_use.set()
            # b's load waits for room (the pool's asyncio.Condition lists its waiters): a is not evicted
            await async_wait_for(lambda: pool._changed._waiters, what="b's load waiting for room")
            order.append("a released")

    async def want_b():
        await a_in_use.wait()
        async with pool.use(b):
            order.append("b loaded")

    await asyncio.gather(hold_a(), want_b())
    assert order == ["a in use", "a released", "b loaded"]
    assert pool.loaded() == ["b"]


async def test_concurrent_users_share_one_load():
    pool, loaded, _ = make_pool(100)
    s = spec("a", 10)

    async def use():
        async with pool.use(s):
            await asyncio.sleep(0.01)  # each user holds the model a moment, as an item's compute would

    await asyncio.gather(*(use() for _ in range(5)))
    assert loaded == ["a"]


async def test_a_cancelled_user_leaves_the_shared_load_to_the_others():
    """An item taken back mid-load is cancelled; whoever waits on the same load still gets the model."""

    started = asyncio.Event()
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def load(s: ModelSpec):
        loop.call_soon_threadsafe(started.set)
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result()
        return FakeRuntime(s, [])

    pool = ModelPool(100, load, ThreadPoolExecutor(1))
    s = spec("a", 10)

    async def use():
        async with pool.use(s) as runtime:
            return runtime

    first = asyncio.create_task(use())
    await started.wait()
    second = asyncio.create_task(use())
    await async_wait_for(lambda: pool._awaited["a"] == 2, what="both users waiting on the one load")
    first.cancel()
    await async_wait_for(lambda: pool._awaited["a"] == 1, what="the cancelled user gone from the load")
    release.set()
    runtime = await asyncio.wait_for(second, 5)
    assert first.cancelled() and runtime.spec.name == "a"
    assert pool.loaded() == ["a"] and pool.loads == 1


async def test_a_loaded_model_reaches_its_waiters_before_another_load_can_evict_it():
    """Three models, room for two, all wanted at once: each loads once, none is lost in between."""

    def load(s: ModelSpec):
        time.sleep(0.02)  # a load takes time: the three uses overlap
        return FakeRuntime(s, [])

    pool = ModelPool(20, load, ThreadPoolExecutor(1))

    async def use(name: str):
        async with pool.use(spec(name, 10)):
            await asyncio.sleep(0.05)  # in use while the other models are wanted

    await asyncio.wait_for(asyncio.gather(*(use(n) for n in "abc")), 10)
    assert pool.loads == 3


async def test_eviction_spares_the_last_copy_of_a_model_with_waiting_work():
    pool, loaded, closed = make_pool(100)
    for name in ("last-copy", "shared", "idle"):
        async with pool.use(spec(name, 30)):
            pass
    # waiting work for two of them; "shared" is also held by another worker
    pool.demand = {"last-copy": [5, 1], "shared": [5, 2]}
    async with pool.use(spec("new-1", 30)):
        pass
    pool.demand["new-1"] = [3, 1]
    async with pool.use(spec("new-2", 30)):
        pass
    # least recently used would have evicted "last-copy" first
    assert pool.evictions == ["idle", "shared"]
    assert "last-copy" in pool.loaded()
