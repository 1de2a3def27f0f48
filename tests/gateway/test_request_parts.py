"""Large online requests as parts (scheduler_plugins/request_parts.py), their deadline, and OpenAI token arrays
read as cl100k_base (scheduler_plugins/token_arrays.py): without a cluster (the real clients against a served
cluster are tests/gateway/test_clients.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.gateway import request_parts, token_arrays
from shoal.scheduler_plugins.gateway.wire import RequestError
from tests.support.fake_scheduler import running_queue, spec
from tests.support.waiting import async_wait_for

# OpenAI's published SHA-256 of cl100k_base.tiktoken (tiktoken_ext/openai_public.py checks a download against it).
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def vectors_of(texts: list[str]) -> np.ndarray:
    """A fake worker's vectors: text "t7" gives a row of 7s."""
    return np.array([[float(t[1:])] * 8 for t in texts], dtype="<f4")


def encoded(texts: list[str], tokens: int = 1) -> dict:
    vectors = vectors_of(texts)
    return {"embeddings": vectors.tobytes(), "shape": list(vectors.shape), "dtype": "float32", "tokens": tokens}


def test_a_payload_splits_in_order_and_the_answers_join_in_order():
    texts = [f"t{i}" for i in range(2048)]
    parts = request_parts.split({"texts": texts, "truncate": False, "dim": 4}, 256)
    assert len(parts) == 8 and [p["texts"] for p in parts] == [texts[i : i + 256] for i in range(0, 2048, 256)]
    assert all(p["truncate"] is False and p["dim"] == 4 for p in parts)
    assert [p["first_input"] for p in parts] == list(range(0, 2048, 256))  # a worker's error names the input
    assert request_parts.split({"query": "q", "documents": ["a", "b", "c"]}, 2) == [
        {"query": "q", "documents": ["a", "b"], "first_input": 0},
        {"query": "q", "documents": ["c"], "first_input": 2},
    ]
    small = {"texts": ["t1"]}
    assert request_parts.split(small, 256)[0] is small

    answers = [{**encoded(p["texts"], tokens=3), "timing": {"queue": i, "compute": 1.0}} for i, p in enumerate(parts)]
    joined = request_parts.join(answers)
    matrix = np.frombuffer(joined["embeddings"], "<f4").reshape(joined["shape"])
    assert np.array_equal(matrix, vectors_of(texts)) and joined["tokens"] == 24
    assert joined["timing"] == {"queue": 7, "compute": 1.0}  # the slowest part's
    scores = request_parts.join([{"scores": [0.1, 0.2], "tokens": 1}, {"scores": [0.3], "tokens": 2}])
    assert scores == {"scores": [0.1, 0.2, 0.3], "tokens": 3}


async def test_a_failed_part_is_the_answer_and_the_parts_still_waiting_are_withdrawn():
    started: list[list[str]] = []
    withdrawn: list[list[str]] = []
    release = asyncio.Event()

    async def answer(part, inputs, flow):
        started.append(part["texts"])
        if part["texts"][0] == "t2":
            return {"status": 422, "error": "too long"}
        try:
            await release.wait()
        except asyncio.CancelledError:
            withdrawn.append(part["texts"])
            raise
        return encoded(part["texts"])

    result = await request_parts.answer_in_parts(answer, {"texts": [f"t{i}" for i in range(5)]}, 2)
    assert result == {"status": 422, "error": "too long"}
    assert started == [["t0", "t1"], ["t2", "t3"], ["t4"]]  # queued in input order
    await async_wait_for(lambda: len(withdrawn) == 2, what="the other parts cancelled")
    assert sorted(withdrawn) == [["t0", "t1"], ["t4"]]


