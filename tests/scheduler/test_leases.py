"""Leases and their expiry, on a clock the test drives (no sleeps): their terms (leases.py), the grace for a
load whichever route leases the item, renewal, expiry, silent workers and the online rescue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.leases import FIRST_LOAD_GRACE_SECONDS, load_grace
from shoal.scheduler_plugins.pull_queue import PullQueue
from shoal.scheduler_plugins.work_items import ItemState
from shoal.scheduler_plugins.worker_views import WorkerView
from tests.support.clock import ManualClock
from tests.support.fake_scheduler import running_queue, spec

SETTINGS = GatewaySettings(request_timeout_seconds=30, online_lease_seconds=0.2)
MODELS = {"m": spec("m", load_seconds=1.0)}
SPECS = {"models": {"m": spec("m").model_dump()}}


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[PullQueue, ManualClock]]:
    """The queue on workers w1 and w2, its time kept by a clock the test drives."""
    clock = ManualClock()
    async with running_queue(("w1", "w2"), MODELS, clock=clock) as plugin:
        yield plugin, clock


async def settle() -> None:
    """Let the coroutines a timer woke run (loop passes, not time: the clock stands still)."""
    for _ in range(10):
        await asyncio.sleep(0)


def batch_items(n: int) -> list[dict]:
    return [{"key": f"i{i}", "model": "m", "op": "embed", "rows": 10, "payload": {"i": i}} for i in range(n)]


async def test_an_expired_lease_is_a_spent_attempt_then_a_dead_letter(clocked):
    plugin, clock = clocked
    plugin.batch.submit("j", batch_items(1), {**SPECS, "lease_seconds": 5, "max_attempts": 2})
    for attempt in (1, 2):
        (message,) = (await plugin.batch.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        assert message["attempt"] == attempt and message["lease_seconds"] == 5
        clock.advance(4.9)
        assert plugin.state.items[message["id"]].state is ItemState.LEASED
        clock.advance(0.2)  # past its deadline: the expiry timer fires on its own
        assert f"attempt {attempt}: lease on w1 expired" in plugin.state.items[message["id"]].errors[-1]
        plugin.worker_events("w1")  # it speaks again: takes work again
    status = plugin.batch.job_status("j")
    assert status["complete"] and status["failed"] == 1 and len(status["dead_letters"][0]["errors"]) == 2
    assert (await plugin.batch.pull("w1", timeout=0))["items"] == []


async def test_a_renewal_moves_the_deadline_on_and_an_id_not_held_is_revoked(clocked):
    plugin, clock = clocked
    plugin.batch.submit("j", batch_items(1), {**SPECS, "lease_seconds": 5})
    (message,) = (await plugin.batch.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    for _ in range(4):  # renewed every 4 s, it outlives its first deadline many times
        clock.advance(4.0)
        plugin.worker_events("w1", extend=[message["id"], "j/gone"])
    assert plugin.state.items[message["id"]].state is ItemState.LEASED and plugin.state.counts["expired"] == 0
    assert plugin.scheduler.revoked("w1") == ["j/gone"] * 4
    clock.advance(5.1)
    assert plugin.state.counts["expired"] == 1


async def test_a_batch_pull_leaves_online_requests_to_the_online_pulls(clocked):
    """Issue 45: a worker's online requests come by its online pull, sent whenever no round of its computes.
    A batch pull took them too, right after each round: a second round's worth beside the one the online pull
    took, so a one-text request waited for both (failed before: the batch pull leased the request)."""
    plugin, _ = clocked
    request, _ = plugin.online.submit("m", "embed", {"texts": ["x"]}, 1, SETTINGS)
    assert (await plugin.batch.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"] == []
    assert request.state is ItemState.QUEUED
    (message,) = (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    assert message["id"] == request.id and request.worker == "w1"


async def test_a_worker_that_must_load_the_model_gets_the_load_on_top_of_its_first_lease_only(clocked):
    plugin, clock = clocked
    first, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=[], loaded=[], timeout=0))["items"]
    clock.advance(0.5)  # past the 0.2 s lease, within the first load's grace on top of it
    assert first.worker == "w1" and first.attempts == 1
    plugin.state.leases.renew("w1", [first.id])  # a renewal keeps the grace, never shortens the lease
    assert first.deadline - first.leased_at == pytest.approx(0.2 + FIRST_LOAD_GRACE_SECONDS)

    second, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=0))["items"]
    clock.advance(0.35)  # loaded already: the short lease alone, and nobody renews it
    assert second.worker is None and "lease on w2 expired" in second.errors[0]


def test_the_grace_is_twice_the_load_the_worker_measured_and_none_when_it_has_the_model_loaded():
    view = WorkerView("w1", load_seconds={"m": 2.0, "fast": 0.0}, loaded={"l"})
    assert load_grace(view, "m") == 5.0 and load_grace(view, "n") == FIRST_LOAD_GRACE_SECONDS
    assert load_grace(view, "fast") == 1.0  # measured, under a millisecond: not the unmeasured 30 s
    assert load_grace(view, "l") == 0.0


async def test_a_worker_whose_lease_lapsed_takes_nothing_more_until_it_speaks_again(clocked):
    plugin, clock = clocked
    request, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    # w1 freezes, with an online pull it sent before (waiting here) and no renewal after.
    frozen_pull = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=1.5))
    await settle()
    clock.advance(0.3)  # the 0.2 s lease lapses
    await settle()
    assert plugin.state.views.views["w1"].silent and "lease on w1 expired" in request.errors[0]
    assert request.worker is None  # requeued, not leased again to the frozen worker's waiting pull
    reply = await plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [request.id]
    plugin.online.ack_all("w2", [(request.id, {"tokens": 1}, 0.01)])
    assert not frozen_pull.done()
    clock.advance(1.5)
    assert (await frozen_pull)["items"] == []

    plugin.worker_events("w1", extend=[])  # any message of its own: it is back
    assert not plugin.state.views.views["w1"].silent
    again, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"][0]["id"] == again.id


async def test_requests_of_a_silent_holder_go_to_a_worker_that_does_not_hold_the_model(clocked):
    """The frozen worker was the model's only holder: its requests, and those that come while it
    is silent, must not wait for it (they did until it thawed: chaos's p99 during freezes)."""
    plugin, clock = clocked
    leased, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=1.5))
    await settle()
    later, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    await settle()
    assert not other.done() and later.worker is None  # w1 still holds m: w2's pull is not woken
    clock.advance(0.3)  # w1's lease lapses: it is silent, and no longer m's holder
    await settle()
    assert plugin.state.views.views["w1"].silent and plugin.state.views.holders.get("m", 0) == 1  # w2 now
    assert sorted(m["id"] for m in (await other)["items"]) == sorted([leased.id, later.id])
    plugin.worker_events("w1", extend=[])  # back: a holder again, beside w2
    assert plugin.state.views.holders["m"] == 2


