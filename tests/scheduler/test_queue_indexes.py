"""The pull queue at cluster scale: new work wakes only its takers, and every index the
scheduler keeps stays equal to a recomputation from scratch."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.protocol import Lane
from shoal.scheduler_plugins.pull_queue import PullQueue
from shoal.scheduler_plugins.work_items import ItemState
from shoal.scheduler_plugins.worker_views import can_host
from tests.support.fake_scheduler import running_queue, spec, worker_state

SETTINGS = GatewaySettings(request_timeout_seconds=30, max_attempts=2)


def queue(workers: Iterable[str], models: Iterable[str] = ("m", "n")) -> AbstractAsyncContextManager[PullQueue]:
    """The queue on a fake scheduler of `workers`, serving simulated `models`; closed on exit."""
    return running_queue(workers, {m: spec(m) for m in models})


def items(model: str, n: int, rows: int = 10, prefix: str = "") -> list[dict]:
    return [
        {"key": f"{prefix}{model}-{i}", "model": model, "op": "embed", "rows": rows, "payload": {}} for i in range(n)
    ]


async def settle() -> None:
    """Let every woken pull run its pass: turns of the event loop, no time (counting them is the test)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def wakes_after(plugin: PullQueue, event: Callable[[], object]) -> int:
    """How many waiting pulls ran a pass of their loop because of `event`: each pass asks the scheduler's
    worker table once whether its worker is still there, and the fake's table counts the asks."""
    await settle()
    plugin.scheduler.workers.checks = 0
    event()
    await settle()
    return plugin.scheduler.workers.checks


WORKERS = [f"w{i}" for i in range(256)]


async def test_an_online_request_wakes_one_waiting_pull_whatever_the_number_of_workers():
    async with queue(WORKERS) as plugin:
        pulls = [asyncio.create_task(plugin.online.pull(w, held=["m"], loaded=["m"], timeout=30)) for w in WORKERS]
        woken = await wakes_after(plugin, lambda: plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS))
        assert woken <= 2, woken
        assert sum(1 for p in pulls if p.done() and p.result()["items"]) == 1
        for p in pulls:
            p.cancel()


async def test_a_batch_submit_of_k_items_wakes_at_most_k_batch_pulls():
    async with queue(WORKERS) as plugin:
        pulls = [asyncio.create_task(plugin.batch.pull(w, held=["m"], timeout=30, in_hand=1)) for w in WORKERS]
        woken = await wakes_after(plugin, lambda: plugin.batch.submit("j", items("m", 3), {}))
        assert woken <= 3, woken
        assert sum(len(p.result()["items"]) for p in pulls if p.done()) == 3
        for p in pulls:
            p.cancel()


async def test_a_batch_submit_wakes_holders_before_other_workers():
    async with queue(["holder", "other"]) as plugin:
        other = asyncio.create_task(plugin.batch.pull("other", held=["n"], timeout=30, in_hand=1))
        holder = asyncio.create_task(plugin.batch.pull("holder", held=["m"], timeout=30, in_hand=1))
        await settle()
        plugin.batch.submit("j", items("m", 1), {})
        await settle()
        assert holder.done() and [i["model"] for i in holder.result()["items"]] == ["m"]
        assert not other.done()
        other.cancel()


async def test_online_items_of_a_lost_worker_wake_a_waiting_online_pull_at_once():
    async with queue(["w1", "w2"]) as plugin:
        item, future = plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
        assert (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]
        survivor = asyncio.create_task(plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=30))
        await settle()
        del plugin.scheduler.workers["w1"]
        plugin.remove_worker(plugin.scheduler, "w1")
        await settle()
        assert survivor.done(), "the requeued request waited for the survivor's next pull timeout"
        assert [m["id"] for m in survivor.result()["items"]] == [item.id] and not future.done()