async def test_a_request_holds_at_most_its_inputs_in_flight_and_its_parts_share_one_flow():
    asked: list[tuple[list[str], str | None]] = []
    in_flight, most = 0, 0
    release = asyncio.Event()

    async def answer(part, inputs, flow):
        nonlocal in_flight, most
        asked.append((part["texts"], flow))
        in_flight += inputs
        most = max(most, in_flight)
        await release.wait()
        in_flight -= inputs
        return encoded(part["texts"])

    texts = [f"t{i}" for i in range(10)]
    request = asyncio.create_task(request_parts.answer_in_parts(answer, {"texts": texts}, 2, in_flight=5))
    await async_wait_for(lambda: len(asked) == 2, what="two parts asked")
    await asyncio.sleep(0.01)
    assert len(asked) == 2  # 5 inputs in flight at most: two parts of 2, the third waits in the gateway
    release.set()
    result = await request
    assert np.array_equal(np.frombuffer(result["embeddings"], "<f4").reshape(result["shape"]), vectors_of(texts))
    assert [part for part, _ in asked] == [texts[i : i + 2] for i in range(0, 10, 2)] and most <= 5
    flows = {flow for _, flow in asked}
    assert len(flows) == 1 and None not in flows  # one request, one fair share in the queue
    assert await request_parts.answer_in_parts(answer, {"texts": ["t1"]}, 2) == encoded(["t1"])
    assert asked[-1][1] is None  # a request in one part: the queue makes it a flow of its own


def test_the_deadline_grows_with_the_inputs():
    settings = GatewaySettings(request_timeout_seconds=30)
    assert settings.deadline(1) == settings.deadline(256) == 30
    assert settings.deadline(257) == 60 and settings.deadline(2048) == 240
    assert settings.longest_deadline == settings.deadline(10_000) == 40 * 30  # Cohere's 10,000 documents
    assert (settings.max_inputs, settings.max_documents) == (2048, 10_000)


async def test_the_gateway_queues_a_large_request_as_parts_and_answers_in_input_order():
    import aiohttp

    async with running_queue(models={"m": spec("m", max_batch_size=4)}) as plugin:
        url = (await plugin.gateway_start({"port": 0, "max_inputs": 10, "request_timeout_seconds": 5}))["url"]
        texts = [f"t{i}" for i in range(10)]
        async with aiohttp.ClientSession() as session:

            async def post(body: dict) -> tuple[int, dict]:
                async with session.post(f"{url}/v1/embeddings", json=body) as response:
                    return response.status, await response.json()

            request = asyncio.create_task(post({"model": "m", "input": texts, "encoding_format": "float"}))
            await async_wait_for(lambda: plugin.online.pending("m") == 3, what="three parts queued")
            # One part a pull (requests of a forward batch's inputs in all), so idle workers share the request.
            items = [(await plugin.online.pull(w, held=["m"], timeout=0))["items"] for w in ("w1", "w2", "w1")]
            assert [[m["payload"]["texts"] for m in group] for group in items] == [
                [texts[:4]],
                [texts[4:8]],
                [texts[8:]],
            ]
            assert [plugin.state.items[group[0]["id"]].rows for group in items] == [4, 4, 2]
            answer = {group[0]["id"]: encoded(group[0]["payload"]["texts"], tokens=2) for group in items}
            ids = [group[0]["id"] for group in items]
            await plugin.online.pull("w2", held=["m"], timeout=0, acks=[[ids[1], answer[ids[1]], 0.01]])
            acks = [[item_id, answer[item_id], 0.01] for item_id in (ids[2], ids[0])]
            await plugin.online.pull("w1", held=["m"], timeout=0, acks=acks)
            status, body = await request
            assert status == 200 and [d["index"] for d in body["data"]] == list(range(10))
            assert np.array_equal([d["embedding"] for d in body["data"]], vectors_of(texts))
            assert body["usage"]["prompt_tokens"] == 6

            request = asyncio.create_task(post({"model": "m", "input": texts}))
            await async_wait_for(lambda: plugin.online.pending("m") == 3, what="three parts queued")
            items = [(await plugin.online.pull(w, held=["m"], timeout=0))["items"][0] for w in ("w1", "w2")]
            failed = [[items[1]["id"], {"status": 422, "error": "an input is too long"}, 0.01]]
            await plugin.online.pull("w2", held=["m"], timeout=0, acks=failed)
            status, body = await request
            assert status == 422 and body["error"]["message"] == "an input is too long"
            await async_wait_for(lambda: plugin.online.pending("m") == 0, what="the other parts withdrawn")
            assert not any(item_id.startswith("online-") for item_id in plugin.state.items)

            status, body = await post({"model": "m", "input": ["t"] * 11})
            assert status == 422 and "at most 10" in body["error"]["message"]
        await plugin.gateway_stop()


