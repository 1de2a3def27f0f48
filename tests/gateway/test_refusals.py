"""Hostile requests against both gateways of a real cluster: each gets a 4xx in the JSON error shape, at once, saying why.

A `dask scheduler --preload shoal.scheduler_plugins --shoal-gateway-port` (the embedded gateway, auth off) and a
`shoal gateway` process (auth on) in front of it, with one `dask worker` serving the tiny models. Requests go as raw
bytes on sockets where a client library would refuse to send them. Issue 45: limits come before validation (a body of
a million integers is refused by its limit, the process's memory flat), the body reader answers every malformed body
(a bad Content-Encoding, a bad chunk, an unsupported Expect, too many headers, no Host, bad MessagePack) with its
reason, no client string comes back longer than 200 characters, and nothing a client does leaves a traceback in the
gateway's log. The last test sends the whole hostile table, auth off and on, then checks the logs and the vectors.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest

from shoal.pipeline.client import OnlineClient
from tests.support.dask_cli import wait_for_address
from tests.support.files import write_profile
from tests.support.paths import DASK, SHOAL
from tests.support.processes import Processes, free_port
from tests.support.raw_http import Answer, exchange, parse, read_until_closed, request_bytes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # a cluster of processes

TOKEN = "hostile-t0ken"
JSON = "application/json"
MSGPACK = "application/msgpack"
MILLION = [1] * 1_000_000
LIMIT_WORDS = ("at most", "the limit is")  # what a refusal by a size limit says


@dataclass
class Server:
    """One gateway: where it listens, its process (for memory) and its log, and its token (None: auth off)."""

    name: str
    port: int
    process: subprocess.Popen
    log: Path
    token: str | None

    def send(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str | bytes] | None = None,
        *,
        auth: bool = True,
        host: bool = True,
        timeout: float = 60,
    ) -> Answer:
        headers = dict(headers or {})
        if self.token and auth:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        return exchange(self.port, request_bytes(method, path, body, headers, host), timeout)

    def post(self, path: str, body: Any, media: str = JSON, headers: dict | None = None, **options) -> Answer:
        data = msgpack.packb(body) if media == MSGPACK else json.dumps(body).encode()
        return self.send("POST", path, data, {"Content-Type": media, "Accept": JSON, **(headers or {})}, **options)

    def authorization(self) -> bytes:
        return f"Authorization: Bearer {self.token}\r\n".encode() if self.token else b""

    def rss(self) -> int:
        return psutil.Process(self.process.pid).memory_info().rss

    def in_flight(self) -> int:
        """Requests being answered (shoal_online_in_flight), less the /metrics request asking."""
        text = self.send("GET", "/metrics").body.decode()
        line = next(line for line in text.splitlines() if line.startswith("shoal_online_in_flight "))
        return int(float(line.rsplit(" ", 1)[1])) - 1

    def tracebacks(self) -> list[str]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [line for line in lines if "Traceback" in line or "Unhandled exception" in line]

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_catalog) -> Iterator[dict[str, Server]]:
    folder = tmp_path_factory.mktemp("hostile")
    profile = write_profile(folder, workers=1)
    env = {k: v for k, v in os.environ.items() if k != "SHOAL_GATEWAY_TOKEN"}
    env["SHOAL_CATALOG"] = str(tiny_catalog)
    logs = {name: folder / f"{name}.log" for name in ("embedded", "process", "worker")}
    procs = Processes()

    def start(command: list[str], log: Path, **extra: str) -> subprocess.Popen:
        return procs.start(command, log=log, env={**env, **extra})

    with procs:
        scheduler_file, embedded_port = folder / "scheduler.json", free_port()
        scheduler = start(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"]
            + ["--scheduler-file", str(scheduler_file), "--preload", "shoal.scheduler_plugins"]
            + ["--shoal-gateway-port", str(embedded_port)],
            logs["embedded"],
        )
        address = wait_for_address(scheduler_file)
        start(
            [DASK, "worker", address, "--nthreads", "1", "--nworkers", "1", "--preload", "shoal.workers"]
            + ["--shoal-profile", str(profile)],
            logs["worker"],
        )
        gateway = start(
            [SHOAL, "gateway", "--scheduler", address, "--catalog", str(tiny_catalog), "--port", "0"],
            logs["process"],
            SHOAL_GATEWAY_TOKEN=TOKEN,
        )
        wait_for(lambda: "gateway on" in logs["process"].read_text(), 120, "shoal gateway listening", 0.2)
        url = logs["process"].read_text().split("gateway on ")[1].split()[0]
        found = {
            "embedded": Server("embedded", embedded_port, scheduler, logs["embedded"], None),
            "process": Server("process", int(url.rsplit(":", 1)[1]), gateway, logs["process"], TOKEN),
        }
        for server in found.values():
            with OnlineClient(server.url(), timeout=120, token=server.token) as online:
                wait_for(partial(_ready, online), 180, f"{server.name} gateway answering", 0.5)
        yield found


def _ready(online: OnlineClient) -> bool:
    try:
        online.encode("tiny", ["warm up"])
        online.rerank("tiny-reranker", "warm", ["up"])
    except Exception:  # not listening yet, no worker yet: retried
        return False
    return True


@pytest.fixture(params=["embedded", "process"])
def server(request, servers) -> Server:
    return servers[request.param]


# -- 1. limits before validation -----------------------------------------------------------------------------


HUGE = {
    "Cohere /v2/rerank documents": ("/v2/rerank", JSON, {"model": "tiny-reranker", "query": "q", "documents": MILLION}),
    "Cohere /v1/rerank documents": ("/v1/rerank", JSON, {"model": "tiny-reranker", "query": "q", "documents": MILLION}),
    "native rerank documents": ("/v1/rerank/tiny-reranker", MSGPACK, {"query": "q", "documents": MILLION}),
    "MessagePack texts": ("/v1/encode/tiny", MSGPACK, {"texts": MILLION}),
    "JSON texts": ("/v1/encode/tiny", JSON, {"texts": MILLION}),
    "OpenAI input=[1]*1e6+['x']": ("/v1/embeddings", JSON, {"model": "tiny", "input": [*MILLION, "x"]}),
    "OpenAI one token array of 1e6 ids": ("/v1/embeddings", JSON, {"model": "tiny", "input": MILLION}),
    "OpenAI 700,000 one-id token arrays": ("/v1/embeddings", JSON, {"model": "tiny", "input": [[1]] * 700_000}),
    "OpenAI 700,000 one-id token arrays, MessagePack": (
        "/v1/embeddings",
        MSGPACK,
        {"model": "tiny", "input": [[1]] * 700_000},
    ),
    "OpenAI 1,000 token arrays of 1,000 ids": (
        "/v1/embeddings",
        MSGPACK,
        {"model": "tiny", "input": [[1] * 1000] * 1000},
    ),
    "int8 ranges of 500,000 dimensions": (
        "/v1/encode/tiny",
        MSGPACK,
        {"texts": ["a"], "precision": "int8", "ranges": [[0.0] * 500_000, [1.0] * 500_000]},
    ),
    "Cohere /v2/embed texts": ("/v2/embed", JSON, {"model": "tiny", "texts": MILLION}),
    "Cohere /v2/embed images": ("/v2/embed", JSON, {"model": "tiny", "input_type": "image", "images": MILLION}),
    "MessagePack images": ("/v1/encode/tiny", MSGPACK, {"images": MILLION}),
    "sparse route texts": ("/v1/sparse/tiny", MSGPACK, {"texts": MILLION}),
    "classify route labels": ("/v1/classify/tiny", MSGPACK, {"texts": ["a"], "labels": ["x"] * 1_000_000}),
    "1,000 nested lists of 1,000": ("/v1/encode/tiny", MSGPACK, {"texts": [[[]] * 1000] * 1000}),
    "300,000 fields": ("/v1/encode/tiny", MSGPACK, {f"f{i}": 1 for i in range(300_000)}),
}


@pytest.mark.parametrize("case", list(HUGE))
def test_a_body_of_a_million_values_is_refused_by_its_limit_with_the_memory_flat(server, case):
    path, media, body = HUGE[case]
    before = server.rss()
    answer = server.post(path, body, media)
    assert answer.status in (400, 413, 422), answer.raw[:300]
    message = answer.error["message"]
    assert any(words in message for words in LIMIT_WORDS), message
    assert len(message) < 1000, message
    # Validating a million elements cost 2.5 GB before the limits came first.
    assert server.rss() - before < 200 * 2**20
    assert server.post("/v1/encode/tiny", {"texts": ["still serving"]}).status == 200


@pytest.mark.parametrize(
    "path,body,where",
    [
        ("/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": [1] * 10_000}, "documents[0]"),
        ("/v1/embeddings", {"model": "tiny", "input": [*(["x"] * 2047), 1]}, "input[2047]"),
        ("/v1/embeddings", {"model": "tiny", "input": [[1, 2], [3, "x"]]}, "input[1][1]"),
        ("/v1/encode/tiny", {"texts": ["a", None]}, "texts[1]"),
    ],
)
def test_a_legal_size_body_of_wrong_elements_is_refused_at_the_first_naming_it(server, path, body, where):
    answer = server.post(path, body)
    assert answer.status == 400 and where in answer.error["message"], answer.raw[:500]


# -- 2. the body reader: every malformed body a 4xx at once, saying why ----------------------------------------

LEGIT = json.dumps({"model": "tiny", "input": "hi"}).encode()


def _bad_crc(data: bytes) -> bytes:
    packed = bytearray(gzip.compress(data))
    packed[-8] ^= 0xFF  # the CRC-32 of the trailer
    return bytes(packed)


BAD_ENCODINGS = {
    "gzip that is not gzip": ("gzip", LEGIT),
    "deflate that is not deflate": ("deflate", LEGIT),
    "gzip with a bad CRC": ("gzip", _bad_crc(LEGIT)),
    "gzip cut short": ("gzip", gzip.compress(LEGIT)[:-12]),
}


@pytest.mark.parametrize("case", list(BAD_ENCODINGS))
def test_a_bad_content_encoding_is_a_400_saying_why_and_no_traceback(server, case):
    encoding, body = BAD_ENCODINGS[case]
    headers = {"Content-Type": JSON, "Content-Encoding": encoding}
    answer = server.send("POST", "/v1/embeddings", body, headers)
    assert answer.status == 400, answer.raw[:500]
    assert encoding in answer.error["message"] and "Content-Encoding" in answer.error["message"]
    if server.token:  # the same body from anyone: refused by auth, never read, nothing logged
        assert server.send("POST", "/v1/embeddings", body, headers, auth=False).status == 401
    good = server.send("POST", "/v1/embeddings", gzip.compress(LEGIT), {**headers, "Content-Encoding": "gzip"})
    assert good.status == 200 and len(json.loads(good.body)["data"][0]["embedding"]) == 32
    deflated = server.send("POST", "/v1/embeddings", zlib.compress(LEGIT), {**headers, "Content-Encoding": "deflate"})
    assert deflated.status == 200
    assert server.tracebacks() == []


def test_a_bad_chunk_after_the_handler_started_is_a_400_at_once(server):
    head = (
        b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
        + server.authorization()
        + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + b"8\r\n" + b'{"texts"' + b"\r\n")
        wait_for(lambda: server.in_flight() == 1, 30, "the handler started, reading the body")
        sock.sendall(b'zz\r\n: ["a"]}\r\n0\r\n\r\n')
        sock.settimeout(10)  # the bound on "at once": the body timeout is 30 s
        answer = parse(read_until_closed(sock))
    assert answer.status == 400, answer.raw[:500]
    assert "chunk" in answer.error["message"]
    assert server.tracebacks() == []


def test_an_unsupported_expect_is_a_417_in_the_json_shape(server):
    answer = server.send("POST", "/v1/encode/tiny", b'{"texts":["a"]}', {"Content-Type": JSON, "Expect": "999-x"})
    assert answer.status == 417
    assert answer.error["code"] == 417 and "999-x" in answer.error["message"]


def test_expect_100_continue_is_answered_after_auth_and_the_size_limit(server):
    body = b'{"texts":["a"]}'

    def ask(extra: bytes, length: int = len(body)) -> tuple[bytes, Answer]:
        head = (
            b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
            + extra
            + f"Content-Length: {length}\r\nConnection: close\r\n\r\n".encode()
        )
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(head)
            first = sock.recv(65536)
            if first.startswith(b"HTTP/1.1 100"):
                sock.sendall(body)
            return first, parse(first + read_until_closed(sock))

    first, answer = ask(server.authorization())
    assert first.startswith(b"HTTP/1.1 100 Continue") and answer.status == 200
    first, answer = ask(server.authorization(), length=10**9)
    assert answer.status == 413 and not first.startswith(b"HTTP/1.1 100")
    if server.token:
        first, answer = ask(b"")
        assert answer.status == 401 and not first.startswith(b"HTTP/1.1 100")


def test_too_many_headers_and_no_host_are_400s_saying_why(server):
    many = {f"X-Header-{i}": "v" for i in range(1000)}
    answer = server.send("POST", "/v1/encode/tiny", b'{"texts":["a"]}', {"Content-Type": JSON, **many})
    assert answer.status == 400 and "too many headers" in answer.error["message"].lower()
    answer = server.send("POST", "/v1/encode/tiny", b'{"texts":["a"]}', {"Content-Type": JSON}, host=False)
    assert answer.status == 400 and "Host" in answer.error["message"]


@pytest.mark.parametrize(
    "body,reason",
    [
        (b"\xc1", "0xc1"),  # a byte MessagePack never uses
        (b"\x91" * 100_000 + b"\x01", "nested too deeply"),
        (b"\x82\xa5texts\x91\xa1a", "truncated"),  # a map of two entries with one
    ],
)
def test_bad_messagepack_says_why(server, body, reason):
    answer = server.send("POST", "/v1/encode/tiny", body, {"Content-Type": MSGPACK, "Accept": JSON})
    assert answer.status == 400
    message = answer.error["message"]
    assert message.startswith("the body is not valid MessagePack: ") or "nested too deeply" in message, message
    assert reason in message, message


# -- 4. no client string echoed past 200 characters -------------------------------------------------------------

ECHOES = {
    "a 1 MB model name (OpenAI)": lambda s: s.post("/v1/embeddings", {"model": "m" * 2**20, "input": "x"}),
    "a 1 MB model name (Cohere)": lambda s: s.post(
        "/v2/rerank", {"model": "m" * 2**20, "query": "q", "documents": ["d"]}
    ),
    "an 8 KB model name in the path": lambda s: s.post("/v1/encode/" + "m" * 8000, {"texts": ["a"]}),
    "an 8 KB X-Shoal-Timeout": lambda s: s.post(
        "/v1/encode/tiny", {"texts": ["a"]}, headers={"X-Shoal-Timeout": "m" * 8000}
    ),
    "an 8 KB Content-Type": lambda s: s.send(
        "POST", "/v1/encode/tiny", b"{}", {"Content-Type": "m" * 8000, "Accept": JSON}
    ),
    "a 1 MB field name": lambda s: s.post("/v1/encode/tiny", {"texts": ["a"], "m" * 2**20: 1}),
    "a 1 MB Expect": lambda s: s.send("POST", "/v1/encode/tiny", b"{}", {"Content-Type": JSON, "Expect": "m" * 8000}),
    "a 1 MB prompt_name": lambda s: s.post("/v1/encode/tiny", {"texts": ["a"], "prompt_name": "m" * 2**20}),
}


@pytest.mark.parametrize("case", list(ECHOES))
def test_no_client_string_comes_back_longer_than_200_characters(server, case):
    answer = ECHOES[case](server)
    assert 400 <= answer.status < 500, answer.raw[:300]
    message = answer.error["message"]
    assert "m" * 201 not in message and len(answer.body) < 2000, message[:500]


# -- the whole hostile suite, auth off and on --------------------------------------------------------------------


def _chunked(*chunks: bytes) -> bytes:
    return b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks) + b"0\r\n\r\n"


def _post(path: str, body: bytes, media: str = JSON, **headers: str) -> tuple[str, str, bytes, dict[str, str]]:
    return "POST", path, body, {"Content-Type": media, **headers}


def _json(path: str, body: Any) -> tuple[str, str, bytes, dict[str, str]]:
    return _post(path, json.dumps(body).encode())


def _pack(path: str, body: Any) -> tuple[str, str, bytes, dict[str, str]]:
    return _post(path, msgpack.packb(body), MSGPACK)


HEAD = b"POST /v1/encode/tiny HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\nConnection: close\r\n"
# Raw requests: framing no client library sends. The auth line goes after the request line.
RAW = {
    "a bad chunk size": HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    "a chunk longer than it says": HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n0\r\n\r\n",
    "a chunk extension of 10 KB": HEAD
    + b"Transfer-Encoding: chunked\r\n\r\n2;"
    + b"x" * 10_000
    + b"\r\nab\r\n0\r\n\r\n",
    "Content-Length -5": HEAD + b"Content-Length: -5\r\n\r\n",
    "Content-Length abc": HEAD + b"Content-Length: abc\r\n\r\n",
    "two Content-Lengths": HEAD + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "Content-Length and chunked": HEAD + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "Transfer-Encoding gzip": HEAD + b"Transfer-Encoding: gzip\r\n\r\n{}",
    "a header of 9 KB": HEAD + b"X-Big: " + b"x" * 9000 + b"\r\n\r\n",
    "a request line of 9 KB": b"POST /v1/encode/" + b"x" * 9000 + b" HTTP/1.1\r\nHost: shoal\r\n\r\n",
    "an invalid header character": HEAD + b"X-Bad: a\x01b\r\nContent-Length: 2\r\n\r\n{}",
    "a header without a colon": HEAD + b"Nonsense\r\nContent-Length: 2\r\n\r\n{}",
    "an unknown method": b"FETCH /v1/models HTTP/1.1\r\nHost: shoal\r\n\r\n",
    "HTTP/2's preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "TLS sent to plain HTTP": bytes.fromhex("16030100f5010000f10303") + os.urandom(32),
    "HTTP/9.9": b"GET /healthz HTTP/9.9\r\nHost: shoal\r\n\r\n",
    "a NUL in the path": b"GET /v1/mod\x00els HTTP/1.1\r\nHost: shoal\r\n\r\n",
    "a bare LF line end": b"POST /v1/encode/tiny HTTP/1.1\nHost: shoal\nContent-Length: 2\n\n{}",
}
REQUESTS = {
    "bad JSON": _post("/v1/encode/tiny", b'{"texts": ['),
    "JSON that is not a map": _post("/v1/encode/tiny", b"[1, 2]"),
    "JSON null": _post("/v1/encode/tiny", b"null"),
    "an empty body": _post("/v1/encode/tiny", b""),
    "text/plain": _post("/v1/encode/tiny", b'{"texts":["a"]}', "text/plain"),
    "JSON nested 100,000 deep": _post("/v1/encode/tiny", b"[" * 100_000),
    "JSON fields nested 100,000 deep": _post("/v1/embeddings", b'{"input":' * 100_000),
    "JSON NaN": _post("/v1/encode/tiny", b'{"texts": ["a"], "dim": NaN}'),
    "JSON integer of 5,000 digits": _post("/v1/encode/tiny", b'{"texts": ["a"], "dim": ' + b"9" * 5000 + b"}"),
    "JSON lone surrogate": _post("/v1/encode/tiny", b'{"texts": ["\\ud800"]}'),
    "MessagePack 0xc1": _post("/v1/encode/tiny", b"\xc1", MSGPACK),
    "MessagePack nested 100,000 deep": _post("/v1/encode/tiny", b"\x91" * 100_000 + b"\x01", MSGPACK),
    "MessagePack truncated": _post("/v1/encode/tiny", msgpack.packb({"texts": ["abc"]})[:-2], MSGPACK),
    "MessagePack extension type": _post("/v1/encode/tiny", b"\x81\xa5texts\xd4\x01\x00", MSGPACK),
    "MessagePack integer keys": _post("/v1/encode/tiny", b"\x81\x01\x91\xa1a", MSGPACK),
    "MessagePack bytes for a text": _pack("/v1/encode/tiny", {"texts": [b"\xff\xfe"]}),
    "MessagePack trailing bytes": _post("/v1/encode/tiny", msgpack.packb({"texts": ["a"]}) + b"\x01", MSGPACK),
    "a body over the limit": _post("/v1/encode/tiny", b'{"texts": ["' + b"a" * (5 * 2**20) + b'"]}'),
    "a gzip bomb": _post("/v1/encode/tiny", gzip.compress(b" " * (64 * 2**20)), **{"Content-Encoding": "gzip"}),
    "bad gzip": _post("/v1/embeddings", LEGIT, **{"Content-Encoding": "gzip"}),
    "bad deflate": _post("/v1/embeddings", LEGIT, **{"Content-Encoding": "deflate"}),
    "gzip with a bad CRC": _post("/v1/embeddings", _bad_crc(LEGIT), **{"Content-Encoding": "gzip"}),
    "an unknown Content-Encoding": _post("/v1/embeddings", LEGIT, **{"Content-Encoding": "x-unknown"}),
    "Expect 999-x": _post("/v1/encode/tiny", b'{"texts":["a"]}', Expect="999-x"),
    "a chunked body over the limit": (
        "POST",
        "/v1/encode/tiny",
        _chunked(*[b"a" * 2**20] * 5),
        {"Content-Type": JSON, "Transfer-Encoding": "chunked"},
    ),
    "GET on a POST route": ("GET", "/v1/encode/tiny", b"", {}),
    "no such route": _json("/v2/embeddings", {"model": "tiny", "input": "a"}),
    "an unknown model": _json("/v1/embeddings", {"model": "nope", "input": "a"}),
    "a reranker asked to embed": _json("/v1/embeddings", {"model": "tiny-reranker", "input": "a"}),
    "an embedder asked for sparse vectors": _json("/v1/sparse/tiny", {"texts": ["a"]}),
    "X-Shoal-Timeout nan": _post("/v1/encode/tiny", b'{"texts":["a"]}', **{"X-Shoal-Timeout": "nan"}),
    "X-Shoal-Timeout -1": _post("/v1/encode/tiny", b'{"texts":["a"]}', **{"X-Shoal-Timeout": "-1"}),
    "X-Shoal-Timeout words": _post("/v1/encode/tiny", b'{"texts":["a"]}', **{"X-Shoal-Timeout": "soon"}),
    "a negative dim": _json("/v1/encode/tiny", {"texts": ["a"], "dim": -1}),
    "a dim of 10^18": _json("/v1/encode/tiny", {"texts": ["a"], "dim": 10**18}),
    "dtype float64": _json("/v1/encode/tiny", {"texts": ["a"], "dtype": "float64"}),
    "int8 without ranges": _json("/v1/encode/tiny", {"texts": ["a"], "precision": "int8"}),
    "ranges of unequal lengths": _json(
        "/v1/encode/tiny", {"texts": ["a"], "precision": "int8", "ranges": [[0], [1, 2]]}
    ),
    "ranges of strings": _json("/v1/encode/tiny", {"texts": ["a"], "precision": "int8", "ranges": [["a"], ["b"]]}),
    "both prompt and prompt_name": _json("/v1/encode/tiny", {"texts": ["a"], "prompt": "p", "prompt_name": "q"}),
    "an unknown field": _json("/v1/encode/tiny", {"texts": ["a"], "colour": "red"}),
    "fifty unknown fields": _json("/v1/encode/tiny", {"texts": ["a"], **{f"f{i}": i for i in range(50)}}),
    "texts a string": _json("/v1/encode/tiny", {"texts": "a"}),
    "texts empty": _json("/v1/encode/tiny", {"texts": []}),
    "3,000 texts": _json("/v1/encode/tiny", {"texts": ["a"] * 3000}),
    "a long text without truncation": _json("/v1/encode/tiny", {"texts": ["a" * 20_000], "truncate": False}),
    "OpenAI input empty": _json("/v1/embeddings", {"model": "tiny", "input": []}),
    "OpenAI an empty token array": _json("/v1/embeddings", {"model": "tiny", "input": [[]]}),
    "OpenAI a negative token id": _json("/v1/embeddings", {"model": "tiny", "input": [[-1]]}),
    "OpenAI a token id of 2^40": _json("/v1/embeddings", {"model": "tiny", "input": [[2**40]]}),
    "OpenAI a token id of 10^30": _json("/v1/embeddings", {"model": "tiny", "input": [10**30]}),
    "OpenAI true as a token id": _json("/v1/embeddings", {"model": "tiny", "input": [True]}),
    "OpenAI 9,000 ids in one array": _json("/v1/embeddings", {"model": "tiny", "input": [1] * 9000}),
    "OpenAI a map as input": _json("/v1/embeddings", {"model": "tiny", "input": {"a": 1}}),
    "OpenAI encoding_format hex": _json("/v1/embeddings", {"model": "tiny", "input": "a", "encoding_format": "hex"}),
    "OpenAI dimensions 0": _json("/v1/embeddings", {"model": "tiny", "input": "a", "dimensions": 0}),
    "OpenAI model a list": _json("/v1/embeddings", {"model": ["tiny"], "input": "a"}),
    "Cohere no documents": _json("/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": []}),
    "Cohere a document without text": _json(
        "/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": [{"txt": "a"}]}
    ),
    "Cohere top_n -1": _json("/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": ["a"], "top_n": -1}),
    "Cohere no query": _json("/v2/rerank", {"model": "tiny-reranker", "documents": ["a"]}),
    "Cohere 10,001 documents": _json(
        "/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": ["a"] * 10_001}
    ),
    "native rerank a query list": _json("/v1/rerank/tiny-reranker", {"query": ["q"], "documents": ["a"]}),
    "native rerank documents null": _json("/v1/rerank/tiny-reranker", {"query": "q", "documents": None}),
    "Cohere embed images for a text model": _json(
        "/v2/embed", {"model": "tiny", "input_type": "image", "images": ["data:image/png;base64,AAAA"]}
    ),
    "Cohere embed texts of numbers": _json("/v2/embed", {"model": "tiny", "texts": [1, 2]}),
    "Cohere embed both texts and images": _json("/v2/embed", {"model": "tiny", "texts": ["a"], "images": ["b"]}),
    "images for a text model": _pack("/v1/encode/tiny", {"images": [b"\x89PNG"]}),
    "images of numbers": _pack("/v1/encode/tiny", {"images": [1]}),
    "a 1 MB model name": _json("/v1/embeddings", {"model": "m" * 2**20, "input": "a"}),
    "a million integers (Cohere)": _json("/v2/rerank", {"model": "tiny-reranker", "query": "q", "documents": MILLION}),
    "a million integers (MessagePack)": _pack("/v1/encode/tiny", {"texts": MILLION}),
    "a million integers (OpenAI)": _json("/v1/embeddings", {"model": "tiny", "input": [*MILLION, "x"]}),
}


def _hostile(server: Server, auth: bool) -> dict[str, Answer]:
    answers = {}
    for name, raw in RAW.items():
        if auth and server.token and b"\r\n" in raw:  # not TLS's bytes, nor lines ended by LF alone
            first, rest = raw.split(b"\r\n", 1)
            raw = first + b"\r\n" + server.authorization() + rest
        answers[name] = exchange(server.port, raw, timeout=60)
    for name, (method, path, body, headers) in REQUESTS.items():
        answers[name] = server.send(method, path, body, {"Accept": JSON, **headers}, auth=auth)
    return answers


def test_the_hostile_suite_gets_4xx_errors_in_the_json_shape_no_traceback_and_correct_vectors_after(
    servers, tiny_model
):
    from sentence_transformers import SentenceTransformer

    for server in servers.values():
        for auth in {True, server.token is None}:  # auth off: once; auth on: with the token and without
            for name, answer in _hostile(server, auth).items():
                where = (server.name, "with token" if auth else "without token", name)
                assert 400 <= answer.status < 500, (*where, answer.raw[:300])
                error = answer.error
                assert error["code"] == answer.status and error["message"], (*where, error)
                assert len(answer.body) < 2000, where
    for server in servers.values():
        assert server.tracebacks() == [], server.name
    texts = ["after the hostile suite", "every vector still right"]
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(texts)
    for server in servers.values():
        with OnlineClient(server.url(), timeout=60, token=server.token) as online:
            np.testing.assert_allclose(online.encode("tiny", texts), direct, atol=1e-5)