async def test_a_waiting_online_pull_of_a_worker_that_just_took_a_model_serves_its_requests():
    """A batch steal makes w1 a holder while its online pull waits: the request must reach it."""

    async with queue(["w1"]) as plugin:
        online = asyncio.create_task(plugin.online.pull("w1", held=[], loaded=[], timeout=30))
        await settle()
        plugin.batch.submit("j", items("m", 1), {})
        assert (await plugin.batch.pull("w1", held=[], timeout=0))["items"]  # a steal: w1 holds m now
        plugin.online.submit("m", "embed", {"texts": ["a"]}, 1, SETTINGS)
        await settle()
        assert online.done() and len(online.result()["items"]) == 1


# -- every index against a recomputation from scratch ------------------------------------

MODELS = ["a", "b", "c", "g"]
POOL = ["w0", "w1", "w2", "w3", "w4"]

step = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(MODELS), st.integers(1, 4), st.integers(1, 1500)),
    st.tuples(st.just("online"), st.sampled_from(MODELS)),
    st.tuples(
        st.just("pull"),
        st.sampled_from(POOL),
        st.lists(st.sampled_from(MODELS), max_size=3),
        st.lists(st.sampled_from(MODELS), max_size=3),
        st.integers(1, 3),
        st.integers(0, 2),
        st.sampled_from(MODELS),  # a model whose load the worker measured: faster or slower than the catalog's
        st.sampled_from([0.1, 1.0, 3.0]),
    ),
    st.tuples(
        st.just("pull_online"), st.sampled_from(POOL), st.lists(st.sampled_from(MODELS), max_size=3), st.booleans()
    ),
    st.tuples(st.just("start"), st.integers(0, 50)),
    st.tuples(st.just("ack"), st.integers(0, 50), st.floats(0.01, 2.0)),
    st.tuples(st.just("fail"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("expire"), st.integers(0, 50)),
    st.tuples(st.just("remove"), st.sampled_from(POOL)),
    st.tuples(st.just("rejoin"), st.sampled_from(POOL)),
    st.tuples(st.just("respec"), st.sampled_from(MODELS), st.sampled_from([0.0, 0.2, 1.0, 3.0])),  # 0: none given
)


def leased_items(plugin: PullQueue) -> list:
    return sorted((w for w in plugin.state.items.values() if w.state is ItemState.LEASED), key=lambda w: w.id)


def check_indexes(plugin: PullQueue) -> None:
    views = plugin.state.views
    assert views.holders == Counter(m for v in views.values() if not v.silent for m in v.held)
    assert views.loaded == Counter(m for v in views.values() for m in v.loaded)
    for model in MODELS:
        model_spec = plugin.state.model_specs[model]
        assert views.anyone_can_host(model_spec) == any(can_host(model_spec, v) for v in views.values())
    leased = leased_items(plugin)
    by_worker = defaultdict(set)
    for work in leased:
        by_worker[work.worker].add(work.id)
    assert {w: set(ids) for w, ids in plugin.state.leases.by_worker.items()} == dict(by_worker)
    placement = plugin.state.placement
    unstarted = defaultdict(set)
    ahead: dict[str, float] = defaultdict(float)
    for work in leased:
        if work.lane is Lane.BATCH and not work.started:
            unstarted[work.worker].add(work.id)
        elif work.started:
            ahead[work.worker] += work.expected_seconds
    take_backs = placement.take_backs
    assert {w: {i for group in models.values() for i in group} for w, models in take_backs.by_holder.items()} == dict(
        unstarted
    )
    groups = {(w.worker, w.model) for w in leased if w.id in unstarted[w.worker]}
    assert set(take_backs._waits) == groups and all(take_backs.by_holder[h][m] for h, m in groups)
    for worker, seconds in ahead.items():
        assert abs(placement._ahead.get(worker, 0.0) - seconds) < 1e-6
    longest: dict[str, float] = {}
    for (holder, model), (wait, order) in take_backs._waits.items():
        assert (-wait, order, holder) in take_backs._groups[model]  # its live entry is in its model's heap
        longest[model] = max(longest.get(model, wait), wait)
    for model, wait in longest.items():
        assert take_backs._tops[model][0] >= wait  # a model's key may overestimate its longest wait, never less
    for model in MODELS:
        for lane in Lane:
            queued = [
                w
                for w in plugin.state.items.values()
                if w.state is ItemState.QUEUED and w.model == model and w.lane is lane
            ]
            assert plugin.state.queues.waiting_items(model, lane) == len(queued)
            assert plugin.state.queues.waiting_rows(model, lane) == sum(w.rows for w in queued)
            assert (model in plugin.state.queues.models(lane)) == bool(queued)


