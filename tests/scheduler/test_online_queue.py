"""The online path's parts without a cluster: queue items and futures, decoding limits,
API shapes, the device turns' priority, and the worker's group operations."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace

import msgpack
import numpy as np
import pytest

from shoal.configs import ConfigError, GatewaySettings, ModelSpec
from shoal.scheduler_plugins.gateway import api_formats as api
from shoal.scheduler_plugins.gateway.auth import BearerAuth
from shoal.scheduler_plugins.gateway.wire import JSON, MSGPACK, RequestError, decode, media_type, response_type
from shoal.scheduler_plugins.online_requests import OnlineFailure
from shoal.scheduler_plugins.pull_queue import PullQueue
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.batching.online_groups import OnlineGroups
from shoal.workers.model_pool import ModelPool
from shoal.workers.operations import online_operations
from shoal.workers.runtimes.sim_runtime import SimulatedRuntime
from shoal.workers.scheduler_stream import SchedulerStream
from tests.support.fake_scheduler import RecordingStream, running_queue, spec
from tests.support.waiting import async_wait_for, wait_for

LIMITS = GatewaySettings(max_inputs=4, max_input_chars=10)
SETTINGS = GatewaySettings(request_timeout_seconds=5, max_attempts=2, online_lease_seconds=5)  # nobody renews here


@pytest.fixture
async def plugin() -> AsyncIterator[PullQueue]:
    """The queue on a fake scheduler of workers w1 and w2, serving the simulated model "m"."""
    async with running_queue(models={"m": spec("m")}) as plugin:
        yield plugin


async def test_online_requests_are_pulled_together_and_acked_with_the_next_pull(plugin):
    submitted = [plugin.online.submit("m", "encode", {"texts": [f"t{i}"]}, 1, SETTINGS) for i in range(3)]
    reply = await plugin.online.pull("w1", held=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [item.id for item, _ in submitted]
    assert reply["models"] == {"m": spec("m").model_dump()}
    assert reply["items"][0]["lease_seconds"] == SETTINGS.online_lease_seconds  # short, renewed by the worker
    acks = [[m["id"], {"n": i}, 0.01] for i, m in enumerate(reply["items"])]
    assert (await plugin.online.pull("w1", held=["m"], timeout=0, acks=acks))["items"] == []
    for i, (_, future) in enumerate(submitted):
        result = future.result()
        assert result["n"] == i and result["timing"]["compute"] == 0.01 and result["timing"]["queue"] >= 0
    assert not any(i.startswith("online-") for i in plugin.items)  # forgotten once answered


async def test_an_online_pull_takes_at_most_the_models_max_batch_size_and_wakes_another_for_the_rest():
    async with running_queue(models={"m": spec("m", max_batch_size=3)}) as plugin:
        submitted = [plugin.online.submit("m", "encode", {"texts": [f"t{i}"]}, 1, SETTINGS)[0] for i in range(7)]
        taken = [(await plugin.online.pull(w, held=["m"], timeout=0))["items"] for w in ("w1", "w2", "w1")]
        assert [[m["id"] for m in group] for group in taken] == [
            [item.id for item in submitted[:3]],
            [item.id for item in submitted[3:6]],
            [submitted[6].id],
        ]


async def test_an_online_pull_takes_requests_of_at_most_a_batch_of_texts_but_always_one():
    async with running_queue(models={"m": spec("m", max_batch_size=4)}) as plugin:
        sizes = [1, 2, 1, 3, 6, 1]
        submitted = [plugin.online.submit("m", "encode", {"texts": ["t"] * n}, n, SETTINGS)[0].id for n in sizes]
        taken = [
            [m["id"] for m in (await plugin.online.pull(w, held=["m"], timeout=0))["items"]]
            for w in ("w1", "w2", "w1", "w2")
        ]
        # 1+2+1 texts; 3 (a fourth text would pass 4); 6 alone (larger than a batch: never left behind); 1
        assert taken == [submitted[:3], [submitted[3]], [submitted[4]], [submitted[5]]]


async def test_online_items_of_a_lost_worker_are_retried_then_fail_with_the_reason(plugin):
    item, future = plugin.online.submit("m", "encode", {"texts": ["x"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0)
    plugin.remove_worker(None, "w1")
    reply = await plugin.online.pull("w2", held=["m"], timeout=0)
    assert [m["id"] for m in reply["items"]] == [item.id] and not future.done()
    plugin.remove_worker(None, "w2")  # second and last attempt
    with pytest.raises(OnlineFailure, match="was lost"):
        future.result()


async def test_an_online_pull_of_an_unheld_model_makes_the_worker_its_holder(plugin):
    plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
    assert len((await plugin.online.pull("w1", held=[], timeout=0))["items"]) == 1
    assert "m" in plugin.worker_views["w1"].held  # loading it: w2 must not load it too
    plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w2", held=[], timeout=0))["items"] == []


async def test_a_cancelled_request_is_never_leased_and_its_late_ack_is_refused(plugin):
    queued, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
    plugin.online.cancel(queued)
    assert (await plugin.online.pull("w1", held=["m"], timeout=0))["items"] == []
    leased, _ = plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0)
    plugin.online.cancel(leased)
    assert plugin.online.ack("w1", leased.id, {}, 0.0) is False
    assert not plugin.leases.of_worker("w1")


async def test_online_pull_leaves_a_model_held_elsewhere_to_its_holder(plugin):
    plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
    await plugin.online.pull("w1", held=["m"], timeout=0.01)  # w1 registers as a holder, takes it
    plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)
    assert (await plugin.online.pull("w2", held=[], timeout=0))["items"] == []
    assert len((await plugin.online.pull("w1", held=["m"], timeout=0))["items"]) == 1


@pytest.mark.parametrize("loading_is_busy", [False, True])
async def test_a_request_goes_to_the_worker_with_its_model_loaded_not_one_still_loading_it(loading_is_busy, plugin):
    """Both hold m; w2 is still loading it. Even busy (one forward batch to wait), w1 answers sooner."""

    loaded = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], busy=True, timeout=1))
    await async_wait_for(lambda: len(plugin.online.pulls) == 1, what="w1's online pull waiting")
    item, _ = plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
    loading = await plugin.online.pull("w2", held=["m"], loaded=[], busy=loading_is_busy, timeout=0)
    assert loading["items"] == []
    assert [m["id"] for m in (await loaded)["items"]] == [item.id]


def test_msgpack_is_decoded_with_limits_and_without_extension_types():
    assert decode(msgpack.packb({"texts": ["a"]}), MSGPACK, 100) == {"texts": ["a"]}
    for body in (
        msgpack.packb(msgpack.ExtType(1, b"x")),
        msgpack.packb({"t": msgpack.Timestamp(1)}),
        msgpack.packb("x" * 200),
        b"\xc1",
        msgpack.packb([1]) + b"\x01",
    ):
        with pytest.raises(RequestError) as info:
            decode(body, MSGPACK, 100)
        assert info.value.status == 400 and "MessagePack" in info.value.message
    with pytest.raises(RequestError, match="not valid JSON"):
        decode(b"{nope", JSON, 100)


def test_media_types_and_negotiation():
    assert media_type("application/x-msgpack", JSON) == MSGPACK
    assert media_type("application/json; charset=utf-8", MSGPACK) == JSON
    assert media_type(None, MSGPACK) == MSGPACK and media_type("text/plain", JSON) is None
    assert response_type("application/json", MSGPACK) == JSON
    assert response_type("*/*", MSGPACK) == MSGPACK


def test_limits_truncate_or_refuse():
    call = api.encode_call("m", {"texts": ["0123456789abc"]}, LIMITS)
    assert call.texts == ["0123456789"]
    cases = [
        ({"texts": ["0123456789abc"], "truncate": False}, 422, "over the limit of 10"),
        ({"texts": ["a"] * 5}, 422, "at most 4"),
        ({"texts": []}, 422, "empty"),
        ({"texts": [1]}, 400, "texts.0"),
        ({"texts": ["a"], "dtype": "int8"}, 400, "dtype"),
        ({"texts": ["a"], "colour": 1}, 400, "colour"),
        (["a"], 400, "must be a map"),
    ]
    for body, status, message in cases:
        with pytest.raises(RequestError) as info:
            api.encode_call("m", body, LIMITS)
        assert info.value.status == status and message in info.value.message, body


def test_openai_and_cohere_shapes():
    body = api.openai_request({"model": "m", "input": "hi", "user": "ignored"})
    call = api.openai_call(body, body.texts(), LIMITS)
    assert call.texts == ["hi"] and body.encoding_format == "float" and body.token_arrays() is None
    assert api.openai_request({"model": "m", "input": [1, 2]}).token_arrays() == [[1, 2]]  # one array
    assert api.openai_request({"model": "m", "input": [[1], [2, 3]]}).token_arrays() == [[1], [2, 3]]
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    result = {"embeddings": vectors.tobytes(), "shape": [2, 3], "dtype": "float32", "tokens": 7}
    body = api.openai_request({"model": "m", "input": ["a", "b"], "encoding_format": "base64"})
    call = api.openai_call(body, body.texts(), LIMITS)
    reply = api.openai_response(call, body, result)
    import base64

    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in reply["data"]]
    assert np.array_equal(np.stack(decoded), vectors) and reply["usage"]["prompt_tokens"] == 7

    call, body = api.cohere_call(
        {"model": "r", "query": "q", "documents": ["a", {"text": "b"}, "c"], "top_n": 2, "return_documents": True},
        LIMITS,
    )
    reply = api.cohere_response(call, body, {"scores": [0.1, 0.9, 0.5]}, "2")
    assert [(r["index"], r["document"]["text"]) for r in reply["results"]] == [(1, "b"), (2, "c")]


def test_bearer_auth(tmp_path, monkeypatch):
    assert BearerAuth(None).allows(None)
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    auth = BearerAuth.from_settings(GatewaySettings(token_file=str(token_file)))
    assert auth.allows("Bearer s3cret") and auth.allows("bearer s3cret")
    assert not auth.allows(None) and not auth.allows("Bearer wrong") and not auth.allows("Basic s3cret")
    monkeypatch.setenv("MY_TOKEN", "abc")
    assert BearerAuth.from_settings(GatewaySettings(token_env="MY_TOKEN")).allows("Bearer abc")


def test_device_thread_runs_online_work_at_the_next_turn_before_waiting_batch_work():
    device, order = DeviceThread(), []
    first_turn = threading.Event()

    def batch(name: str, turns: int, hold: float = 0.0) -> None:
        for i in range(turns):
            with device.turn():
                order.append(f"{name} {i}")
                first_turn.set()
                time.sleep(hold)  # a forward batch's compute time, holding the device

    running = device.run(batch, "running", 3, 0.1)
    first_turn.wait()
    waiting = device.run(batch, "waiting", 1)
    online = device.run_online(lambda: order.append("online") or threading.get_ident())
    online_thread = online.result(timeout=5)
    running.result(timeout=5), waiting.result(timeout=5)
    assert order == ["running 0", "online", "running 1", "running 2", "waiting 0"]
    assert online_thread == device.run(threading.get_ident).result(timeout=5)  # one thread for every model call
    device.shutdown()


def test_device_thread_runs_online_work_at_once_when_idle_and_reports_its_errors():
    device = DeviceThread()
    assert device.run_online(lambda: 42).result(timeout=5) == 42
    with pytest.raises(ZeroDivisionError):
        device.run_online(lambda: 1 / 0).result(timeout=5)
    with device.turn():  # a turn off the device thread serves nothing and never blocks
        pass
    device.shutdown()


def test_online_call_waits_for_one_forward_batch_not_the_whole_item():
    """A batch item of 20 forward batches computes; an online group arriving meanwhile is answered before it ends."""
    device = TurnLog()
    spec = ModelSpec(name="s", kind="sim", dim=8, max_seq_length=16, batch_fixed_seconds=0.05, max_batch_size=1)
    runtime = SimulatedRuntime(spec, device_thread=device)
    item = device.run(runtime.embed, [f"row {i}" for i in range(20)])  # 20 batches of 50 ms
    wait_for(lambda: device.log, timeout=10, what="the item's first forward batch")
    payload = {"texts": ["query"], "truncate": True, "dtype": "float32"}
    answer = device.run_online(lambda: online_operations.encode(runtime, [payload])).result(timeout=5)
    answered_while_item_ran = not item.done()
    item.result(timeout=5)
    assert answer[0]["shape"] == [1, 8] and answered_while_item_ran
    device.shutdown()


class TurnLog(DeviceThread):
    """A device thread that logs whose each forward batch is; `online` is set by the first online one."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []
        self.online = threading.Event()

    @contextmanager
    def turn(self):
        with super().turn():
            serving = self._serving
            self.log.append("online" if serving else "batch")
            if serving:
                self.online.set()
            yield


