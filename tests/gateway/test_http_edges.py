"""The last sharp edges (issue 25): blank model names, OUTPUT inside INPUT, the HTTP server's own errors,
and the accepted-today cases each decided.

The CLI refusals run `shoal` in this process against an unreachable scheduler: a refusal comes before any
cluster is reached (and before anything is written). The gateway tests start a real gateway on a real
pull queue (its scheduler faked, as in test_online_units.py) and talk to it over raw sockets, since no HTTP
client library sends requests this malformed.
"""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
from collections.abc import Iterator

import click
import pytest
import s3fs
import yaml

from tests.support.cli import embed_args, invoke_shoal, reindex_job
from tests.support.fake_scheduler import FakeScheduler
from tests.support.files import write_shards
from tests.support.s3 import s3_options

UNREACHABLE = "tcp://127.0.0.1:9"  # a refusal that comes first never gets as far as this scheduler
SIM = {"kind": "sim", "dim": 16, "max_seq_length": 64, "memory_bytes": 1000}


@pytest.fixture
def sim_catalog(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": {"sim": SIM}}))
    return path


# -- 1. blank model names -----------------------------------------------------------------------


def _model_options() -> list[tuple[str, str, int]]:
    """(command, option, its required arguments) for every option of every command that names models."""
    from shoal.pipeline.cli import main

    found = []
    for name, command in sorted(main.commands.items()):
        arguments = sum(isinstance(p, click.Argument) and p.required for p in command.params)
        found += [
            (name, option, arguments)
            for p in command.params
            for option in p.opts
            if option in ("--model", "--models", "--reranker")
        ]
    return found


def test_the_options_found_are_every_model_option_of_every_command():
    assert {(c, o) for c, o, _ in _model_options()} == {
        ("check-precision", "--model"),
        ("classify", "--model"),
        ("embed", "--model"),
        ("eval", "--model"),
        ("eval", "--reranker"),
        ("extract", "--model"),
        ("rerank", "--model"),
        ("serve", "--models"),
        ("tune", "--models"),
    }


@pytest.mark.parametrize("command, option, arguments", _model_options())
@pytest.mark.parametrize("blank", ["", " ", ",", " , "])
def test_a_blank_model_list_is_a_usage_error_naming_the_option(command, option, arguments, blank, tmp_path):
    result = invoke_shoal(command, *[str(tmp_path / f"arg{i}") for i in range(arguments)], option, blank)
    assert result.returncode == 2, result.stderr
    assert f"Invalid value for '{option}'" in result.stderr and "names no model" in result.stderr, result.stderr


# -- 2. OUTPUT inside INPUT -----------------------------------------------------------------------


def _embed(source, output, catalog, *extra: str):
    return invoke_shoal(*embed_args(source, output, catalog, *extra, scheduler=UNREACHABLE, model="sim"))


@pytest.mark.parametrize(
    "source, output, expected",
    [
        ("data", "data/vectors", "is inside input"),
        ("data/", "data/vectors/", "is inside input"),
        ("data/*.parquet", "data/vectors", "is inside input"),
        ("data", "data/nested/deeper/vectors", "is inside input"),
        ("data", "data", "is the input folder"),
        ("data/", "data", "is the input folder"),
        ("data/sub", "data", "is inside output"),
    ],
)
def test_output_and_input_that_overlap_are_refused_before_anything_is_written(
    sim_catalog, tmp_path, source, output, expected
):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    write_shards(tmp_path / "data" / "sub", ["c"], shards=1, row_group_size=1)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = _embed(tmp_path / source, tmp_path / output, sim_catalog)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "OUTPUT" in result.stderr, result.stderr
    assert repr(str(tmp_path / source)) in result.stderr and repr(str(tmp_path / output)) in result.stderr
    assert "cannot reach the scheduler" not in result.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # not even a write probe


def test_output_beside_input_and_a_file_beside_its_parts_pass_the_preflight(tmp_path):
    from shoal.pipeline.jobs.engine import preflight

    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    for source, output in (("data", "data-vectors"), ("data/shard-000.parquet", "data"), ("data", "database")):
        preflight(str(tmp_path / source), str(tmp_path / output), {})


def test_a_lance_output_inside_input_is_refused_naming_the_dataset(sim_catalog, tmp_path):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    dataset = tmp_path / "data" / "vectors.lance"
    result = _embed(tmp_path / "data", f"lance://{dataset}", sim_catalog)
    assert result.returncode == 2, result.stderr
    assert f"output {str(dataset)!r} is inside input" in result.stderr, result.stderr
    assert not dataset.exists()


def test_a_reindex_job_with_its_output_inside_its_input_is_refused_before_its_lock(sim_catalog, tmp_path):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    job = tmp_path / "job.yaml"
    spec = reindex_job(tmp_path / "data", tmp_path / "data" / "index", sim_catalog, UNREACHABLE, model="sim")
    job.write_text(yaml.safe_dump(spec))
    for dry_run in ([], ["--dry-run"]):
        result = invoke_shoal("reindex", str(job), *dry_run)
        assert result.returncode == 2 and "is inside input" in result.stderr, result.stderr
        assert not (tmp_path / "data" / "index").exists()


@pytest.mark.parametrize(
    "source, output, expected",
    [
        ("s3://edges/data", "s3://edges/data/vectors", "is inside input"),
        ("s3://edges/data/", "s3a://edges/data/vectors/", "is inside input"),
        ("s3a://edges/data/*.parquet", "s3://edges/data/vectors", "is inside input"),
        ("s3://edges/data", "s3a://edges/data/", "is the input folder"),
        ("s3://edges/data", "s3://edges", "is inside output"),
    ],
)
def test_the_same_refusals_on_s3_whatever_the_scheme_spelling(
    s3_server, sim_catalog, tmp_path, source, output, expected
):
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    if not fs.exists("edges"):
        fs.mkdir("edges")
        write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
        fs.put_file(str(tmp_path / "data" / "shard-000.parquet"), "edges/data/shard-000.parquet")
    before = sorted(fs.find("edges"))
    result = _embed(source, output, sim_catalog, "--storage-options", json.dumps(options))
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert repr(source) in result.stderr and repr(output) in result.stderr
    fs.invalidate_cache()
    assert sorted(fs.find("edges")) == before


# -- the gateway over raw sockets ---------------------------------------------------------------

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


# -- 7. accepted today, each decided --------------------------------------------------------------


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


@pytest.mark.parametrize("dim", ["4", "12"])
def test_binary_embed_with_a_dim_of_part_bytes_is_refused_before_any_cluster(sim_catalog, tmp_path, dim):
    write_shards(tmp_path / "data", ["a", "b"], shards=1, row_group_size=2)
    extra = ("--precision", "binary", "--dim", dim)
    result = invoke_shoal(
        *embed_args(tmp_path / "data", tmp_path / "out", sim_catalog, *extra, scheduler=UNREACHABLE, model="sim")
    )
    assert result.returncode == 2 and f"dim {dim} is not a multiple of 8" in result.stderr, result.stderr


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
