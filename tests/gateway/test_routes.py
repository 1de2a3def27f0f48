"""The online endpoint over real HTTP on loopback, on a two-worker cluster shared with batch jobs."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import msgpack
import numpy as np
import pytest

from shoal.configs import load_catalog
from shoal.pipeline.client import AsyncOnlineClient, OnlineClient, OnlineError
from shoal.pipeline.cluster import pull_queue
from tests.support.cli import embed_args, run_shoal
from tests.support.files import read_output, write_shards

SLOW = {"name": "slow", "kind": "sim", "dim": 4, "max_seq_length": 32, "memory_bytes": 1000, "batch_fixed_seconds": 0.3}
SETTINGS = {
    "port": 0,
    "max_inputs": 8,
    "max_input_chars": 2000,
    "max_body_bytes": 65536,
    "request_timeout_seconds": 120,
}
MSGPACK_HEADERS = {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}


class Gateway:
    """The gateway in the test cluster's scheduler, restartable with other settings on the same port."""

    def __init__(self, client, models: dict) -> None:
        self.client, self.models = client, models
        self.url = self.start()

    def start(self, **overrides) -> str:
        settings = {**SETTINGS, **overrides}
        if hasattr(self, "url"):
            settings["port"] = urlsplit(self.url).port
        reply = self.client.sync(
            pull_queue(self.client).gateway_start, settings=settings, models=self.models, replace=True
        )
        return reply["url"]

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers, decoded body) over a fresh connection."""
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.netloc, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        kind = response.getheader("Content-Type", "")
        decoded = msgpack.unpackb(raw) if "msgpack" in kind else json.loads(raw) if "json" in kind else raw
        return response.status, dict(response.getheaders()), decoded

    def post(self, path: str, body, as_json: bool = False, headers: dict | None = None):
        if as_json:
            data, base = json.dumps(body).encode(), {"Content-Type": "application/json"}
        else:
            data, base = (body if isinstance(body, bytes) else msgpack.packb(body)), dict(MSGPACK_HEADERS)
        return self.request("POST", path, data, {**base, **(headers or {})})


@pytest.fixture(scope="module")
def gateway(cluster, tiny_catalog):
    _, client = cluster
    models = {n: s.model_dump() for n, s in load_catalog(str(tiny_catalog)).models.items()}
    models["slow"] = SLOW
    gw = Gateway(client, models)
    with OnlineClient(gw.url, timeout=120) as online:  # first use loads the models (torch import): not timed
        online.encode("tiny", ["warm up"])
        online.rerank("tiny-reranker", "warm", ["up"])
    yield gw
    client.sync(pull_queue(client).gateway_stop)


TEXTS = ["The cat sat on the mat.", "A quick brown fox", "Vector search with small models", "x"]


def direct_vectors(model_path, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path), device="cpu").encode(texts)


def test_msgpack_and_json_round_trips_equal_a_direct_model_call(gateway, tiny_model):
    direct = direct_vectors(tiny_model, TEXTS)
    with OnlineClient(gateway.url) as online:
        vectors = online.encode("tiny", TEXTS)
        half = online.encode("tiny", TEXTS, dtype="float16")
    assert vectors.dtype == np.float32 and vectors.shape == direct.shape
    np.testing.assert_allclose(vectors, direct, atol=1e-5)
    assert half.dtype == np.float16 and np.allclose(half, direct, atol=2e-3)

    status, headers, reply = gateway.post("/v1/encode/tiny", {"texts": TEXTS}, as_json=True)
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert reply["shape"] == list(direct.shape) and reply["usage"]["tokens"] > len(TEXTS)
    np.testing.assert_allclose(np.array(reply["embeddings"]), direct, atol=1e-5)

    status, _, reply = gateway.post("/v1/encode/tiny", {"texts": TEXTS[:1]}, headers={"Accept": "application/json"})
    assert status == 200 and len(reply["embeddings"][0]) == direct.shape[1]


async def test_async_client_many_requests_at_once(gateway, tiny_model):
    import asyncio

    direct = direct_vectors(tiny_model, TEXTS)
    async with AsyncOnlineClient(gateway.url) as online:
        answers = await asyncio.gather(*(online.encode("tiny", [t]) for t in TEXTS * 5))
    for i, vectors in enumerate(answers):
        np.testing.assert_allclose(vectors[0], direct[i % len(TEXTS)], atol=1e-5)


def test_openai_embeddings_request_answered_in_openai_shape(gateway, tiny_model):
    direct = direct_vectors(tiny_model, TEXTS)
    status, _, reply = gateway.post("/v1/embeddings", {"model": "tiny", "input": TEXTS[0], "user": "u1"}, as_json=True)
    assert status == 200 and reply["object"] == "list" and reply["model"] == "tiny"
    assert reply["data"][0]["object"] == "embedding" and reply["data"][0]["index"] == 0
    np.testing.assert_allclose(reply["data"][0]["embedding"], direct[0], atol=1e-5)
    assert reply["usage"]["prompt_tokens"] == reply["usage"]["total_tokens"] > 0

    body = {"model": "tiny", "input": TEXTS, "encoding_format": "base64"}
    status, _, reply = gateway.post("/v1/embeddings", body, as_json=True)
    decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in reply["data"]])
    assert status == 200 and [d["index"] for d in reply["data"]] == [0, 1, 2, 3]
    np.testing.assert_allclose(decoded, direct, atol=1e-5)


def test_compact_vectors_online_equal_quantize_embeddings_of_direct_vectors(gateway, tiny_model):
    from sentence_transformers.util.quantization import quantize_embeddings

    direct = direct_vectors(tiny_model, TEXTS)
    cut = direct[:, :16] / np.linalg.norm(direct[:, :16], axis=1, keepdims=True)
    ranges = [(cut.min(0) - 0.05).tolist(), (cut.max(0) + 0.05).tolist()]
    for body, dtype in (
        ({"dim": 16}, "<f4"),
        ({"dim": 16, "precision": "int8", "ranges": ranges}, "i1"),
        ({"dim": 16, "precision": "ubinary"}, "u1"),
    ):
        status, _, reply = gateway.post("/v1/encode/tiny", {"texts": TEXTS, **body})
        assert status == 200, reply
        got = np.frombuffer(reply["embeddings"], dtype).reshape(reply["shape"])
        expected = quantize_embeddings(
            cut, precision=body.get("precision", "float32"), ranges=np.array(ranges, np.float32)
        )
        assert reply["dtype"] == body.get("precision", "float32") and got.shape == expected.shape
        np.testing.assert_allclose(
            got.astype(np.float32), expected.astype(np.float32), atol=1e-5 if dtype == "<f4" else 1
        )
    with OnlineClient(gateway.url) as online:
        packed = online.encode("tiny", TEXTS, precision="binary", dim=16)
    np.testing.assert_array_equal(packed, quantize_embeddings(cut, precision="binary"))
    status, _, reply = gateway.post("/v1/embeddings", {"model": "tiny", "input": TEXTS, "dimensions": 16}, as_json=True)
    assert status == 200
    np.testing.assert_allclose([d["embedding"] for d in reply["data"]], cut, atol=1e-5)


def test_rerank_native_and_cohere_shapes_equal_a_direct_model_call(gateway, tiny_reranker):
    from sentence_transformers import CrossEncoder

    query, documents = "small models", TEXTS
    direct = CrossEncoder(str(tiny_reranker), device="cpu").predict([(query, d) for d in documents])
    with OnlineClient(gateway.url) as online:
        scores = online.rerank("tiny-reranker", query, documents)
    np.testing.assert_allclose(scores, direct, atol=1e-5)

    body = {
        "model": "tiny-reranker",
        "query": query,
        "documents": [{"text": d} for d in documents],
        "top_n": 2,
        "return_documents": True,
    }
    status, _, reply = gateway.post("/v1/rerank", body, as_json=True)
    best = np.argsort(-direct)[:2]
    assert status == 200 and [r["index"] for r in reply["results"]] == best.tolist()
    assert [r["document"]["text"] for r in reply["results"]] == [documents[i] for i in best]
    np.testing.assert_allclose([r["relevance_score"] for r in reply["results"]], direct[best], atol=1e-5)
    assert reply["id"] and reply["meta"]["billed_units"]["search_units"] == 1


def test_models_health_readiness_and_metrics(gateway):
    status, _, reply = gateway.request("GET", "/v1/models")
    by_id = {m["id"]: m for m in reply["data"]}
    assert status == 200 and by_id["tiny"]["kind"] == "embedder" and by_id["tiny-reranker"]["kind"] == "reranker"
    assert gateway.request("GET", "/healthz")[0] == 200
    status, _, reply = gateway.request("GET", "/readyz")
    assert status == 200 and reply["ready"] and reply["workers"] == 2
    gateway.post("/v1/encode/tiny", {"texts": ["metrics"]})
    status, headers, text = gateway.request("GET", "/metrics")
    text = text.decode()
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert 'shoal_online_requests_total{model="tiny",status="200"}' in text
    for stage in ("queue", "compute", "total"):
        assert f'shoal_online_latency_seconds_count{{model="tiny",stage="{stage}"}}' in text
    assert 'shoal_queue_depth{lane="online",model="tiny"}' in text and "shoal_online_in_flight" in text


BAD_INPUTS = [
    # (name, path, body (bytes: as is; else packed), headers, status, message fragment)
    ("not msgpack", "/v1/encode/tiny", b"\xc1\xc1", None, 400, "not valid MessagePack"),
    ("not json", "/v1/embeddings", b"{nope", {"Content-Type": "application/json"}, 400, "not valid JSON"),
    (
        "extension type",
        "/v1/encode/tiny",
        msgpack.packb({"texts": [msgpack.ExtType(3, b"x")]}),
        None,
        400,
        "MessagePack",
    ),
    ("wrong type", "/v1/encode/tiny", {"texts": "a string"}, None, 400, "texts"),
    ("missing field", "/v1/encode/tiny", {"text": ["a"]}, None, 400, "texts"),
    ("not a map", "/v1/encode/tiny", [1, 2], None, 400, "must be a map"),
    ("empty body", "/v1/encode/tiny", b"", None, 400, "empty"),
    ("unknown model", "/v1/encode/nope", {"texts": ["a"]}, None, 404, "unknown model 'nope'"),
    ("unknown model, openai", "/v1/embeddings", {"model": "nope", "input": "a"}, None, 404, "unknown model"),
    ("wrong kind", "/v1/rerank/tiny", {"query": "q", "documents": ["a"]}, None, 400, "is of kind 'embedder'"),
    ("too large", "/v1/encode/tiny", {"texts": ["a" * 70000]}, None, 413, "65536 bytes"),
    ("too many inputs", "/v1/encode/tiny", {"texts": ["a"] * 9}, None, 422, "at most 8"),
    (
        "too long, no truncation",
        "/v1/encode/tiny",
        {"texts": ["a" * 2001], "truncate": False},
        None,
        422,
        "2001 characters",
    ),
    (
        "too many tokens, no truncation",
        "/v1/encode/tiny",
        {"texts": ["word " * 300], "truncate": False},
        None,
        422,
        "128 tokens",
    ),
    ("not cl100k ids", "/v1/embeddings", {"model": "tiny", "input": [[1, 100261]]}, None, 400, "token arrays"),
    (
        "dimensions",
        "/v1/embeddings",
        {"model": "tiny", "input": "a", "dimensions": 64},
        None,
        400,
        "gives 32 dimensions",
    ),
    ("int8 without ranges", "/v1/encode/tiny", {"texts": ["a"], "precision": "int8"}, None, 422, "needs `ranges`"),
    ("media type", "/v1/encode/tiny", b"texts=a", {"Content-Type": "text/plain"}, 415, "application/msgpack"),
    ("bad timeout", "/v1/encode/tiny", {"texts": ["a"]}, {"X-Shoal-Timeout": "soon"}, 400, "X-Shoal-Timeout"),
    ("no route", "/v1/nothing", {"texts": ["a"]}, None, 404, "Not Found"),
    ("deadline", "/v1/encode/slow", {"texts": ["a"]}, {"X-Shoal-Timeout": "0.05"}, 504, "no answer within 0.05 s"),
]


@pytest.mark.parametrize("name,path,body,headers,status,message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_gets_its_status_and_message_and_the_server_keeps_serving(
    gateway, name, path, body, headers, status, message
):
    got, _, reply = gateway.post(path, body, headers=headers)
    assert got == status, reply
    assert message in reply["error"]["message"] and reply["error"]["code"] == status
    assert "Traceback" not in json.dumps(reply, default=str)
    with OnlineClient(gateway.url) as online:
        assert online.encode("tiny", ["still serving"]).shape == (1, 32)


def test_long_input_is_truncated_when_allowed(gateway):
    with OnlineClient(gateway.url) as online:
        assert online.encode("tiny", ["word " * 1000]).shape == (1, 32)


def test_queue_full_is_429_with_retry_after(gateway):
    gateway.start(max_queue_depth=2, retry_after_seconds=2)
    try:
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda i: gateway.post("/v1/encode/slow", {"texts": [f"t{i}"]}), range(12)))
    finally:
        gateway.start()
    statuses = [status for status, _, _ in replies]
    assert set(statuses) <= {200, 429} and statuses.count(429) >= 1 and statuses.count(200) >= 2, statuses
    refused = next(r for r in replies if r[0] == 429)
    assert refused[1]["Retry-After"] == "2" and "too many requests" in refused[2]["error"]["message"]


def test_auth_on_and_off(gateway, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("t0ken\n")
    gateway.start(token_file=str(token_file))
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken"}):
            status, got, reply = gateway.post("/v1/encode/tiny", {"texts": ["a"]}, headers=headers)
            assert (
                status == 401 and got["WWW-Authenticate"].startswith("Bearer") and "token" in reply["error"]["message"]
            )
        assert gateway.request("GET", "/v1/models")[0] == 401
        assert gateway.request("GET", "/healthz")[0] == 200
        with pytest.raises(OnlineError) as info:
            OnlineClient(gateway.url, token="").encode("tiny", ["a"])
        assert info.value.status == 401
        with OnlineClient(gateway.url, token="t0ken") as online:
            assert online.encode("tiny", ["a"]).shape == (1, 32)
        status, _, _ = gateway.post(
            "/v1/embeddings", {"model": "tiny", "input": "a"}, as_json=True, headers={"Authorization": "Bearer t0ken"}
        )
        assert status == 200
    finally:
        gateway.start()
    assert gateway.post("/v1/encode/tiny", {"texts": ["a"]})[0] == 200


def test_batch_job_runs_while_online_requests_flow(gateway, cluster, tiny_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    ids = write_shards(tmp_path / "in", demo_texts[:2400], shards=3, row_group_size=200)
    answered: list[float] = []
    failures: list[str] = []
    done = threading.Event()

    def online_traffic():
        with OnlineClient(gateway.url) as online:
            while not done.is_set():
                try:
                    assert online.encode("tiny", ["a query while the batch runs"]).shape == (1, 32)
                    answered.append(time.monotonic())
                except Exception as exc:  # noqa: BLE001 - every failure is reported below
                    failures.append(repr(exc))
                time.sleep(0.02)  # the client's pace: about 50 queries a second while the batch runs

    traffic = threading.Thread(target=online_traffic)
    started = time.monotonic()
    traffic.start()
    try:
        result = run_shoal(
            *embed_args(
                tmp_path / "in",
                tmp_path / "out",
                tiny_catalog,
                scheduler=client.scheduler.address,
                profile=test_profile,
            )
        )
    finally:
        finished = time.monotonic()
        done.set()
        traffic.join()
    assert result.returncode == 0, result.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
    assert not failures, failures[:3]
    during = [t for t in answered if started <= t <= finished]
    gaps = np.diff([started, *during, finished])
    assert len(during) >= 10 and gaps.max() < 3.0, (len(during), gaps.max())
