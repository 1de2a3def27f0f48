"""The online queue without a cluster: requests pulled in groups, leased, acked, retried and moved, on the
scheduler plugin driven in-process (a fake scheduler of workers w1 and w2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.online_requests import OnlineFailure
from shoal.scheduler_plugins.pull_queue import PullQueue
from tests.support.clock import ManualClock
from tests.support.fake_scheduler import running_queue, spec
from tests.support.waiting import async_wait_for

SETTINGS = GatewaySettings(request_timeout_seconds=5, max_attempts=2, online_lease_seconds=5)  # nobody renews here


@pytest.fixture
async def plugin() -> AsyncIterator[PullQueue]:
    """The queue on a fake scheduler of workers w1 and w2, serving the simulated model "m"."""
    async with running_queue(models={"m": spec("m")}) as plugin:
        yield plugin


async def test_online_requests_are_pulled_together_and_acked_with_the_next_pull(plugin):
    submitted = [plugin.online.submit("m", "embed", {"texts": [f"t{i}"]}, 1, SETTINGS) for i in range(3)]
    reply = await plugin.online.pull("w1", held=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [item.id for item, _ in submitted]
    assert reply["models"] == {"m": spec("m").model_dump()}
    assert reply["items"][0]["lease_seconds"] == SETTINGS.online_lease_seconds  # short, renewed by the worker
    acks = [[m["id"], {"n": i}, 0.01] for i, m in enumerate(reply["items"])]
    assert (await plugin.online.pull("w1", held=["m"], timeout=0, acks=acks))["items"] == []
    for i, (_, future) in enumerate(submitted):
        result = future.result()
        assert result["n"] == i and result["timing"]["compute"] == 0.01 and result["timing"]["queue"] >= 0
    assert not any(i.startswith("online-") for i in plugin.state.items)  # forgotten once answered


async def test_an_online_pull_takes_at_most_the_models_max_batch_size_and_wakes_another_for_the_rest():
    async with running_queue(models={"m": spec("m", max_batch_size=3)}) as plugin:
        submitted = [plugin.online.submit("m", "embed", {"texts": [f"t{i}"]}, 1, SETTINGS)[0] for i in range(7)]
        taken = [(await plugin.online.pull(w, held=["m"], timeout=0))["items"] for w in ("w1", "w2", "w1")]
        assert [[m["id"] for m in group] for group in taken] == [
            [item.id for item in submitted[:3]],
            [item.id for item in submitted[3:6]],
            [submitted[6].id],
        ]


async def test_the_parts_of_a_large_request_interleave_with_one_text_requests_instead_of_going_first():
    """Issue 45: fair shares across requests. Before, a large request's parts went first in a block."""
    async with running_queue(models={"m": spec("m", max_batch_size=4)}) as plugin:

        def ask(texts: int, flow: str | None = None) -> str:
            return plugin.online.submit("m", "embed", {"texts": ["t"] * texts}, texts, SETTINGS, flow)[0].id

        big = [ask(4, flow="big") for _ in range(5)]  # one request of 20 texts: five parts, one flow
        small = [ask(1) for _ in range(3)]

        async def pull() -> list[str]:
            return [m["id"] for m in (await plugin.online.pull("w1", held=["m"], timeout=0))["items"]]

        assert await pull() == small  # a forward batch's worth of the fewest-texts flows: the three one-texts
        assert await pull() == big[:1]
        later = ask(1)  # comes while the large request's parts wait: goes ahead of all but those due
        assert await pull() == [later]
        assert [await pull() for _ in range(4)] == [[part] for part in big[1:]]
        other = [ask(4, flow="other"), ask(4, flow="other")]  # a second large request shares with the first
        third = [ask(4, flow="third")]
        assert [await pull() for _ in range(3)] == [[other[0]], [third[0]], [other[1]]]


async def test_an_online_pull_takes_the_inputs_its_worker_computes_in_a_round():
    """Issue 45: a worker that measured its rounds says how many inputs one takes (`online_rows`); its pull
    leases no more (at least one request), and never more than the model's online batch."""
    async with running_queue(models={"m": spec("m", max_batch_size=8)}) as plugin:
        submitted = [plugin.online.submit("m", "embed", {"texts": ["t"]}, 1, SETTINGS)[0].id for _ in range(20)]

        async def pull(rows: dict[str, int] | None) -> list[str]:
            reply = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0, online_rows=rows)
            return [m["id"] for m in reply["items"]]

        assert await pull({"m": 3}) == submitted[:3]
        assert await pull({"m": 100}) == submitted[3:11]  # the online batch caps it
        assert await pull(None) == submitted[11:19]  # nothing said: the last it said (100), capped again
        assert await pull({"m": 0}) == submitted[19:]  # always one


async def test_a_full_queue_refuses_new_requests_not_the_later_parts_of_one_let_in(plugin):
    """A 2,048-input request is 256 parts of 8: refused 429 at its 200th part, its first 199 were computed for
    nothing. The depth is checked for a request as it comes (its first part)."""
    settings = GatewaySettings(max_queue_depth=2)
    first = plugin.online.refusal("m", settings, {"texts": ["a"], "first_input": 0})
    assert first is None
    for i in range(3):
        plugin.online.submit("m", "embed", {"texts": ["t"], "first_input": i}, 1, settings, "big")
    assert plugin.online.refusal("m", settings, {"texts": ["t"], "first_input": 3}) is None  # its request: let in
    refused = plugin.online.refusal("m", settings, {"texts": ["t"]})  # a new request
    assert refused is not None and refused["status"] == 429
    assert plugin.online.refusal("m", settings, {"texts": ["t"], "first_input": 0})["status"] == 429  # a new one


