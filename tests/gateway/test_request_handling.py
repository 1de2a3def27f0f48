"""A request's way through the gateway without a cluster: decoding with limits, media types, the OpenAI and
Cohere shapes, bearer auth, the models it serves, and its 4xx and 503 answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgpack
import numpy as np
import pytest

from shoal.configs import ConfigError, GatewaySettings
from shoal.scheduler_plugins.gateway import api_formats as api
from shoal.scheduler_plugins.gateway.auth import BearerAuth
from shoal.scheduler_plugins.gateway.wire import (
    JSON,
    MSGPACK,
    DecodeBounds,
    RequestError,
    decode,
    media_type,
    response_type,
)
from shoal.scheduler_plugins.online_route import LocalBackend
from shoal.scheduler_plugins.pull_queue import PullQueue
from tests.support.fake_scheduler import running_queue, spec
from tests.support.waiting import async_wait_for

LIMITS = GatewaySettings(max_inputs=4, max_input_chars=10)
BOUNDS = DecodeBounds(values=100, containers=10, entries=10, strings=100, list_items=100, map_entries=64)
SETTINGS = GatewaySettings(request_timeout_seconds=5, max_attempts=2, online_lease_seconds=5)  # nobody renews here


@pytest.fixture
async def plugin() -> AsyncIterator[PullQueue]:
    """The queue on a fake scheduler of workers w1 and w2, serving the simulated model "m"."""
    async with running_queue(models={"m": spec("m")}) as plugin:
        yield plugin


def test_msgpack_is_decoded_with_limits_and_without_extension_types():
    assert decode(msgpack.packb({"texts": ["a"]}), MSGPACK, BOUNDS) == {"texts": ["a"]}
    for body in (
        msgpack.packb(msgpack.ExtType(1, b"x")),
        msgpack.packb({"t": msgpack.Timestamp(1)}),
        b"\xdb\xff\xff\xff\xff",  # a string of 4 GB in a body of 5 bytes
        b"\xc1",
        msgpack.packb([1]) + b"\x01",
    ):
        with pytest.raises(RequestError) as info:
            decode(body, MSGPACK, BOUNDS)
        assert info.value.status == 400 and "MessagePack" in info.value.message
    with pytest.raises(RequestError, match="not valid JSON"):
        decode(b"{nope", JSON, BOUNDS)


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
        ({"texts": [1]}, 400, "texts[0]"),
        ({"texts": ["a"], "dtype": "int8"}, 400, "dtype"),
        ({"texts": ["a"], "colour": 1}, 400, "colour"),
        (["a"], 400, "must be a map"),
    ]
    for body, status, message in cases:
        with pytest.raises(RequestError) as info:
            api.encode_call("m", body, LIMITS)
        assert info.value.status == status and message in info.value.message, body


def test_openai_and_cohere_shapes():
    body = api.openai_request({"model": "m", "input": "hi", "user": "ignored"}, LIMITS)
    call = api.openai_call(body, body.texts(), LIMITS)
    assert call.texts == ["hi"] and body.encoding_format == "float" and body.token_arrays() is None
    assert api.openai_request({"model": "m", "input": [1, 2]}, LIMITS).token_arrays() == [[1, 2]]  # one array
    assert api.openai_request({"model": "m", "input": [[1], [2, 3]]}, LIMITS).token_arrays() == [[1], [2, 3]]
    vectors = np.arange(6, dtype="<f4").reshape(2, 3)
    result = {"embeddings": vectors.tobytes(), "shape": [2, 3], "dtype": "float32", "tokens": 7}
    body = api.openai_request({"model": "m", "input": ["a", "b"], "encoding_format": "base64"}, LIMITS)
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


async def test_a_gateways_models_are_validated_where_they_enter_and_a_bad_one_is_named(plugin):
    with pytest.raises(ConfigError, match=r"the gateway's models: model 'bad' has no valid spec: kind: Field required"):
        await plugin.gateway_start({"port": 0}, models={"bad": {"name": "bad", "dim": 8, "max_seq_length": 64}})
    with pytest.raises(ConfigError, match=r"a gateway's models: model 'bad' has no valid spec: dim: .*greater than 0"):
        plugin.online.remote_models({"bad": {**spec("bad").model_dump(), "dim": 0}})
    assert plugin.gateway is None and "bad" not in plugin.state.model_specs
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


async def test_a_request_that_cannot_be_sent_is_refused_alone_with_a_400(plugin):
    backend = LocalBackend(plugin.online)
    pulled = asyncio.create_task(plugin.online.pull("w1", held=["m"], loaded=["m"], timeout=5))
    await async_wait_for(lambda: len(plugin.online.pulls) == 1, what="w1's online pull waiting")
    poison = await backend.answer("m", "embed", {"texts": ["\ud800"]}, 1, 5, SETTINGS)
    assert poison["status"] == 400 and "cannot be sent" in poison["error"]
    legit = asyncio.create_task(backend.answer("m", "embed", {"texts": ["fine"]}, 1, 5, SETTINGS))
    reply = await pulled
    assert [m["payload"]["texts"] for m in reply["items"]] == [["fine"]]
    plugin.online.ack_all("w1", [(reply["items"][0]["id"], {"shape": [1, 8]}, 0.0)])
    assert (await legit)["shape"] == [1, 8]
