"""The gateway's HTTP server at its edges: connections over the cap, requests the HTTP parser refuses, body
timeouts, vector options it cannot honour, the bearer scheme.

A real gateway on a real pull queue (its scheduler faked, as in tests/scheduler/test_online_queue.py), talked to
over raw sockets, since no HTTP client library sends requests this malformed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.support.fake_scheduler import FakeScheduler

SIM = {"kind": "sim", "dim": 16, "max_seq_length": 64, "memory_bytes": 1000}


TOKEN = "s3cr3t-t0ken"


class Served:
    """A gateway on a real pull queue, in an event loop of its own thread; what that loop reports as an
    unhandled error (a task's exception never retrieved) is kept in `loop_errors`."""

    def __init__(self) -> None:
        from shoal.configs import ModelSpec
        from shoal.scheduler_plugins.pull_queue import PullQueue

        self.loop = asyncio.new_event_loop()
        self.loop_errors: list[str] = []
        self.loop.set_exception_handler(lambda loop, context: self.loop_errors.append(context["message"]))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.plugin = PullQueue(models={"sim": ModelSpec.model_validate({"name": "sim", **SIM})})
        self.run(self.plugin.start(FakeScheduler()))
        self.port = 0

    def run(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def start(self, **settings) -> None:
        reply = self.run(self.plugin.gateway_start(settings={"port": 0, **settings}, replace=True))
        self.port = int(reply["url"].rsplit(":", 1)[1])

    def collect_garbage(self) -> None:
        """A task that failed unobserved is reported when it is collected: collect now, in the loop."""

        async def collect() -> None:
            gc.collect()

        self.run(collect())

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=30)

    def exchange(self, raw: bytes, timeout: float = 30) -> bytes:
        """Send `raw`, read until the server closes."""
        with self.connect() as sock:
            sock.sendall(raw)
            sock.settimeout(timeout)
            return _read_until_closed(sock)

    def close(self) -> None:
        self.run(self.plugin.gateway_stop())
        self.run(self.plugin.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def _read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _answer(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ", 2)[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.fixture
def served(tmp_path, monkeypatch) -> Iterator[Served]:
    monkeypatch.setenv("SHOAL_SHARP_EDGES_TOKEN", TOKEN)
    gateway = Served()
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.mark.integration  # a server
def test_connections_over_the_cap_get_a_503_no_traceback_and_a_metric(served):
    served.start(max_connections=2)
    held = [served.connect() for _ in range(2)]
    try:
        for sock in held:  # answered, so surely admitted before the extra ones
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: shoal\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        for _ in range(20):
            status, headers, _ = _answer(served.exchange(b""))
            assert status == 503 and headers["retry-after"] == "1"
    finally:
        for sock in held:
            sock.close()
    served.collect_garbage()
    assert served.loop_errors == []
    metrics = served.exchange(b"GET /metrics HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n\r\n").decode()
    assert "shoal_gateway_connections_refused_total 20.0" in metrics


MALFORMED = {
    "an invalid header character": (
        b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\x01\r\nContent-Length: 2\r\n\r\n{}",
        "Invalid header value char",
    ),
    "a header over 8 KB": (
        b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"x" * 9000
        + b"\r\n\r\n",
        "longer than the server's limit",
    ),
    "an unknown method": (b"FETCH /v1/models HTTP/1.1\r\nHost: shoal\r\n\r\n", "not an HTTP method"),
    "Content-Length -1": (
        b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nContent-Length: -1\r\n\r\n",
        "Invalid character in Content-Length",
    ),
    "Content-Length and Transfer-Encoding": (
        b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "Transfer-Encoding can't be present with Content-Length",
    ),
}


@pytest.mark.integration  # a server
def test_requests_the_http_parser_refuses_get_the_json_error_shape_and_no_echo(served):
    served.start(token_env="SHOAL_SHARP_EDGES_TOKEN")
    for name, (raw, reason) in MALFORMED.items():
        answer = served.exchange(raw)
        status, headers, body = _answer(answer)
        assert status == 400 and headers["content-type"].startswith("application/json"), (name, answer)
        error = json.loads(body)["error"]
        assert error["code"] == 400 and error["type"] == "invalid_request", (name, error)
        assert error["message"].startswith("malformed HTTP request: ") and reason in error["message"], (name, error)
        assert TOKEN.encode() not in answer and b"FETCH" not in answer, (name, answer)
    served.collect_garbage()
    assert served.loop_errors == []


@pytest.mark.integration  # a server
def test_a_body_timeout_answers_408_and_closes_the_connection(served):
    # Header timeout far off: the close must come with the 408, not from a later timer (nor aiohttp's
    # 10 s of lingering over a body that is not coming).
    served.start(body_timeout_seconds=0.5, header_timeout_seconds=120)
    with served.connect() as sock:
        sock.sendall(
            b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"texts"'
        )
        sock.settimeout(5)  # the bound on "closed with the 408"
        status, headers, body = _answer(_read_until_closed(sock))
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "body_timeout"


# -- vector options no answer can hold --------------------------------------------------------------


def _post_json(served: Served, path: str, body: dict, headers: bytes = b"") -> tuple[int, dict]:
    data = json.dumps(body).encode()
    raw = (
        f"POST {path} HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\nConnection: close\r\n"
        f"Content-Length: {len(data)}\r\n".encode()
        + headers
        + b"\r\n"
        + data
    )
    status, _, answer = _answer(served.exchange(raw))
    return status, json.loads(answer)


@pytest.mark.integration  # a server
def test_int8_ranges_without_a_span_and_binary_vectors_of_part_bytes_are_400s(served):
    served.start(request_timeout_seconds=5)  # no worker: a request that got as far as the queue would wait
    flat = [[0.1] * SIM["dim"], [0.1] * SIM["dim"]]
    status, reply = _post_json(served, "/v1/encode/sim", {"texts": ["a"], "precision": "int8", "ranges": flat})
    assert status == 400 and "ranges dimension 0" in reply["error"]["message"], reply
    for precision, dim in (("binary", 4), ("ubinary", 7), ("binary", 12)):
        status, reply = _post_json(served, "/v1/encode/sim", {"texts": ["a"], "precision": precision, "dim": dim})
        assert status == 400 and f"dim {dim} is not a multiple of 8" in reply["error"]["message"], reply


@pytest.mark.integration  # a server
def test_the_bearer_scheme_is_case_insensitive_then_spaces_only(served):
    served.start(token_env="SHOAL_SHARP_EDGES_TOKEN")
    answers = {}
    for given in ("Bearer T", "bEaReR   T", "BEARER T", "Bearer \tT", "Bearer\tT", "BearerT", "Basic T"):
        header = given.replace("T", TOKEN)
        raw = f"GET /v1/models HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\nAuthorization: {header}\r\n\r\n"
        answers[given] = _answer(served.exchange(raw.encode()))[0]
    assert answers == {
        "Bearer T": 200,
        "bEaReR   T": 200,
        "BEARER T": 200,
        "Bearer \tT": 401,
        "Bearer\tT": 401,
        "BearerT": 401,
        "Basic T": 401,
    }


@pytest.mark.integration  # a server
def test_over_its_rate_limit_a_client_gets_a_429_with_retry_after_and_others_do_not(served, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("first-t0ken\nsecond-t0ken\n")
    # One request per 100 s after a burst of 2: the third comes well within that, whatever the machine's load.
    # No worker serves `sim` here: an admitted request waits out its timeout (then a 504), so keep that short.
    served.start(token_file=str(tokens), requests_per_second=0.01, request_burst=2, request_timeout_seconds=1)

    def ask(token: str) -> tuple[int, dict[str, str], bytes]:
        return _answer(
            served.exchange(
                b"POST /v1/encode/sim HTTP/1.1\r\nHost: shoal\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {token}\r\n".encode()
                + b'Content-Length: 15\r\nConnection: close\r\n\r\n{"texts":["a"]}'
            )
        )

    assert [ask("first-t0ken")[0] for _ in range(2)] != [429, 429]
    status, headers, body = ask("first-t0ken")
    assert status == 429 and 1 <= int(headers["retry-after"]) <= 100
    assert "rate limit of 0.01 requests a second" in json.loads(body)["error"]["message"]
    assert ask("second-t0ken")[0] != 429
    assert ask("wrong")[0] == 401  # counted only once authenticated