async def test_an_online_pull_takes_requests_of_at_most_a_batch_of_texts_but_always_one():
    async with running_queue(models={"m": spec("m", max_batch_size=4)}) as plugin:
        sizes = [1, 2, 1, 3, 6, 1]
        submitted = [plugin.online.submit("m", "embed", {"texts": ["t"] * n}, n, SETTINGS)[0].id for n in sizes]
        taken = [
            [m["id"] for m in (await plugin.online.pull(w, held=["m"], timeout=0))["items"]]
            for w in ("w1", "w2", "w1", "w2")
        ]
        # Fair shares: the fewest texts first (1+1+1: the 2 would pass 4); 2 (the 3 would pass 4); 3; 6 alone
        # (larger than a batch: never left behind).
        one, two, three, six = [submitted[i] for i in (0, 2, 5)], [submitted[1]], [submitted[3]], [submitted[4]]
        assert taken == [one, two, three, six]


async def test_online_items_of_a_lost_worker_are_retried_then_fail_with_the_reason(plugin):
    item, future = plugin.online.submit("m", "embed", {"texts": ["x"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0)
    plugin.remove_worker(None, "w1")
    reply = await plugin.online.pull("w2", held=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [item.id] and not future.done()
    plugin.remove_worker(None, "w2")  # second and last attempt
    with pytest.raises(OnlineFailure, match="was lost"):
        future.result()


async def test_an_online_pull_of_an_unheld_model_makes_the_worker_its_holder(plugin):
    plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert len((await plugin.online.pull("w1", held=[], timeout=0))["items"]) == 1
    assert "m" in plugin.state.views.views["w1"].held  # loading it: w2 must not load it too
    plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w2", held=[], timeout=0))["items"] == []


async def test_a_cancelled_request_is_never_leased_and_its_late_ack_is_refused(plugin):
    queued, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    plugin.online.cancel(queued)
    assert (await plugin.online.pull("w1", held=["m"], timeout=0))["items"] == []
    leased, _ = plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0)
    plugin.online.cancel(leased)
    plugin.online.ack_all("w1", [(leased.id, {}, 0.0)])
    assert plugin.state.counts["acked"] == 0  # refused
    assert not plugin.state.leases.of_worker("w1")


async def test_online_pull_leaves_a_model_held_elsewhere_to_its_holder(plugin):
    plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0.01)  # w1 registers as a holder, takes it
    plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w2", held=[], timeout=0))["items"] == []
    assert len((await plugin.online.pull("w1", held=["m"], timeout=0))["items"]) == 1


@pytest.mark.parametrize("loading_is_busy", [False, True])
async def test_a_request_goes_to_the_worker_with_its_model_loaded_not_one_still_loading_it(loading_is_busy, plugin):
    """Both hold m; w2 is still loading it. Even busy (one forward batch to wait), w1 answers sooner."""

    loaded = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], busy=True, timeout=1))
    await async_wait_for(lambda: len(plugin.online.pulls) == 1, what="w1's online pull waiting")
    item, _ = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    loading = await plugin.online.pull("w2", held=["m"], loaded=[], busy=loading_is_busy, timeout=0)
    assert loading["items"] == []
    assert [m["id"] for m in (await loaded)["items"]] == [item.id]


async def test_a_busy_worker_leaves_online_requests_to_an_idle_one(plugin):
    idle = asyncio.create_task(plugin.online.pull("w2", held=["m"], timeout=1))
    busy = asyncio.create_task(plugin.online.pull("w1", held=["m"], timeout=1, busy=True))
    await async_wait_for(lambda: len(plugin.online.pulls) == 2, what="both online pulls waiting")
    plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
    assert len((await idle)["items"]) == 1 and (await busy)["items"] == []
    plugin.online.submit("m", "embed", {"texts": ["b"]}, 1, SETTINGS)  # no idle puller now
    assert len((await plugin.online.pull("w1", held=["m"], timeout=0, busy=True))["items"]) == 1


async def test_requests_on_a_worker_that_stops_renewing_move_to_another_within_their_short_lease():
    """A frozen worker (SIGSTOP, a hung driver) renews nothing: its requests go elsewhere, not at their deadline."""

    settings = GatewaySettings(request_timeout_seconds=30, online_lease_seconds=1.0)
    clock = ManualClock()
    async with running_queue(models={"m": spec("m")}, clock=clock) as plugin:
        kept, _ = plugin.online.submit("m", "embed", {"texts": ["kept"]}, 1, settings)
        first = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0)
        assert [m["id"] for m in first["items"]] == [kept.id]
        for _ in range(6):  # 1.5 s of renewals, past the lease: a live worker keeps what it holds
            clock.advance(0.25)
            plugin.worker_events("w1", extend=[kept.id])
        assert kept.worker == "w1" and kept.attempts == 1
        moved, future = plugin.online.submit("m", "embed", {"texts": ["moved"]}, 1, settings)
        frozen = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0)
        assert [m["id"] for m in frozen["items"]] == [moved.id]
        # w1 goes silent; the lease checker puts the request back and wakes w2's waiting pull
        waiting = asyncio.create_task(plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=10))
        await async_wait_for(lambda: len(plugin.online.pulls) == 1, what="w2's online pull waiting")
        clock.advance(1.2)  # past the lease (and CHECK_SECONDS), well before the request's 30 s deadline
        reply = await waiting
        assert (moved.id, 2) in [(m["id"], m["attempt"]) for m in reply["items"]]  # `kept` too, unrenewed now
        assert moved.id in plugin.scheduler.revoked("w1")
        await plugin.online.pull("w2", held=["m"], timeout=0, acks=[[moved.id, {"n": 1}, 0.0]])
        assert future.result()["n"] == 1
