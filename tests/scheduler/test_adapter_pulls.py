"""The scheduler's side of LoRA adapters (issue 42), without a cluster: one online pull takes the waiting
requests of a base's adapters (and of the base) together, a forward batch's worth, so the worker computes them in
one mixed call; an adapter nobody holds goes to a holder of its base; placement counts an adapter's load where
its base is loaded as milliseconds. The plugin is driven in-process (a fake scheduler of workers w1 and w2)."""

from __future__ import annotations

import asyncio

from shoal.configs import AdapterSpec, GatewaySettings, ModelSpec
from shoal.scheduler_plugins.model_queues import ModelQueues
from shoal.scheduler_plugins.placement import DEFAULT_ADAPTER_LOAD_SECONDS, DEFAULT_LOAD_SECONDS
from shoal.scheduler_plugins.protocol import Lane
from shoal.scheduler_plugins.work_items import WorkItem
from tests.support.fake_scheduler import running_queue, spec
from tests.support.waiting import async_wait_for

SETTINGS = GatewaySettings(request_timeout_seconds=5, max_attempts=2, online_lease_seconds=5)  # nobody renews here
BASE = spec("b", max_batch_size=6)


def adapter(name: str, base: ModelSpec = BASE) -> ModelSpec:
    return base.model_copy(
        update={"name": f"{base.name}+{name}", "adapter": AdapterSpec(base=base.name, name=name, source="/x")}
    )


FLEET = {"b": BASE, **{s.name: s for s in (adapter(f"a{i}") for i in range(4))}, "other": spec("other")}


async def test_one_online_pull_takes_the_requests_of_a_bases_adapters_together_up_to_a_batch():
    async with running_queue(models=FLEET) as plugin:
        asked = [f"b+a{i % 4}" for i in range(8)] + ["b", "other"]
        ids = {plugin.online.submit(model, "embed", {"texts": ["t"]}, 1, SETTINGS)[0].id: model for model in asked}
        first = await plugin.online.pull("w1", held=["b"], timeout=0)
        models = [m["model"] for m in first["items"]]
        assert len(models) == 6 and set(models) <= {"b", *(f"b+a{i}" for i in range(4))} and "other" not in models
        assert len(set(models)) >= 4  # several adapters in one group: one mixed forward on the worker
        assert set(first["models"]) == set(models)  # each model's spec comes with its requests
        rest = await plugin.online.pull("w1", held=["b", *models], timeout=0)
        second = [m["model"] for m in rest["items"]]
        assert sorted(models + second) == sorted(m for m in asked if m != "other")  # the family's, every one once
        other = await plugin.online.pull("w2", held=["other"], timeout=0)
        assert [ids[m["id"]] for m in other["items"]] == ["other"]


async def test_an_adapter_nobody_holds_goes_to_a_holder_of_its_base():
    async with running_queue(models=FLEET) as plugin:
        # w1 holds the base, w2 a model of its own; both wait with an online pull.
        pulls = {w: asyncio.create_task(plugin.online.pull(w, held=held, timeout=5)) for w, held in
                 (("w2", ["other"]), ("w1", ["b"]))}  # fmt: skip
        await async_wait_for(lambda: len(plugin.online.pulls) == 2, what="both pulls parked")
        plugin.online.submit("b+a3", "embed", {"texts": ["t"]}, 1, SETTINGS)
        done, _ = await asyncio.wait(pulls.values(), timeout=2, return_when=asyncio.FIRST_COMPLETED)
        assert [task for task in done] == [pulls["w1"]] and pulls["w1"].result()["items"][0]["model"] == "b+a3"
        pulls["w2"].cancel()


def test_placement_counts_an_adapters_load_as_milliseconds_where_its_base_is_loaded():
    from shoal.scheduler_plugins.placement import Placement
    from shoal.scheduler_plugins.worker_views import WorkerViews

    views = WorkerViews()
    placement = Placement(ModelQueues(), views, FLEET)
    with_base = views.report("w1", held=["b"], loaded=["b"], load_seconds={"b": 4.0})[0]
    without = views.report("w2", held=[], loaded=[], load_seconds={})[0]
    measured = views.report("w3", held=["b"], loaded=["b"], load_seconds={"b+a1": 0.004})[0]
    assert placement.load_seconds(with_base, "b+a0") == DEFAULT_ADAPTER_LOAD_SECONDS
    assert placement.load_seconds(without, "b+a0") == DEFAULT_ADAPTER_LOAD_SECONDS + DEFAULT_LOAD_SECONDS
    assert placement.load_seconds(measured, "b+a1") == 0.004  # as that worker measured it


def test_the_queue_takes_a_familys_items_in_one_take_and_keeps_its_counts():
    queues = ModelQueues(family=lambda model: model.partition("+")[0])
    items = [WorkItem(f"i{n}", "j", model, "embed", {}, Lane.ONLINE, rows=2) for n, model in enumerate(
        ["b+x", "b+y", "c", "b", "b+x", "b+z"])]  # fmt: skip
    for item in items:
        queues.push(item)
    taken = queues.take_family("b+x", Lane.ONLINE, limit=10, rows=7)  # 3 items of 2 rows fit
    assert [item.model for item in taken] == ["b+x", "b+x", "b+y"]
    assert queues.waiting_items("b+x", Lane.ONLINE) == 0 and queues.waiting_items("b+y", Lane.ONLINE) == 0
    rest = queues.take_family("b", Lane.ONLINE, limit=10)
    assert sorted(item.model for item in rest) == ["b", "b+z"] and queues.models(Lane.ONLINE) == ["c"]