def best_steal_gain(plugin: PullQueue, view) -> tuple[int, float] | None:
    """The old scan over every model: (unheld, gain) of the best steal, or None."""
    placement, queues = plugin.state.placement, plugin.state.queues
    best = None
    for model in queues.models(Lane.BATCH):
        if model in view.held or not can_host(plugin.state.model_specs[model], view):
            continue
        holders = plugin.state.views.holders.get(model, 0)
        if holders == 0:
            candidate = (1, float(queues.waiting_rows(model, Lane.BATCH)))
        else:
            drain = queues.waiting_rows(model, Lane.BATCH) / (placement.stats.rows_per_second(model) * holders)
            gain = drain - placement.steal_factor * placement.load_seconds(view, model)
            if gain <= 0:
                continue
            candidate = (0, gain)
        best = candidate if best is None or candidate > best else best
    return best


def best_take_back_gain(plugin: PullQueue, thief) -> float | None:
    """The old scan over every leased item of every worker."""
    placement = plugin.state.placement
    best = None
    for work in leased_items(plugin):
        if work.worker == thief.address or work.started or work.lane is not Lane.BATCH:
            continue
        if work.model not in thief.held and not can_host(plugin.state.model_specs[work.model], thief):
            continue
        holder = plugin.state.views.get(work.worker)
        on_holder = placement._ahead.get(work.worker, 0.0)
        if holder is not None and work.model not in holder.loaded:
            on_holder += placement.load_seconds(holder, work.model)
        on_thief = (
            0.0 if work.model in thief.loaded else placement.steal_factor * placement.load_seconds(thief, work.model)
        )
        gain = on_holder - on_thief
        if gain > 0 and (best is None or gain > best):
            best = gain
    return best


