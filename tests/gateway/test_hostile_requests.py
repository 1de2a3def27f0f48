"""Hostile but realistic use: poison requests fail alone, nothing listens beyond loopback, every failure is a status.

The gateway tests run against the module's two-worker cluster over real
HTTP (raw sockets where a well-behaved client cannot misbehave enough); the
batch tests run `shoal` against the same cluster, or against an unreachable
scheduler to show a refusal comes before any cluster is reached.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import msgpack
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from shoal.configs import load_catalog
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import pull_queue
from tests.support.cli import embed_args, invoke_shoal
from tests.support.files import read_output, write_profile, write_shards
from tests.support.gateway import SIM
from tests.support.paths import ROOT, SHOAL
from tests.support.waiting import wait_for

UNREACHABLE = "tcp://127.0.0.1:9"  # a refusal that comes first never gets as far as this scheduler
LOOPBACK = {"127.0.0.1", "::1"}
SETTINGS = {"port": 0, "max_inputs": 8, "request_timeout_seconds": 60}
POISON = "\ud800"  # a lone surrogate: JSON's "\ud800" escape allows it, UTF-8 has no form for it


# -- the gateway ------------------------------------------------------------------------


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


# -- listeners --------------------------------------------------------------------------


def _listeners(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the process and its descendants."""
    found = set()
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                found |= {
                    (c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                }
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    except psutil.NoSuchProcess:
        pass
    return found


@pytest.fixture(scope="module")
def sim_catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "catalog.yaml"
    models = {"slowish": {**SIM, "batch_fixed_seconds": 0.2, "max_batch_size": 8}}  # a few seconds per job
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stderr is not None, "stderr is not piped"
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if marker in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {marker!r} in {seen}")


@pytest.mark.integration  # starts `shoal serve` and `shoal embed` processes
def test_nothing_shoal_serve_or_shoal_embed_starts_listens_beyond_loopback(sim_catalog, tmp_path, demo_texts):
    profile = write_profile(tmp_path, name="two", workers=2, rows_per_item=50)
    serve = subprocess.Popen(
        [SHOAL, "serve", "--catalog", str(sim_catalog), "--profile", str(profile), "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(serve, "serving")
        listening = _listeners(serve.pid)
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
    # the scheduler, its dashboard, the gateway, two nannies and two workers
    assert len(listening) >= 5 and {ip for ip, _ in listening} <= LOOPBACK, listening

    write_shards(tmp_path / "in", demo_texts[:400], shards=2, row_group_size=50)
    embed = subprocess.Popen(
        [SHOAL, *embed_args(tmp_path / "in", tmp_path / "out", sim_catalog, profile=profile, model="slowish")],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seen: set[tuple[str, int]] = set()
    while embed.poll() is None:  # sampled for the whole run: every listener it opens, however briefly
        seen |= _listeners(embed.pid)
        time.sleep(0.2)
    assert embed.returncode == 0
    assert len(seen) >= 4 and {ip for ip, _ in seen} <= LOOPBACK, seen


# -- batch jobs ---------------------------------------------------------------------------


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """A folder no write can land in: a read-only tmpfs for root (whom mode bits do not stop), else mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "shoal-ro", str(path)], capture_output=True
    ).returncode:
        pytest.skip("running as root where a read-only tmpfs cannot be mounted")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.fixture
def shoal(cluster, tiny_catalog, test_profile):
    _, client = cluster

    def run(*args: str, scheduler: str | None = None):
        return invoke_shoal(
            *args,
            "--catalog",
            str(tiny_catalog),
            "--profile",
            str(test_profile),
            "--scheduler",
            scheduler or client.scheduler.address,
        )

    return run


def _one_shard(directory: Path, rows: int = 20) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"id": list(range(rows)), "text": [f"text {i}" for i in range(rows)]}), directory / "a.parquet"
    )
    return directory


def test_an_output_that_cannot_be_written_is_refused_before_the_cluster_is_reached(
    tiny_catalog, test_profile, tmp_path
):
    source = _one_shard(tmp_path / "in")
    (tmp_path / "a-file").write_text("x")
    pairs = tmp_path / "pairs.parquet"
    pq.write_table(pa.table({"id": [1], "query": ["q"], "passage": ["p"]}), pairs)
    common = ("--catalog", str(tiny_catalog), "--profile", str(test_profile), "--scheduler", UNREACHABLE)
    with read_only_folder(tmp_path / "ro") as ro:
        cases = {
            "read-only": (str(ro / "out"), "Read-only file system" if os.geteuid() == 0 else "Permission denied"),
            "a file": (str(tmp_path / "a-file"), "is a file"),
            "under a file": (str(tmp_path / "a-file" / "out"), "cannot be written"),
        }
        for case, (output, reason) in cases.items():
            for command in (
                ("embed", str(source), output, "--model", "tiny"),
                ("rerank", str(pairs), output, "--model", "tiny-reranker"),
            ):
                result = invoke_shoal(*command, *common)
                assert result.returncode == 2, (case, result.stderr)
                assert f"output {output!r}" in result.stderr and reason in result.stderr, (case, result.stderr)
                assert "cannot reach the scheduler" not in result.stderr
        job = tmp_path / "job.yaml"
        job.write_text(
            yaml.safe_dump(
                {
                    "name": "docs",
                    "input": str(source),
                    "output": str(ro / "out"),
                    "model": "tiny",
                    "catalog": str(tiny_catalog),
                    "scheduler": UNREACHABLE,
                }
            )
        )
        result = invoke_shoal("reindex", str(job))
        assert result.returncode == 2 and "cannot be written" in result.stderr, result.stderr
        pipeline = tmp_path / "pipeline.yaml"
        pipeline.write_text(
            yaml.safe_dump(
                {
                    "output": str(ro / "out"),
                    "corpus": {"input": str(source)},
                    "queries": {"input": str(source)},
                    "embed": {"model": "tiny"},
                }
            )
        )
        result = invoke_shoal("run", str(pipeline), *common)
        assert result.returncode == 2 and "cannot be written" in result.stderr, result.stderr
        assert "cannot reach the scheduler" not in result.stderr


def test_a_glob_matching_nothing_is_refused_before_the_cluster_is_reached(tiny_catalog, tmp_path):
    result = invoke_shoal(*embed_args(tmp_path / "*.parquet", tmp_path / "out", tiny_catalog, scheduler=UNREACHABLE))
    assert result.returncode == 2 and "matches no Parquet files" in result.stderr, result.stderr


def test_a_refused_part_write_is_permanent_and_a_refused_manifest_still_ends_with_a_summary(tmp_path):
    from shoal.pipeline.jobs.engine import BatchJob, _write_manifest
    from shoal.workers.data.parquet_slices import write_part
    from shoal.workers.data.storage import OutputRefused
    from shoal.workers.operations import PERMANENT_ERRORS

    with read_only_folder(tmp_path / "ro") as ro:
        with pytest.raises(OutputRefused) as info:
            write_part(str(ro / "out" / "part-1.parquet"), pa.table({"a": [1]}), None)
        assert isinstance(info.value, PERMANENT_ERRORS) and "part-1.parquet: cannot write" in str(info.value)
        manifest = {"complete": True}
        url, error = _write_manifest(BatchJob("embed", "in", str(ro), "tiny", {}, [], {}), manifest)
        assert url == "" and "cannot write the manifest" in error and manifest["complete"] is False
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputRefused):  # a file where a folder should be
        write_part(str(tmp_path / "a-file" / "part.parquet"), pa.table({"a": [1]}), None)
    if os.geteuid() == 0:  # a full disk: a 64 KiB tmpfs and a part of incompressible bytes
        full = tmp_path / "full"
        full.mkdir()
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64k", "shoal-full", str(full)], capture_output=True
            ).returncode
            == 0
        ):
            try:
                with pytest.raises(OutputRefused, match="No space left"):
                    write_part(str(full / "part.parquet"), pa.table({"a": [os.urandom(1 << 20)]}), None)
                assert not list(full.iterdir())  # the temporary file is gone too
            finally:
                subprocess.run(["umount", str(full)], check=True)


def test_underscore_and_dot_folders_in_the_input_are_not_input(tmp_path):
    from shoal.pipeline.jobs.planner import PlanError, list_shards

    for folder in ("", "_staging/", ".cache/", "keep/"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": ["x"]}), tmp_path / folder / "a.parquet")
    names = [s.url.split(str(tmp_path), 1)[1] for s in list_shards(str(tmp_path))]
    assert names == ["/a.parquet", "/keep/a.parquet"]
    # A file named on its own is input even inside OUTPUT (parts written beside their source).
    assert len(list_shards(str(tmp_path / "keep" / "a.parquet"), None, str(tmp_path / "keep"))) == 1
    with pytest.raises(PlanError, match="is inside output"):
        list_shards(str(tmp_path / "keep"), None, str(tmp_path))


def test_a_row_that_is_not_utf8_is_a_named_rejection_and_every_other_row_is_embedded(shoal, tiny_model, tmp_path):
    texts = [f"sentence {i}".encode() for i in range(30)]
    texts[7] = b"broken \xed\xa0\x80 surrogate"
    texts[21] = b"\xff\xfe"
    column = pa.array(texts, type=pa.binary()).view(pa.string())  # written as a careless writer would
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"id": list(range(30)), "text": column}), tmp_path / "in" / "bad.parquet", row_group_size=10
    )
    result = shoal("embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "tiny")
    assert result.returncode == 1, result.stderr
    assert "bad.parquet row 7, column 'text': not valid UTF-8 (byte 0xed at offset 7)" in result.stderr
    assert "bad.parquet row 21, column 'text': not valid UTF-8 (byte 0xff at offset 0)" in result.stderr
    table = read_output(tmp_path / "out").sort_by("id")
    assert table.column("id").to_pylist() == list(range(30))
    vectors = table.column("embedding").to_pylist()
    assert vectors[7] is None and vectors[21] is None
    good = [i for i in range(30) if i not in (7, 21)]
    np.testing.assert_allclose(
        [vectors[i] for i in good], _direct(tiny_model, [texts[i].decode() for i in good]), atol=1e-5
    )
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["rejected_rows"] == 2 and manifest["complete"]


def test_a_model_named_twice_runs_once(shoal, tmp_path):
    source = _one_shard(tmp_path / "in")
    result = shoal("embed", str(source), str(tmp_path / "out"), "--model", "tiny,tiny")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "_manifest.json").exists() and not (tmp_path / "out" / "tiny").exists()


def test_ctrl_c_exits_130_and_the_rerun_finishes_the_job(cluster, sim_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    # 16 parts: the job runs for seconds after its first part is written, however fast the workers start.
    ids = write_shards(tmp_path / "in", demo_texts[:1600], shards=16, row_group_size=25)
    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile, "model": "slowish"}
    args = [SHOAL, *embed_args(tmp_path / "in", tmp_path / "out", sim_catalog, **on_cluster)]
    # SIGINT as in a terminal, even when the tests run in the background (which starts them with it ignored).
    interruptible = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
    )
    wait_for(  # interrupted mid-job, once a part is written
        lambda: list((tmp_path / "out").glob("part-*.parquet")) or proc.poll() is not None,
        timeout=120,
        what="a first part written",
    )
    assert proc.poll() is None, "the job ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    rerun = invoke_shoal(*args[1:])  # in this process: no second interpreter start
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