async def test_a_request_arriving_during_an_online_round_runs_right_after_it_not_after_the_next_batch_turn():
    online_spec = ModelSpec(name="o", kind="sim", dim=8, max_seq_length=16, batch_fixed_seconds=0.1)
    batch_spec = ModelSpec(name="b", kind="sim", dim=8, max_seq_length=16, batch_fixed_seconds=0.05, max_batch_size=1)
    device = TurnLog()
    pool = ModelPool(10**9, lambda s: SimulatedRuntime(s, device_thread=device), ThreadPoolExecutor(1))
    with groups_on_a_recorded_stream(pool, device, {"o": online_spec}) as (groups, sent):
        await pool.pin(online_spec)
        batch = SimulatedRuntime(batch_spec, device_thread=device)
        item = asyncio.wrap_future(device.run(batch.embed, [f"row {i}" for i in range(8)]))  # 8 turns of 50 ms
        await async_wait_for(lambda: "batch" in device.log, what="the batch item's first turn")

        def request(name: str) -> dict:
            payload = {"texts": [name], "truncate": True, "dtype": "float32"}
            return {"id": name, "model": "o", "op": "encode", "payload": payload, "lease_seconds": 1.0}

        groups.add([request("A")])
        await asyncio.get_running_loop().run_in_executor(None, device.online.wait)
        groups.add([request("B")])  # while A's round computes (100 ms)
        await item
        kept: list[str] = []
        await async_wait_for(lambda: len(answered(groups, sent, kept)) == 2, what="A and B acked")
        acked = answered(groups, sent, kept)
    log = device.log
    assert acked == ["A", "B"]
    first = log.index("online")
    assert log.count("online") == 2 and log[first + 1] == "online"  # no batch turn between the two rounds
    assert "batch" in log[:first] and "batch" in log[first + 2 :]  # both came during the batch item


