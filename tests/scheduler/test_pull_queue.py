"""The scheduler plugin's queue logic: leases, retries, dead letters, placement, long poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY, generate_latest

from shoal.configs import ConfigError
from shoal.scheduler_plugins.protocol import EVENTS, Lane
from shoal.scheduler_plugins.pull_queue import PullQueue
from tests.support.clock import ManualClock
from tests.support.fake_scheduler import running_queue, spec, worker_state
from tests.support.waiting import async_wait_for


def items(model: str, n: int, rows: int = 10) -> list[dict]:
    return [{"key": f"{model}-{i}", "model": model, "op": "embed", "rows": rows, "payload": {"i": i}} for i in range(n)]


SPECS = {"models": {"m": spec("m").model_dump(), "n": spec("n").model_dump()}}


@pytest.fixture
async def plugin() -> AsyncIterator[PullQueue]:
    """The queue on a fake scheduler of workers w1 and w2."""
    async with running_queue() as plugin:
        yield plugin


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[PullQueue, ManualClock]]:
    """The same, its leases and timers on a clock the test drives (no sleeps)."""
    clock = ManualClock()
    async with running_queue(clock=clock) as plugin:
        yield plugin, clock


async def test_handlers_declared_in_one_place(plugin):
    assert {
        "shoal_submit",
        "shoal_pull",
        "shoal_job_status",
        "shoal_job_release",
        "shoal_overview",
    } <= set(plugin.scheduler.handlers)
    assert set(plugin.scheduler.stream_handlers) == {EVENTS}


async def test_one_events_message_starts_acks_fails_and_renews_many_items_and_revokes_what_is_lost(clocked):
    plugin, clock = clocked
    plugin.batch.submit("j", items("m", 4), SPECS)
    a, b, c, d = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=4, timeout=0))["items"]]
    events = plugin.scheduler.stream_handlers[EVENTS]
    events(worker="w1", started=[a, b], acks=[[a, {"rows": 10}]], failed=[[b, "OSError: reset", False]])
    assert plugin.state.items[c].started is False and plugin.batch.job_status("j")["done"] == 1
    assert plugin.state.items[b].state.value == "queued" and "OSError: reset" in plugin.state.items[b].errors[0]
    before = plugin.state.items[c].deadline, plugin.state.items[d].deadline
    clock.advance(0.01)
    events(worker="w1", extend=[c, d, "j/unknown"])
    assert plugin.state.items[c].deadline > before[0] and plugin.state.items[d].deadline > before[1]
    assert plugin.batch.job_status("j")["leased"] == 2
    assert plugin.scheduler.revoked("w1") == ["j/unknown"]  # not held: revoked, not answered
    events(worker="w1", acks=[["j/unknown", {}]], extend=[[1, 2]])  # a bad event is logged, never raised
    assert plugin.batch.job_status("j")["done"] == 1


async def test_events_riding_on_a_pull_are_handled_before_it_leases(plugin):
    plugin.batch.submit("j", items("m", 3), SPECS)
    a, b = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    events = {"started": [b], "acks": [[a, {"rows": 10}]]}
    reply = await plugin.batch.pull("w1", held=["m"], room=2, in_hand=1, timeout=0, events=events)
    assert plugin.batch.job_status("j")["done"] == 1 and plugin.state.items[b].started
    assert [m["id"] for m in reply["items"]] == ["j/m-2"]
    await plugin.batch.pull("w1", held=["m"], timeout=0, events={"acks": [[b, {"rows": 10}], ["j/m-2", {"rows": 10}]]})
    assert plugin.batch.job_status("j")["complete"] and plugin.batch.job_status("j")["rows_done"] == 30


async def test_an_ack_from_another_worker_finishes_the_item_and_revokes_it_from_its_holder(plugin):
    plugin.batch.submit("j", items("m", 1), SPECS)
    item = (await plugin.batch.pull("w1", held=["m"], timeout=0))["items"][0]["id"]
    assert plugin.state.ack("w2", item, {"rows": 10}) is True  # w2 computed it under an older lease
    assert plugin.scheduler.revoked("w1") == [item]
    assert plugin.batch.job_status("j")["rows_by_worker"] == {"w2": 10}


async def test_pull_ack_completes_job_with_rows_per_worker(plugin):
    plugin.batch.submit("j", items("m", 3), SPECS)
    reply = await plugin.batch.pull("w1", held=["m"], room=2, timeout=0)
    assert [m["id"] for m in reply["items"]] == ["j/m-0", "j/m-1"]
    assert reply["models"] == {"m": spec("m").model_dump()} and reply["items"][0]["lease_seconds"] == 60
    for m in reply["items"]:
        plugin.state.ack("w1", m["id"], {"rows": 10})
    # w1 now holds m and 10 rows drain faster than a load: w2 gets m only because it holds it too
    assert (await plugin.batch.pull("w2", room=5, timeout=0, in_hand=1))["items"] == []
    reply = await plugin.batch.pull("w2", held=["m"], room=5, timeout=0)
    plugin.state.ack("w2", reply["items"][0]["id"], {"rows": 10})
    status = plugin.batch.job_status("j", results=True)
    assert status["complete"] and status["rows_done"] == 30
    assert status["rows_by_worker"] == {"w1": 20, "w2": 10} and len(status["results"]) == 3


async def test_job_status_counts_follow_every_transition_without_a_pass_over_the_items(clocked):
    plugin, clock = clocked

    def counted(plugin: PullQueue, job: str) -> dict[str, dict[str, int]]:
        by_model: dict[str, dict[str, int]] = {}
        for work in plugin.batch.jobs[job].items.values():
            states = by_model.setdefault(work.model, {})
            states[work.state.value] = states.get(work.state.value, 0) + 1
        return by_model

    def check(plugin: PullQueue) -> None:
        overview = plugin.overview()["jobs"]
        for job in plugin.batch.jobs:
            by_model = counted(plugin, job)
            assert overview[job]["models"] == by_model
            status = plugin.batch.job_status(job)
            assert status["queued"] == sum(s.get("queued", 0) for s in by_model.values())
            assert status["leased"] == sum(s.get("leased", 0) for s in by_model.values())

    plugin.batch.submit("j", [*items("m", 4), *items("n", 2)], {**SPECS, "lease_seconds": 0.05, "max_attempts": 2})
    check(plugin)
    a, b, c = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=3, timeout=0))["items"]]
    check(plugin)
    plugin.worker_events("w1", started=[a], acks=[[a, {"rows": 10}]], failed=[[b, "boom", True]])
    check(plugin)
    await plugin.batch.pull("w2", held=["m"], timeout=0)  # takes c back or leases the last m item
    check(plugin)
    clock.advance(60)  # every lease runs out, a first load's grace included: back to queued
    assert plugin.state.counts["expired"] >= 1 and not plugin.state.leases.by_worker
    check(plugin)
    plugin.batch.submit("k", items("m", 2), SPECS)
    plugin.batch.job_release("k")
    assert plugin.batch.job_status("j")["done"] == 1 and plugin.batch.job_status("j")["failed"] == 1
    check(plugin)


async def test_lost_worker_items_go_back_to_the_front(plugin):
    plugin.batch.submit("j", items("m", 3), SPECS)
    taken = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    del plugin.scheduler.workers["w1"]
    plugin.remove_worker(plugin.scheduler, "w1", stimulus_id="test")
    again = [m["id"] for m in (await plugin.batch.pull("w2", held=["m"], room=3, timeout=0))["items"]]
    assert set(again[:2]) == set(taken) and again[2] == "j/m-2"
    assert plugin.state.counts["lost"] == 2
    assert (await plugin.batch.pull("w1", held=["m"], timeout=0)) == {"items": [], "reason": "unknown worker"}
    assert (await plugin.online.pull("w1", held=["m"], timeout=0))["reason"] == "unknown worker"
    assert "w1" not in plugin.state.views.views  # a late pull does not bring it back as a holder of m


async def test_permanent_failure_is_dead_at_once_retryable_is_retried(plugin):
    plugin.batch.submit("j", items("m", 2), SPECS)
    first, second = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    plugin.state.fail("w1", first, "InputError: no column 'text'", permanent=True)
    plugin.state.fail("w1", second, "OSError: connection reset")
    assert plugin.state.fail("w2", second, "not mine") is False
    status = plugin.batch.job_status("j")
    assert status["failed"] == 1 and status["queued"] == 1
    assert "no column 'text'" in status["dead_letters"][0]["errors"][0]


async def test_late_ack_after_requeue_counts_once(clocked):
    plugin, clock = clocked
    plugin.batch.submit("j", items("m", 1), {**SPECS, "lease_seconds": 0.01})
    item = (await plugin.batch.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"][0]["id"]  # no load: no grace
    clock.advance(0.2)  # the 0.01 s lease runs out, as a slow worker's would (noticed within CHECK_SECONDS)
    assert plugin.state.items[item].state.value == "queued"
    assert plugin.state.ack("w1", item, {"rows": 10}) is True
    assert plugin.state.ack("w1", item, {"rows": 10}) is False
    assert (await plugin.batch.pull("w2", timeout=0))["items"] == []  # the stale queue entry is skipped
    status = plugin.batch.job_status("j")
    assert status["complete"] and status["rows_done"] == 10


async def test_long_poll_wakes_when_work_arrives(plugin):
    start = time.monotonic()
    waiting = asyncio.create_task(plugin.batch.pull("w1", timeout=5))
    await async_wait_for(lambda: len(plugin.batch.pulls) == 1, what="w1's pull waiting")
    plugin.batch.submit("j", items("m", 1), SPECS)
    reply = await waiting
    assert reply["items"] and time.monotonic() - start < 2
    assert plugin.state.start("w1", reply["items"][0]["id"]) is True
    empty = await plugin.batch.pull("w2", timeout=0.2)
    assert empty == {"items": []}


async def test_held_models_first_and_online_items_to_online_pulls_only(plugin):
    plugin.batch.submit("batch-m", items("m", 2), SPECS)
    plugin.batch.submit("batch-n", items("n", 2), SPECS)
    # held model first, even though m's backlog is older
    assert (await plugin.batch.pull("w1", held=["n"], timeout=0))["items"][0]["model"] == "n"
    plugin.batch.submit("online", items("n", 3, rows=1), {**SPECS, "lane": Lane.ONLINE})
    # w2 does not hold n while w1 does: the online items wait for w1
    assert [m["model"] for m in (await plugin.online.pull("w2", held=["m"], timeout=0))["items"]] == []
    # a batch pull takes batch work (issue 45: online items come by the worker's online pull, a round at a time)
    reply = await plugin.batch.pull("w1", held=["n"], room=1, timeout=0)
    assert [(m["model"], m["lane"]) for m in reply["items"]] == [("n", Lane.BATCH)]
    reply = await plugin.online.pull("w1", held=["n"], timeout=0)
    assert [(m["model"], m["lane"]) for m in reply["items"]] == [("n", Lane.ONLINE)] * 3  # every one, one pull


async def test_a_spec_without_memory_bytes_needs_the_catalog_default_not_zero(plugin):
    """The scheduler reads a spec with ModelSpec's defaults, as workers do: 500 MB unless it says otherwise."""
    fields = {"name": "m", "kind": "sim", "dim": 8, "max_seq_length": 128}  # no memory_bytes
    plugin.batch.submit("j", items("m", 1), {"models": {"m": fields}, "unplaceable_seconds": 0})
    assert (await plugin.batch.pull("w1", held=[], timeout=0, budget=100_000_000))["items"] == []
    plugin.state.bury_unplaceable()
    assert "needs 0.50 GB of model memory" in plugin.batch.job_status("j")["dead_letters"][0]["errors"][0]


