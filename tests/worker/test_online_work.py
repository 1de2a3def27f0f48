"""A worker's online work without a cluster: the device thread's turns (online before waiting batch work), and
the groups of requests a worker computes and answers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest

from shoal.configs import ModelSpec
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.batching.online_groups import OnlineGroups
from shoal.workers.batching.round_sizes import RoundSizes
from shoal.workers.model_pool import ModelPool
from shoal.workers.operations import embed_operation, rerank_operation
from shoal.workers.runtimes.sim_runtime import SimulatedRuntime
from shoal.workers.scheduler_stream import SchedulerStream
from tests.support.fake_scheduler import RecordingStream
from tests.support.waiting import async_wait_for, wait_for


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
    answer = device.run_online(lambda: embed_operation.online(runtime, [payload])).result(timeout=5)
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
            return {"id": name, "model": "o", "op": "embed", "payload": payload, "lease_seconds": 1.0}

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
    stream = SchedulerStream(SimpleNamespace(batched_stream=sent), 0.25)
    groups = OnlineGroups("w", pool, device, specs, stream, RoundSizes(0.25))
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
    first, refused, third = embed_operation.online(runtime, payloads)
    alone, _ = runtime.embed(["a", "b"])
    assert np.array_equal(np.frombuffer(first["embeddings"], "<f4").reshape(first["shape"]), alone)
    assert refused["status"] == 422 and "16 tokens" in refused["error"]
    assert third["dtype"] == "float16" and len(third["embeddings"]) == 8 * 2
    assert rerank_operation.online(runtime, payloads[:1])[0]["status"] == 501


class PoisonRuntime(SimulatedRuntime):
    """A simulated model that cannot compute the text "poison" (as a tokenizer bug would)."""

    def embed(self, texts, measured=None, prompt=None, adapters=None):
        if "poison" in texts:
            raise RuntimeError("cannot compute 'poison'")
        return super().embed(texts, measured, prompt, adapters)


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
        groups.add([{"id": t, "model": "p", "op": "embed", "payload": payload(t), "lease_seconds": 1.0} for t in texts])

        kept: list[str] = []

        def everything_answered() -> bool:
            failed[:] = [f for msg in sent.sent for f in msg.get("failed", [])]
            acked[:] = answered(groups, sent, kept)
            return len(acked) + len(failed) == len(texts)

        await async_wait_for(everything_answered, what="every request answered")
    assert sorted(acked) == ["a", "b", "c"]
    assert failed == [("poison", "RuntimeError: cannot compute 'poison'", False)]


def test_round_sizes_converge_on_the_inputs_one_round_computes_in_its_time():
    """Issue 45: a round of a + b x n seconds (a fixed cost, b per input): the size asked settles where the round
    takes its time, from above (the online batch) or below (a lone query's round) alike."""
    fixed, per_input, seconds = 0.02, 0.005, 0.25
    for first in (512, 1):
        sizes = RoundSizes(seconds)
        rows = first
        for _ in range(40):
            sizes.measured("m", rows, fixed + per_input * rows)
            rows = sizes.rows()["m"]
        assert rows == pytest.approx((seconds - fixed) / per_input, abs=1)  # 46 inputs: 0.25 s
    sizes.measured("m", 1, fixed + per_input)  # a lone query among them
    assert sizes.rows()["m"] == pytest.approx(46, abs=1)
    assert "m" not in RoundSizes(seconds).rows()  # nothing measured: not named (its first round: the online batch)


def test_a_model_whose_call_alone_outlasts_the_round_time_is_not_cut_to_one_input_a_round():
    """A call's own cost of 0.4 s (a large model's, or a simulated one's) makes any round longer than 0.25 s;
    rounds of one input would only make requests wait in line for it, each paying it (failed before: one)."""
    sizes = RoundSizes(0.25)
    sizes.measured("fixed", 1, 0.4)
    assert sizes.rows() == {"fixed": 2}  # two at least: a second size tells the call's cost from an input's
    sizes.measured("fixed", 2, 0.4)
    assert sizes.rows()["fixed"] >= 512  # its time does not grow with its inputs
    slow = RoundSizes(0.25)
    for inputs in (1, 2, 1):
        slow.measured("slow", inputs, 3.0 * inputs)  # 3 s an input: the least a round takes
    assert slow.rows() == {"slow": 2}
    held = RoundSizes(0.25)
    for inputs, seconds in ((1, 0.2), (1, 0.2), (2, 0.4)):  # a 0.2 s call, one round slowed by another's turn
        held.measured("held", inputs, seconds)
    assert held.rows() == {"held": 2}  # not one a round: a burst waited in line (test_worker_loss, failed before)
    for _ in range(3):
        held.measured("held", 2, 0.2)
    assert held.rows()["held"] > 2  # the rounds of two tell its cost apart
    both = RoundSizes(0.25)
    for inputs in (1, 8, 4):
        both.measured("both", inputs, 0.4 + 0.01 * inputs)  # 0.4 s a call: the inputs may take as long again
    assert both.rows()["both"] == pytest.approx(40, abs=1)


async def test_an_online_round_measures_its_rate_for_the_next_pulls():
    spec = ModelSpec(name="r", kind="sim", dim=8, max_seq_length=16, per_token_seconds=0.001)
    device = DeviceThread()
    pool = ModelPool(10**9, lambda s: SimulatedRuntime(s, device_thread=device), ThreadPoolExecutor(1))
    with groups_on_a_recorded_stream(pool, device, {"r": spec}) as (groups, sent):
        await pool.pin(spec)
        payload = {"texts": ["a few words"] * 10, "truncate": True, "dtype": "float32"}
        groups.add([{"id": "x", "model": "r", "op": "embed", "payload": payload, "rows": 10, "lease_seconds": 1.0}])
        kept: list[str] = []
        await async_wait_for(lambda: answered(groups, sent, kept) == ["x"], what="the request answered")
        rows = groups.sizes.rows()["r"]
    # Ten inputs of a few tokens each (padded alike) at 1 ms a token: about 0.25 s / (tokens x 1 ms) inputs.
    (tokens,), _ = SimulatedRuntime(spec).token_lengths(["a few words"])
    assert rows == pytest.approx(0.25 / (tokens * 0.001), rel=0.3)