async def test_requests_of_a_holder_stopped_between_two_pulls_go_to_another_worker_after_a_lease(clocked):
    """Frozen after an answer and before its next pull, the sole holder has no lease to lapse and no
    pull to wake: its model's requests waited for it to thaw (or to be removed, minutes later)."""
    plugin, clock = clocked
    first, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    plugin.online.ack_all("w1", [(first.id, {"tokens": 1}, 0.01)])  # then w1 stops, no pull sent
    other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=2.0))
    await settle()
    later, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    clock.advance(0.19)
    await settle()
    assert not other.done() and later.worker is None  # within a lease its holder is waited for
    clock.advance(0.02)  # a lease (0.2 s) after it was queued, w2 takes it
    await settle()
    reply = other.result()
    assert [m["id"] for m in reply["items"]] == [later.id] and later.worker == "w2"
    assert not plugin.state.views.views["w1"].silent and plugin.state.views.holders["m"] == 2
    assert plugin.state.counts["rescued"] == 1


async def test_a_holder_that_pulls_within_a_lease_keeps_its_models_requests(clocked):
    plugin, clock = clocked
    first, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
    plugin.online.ack_all("w1", [(first.id, {"tokens": 1}, 0.01)])
    other = asyncio.create_task(plugin.online.pull("w2", held=[], loaded=[], timeout=0.6))
    await settle()
    later, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    clock.advance(0.1)  # busy with a group, say: its next pull comes within the lease
    reply = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [later.id]
    plugin.online.ack_all("w1", [(later.id, {"tokens": 1}, 0.01)])
    clock.advance(0.6)
    assert (await other)["items"] == []  # never woken: the rescue found nothing left to rescue
    assert plugin.state.views.holders["m"] == 1 and plugin.state.counts["rescued"] == 0