@contextmanager
def groups_on_a_recorded_stream(
    pool: ModelPool, device: DeviceThread, specs: dict[str, ModelSpec]
) -> Iterator[tuple[OnlineGroups, RecordingStream]]:
    """A worker's online groups whose event stream to the scheduler is recorded; on exit they are closed
    and the device thread shut down, whether the test passed or not."""
    sent = RecordingStream()
    groups = OnlineGroups("w", pool, device, specs, SchedulerStream(SimpleNamespace(batched_stream=sent), 0.25))
    try:
        yield groups, sent
    finally:
        groups.close()
        device.shutdown()


def answered(groups: OnlineGroups, sent: RecordingStream, kept: list[str]) -> list[str]:
    """Request ids acked so far: on the event stream, then those kept for the next online pull (into `kept`)."""
    kept.extend(ack[0] for ack in groups.take_acks())
    return [ack[0] for msg in sent.sent for ack in msg.get("online_acks", [])] + kept


def test_group_encode_gives_each_request_its_slice():
    spec = ModelSpec(name="s", kind="sim", dim=8, max_seq_length=16)
    runtime = SimulatedRuntime(spec)
    payloads = [
        {"texts": ["a", "b"], "truncate": True, "dtype": "float32"},
        {"texts": ["x" * 200], "truncate": False, "dtype": "float32"},  # 52 tokens > 16
        {"texts": ["c"], "truncate": True, "dtype": "float16"},
    ]
    first, refused, third = online_operations.encode(runtime, payloads)
    alone, _ = runtime.embed(["a", "b"])
    assert np.array_equal(np.frombuffer(first["embeddings"], "<f4").reshape(first["shape"]), alone)
    assert refused["status"] == 422 and "16 tokens" in refused["error"]
    assert third["dtype"] == "float16" and len(third["embeddings"]) == 8 * 2
    assert online_operations.score(runtime, payloads[:1])[0]["status"] == 501


