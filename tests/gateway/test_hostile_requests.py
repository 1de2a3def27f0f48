"""Hostile but realistic requests: a poison request fails alone, undecodable headers and malformed framing are
statuses, slow clients are cut off and connections capped.

Against the gateway of the session's two-worker cluster over real HTTP (raw sockets where a well-behaved client
cannot misbehave enough).
"""

from __future__ import annotations

import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import msgpack
import numpy as np
import pytest

from shoal.configs import load_catalog
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import pull_queue
from tests.support.waiting import wait_for

SETTINGS = {"port": 0, "max_inputs": 8, "request_timeout_seconds": 60}
POISON = "\ud800"  # a lone surrogate: JSON's "\ud800" escape allows it, UTF-8 has no form for it


class Gateway:
    """The gateway in the shared cluster's scheduler, restartable with other settings on one port."""

    def __init__(self, client, models: dict) -> None:
        self.client, self.models = client, models
        self.url = ""
        self.start()

    def start(self, **overrides) -> None:
        settings = {**SETTINGS, **overrides}
        if self.url:
            settings["port"] = self.port
        reply = self.client.sync(
            pull_queue(self.client).gateway_start, settings=settings, models=self.models, replace=True
        )
        self.url = reply["url"]

    @property
    def port(self) -> int:
        port = urlsplit(self.url).port
        assert port, f"no port in {self.url}"
        return port

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def post(self, path: str, body: bytes, kind: str = "application/json", headers: dict | None = None):
        """(status, decoded body) of one request sent as raw bytes: bodies no client library would send."""
        head = {
            "Content-Type": kind,
            "Accept": "application/json",
            "Content-Length": str(len(body)),
            "Connection": "close",
            **(headers or {}),
        }
        lines = [f"POST {path} HTTP/1.1".encode(), b"Host: shoal"]
        lines += [k.encode() + b": " + (v if isinstance(v, bytes) else v.encode()) for k, v in head.items()]
        with self.connect() as sock:
            sock.sendall(b"\r\n".join(lines) + b"\r\n\r\n" + body)
            raw = _read_all(sock)
        status = int(raw.split(b" ", 2)[1])
        payload = raw.split(b"\r\n\r\n", 1)[1]
        return status, json.loads(payload) if payload else None

    def metrics(self) -> str:
        with self.connect() as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n\r\n")
            return _read_all(sock).decode()

    def in_flight(self) -> int:
        """Requests the gateway is answering (shoal_online_in_flight), less the /metrics request that asks."""
        line = next(line for line in self.metrics().splitlines() if line.startswith("shoal_online_in_flight "))
        return int(float(line.rsplit(" ", 1)[1])) - 1

    def statuses(self) -> dict[str, float]:
        """shoal_online_requests_total by status label, for model "tiny"."""
        counts: dict[str, float] = {}
        for line in self.metrics().splitlines():
            if line.startswith('shoal_online_requests_total{model="tiny"'):
                status = line.split('status="', 1)[1].split('"', 1)[0]
                counts[status] = float(line.rsplit(" ", 1)[1])
        return counts


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _closed_by_server(sock: socket.socket) -> bytes:
    """What the server sent before closing (raises socket.timeout if it never closes)."""
    try:
        return _read_all(sock)
    except ConnectionResetError:
        return b""


@pytest.fixture(scope="module")
def gateway(cluster, tiny_catalog):
    _, client = cluster
    models = {n: s.model_dump() for n, s in load_catalog(str(tiny_catalog)).models.items()}
    gw = Gateway(client, models)
    with OnlineClient(gw.url, timeout=120) as online:  # the first request loads the models: not part of a test
        online.encode("tiny", ["warm up"])
        online.rerank("tiny-reranker", "warm", ["up"])
    yield gw
    client.sync(pull_queue(client).gateway_stop)


def _direct(model_path: Path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path), device="cpu").encode(texts)


def _msgpack_with_poison(texts: list[str], index: int) -> bytes:
    """A MessagePack body whose text `index` holds the UTF-8-shaped bytes of a lone surrogate."""
    marked = [t if i != index else "@@@" for i, t in enumerate(texts)]
    return msgpack.packb({"texts": marked}).replace(b"@@@", b"\xed\xa0\x80")


ROUTES = {
    "native msgpack": ("/v1/encode/tiny", lambda texts: ("application/msgpack", msgpack.packb({"texts": texts}))),
    "native json": ("/v1/encode/tiny", lambda texts: ("application/json", json.dumps({"texts": texts}).encode())),
    "openai": (
        "/v1/embeddings",
        lambda texts: ("application/json", json.dumps({"model": "tiny", "input": texts}).encode()),
    ),
}


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_poison_request_among_30_legitimate_ones_fails_alone_with_a_400_naming_its_input(gateway, tiny_model, route):
    path, body = ROUTES[route]
    texts = [f"legitimate request number {i}" for i in range(30)]
    poisoned = ["fine", POISON + " and more"]
    if route == "native msgpack":
        poison_body = ("application/msgpack", _msgpack_with_poison(poisoned, 1))
    else:
        poison_body = body(poisoned)

    def send(request):
        kind, data = request
        # A deadline, not a timing assert: a request stuck behind the poison's group would get a 504.
        return gateway.post(path, data, kind, {"X-Shoal-Timeout": "20"})

    requests = [body([t]) for t in texts]
    requests.insert(15, poison_body)
    with ThreadPoolExecutor(31) as pool:
        answers = list(pool.map(send, requests))
    poison_status, poison_reply = answers.pop(15)
    assert poison_status == 400
    name = "input" if route == "openai" else "texts"
    assert f"{name}[1] is not valid UTF-8" in poison_reply["error"]["message"]
    assert [status for status, _ in answers] == [200] * 30
    direct = _direct(tiny_model, texts)
    for i, (_, reply) in enumerate(answers):
        vector = reply["data"][0]["embedding"] if route == "openai" else reply["embeddings"][0]
        np.testing.assert_allclose(vector, direct[i], atol=1e-5)