async def test_a_large_request_is_queued_as_parts_of_at_most_max_part_inputs():
    """Issue 45: parts of the model's online batch (512 inputs) made a worker's round seconds long on a CPU, and
    a one-text request waited for it whole; `max_part_inputs` cuts finer, a round taking as many as it computes."""
    import aiohttp

    async with running_queue(models={"m": spec("m", max_batch_size=512)}) as plugin:
        url = (await plugin.gateway_start({"port": 0, "max_part_inputs": 3, "request_timeout_seconds": 5}))["url"]
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "input": [f"t{i}" for i in range(10)]}
            request = asyncio.create_task(session.post(f"{url}/v1/embeddings", json=body))
            await async_wait_for(lambda: plugin.online.pending("m") == 4, what="four parts queued")
            queued = [item for item in plugin.state.items.values() if item.model == "m"]
            assert sorted(item.rows for item in queued) == [1, 3, 3, 3] and len({item.flow for item in queued}) == 1
            request.cancel()
        await plugin.gateway_stop()


def test_token_arrays_are_cl100k_base_from_the_shipped_file_checked_against_openais_hash():
    import tiktoken_ext

    shipped = next(Path(p) / "data" / "cl100k_base.tiktoken" for p in tiktoken_ext.__path__ if Path(p, "data").is_dir())
    assert hashlib.sha256(shipped.read_bytes()).hexdigest() == CL100K_SHA256
    encoding = token_arrays.cl100k()
    assert encoding.encode_ordinary("hello world") == [15339, 1917]  # cl100k_base's ids, as OpenAI documents them
    text = "Größe: 3 µm — naïve café ✓\nnew line"
    assert token_arrays.decode([encoding.encode_ordinary(text), [15339, 1917], []]) == [text, "hello world", ""]


@pytest.mark.parametrize("bad", [100261, 100277, 2**31, -1])
def test_an_id_cl100k_base_does_not_have_is_a_400_naming_the_array_and_the_setting(bad):
    with pytest.raises(RequestError) as info:
        token_arrays.decode([[15339], [15339, bad]])
    assert info.value.status == 400 and info.value.message.startswith(f"input[1] holds {bad}, not a cl100k_base")
    assert "send text" in info.value.message
    json.dumps(info.value.message)  # plain text, fit for any answer


async def test_a_gateway_process_may_give_a_request_the_longest_deadline_its_limits_allow():
    link_settings = {"request_timeout_seconds": 5, "max_attempts": 2, "max_queue_depth": 10}
    limits = {"max_inputs": 2048, "max_documents": 512}
    async with running_queue(models={"m": spec("m")}) as plugin:
        requests = [[1, "m", "embed", {"texts": ["t1"]}, 1, 500.0], [2, "m", "embed", {"texts": ["t2"]}, 1, 7.0]]
        plugin.online.remote_submit("g", requests, {**link_settings, **limits})
        timers = {request_id: timer for request_id, (_, timer) in plugin.online.gateways["g"]._requests.items()}
        now = asyncio.get_running_loop().time()
        assert timers[1].when() - now == pytest.approx(5 * 8, abs=1)  # 2,048 texts: 8 times 256
        assert timers[2].when() - now == pytest.approx(7, abs=1)  # the gateway's own deadline, below that
