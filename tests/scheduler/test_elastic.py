"""What the queue tells Dask's autoscalers (scaling.py, elastic.py), on the plugin driven in-process."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from shoal.scheduler_plugins.elastic import Elastic
from shoal.scheduler_plugins.online_route import LocalBackend
from shoal.scheduler_plugins.protocol import EVENTS
from shoal.scheduler_plugins.pull_queue import PullQueue
from shoal.scheduler_plugins.scaling import OnlineLoad, ScalingSettings, need, pinned_cover
from tests.support.fake_scheduler import running_queue, spec

SPECS = {"models": {"m": spec("m").model_dump(), "n": spec("n").model_dump()}}


def items(model: str, n: int, rows: int = 100) -> list[dict]:
    return [{"key": f"{model}-{i}", "model": model, "op": "embed", "rows": rows, "payload": {"i": i}} for i in range(n)]


@pytest.fixture
async def plugin() -> AsyncIterator[PullQueue]:
    async with running_queue(("w1", "w2", "w3", "w4")) as plugin:
        yield plugin


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_greedy_cover_keeps_one_holder_of_each_pinned_model():
    assert pinned_cover({}) == 0
    assert pinned_cover({frozenset({"a", "b"}): 8}) == 1  # workers of one profile pin the same models
    assert pinned_cover({frozenset({"a"}): 3, frozenset({"b"}): 1, frozenset({"a", "c"}): 1}) == 2


def test_the_online_load_is_group_seconds_over_its_window_and_forgets_old_ones():
    clock = Clock()
    load = OnlineLoad(window=10, clock=clock)
    assert load.busy_workers() == 0 and load.idle_for() == math.inf
    load.arrived()
    load.computed(3.0)
    load.computed(2.0)
    assert load.busy_workers() == pytest.approx(0.5)
    clock.now += 11
    assert load.busy_workers() == 0 and load.idle_for() == pytest.approx(11)


async def test_the_target_follows_the_backlog_over_the_measured_rate_capped_by_what_the_items_can_use(plugin):
    assert plugin.scheduler.adaptive_target() == 0
    plugin.batch.submit("j", items("m", 40), SPECS)
    # Not measured yet: as many workers as the items can use (two items each), however slow it may be.
    assert plugin.scheduler.adaptive_target(target_duration="5s") == 20
    assert "backlog of 40 items of m not measured yet" in plugin.elastic.last.reason
    reply = await plugin.batch.pull("w1", held=["m"], room=2, timeout=0)
    for message in reply["items"]:
        plugin.state.ack("w1", message["id"], {"rows": 100, "compute_seconds": 0.5})  # 200 rows/s per worker
    # 38 items x 100 rows at 200 rows/s = 19 worker-seconds: 4 workers drain them within 5 s.
    assert plugin.scheduler.adaptive_target(target_duration="5s") == 4
    assert plugin.scheduler.handlers["adaptive_target"](target_duration=60) == 1
    assert "at 200 rows/s per worker" in plugin.elastic.status()["reason"]


async def test_never_fewer_workers_than_hold_leases(plugin):
    plugin.batch.submit("j", items("m", 3), SPECS)
    for worker in ("w1", "w2", "w3"):
        reply = await plugin.batch.pull(worker, held=["m"], room=1, timeout=0)
        plugin.scheduler.stream_handlers[EVENTS](worker=worker, started=[reply["items"][0]["id"]])
    plugin.state.placement.stats.record("m", 1000, 1.0)  # 1,000 rows/s: the rest is a fraction of a worker-second
    assert plugin.scheduler.adaptive_target(target_duration="5s") == 3
    assert plugin.elastic.last.reason == "3 workers hold leased items"


async def test_online_requests_keep_a_worker_for_the_idle_window_and_busy_groups_ask_for_more(plugin):
    elastic: Elastic = plugin.elastic
    clock = Clock()
    elastic.online.clock = clock
    elastic.online.arrived()
    assert plugin.scheduler.adaptive_target() == 1
    for _ in range(45):  # 45 s of group compute in the 30 s window: 1.5 workers busy, at half use 3
        elastic.online.computed(1.0)
    assert plugin.scheduler.adaptive_target() == 3
    clock.now += ScalingSettings().online_idle_seconds + 1
    assert plugin.scheduler.adaptive_target() == 0


async def test_workers_to_close_prefer_idle_then_models_held_elsewhere_and_keep_a_pinned_holder(plugin):
    plugin.batch.submit("j", items("m", 1), SPECS)
    await plugin.batch.pull("w1", held=["m"], room=1, timeout=0)  # w1: a leased item
    await plugin.batch.pull("w2", held=["n"], pinned=["n"], timeout=0)  # w2: the only holder of pinned n
    await plugin.batch.pull("w3", held=["x"], timeout=0)  # w3: the only holder of x
    await plugin.batch.pull("w4", held=["n"], timeout=0)  # w4: n, held elsewhere too
    close = plugin.scheduler.workers_to_close
    assert close(n=1) == ["w4"]
    assert close(n=2) == ["w4", "w3"]
    assert close(target=1) == ["w4", "w3", "w1"]  # w2 is the last holder of pinned n: never closed
    assert close() == ["w4", "w3"]  # no count asked: the idle ones, no pinned model lost
    assert plugin.scheduler.handlers["workers_to_close"](target=2, attribute="name") == ["w4", "w3"]
    await plugin.batch.pull("w4", held=["n"], pinned=["n"], timeout=0)  # now n has two pinned holders: either goes
    closed = close(target=1)
    assert len(closed) == 3 and closed[-1] == "w1" and len({"w2", "w4"} - set(closed)) == 1
    assert len(close(n=4)) == 3  # asked for all: one holder of n stays


async def test_retiring_a_worker_hands_back_what_it_did_not_start_and_waits_for_what_it_started(plugin):
    plugin.batch.submit("j", items("m", 4), SPECS)
    leased = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=4, timeout=0))["items"]]
    events = plugin.scheduler.stream_handlers[EVENTS]
    events(worker="w1", started=[leased[0]])
    retiring = asyncio.ensure_future(plugin.scheduler.retire_workers(workers=["w1"]))
    for _ in range(10):  # loop passes, not time: it hands back at once and then waits on its started item
        await asyncio.sleep(0)
    assert not retiring.done()  # the started item is still computing there
    assert plugin.scheduler.revoked("w1") == leased[1:]
    assert plugin.batch.job_status("j")["queued"] == 3 and plugin.state.counts["handed_back"] == 3
    assert all(plugin.state.items[i].attempts == 0 for i in leased[1:])  # never started: no attempt spent
    assert (await plugin.batch.pull("w1", held=["m"], room=4, timeout=0)) == {"items": [], "reason": "retiring"}
    taken = [m["id"] for m in (await plugin.batch.pull("w2", held=["m"], room=4, timeout=0))["items"]]
    assert taken == leased[1:]  # at once, from the front of the queue: no lease timeout
    events(worker="w1", acks=[[leased[0], {"rows": 100, "compute_seconds": 0.1}]])
    assert await asyncio.wait_for(retiring, 2) == {"w1": {}}
    assert plugin.scheduler.dask_retired == ["w1"] and plugin.batch.job_status("j")["done"] == 1


async def test_a_retiring_worker_that_does_not_finish_in_time_hands_its_item_back_without_spending_an_attempt(plugin):
    plugin.elastic.settings = ScalingSettings(drain_timeout_seconds=0.2)
    plugin.batch.submit("j", items("m", 1), SPECS)
    item = (await plugin.batch.pull("w1", held=["m"], timeout=0))["items"][0]["id"]
    plugin.scheduler.stream_handlers[EVENTS](worker="w1", started=[item])
    await plugin.scheduler.retire_workers(names=["w1"])
    assert plugin.scheduler.revoked("w1") == [item]
    plugin.remove_worker(plugin.scheduler, "w1")  # what Dask's retirement does last
    assert plugin.state.items[item].state.value == "queued" and plugin.state.items[item].attempts == 0
    assert plugin.state.counts["handed_back"] == 1 and plugin.state.counts["lost"] == 0


async def test_a_worker_removed_while_it_retires_hands_back_what_it_held_and_a_lost_one_spends_an_attempt(plugin):
    plugin.batch.submit("j", items("m", 2), SPECS)
    first, second = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    retiring = asyncio.ensure_future(
        plugin.scheduler.handlers["shoal_retire"](worker="w1", timeout=5.0, events={"started": [first]})
    )
    await asyncio.sleep(0)
    assert plugin.scheduler.revoked("w1") == [second]  # not started: back at once
    plugin.remove_worker(plugin.scheduler, "w1")  # killed during its grace
    assert await retiring == 0
    assert plugin.state.items[first].attempts == 0 and plugin.state.counts["lost"] == 0
    reply = await plugin.batch.pull("w2", held=["m"], room=2, timeout=0)
    assert [m["id"] for m in reply["items"]] == [first, second]
    plugin.remove_worker(plugin.scheduler, "w2")  # not retiring: a loss
    assert plugin.state.items[first].attempts == 1 and plugin.state.counts["lost"] == 2


async def test_a_worker_that_drains_itself_is_silent_to_placement_until_it_leaves(plugin):
    plugin.batch.submit("j", items("m", 2), SPECS)
    await plugin.batch.pull("w1", held=["m"], room=2, timeout=0)
    assert await plugin.scheduler.handlers["shoal_retire"](worker="w1", timeout=1.0) == 0
    assert plugin.state.views.holders.get("m", 0) == 0 and plugin.batch.job_status("j")["queued"] == 2


async def test_with_an_autoscaler_asking_a_request_that_finds_no_worker_waits_instead_of_503(plugin):
    from shoal.configs import GatewaySettings

    settings = GatewaySettings()
    plugin.state.add_specs({"m": spec("m")}, "test")
    plugin.scheduler.workers.clear()
    assert plugin.online.refusal("m", settings)["status"] == 503
    plugin.scheduler.adaptive_target()  # an autoscaler asks
    assert plugin.online.refusal("m", settings) is None
    answer = await LocalBackend(plugin.online).answer("m", "embed", {"texts": ["x"]}, 1, 0.1, settings)
    assert answer["status"] == 503 and "scaling up" in answer["error"]


def test_need_without_a_scheduler_names_its_largest_reason():
    class Queue:
        def batch_models(self):
            return ["m"]

        def remaining(self, model):
            return (10, 1000)

        def rows_per_second(self, model):
            return 100.0

        def workers_with_leases(self):
            return 0

        def online_waiting(self):
            return 0

        def pinned_sets(self):
            return {frozenset({"a"}): 2}

    wanted = need(Queue(), OnlineLoad(), 2.0, ScalingSettings())
    assert wanted.workers == 5 and wanted.reason == "backlog of 10 items of m at 100 rows/s per worker"


async def test_the_target_its_reason_and_the_workers_now_are_on_metrics_and_the_shoal_page(plugin):
    from prometheus_client import REGISTRY, generate_latest

    from shoal.scheduler_plugins.dashboard import render

    plugin.batch.submit("j", items("m", 6), SPECS)
    plugin.scheduler.adaptive_target(target_duration="5s")
    text = generate_latest(REGISTRY).decode()
    assert 'shoal_scaling_target_workers{reason="backlog of 6 items of m not measured yet"} 3.0' in text
    assert "shoal_scaling_current_workers 4.0" in text
    page = render(plugin.metrics.figures(), "tcp://here")
    assert "scaling: target 3 workers, 4 now" in page and "backlog of 6 items of m" in page