def check_choices(plugin: PullQueue) -> None:
    """Steal and take-back picks from the indexes are as good as the old scans' (equal gain)."""
    placement = plugin.state.placement
    for view in list(plugin.state.views.values()):
        expected = best_steal_gain(plugin, view)
        chosen = placement._steal(view)
        if expected is None:
            assert chosen is None
        else:
            assert chosen is not None, f"no steal where {expected} was best"
            holders = plugin.state.views.holders.get(chosen, 0)
            rows = plugin.state.queues.waiting_rows(chosen, Lane.BATCH)
            if expected[0] == 1:
                assert holders == 0 and rows == expected[1]
            else:
                drain = rows / (placement.stats.rows_per_second(chosen) * holders)
                gain = drain - placement.steal_factor * placement.load_seconds(view, chosen)
                assert abs(gain - expected[1]) < 1e-9
        expected_back = best_take_back_gain(plugin, view)
        taken = placement.take_back(view)
        if expected_back is None:
            assert taken is None
        else:
            assert taken is not None and taken.worker is not None  # taken back from its holder
            holder = plugin.state.views.get(taken.worker)
            on_holder = placement._ahead.get(taken.worker, 0.0)
            if holder is not None and taken.model not in holder.loaded:
                on_holder += placement.load_seconds(holder, taken.model)
            on_thief = 0.0 if taken.model in view.loaded else placement.load_seconds(view, taken.model)
            assert abs((on_holder - on_thief) - expected_back) < 1e-9


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=60))
async def test_indexes_equal_a_recomputation_after_any_sequence_of_events(steps):
    models = {
        "a": spec("a", load_seconds=2.0, memory_bytes=10**7),  # on every worker; g only on the two large ones
        "b": spec("b", load_seconds=0.5, memory_bytes=10**7),
        "c": spec("c", memory_bytes=10**7),
        "g": spec("g", requires={"GPU": 1}, memory_bytes=10**9),
    }
    workers = {w: worker_state(GPU=1) if w == "w0" else worker_state() for w in POOL}
    removed: dict[str, object] = {}
    answers = []  # the online requests' futures
    async with running_queue(workers, models) as plugin:
        scheduler = plugin.scheduler
        jobs = 0
        for op, *args in steps:
            leased = leased_items(plugin)
            if op == "submit":
                model, count, rows = args
                jobs += 1
                plugin.batch.submit(f"j{jobs}", items(model, count, rows), {"lease_seconds": 60})
            elif op == "online":
                answers.append(plugin.online.submit(args[0], "embed", {"texts": ["x"]}, 1, SETTINGS)[1])
            elif op == "pull":
                worker, held, loaded, room, in_hand, measured, seconds = args
                budget = 10**10 if worker in ("w0", "w1") else 10**8
                await plugin.batch.pull(
                    worker,
                    held=held,
                    loaded=[m for m in loaded if m in held],
                    room=room,
                    in_hand=in_hand,
                    timeout=0,
                    budget=budget,
                    load_seconds={measured: seconds},
                )
            elif op == "pull_online":
                worker, held, busy = args
                await plugin.online.pull(worker, held=held, loaded=held[:1], busy=busy, timeout=0)
            elif op == "start" and leased:
                work = leased[args[0] % len(leased)]
                plugin.state.start(work.worker, work.id)
            elif op == "ack" and leased:
                work = leased[args[0] % len(leased)]
                if work.lane is Lane.ONLINE:
                    plugin.online.ack_all(work.worker, [(work.id, {}, args[1])])
                else:
                    plugin.state.ack(work.worker, work.id, {"rows": work.rows, "compute_seconds": args[1]})
            elif op == "fail" and leased:
                work = leased[args[0] % len(leased)]
                plugin.state.fail(work.worker, work.id, "boom", permanent=args[1])
            elif op == "expire" and leased:
                work = leased[args[0] % len(leased)]
                work.deadline = 0.0
                plugin.state.leases._push(work)  # its lease ran out: the next check finds it
                plugin.state.leases.expire()
            elif op == "remove" and args[0] in scheduler.workers:
                removed[args[0]] = dict.pop(scheduler.workers, args[0])
                plugin.remove_worker(scheduler, args[0])
            elif op == "rejoin" and args[0] in removed:
                scheduler.workers[args[0]] = removed.pop(args[0])
            elif op == "respec":  # the catalog's load time changes: steal and take-back keys are built on it
                model, seconds = args
                plugin.state.add_specs(
                    {model: {**plugin.state.model_specs.fields[model], "load_seconds": seconds}}, "the test"
                )
            check_indexes(plugin)
            check_choices(plugin)
            check_indexes(plugin)
    for answer in answers:  # a failure left unread is an error on the test's event loop (anyio's runner)
        if answer.done() and not answer.cancelled():
            answer.exception()


async def test_an_idle_pull_touches_a_bounded_number_of_candidates_at_1024_workers_and_1000_models():
    """Items that compute for a while: each worker started one item of its model and leased one more;
    one more item of every model waits. An idle worker that once measured a fast load elsewhere finds
    nothing worth stealing (the holders drain faster than it loads) nor taking back (each item waits
    less on its holder than its load here). It must learn that from a few heap entries: a scan of
    every model or every leased item would make the tail of a large job cost O(cluster) per pull."""

    models = [f"m{i}" for i in range(1000)]
    workers = [f"w{i}" for i in range(1024)]
    specs = {m: spec(m, load_seconds=2.0) for m in models}
    async with running_queue([*workers, "idle"], specs) as plugin:
        plugin.batch.submit(
            "leased", [item for i, w in enumerate(workers) for item in items(models[i % 1000], 2, 100, w)], {}
        )
        for i, w in enumerate(workers):
            leased = (await plugin.batch.pull(w, held=[models[i % 1000]], room=2, timeout=0, in_hand=0))["items"]
            assert leased
            assert plugin.state.start(w, leased[0]["id"])
        plugin.batch.submit("waiting", [item for m in models for item in items(m, 1, 100, "waiting-")], {})
        for pull in range(3):
            before = plugin.state.placement.touched
            reply = await plugin.batch.pull("idle", held=[], timeout=0, in_hand=0, load_seconds={"elsewhere": 0.1})
            touched = plugin.state.placement.touched - before
            assert reply["items"] == [] and plugin.state.counts["taken_back"] == 0, pull
            assert touched <= 8, f"pull {pull} touched {touched} candidates"
        assert len(plugin.state.placement.take_backs.by_holder) >= 1000  # holders of candidates all along
        thief = plugin.state.views.get("idle")
        assert best_steal_gain(plugin, thief) is None and best_take_back_gain(plugin, thief) is None
        # With a model loaded it takes that model's waiting item, then one back: it starts at once here.
        assert [
            m["model"] for m in (await plugin.batch.pull("idle", held=["m500"], timeout=0, in_hand=0))["items"]
        ] == ["m500"]
        before = plugin.state.placement.touched
        reply = await plugin.batch.pull("idle", held=["m500"], timeout=0, in_hand=0)
        assert [m["model"] for m in reply["items"]] == ["m500"] and plugin.state.counts["taken_back"] == 1
        assert plugin.state.placement.touched - before <= 8