async def test_a_gateways_models_are_validated_where_they_enter_and_a_bad_one_is_named(plugin):
    with pytest.raises(ConfigError, match=r"the gateway's models: model 'bad' has no valid spec: kind: Field required"):
        await plugin.gateway_start({"port": 0}, models={"bad": {"name": "bad", "dim": 8, "max_seq_length": 64}})
    with pytest.raises(ConfigError, match=r"a gateway's models: model 'bad' has no valid spec: dim: .*greater than 0"):
        plugin.online.remote_models({"bad": {**spec("bad").model_dump(), "dim": 0}})
    assert plugin.gateway is None and "bad" not in plugin.model_specs
    reply = plugin.online.remote_models({"n": spec("n").model_dump()})  # served with the queue's own
    assert set(reply["models"]) == {"m", "n"} and reply["models"]["n"] == spec("n").model_dump()


async def test_no_workers_and_shutting_down_are_503_with_retry_after():
    import aiohttp

    async with running_queue((), {"m": spec("m", dim=8)}) as plugin:
        url = (await plugin.gateway_start({"port": 0, "retry_after_seconds": 3}))["url"]
        assert "already serves" in (await plugin.gateway_start({"port": 0}))["error"]
        async with aiohttp.ClientSession() as session:
            body = msgpack.packb({"texts": ["a"]})
            headers = {"Content-Type": MSGPACK}
            async with session.post(f"{url}/v1/encode/m", data=body, headers=headers) as response:
                reply = msgpack.unpackb(await response.read())
                assert response.status == 503 and response.headers["Retry-After"] == "3"
                assert reply["error"]["message"] == "no workers are connected"
            async with session.get(f"{url}/readyz") as response:
                assert response.status == 503 and (await response.json())["workers"] == 0
            plugin.gateway.accepting = False  # what stop() does first
            async with session.post(f"{url}/v1/encode/m", data=body, headers=headers) as response:
                assert (
                    response.status == 503
                    and "shutting down" in msgpack.unpackb(await response.read())["error"]["message"]
                )
    assert plugin.gateway is None