async def test_a_job_with_a_bad_spec_is_refused_naming_the_job_model_and_field(plugin):
    bad = {"m": {**spec("m").model_dump(), "memory_bytes": -1}}
    with pytest.raises(
        ConfigError, match=r"job 'j': model 'm' has no valid spec: memory_bytes: Input should be greater"
    ):
        plugin.batch.submit("j", items("m", 1), {"models": bad})
    assert "j" not in plugin.batch.jobs and not plugin.state.items and "m" not in plugin.state.model_specs


async def test_metrics_serve_the_latest_queue_still_running():
    """A queue that closes hands /metrics back to the one started before it (a test's beside a cluster's)."""

    def depths() -> str:
        return "\n".join(line for line in generate_latest(REGISTRY).decode().splitlines() if "queue_depth{" in line)

    async with running_queue(models={"first": spec("first")}) as first:
        first.batch.submit("j", items("first", 1), {})
        async with running_queue(models={"second": spec("second")}) as second:
            second.batch.submit("j", items("second", 1), {})
            assert 'model="second"' in depths() and 'model="first"' not in depths()
        assert 'model="first"' in depths() and 'model="second"' not in depths()


async def test_a_second_start_changes_nothing_and_close_stops_every_periodic_check():
    """Dask starts a plugin a preload registered again when the scheduler starts."""
    async with running_queue() as plugin:
        checker, sampler = plugin._checker, plugin.scheduler.periodic_callbacks["shoal-metrics"]
        await plugin.start(plugin.scheduler)
        assert plugin._checker is checker and plugin.scheduler.periodic_callbacks["shoal-metrics"] is sampler
    assert checker is not None and not checker.is_running()


