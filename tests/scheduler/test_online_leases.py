"""Online leases: short, so a frozen worker's requests move on; long enough for a model load first."""

from __future__ import annotations

import asyncio

import pytest

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.online_queue import FIRST_LOAD_GRACE_SECONDS, load_grace
from shoal.scheduler_plugins.worker_views import WorkerView
from tests.support.fake_scheduler import running_queue, spec

SETTINGS = GatewaySettings(request_timeout_seconds=30, online_lease_seconds=0.2)
MODELS = {"m": spec("m", load_seconds=1.0)}


async def test_a_worker_that_must_load_the_model_gets_the_load_on_top_of_its_first_lease_only():
    async with running_queue(("w1", "w2"), MODELS) as plugin:
        first, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=[], loaded=[], timeout=0))["items"]
        await asyncio.sleep(0.5)  # past the 0.2 s lease, within the first load's grace on top of it
        plugin.expire_leases()
        assert first.worker == "w1" and first.attempts == 1
        plugin.extend("w1", [first.id])  # a renewal keeps the grace, never shortens the lease
        assert first.deadline - first.leased_at == pytest.approx(0.2 + FIRST_LOAD_GRACE_SECONDS)

        second, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=0))["items"]
        await asyncio.sleep(0.35)  # loaded already: the short lease alone, and nobody renews it
        plugin.expire_leases()
        assert second.worker is None and "lease on w2 expired" in second.errors[0]


def test_the_grace_is_twice_the_load_the_worker_measured():
    view = WorkerView("w1", load_seconds={"m": 2.0, "fast": 0.0})
    assert load_grace(view, "m") == 5.0 and load_grace(view, "n") == FIRST_LOAD_GRACE_SECONDS
    assert load_grace(view, "fast") == 1.0  # measured, under a millisecond: not the unmeasured 30 s


async def test_a_worker_whose_lease_lapsed_takes_nothing_more_until_it_speaks_again():
    async with running_queue(("w1", "w2"), MODELS) as plugin:
        request, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        # w1 freezes, with an online pull it sent before (waiting here) and no renewal after.
        frozen_pull = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=1.5))
        await asyncio.sleep(0.45)  # the 0.2 s lease lapses; the lease checker runs every 100 ms
        assert plugin.views.views["w1"].silent and "lease on w1 expired" in request.errors[0]
        assert request.worker is None  # requeued, not leased again to the frozen worker's waiting pull
        reply = await plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=0)
        assert [m["id"] for m in reply["items"]] == [request.id]
        assert plugin.online.ack("w2", request.id, {"tokens": 1}, 0.01)
        assert (await frozen_pull)["items"] == []

        plugin.worker_events("w1", extend=[])  # any message of its own: it is back
        assert not plugin.views.views["w1"].silent
        again, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"][0]["id"] == again.id


async def test_requests_of_a_silent_holder_go_to_a_worker_that_does_not_hold_the_model():
    """The frozen worker was the model's only holder: its requests, and those that come while it
    is silent, must not wait for it (they did until it thawed: chaos's p99 during freezes)."""
    async with running_queue(("w1", "w2"), MODELS) as plugin:
        leased, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=1.5))
        await asyncio.sleep(0.05)
        later, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
        await asyncio.sleep(0.05)
        assert not other.done() and later.worker is None  # w1 still holds m: w2's pull is not woken
        await asyncio.sleep(0.4)  # w1's lease lapses: it is silent, and no longer m's holder
        assert plugin.views.views["w1"].silent and plugin.views.holders.get("m", 0) == 1  # w2 now
        assert sorted(m["id"] for m in (await other)["items"]) == sorted([leased.id, later.id])

        plugin.worker_events("w1", extend=[])  # back: a holder again, beside w2
        assert plugin.views.holders["m"] == 2


async def test_requests_of_a_holder_stopped_between_two_pulls_go_to_another_worker_after_a_lease():
    """Frozen after an answer and before its next pull, the sole holder has no lease to lapse and no
    pull to wake: its model's requests waited for it to thaw (or to be removed, minutes later)."""
    async with running_queue(("w1", "w2"), MODELS) as plugin:
        first, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        assert plugin.online.ack("w1", first.id, {"tokens": 1}, 0.01)  # then w1 stops, no pull sent
        other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=2.0))
        await asyncio.sleep(0.05)
        later, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
        await asyncio.sleep(0.1)
        assert not other.done() and later.worker is None  # within a lease its holder is waited for
        reply = await asyncio.wait_for(other, 1.0)  # a lease (0.2 s) after it was queued, w2 takes it
        assert [m["id"] for m in reply["items"]] == [later.id] and later.worker == "w2"
        assert not plugin.views.views["w1"].silent and plugin.views.holders["m"] == 2
        assert plugin.events["rescued"] == 1


async def test_a_holder_that_pulls_within_a_lease_keeps_its_models_requests():
    async with running_queue(("w1", "w2"), MODELS) as plugin:
        first, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        assert plugin.online.ack("w1", first.id, {"tokens": 1}, 0.01)
        other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=0.6))
        await asyncio.sleep(0.05)
        later, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
        await asyncio.sleep(0.1)  # busy with a group, say: its next pull comes within the lease
        reply = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0)
        assert [m["id"] for m in reply["items"]] == [later.id]
        assert plugin.online.ack("w1", later.id, {"tokens": 1}, 0.01)
        assert (await other)["items"] == []  # never woken: the rescue found nothing left to rescue
        assert plugin.views.holders["m"] == 1 and plugin.events["rescued"] == 0