async def test_a_busy_worker_leaves_online_requests_to_an_idle_one(plugin):
    idle = asyncio.create_task(plugin.online.pull("w2", held=["m"], timeout=1))
    busy = asyncio.create_task(plugin.online.pull("w1", held=["m"], timeout=1, busy=True))
    await async_wait_for(lambda: len(plugin.online.pulls) == 2, what="both online pulls waiting")
    plugin.online.submit("m", "encode", {"texts": ["a"]}, 1, SETTINGS)
    assert len((await idle)["items"]) == 1 and (await busy)["items"] == []
    plugin.online.submit("m", "encode", {"texts": ["b"]}, 1, SETTINGS)  # no idle puller now
    assert len((await plugin.online.pull("w1", held=["m"], timeout=0, busy=True))["items"]) == 1


class PoisonRuntime(SimulatedRuntime):
    """A simulated model that cannot compute the text "poison" (as a tokenizer bug would)."""

    def embed(self, texts, measured=None, prompt=None):
        if "poison" in texts:
            raise RuntimeError("cannot compute 'poison'")
        return super().embed(texts, measured, prompt)


async def test_a_request_whose_computation_raises_fails_alone_and_its_group_is_answered():
    spec = ModelSpec(name="p", kind="sim", dim=8, max_seq_length=16)
    acked: list[str] = []
    failed: list[list] = []
    device = DeviceThread()
    pool = ModelPool(10**9, lambda s: PoisonRuntime(s, device_thread=device), ThreadPoolExecutor(1))
    with groups_on_a_recorded_stream(pool, device, {"p": spec}) as (groups, sent):
        await pool.pin(spec)
        texts = ["a", "b", "poison", "c"]
        payload = lambda text: {"texts": [text], "truncate": True, "dtype": "float32"}  # noqa: E731
        groups.add(
            [{"id": t, "model": "p", "op": "encode", "payload": payload(t), "lease_seconds": 1.0} for t in texts]
        )

        kept: list[str] = []

        def everything_answered() -> bool:
            failed[:] = [f for msg in sent.sent for f in msg.get("failed", [])]
            acked[:] = answered(groups, sent, kept)
            return len(acked) + len(failed) == len(texts)

        await async_wait_for(everything_answered, what="every request answered")
    assert sorted(acked) == ["a", "b", "c"]
    assert failed == [("poison", "RuntimeError: cannot compute 'poison'", False)]