async def test_duplicate_job_rejected(plugin):
    plugin.batch.submit("j", items("m", 1), SPECS)
    with pytest.raises(ValueError, match="already exists"):
        plugin.batch.submit("j", items("m", 1), SPECS)


async def test_idle_worker_takes_back_an_item_not_yet_started(plugin):
    plugin.batch.submit("j", items("m", 2), SPECS)
    first, second = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    assert plugin.state.start("w1", first) is True
    assert (await plugin.batch.pull("w2", held=["m"], in_hand=1, timeout=0))["items"] == []  # busy: no take-back
    taken = (await plugin.batch.pull("w2", held=["m"], in_hand=0, timeout=0))["items"]
    assert [m["id"] for m in taken] == [second] and taken[0]["attempt"] == 1
    assert plugin.scheduler.revoked("w1") == [second]  # told one way, without a round trip per item
    assert plugin.state.start("w1", second) is False  # had it started meanwhile, the first ack would count
    assert plugin.state.start("w2", second) is True
    assert (await plugin.batch.pull("w1", in_hand=0, timeout=0))["items"] == []  # started items stay put


@pytest.mark.parametrize("rows, taken_back", [(1000, True), (10, False)])
async def test_a_worker_without_the_model_takes_back_only_what_its_holder_would_start_later(rows, taken_back, plugin):
    """Holder w1 computes an item (rows / 100 rows/s ahead); w2 would first load m (2 s)."""

    specs = {"models": {"m": spec("m", load_seconds=2.0).model_dump()}}
    plugin.batch.submit("j", items("m", 2, rows=rows), specs)
    first, second = [m["id"] for m in (await plugin.batch.pull("w1", held=["m"], room=2, timeout=0))["items"]]
    assert plugin.state.start("w1", first) is True
    taken = [m["id"] for m in (await plugin.batch.pull("w2", held=[], in_hand=0, timeout=0))["items"]]
    assert taken == ([second] if taken_back else [])