async def test_a_take_back_looks_past_models_the_thief_cannot_host_or_loads_slower_than_the_catalog_says():
    """Every candidate waits 4 s on its holder (4 items started ahead of it). The thief cannot host
    "big" and measured "slow" loading in 3 s (the catalog says 1 s): the item worth taking back is
    "far" (2 s to load here), found below the two models the catalog ranks higher."""

    models = {
        "run": spec("run"),
        "big": spec("big", requires={"GPU": 1}),
        "slow": spec("slow", load_seconds=1.0),
        "far": spec("far", load_seconds=2.0),
    }
    async with running_queue({"holder": worker_state(GPU=1), "thief": worker_state()}, models) as plugin:
        held = list(models)
        plugin.batch.submit("run", items("run", 4, rows=100), {})
        for message in (await plugin.batch.pull("holder", held=held, room=4, timeout=0))["items"]:
            assert plugin.state.start("holder", message["id"])
        plugin.batch.submit("wait", [*items("big", 1), *items("slow", 1), *items("far", 1)], {})
        for _ in range(3):
            assert len((await plugin.batch.pull("holder", held=held, room=1, timeout=0, in_hand=4))["items"]) == 1
        reply = await plugin.batch.pull("thief", held=[], timeout=0, in_hand=0, load_seconds={"slow": 3.0})
        assert [m["model"] for m in reply["items"]] == ["far"] and plugin.state.counts["taken_back"] == 1


async def test_a_steal_finds_a_model_the_thief_loads_faster_than_the_catalog_says():
    """Both models drain in 3 s on their holder. The catalog says "fast" loads in 4 s and "other" in 1 s,
    but the thief measured "fast" at 0.5 s: stealing it gains 2.5 s, "other" 2 s."""

    specs = {m: spec(m, load_seconds=s) for m, s in (("fast", 4.0), ("other", 1.0))}
    async with running_queue(["holder", "thief"], specs) as plugin:
        await plugin.batch.pull("holder", held=["fast", "other"], timeout=0)
        plugin.batch.submit("j", [*items("fast", 3, rows=100), *items("other", 3, rows=100)], {})
        reply = await plugin.batch.pull("thief", held=[], timeout=0, load_seconds={"fast": 0.5})
        assert [m["model"] for m in reply["items"]] == ["fast"]


async def test_a_gpu_only_model_is_judged_unplaceable_from_worker_capabilities():
    async with queue(["cpu"]) as plugin:
        plugin.batch.submit(
            "j", items("m", 1), {"models": {"m": spec("m", requires={"GPU": 1}).model_dump()}, "unplaceable_seconds": 0}
        )
        await plugin.batch.pull("cpu", held=[], timeout=0, in_hand=1)
        plugin.state.bury_unplaceable()
        status = plugin.batch.job_status("j")
        assert status["failed"] == 1 and "GPU=1" in status["dead_letters"][0]["errors"][0]