@pytest.mark.parametrize(
    "path,body,where",
    [
        ("/v1/rerank/tiny-reranker", {"query": POISON, "documents": ["a"]}, "query[0]"),
        ("/v1/rerank/tiny-reranker", {"query": "q", "documents": ["a", "b", "c" + POISON]}, "documents[2]"),
        ("/v1/rerank", {"model": "tiny-reranker", "query": "q", "documents": [{"text": POISON}]}, "documents[0]"),
    ],
)
def test_rerank_routes_refuse_a_lone_surrogate_naming_the_input(gateway, path, body, where):
    status, reply = gateway.post(path, json.dumps(body).encode())
    assert status == 400 and f"{where} is not valid UTF-8" in reply["error"]["message"]
    assert gateway.post(path, json.dumps({**body, "query": "q", "documents": ["a", "b"]}).encode())[0] == 200


def test_100k_nested_brackets_are_a_400(gateway):
    status, reply = gateway.post("/v1/encode/tiny", b"[" * 100_000)
    assert status == 400 and "nested too deeply" in reply["error"]["message"]
    status, reply = gateway.post("/v1/embeddings", b'{"input":' * 100_000)
    assert status == 400 and "nested too deeply" in reply["error"]["message"]


def test_an_authorization_header_that_is_not_utf8_or_not_latin1_is_a_401(gateway, tmp_path):
    token = tmp_path / "token"
    token.write_text("t0ken")
    gateway.start(token_file=str(token))
    try:
        body = json.dumps({"texts": ["a"]}).encode()
        for header in (b"Bearer t0ken\xff\xfe", "Bearer t\u00f6ken".encode(), "Bearer \u4e2d\u6587".encode()):
            status, reply = gateway.post("/v1/encode/tiny", body, headers={"Authorization": header})
            assert status == 401, reply
        assert gateway.post("/v1/encode/tiny", body, headers={"Authorization": "Bearer t0ken"})[0] == 200
    finally:
        gateway.start()


def test_an_error_message_echoing_undecodable_header_bytes_still_encodes_as_msgpack(gateway):
    with gateway.connect() as sock:
        sock.sendall(
            b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: text/\xff\r\n"
            b"Accept: application/msgpack\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        raw = _read_all(sock)
    assert raw.startswith(b"HTTP/1.1 415")
    message = msgpack.unpackb(raw.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    assert "text/\\udcff" in message


def test_malformed_http_framing_is_a_400_and_a_debug_line_not_an_error_traceback(gateway, caplog):
    caplog.set_level(logging.DEBUG, logger="shoal.gateway")
    head = b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\nConnection: close\r\n"
    for framing in (b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", b"Content-Length: -5\r\n\r\n"):
        with gateway.connect() as sock:
            sock.sendall(head + framing)
            assert _read_all(sock).split(b"\r\n", 1)[0].endswith(b"400 Bad Request")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert sum("malformed request answered 400" in r.getMessage() for r in caplog.records) == 2


def test_a_client_gone_mid_body_is_counted_as_a_client_close_not_a_500(gateway):
    before = gateway.statuses()
    with gateway.connect() as sock:
        sock.sendall(
            b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"texts": ["half'
        )
        wait_for(lambda: gateway.in_flight() == 1, timeout=30, what="the head read, the handler waiting for the body")
    wait_for(
        lambda: gateway.statuses().get("499", 0) > before.get("499", 0), timeout=30, what="the request counted as 499"
    )
    assert gateway.statuses().get("500", 0) == before.get("500", 0)


def test_slow_headers_and_bodies_are_cut_off_and_open_connections_are_capped(gateway):
    gateway.start(header_timeout_seconds=1, body_timeout_seconds=1, max_connections=4)
    try:
        dribbler = gateway.connect()
        dribbler.sendall(b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\n")
        for i in range(4):  # a header line now and then, never the blank line that ends them
            time.sleep(0.3)  # the slow client under test: 1.2 s in all, over the 1 s header timeout
            dribbler.sendall(f"X-Dribble-{i}: x\r\n".encode())
        dribbler.settimeout(15)  # the test's bound on "closed": ten times the configured timeout
        assert _closed_by_server(dribbler) == b""
        dribbler.close()

        with gateway.connect() as slow_body:
            slow_body.sendall(
                b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"texts"'
            )
            slow_body.settimeout(15)
            answer = _closed_by_server(slow_body)
        assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer

        held = [gateway.connect() for _ in range(4)]
        try:
            with gateway.connect() as extra:
                extra.settimeout(15)
                assert _closed_by_server(extra).startswith(b"HTTP/1.1 503")
        finally:
            for sock in held:
                sock.close()
    finally:
        gateway.start()
    status, _ = gateway.post("/v1/encode/tiny", json.dumps({"texts": ["a"]}).encode())
    assert status == 200