async def test_jobs_of_one_model_share_it_round_robin(plugin):
    plugin.batch.submit("big", items("m", 6), SPECS)
    plugin.batch.submit("small", items("m", 2), SPECS)
    reply = await plugin.batch.pull("w1", held=["m"], room=4, timeout=0)
    assert [m["job"] for m in reply["items"]] == ["big", "small", "big", "small"]


async def test_requirements_keep_gpu_models_off_cpu_workers():
    async with running_queue({"cpu": worker_state(), "gpu": worker_state(GPU=1)}) as plugin:
        specs = {
            "models": {
                "g": spec("g", requires={"GPU": 1}).model_dump(),
                "big": spec("big", memory_bytes=10**10).model_dump(),
            }
        }
        plugin.batch.submit("j", items("g", 1) + items("big", 1), specs)
        assert (await plugin.batch.pull("cpu", timeout=0, budget=10**9))["items"] == []
        assert [m["model"] for m in (await plugin.batch.pull("gpu", timeout=0, budget=10**9, in_hand=1))["items"]] == [
            "g"
        ]
        assert (await plugin.batch.pull("gpu", timeout=0, budget=10**9, in_hand=1))[
            "items"
        ] == []  # big fits nowhere yet
        assert [m["model"] for m in (await plugin.batch.pull("gpu", timeout=0, budget=10**11, in_hand=1))["items"]] == [
            "big"
        ]


async def test_stealing_only_when_the_backlog_outweighs_the_load(plugin):
    plugin.state.add_specs({"m": spec("m", load_seconds=5.0)}, "the test")
    plugin.state.placement.stats.record("m", 100, 1.0)  # 100 rows/s on a holder
    plugin.batch.submit("j", items("m", 2, rows=100), {})  # 200 rows: 2 s to drain on one holder
    await plugin.batch.pull("w1", held=["m"], timeout=0, in_hand=1)
    # w2 does not hold m; draining the rest takes 1 s on w1, loading takes 5 s: no steal
    assert (await plugin.batch.pull("w2", held=[], timeout=0, in_hand=1))["items"] == []
    plugin.batch.submit("k", items("m", 20, rows=100), {})  # now 21 s of backlog: worth a 5 s load
    assert (await plugin.batch.pull("w2", held=[], timeout=0, in_hand=1))["items"][0]["model"] == "m"


async def test_a_steal_takes_one_item_and_makes_the_thief_a_holder(plugin):
    plugin.batch.submit("j", items("m", 6), SPECS)
    first = await plugin.batch.pull("w1", held=[], timeout=0, room=2)
    assert len(first["items"]) == 1  # the model must load first; the rest stay for others
    assert "m" in plugin.state.views.views["w1"].held
    second = await plugin.batch.pull("w1", held=["m"], timeout=0, room=2)
    assert len(second["items"]) == 2  # now it holds m: a full pull