async def test_a_request_that_cannot_be_sent_is_refused_alone_with_a_400(plugin):
    backend = plugin.online.local_backend()
    pulled = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=5))
    await async_wait_for(lambda: len(plugin.online.pulls) == 1, what="w1's online pull waiting")
    poison = await backend.answer("m", "encode", {"texts": ["\ud800"]}, 1, 5, SETTINGS)
    assert poison["status"] == 400 and "cannot be sent" in poison["error"]
    legit = asyncio.create_task(backend.answer("m", "encode", {"texts": ["fine"]}, 1, 5, SETTINGS))
    reply = await pulled
    assert [m["payload"]["texts"] for m in reply["items"]] == [["fine"]]
    plugin.online.ack("w1", reply["items"][0]["id"], {"shape": [1, 8]}, 0.0)
    assert (await legit)["shape"] == [1, 8]


async def test_requests_on_a_worker_that_stops_renewing_move_to_another_within_their_short_lease(plugin):
    """A frozen worker (SIGSTOP, a hung driver) renews nothing: its requests go elsewhere, not at their deadline."""

    settings = GatewaySettings(request_timeout_seconds=30, online_lease_seconds=1.0)
    kept, _ = plugin.online.submit("m", "encode", {"texts": ["kept"]}, 1, settings)
    assert [m["id"] for m in (await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0))["items"]] == [
        kept.id
    ]
    for _ in range(6):  # 1.5 s of renewals, past the lease: a live worker keeps what it holds
        await asyncio.sleep(0.25)
        plugin.worker_events("w1", extend=[kept.id])
    assert kept.worker == "w1" and kept.attempts == 1
    moved, future = plugin.online.submit("m", "encode", {"texts": ["moved"]}, 1, settings)
    frozen = await plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=0)
    assert [m["id"] for m in frozen["items"]] == [moved.id]
    # w1 goes silent; the lease checker puts the request back and wakes w2's waiting pull
    reply = await plugin.online.pull("w2", held=["m"], loaded=["m"], timeout=10)
    assert (moved.id, 2) in [(m["id"], m["attempt"]) for m in reply["items"]]  # `kept` too, unrenewed now
    assert moved.id in plugin.scheduler.revoked("w1")
    await plugin.online.pull("w2", held=["m"], timeout=0, acks=[[moved.id, {"n": 1}, 0.0]])
    assert future.result()["n"] == 1
