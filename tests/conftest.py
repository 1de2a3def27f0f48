"""Shared fixtures (tiny models, a real multi-process Dask cluster, a real S3 API), the test tiers, and `wait_for`.

Two tiers
---------
`make test-fast` (`pytest -m unit`): the unit tests only, in seconds. A unit test starts no Dask cluster
or client, loads no model (not even the tiny ones `model_factory` builds), starts no S3 server and no
process: the scheduler plugin, the model pool, the device thread, configs, planning and formats are
driven in-process with fakes (see `FakeScheduler` below).

`make test` (`pytest`): everything, the unit tests included. Minutes.

Which tier a test is in is decided here, in `pytest_collection_modifyitems`: every test gets the `unit`
marker unless
  - it needs one of HEAVY_FIXTURES, directly or through another fixture (`cluster`, `tiny_model`, ...), or
  - it is marked `integration` (starts a cluster, server or process itself, without those fixtures;
    mark such a test `@pytest.mark.integration`, or a whole module with `pytestmark = pytest.mark.integration`), or
  - it is marked `slow` (the real MiniLM model).
A test that forgets its `integration` mark fails in the fast tier rather than slowing it: for unit tests,
`_unit_tier_guard` refuses processes, Dask clusters, clients and servers, and the model and S3-server
libraries (torch, transformers, sentence-transformers, onnxruntime, moto; caught when not imported yet,
as in `make test-fast`, where nothing heavy runs first). The fast tier still collects every file: a model
library imported at a test module's top costs every `make test-fast` its import, so import it inside
the tests that use it (test_runtimes.py). One file's unit tests: `pytest -m unit tests/test_pull_queue.py`.

Waiting
-------
Tests never sleep a fixed time for something to happen: they wait for it with `wait_for` (or
`async_wait_for` in a coroutine), which polls the condition and fails with `what` if it never holds.
A sleep that stays is the thing under test (a slow client, a lease left to expire, a forward batch's
compute time) and says so in a comment.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).parent))

from model_factory import TINY_DIM, TINY_MAX_SEQ, build_tiny_cross_encoder, build_tiny_embedder  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "datasets" / "demo"
SHOAL = str(Path(sys.executable).parent / "shoal")
DASK = str(Path(sys.executable).parent / "dask")

# -- tiers ---------------------------------------------------------------------------------

# Fixtures that start a cluster, build or load a model, or start a server: a test needing one is not a unit test.
HEAVY_FIXTURES = {"cluster", "tiny_model", "tiny_reranker", "tiny_catalog", "s3_server"}
# Libraries a unit test must not import: models and the S3 server (checked only while they are not yet imported).
HEAVY_MODULES = {"torch", "transformers", "sentence_transformers", "onnxruntime", "moto"}
# Commands a unit test may run: system tools that take milliseconds (a tmpfs to fill up, in test_hardening.py).
UNIT_COMMANDS = {"mount", "umount"}


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        heavy = HEAVY_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if not heavy and not item.get_closest_marker("integration") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.unit)


class _RefuseHeavyImports(importlib.abc.MetaPathFinder):
    def __init__(self, refuse: Callable[[str], None]) -> None:
        self.refuse = refuse

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY_MODULES:
            self.refuse(f"imports {name}")
        return None


@pytest.fixture(autouse=True)
def _unit_tier_guard(request, monkeypatch):
    """For a unit test: starting a process, a cluster, a client or a server, or importing a model library, fails it."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    import distributed
    import distributed.core
    import distributed.deploy.spec

    def refuse(what: str) -> None:
        pytest.fail(
            f"{request.node.nodeid} is a unit test (make test-fast) but {what}: "
            "mark it @pytest.mark.integration, or give it the fixture it needs (conftest.py, HEAVY_FIXTURES)",
            pytrace=False,
        )

    def refusing(what: str):
        def refused(*args, **kwargs):
            refuse(what)

        return refused

    popen_init = subprocess.Popen.__init__

    def guarded_popen(self, args, *rest, **kwargs):
        command = Path(str(args[0] if isinstance(args, (list, tuple)) else str(args).split()[0])).name
        if command not in UNIT_COMMANDS:
            refuse(f"starts a process ({command})")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded_popen)
    monkeypatch.setattr(distributed.deploy.spec.SpecCluster, "__init__", refusing("starts a Dask cluster"))
    monkeypatch.setattr(distributed.Client, "__init__", refusing("starts a Dask client"))
    monkeypatch.setattr(distributed.core.Server, "__init__", refusing("starts a Dask scheduler, worker or nanny"))
    monkeypatch.setattr(sys, "meta_path", [_RefuseHeavyImports(refuse), *sys.meta_path])
    yield


class RecordingStream:
    """A scheduler's stream to one worker, keeping what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, *msgs: dict) -> None:
        self.sent.extend(msgs)


class FakeScheduler:
    """What the scheduler plugin uses of a Dask scheduler, for unit tests: its workers by address, handlers,
    stream handlers, streams to workers, extensions and periodic callbacks."""

    def __init__(self, workers=("w1", "w2")) -> None:
        self.workers = {w: object() for w in workers}
        self.handlers: dict = {}
        self.stream_handlers: dict = {}
        self.stream_comms: dict[str, RecordingStream] = {w: RecordingStream() for w in workers}
        self.extensions: dict = {}
        self.periodic_callbacks: dict = {}

    def revoked(self, worker: str) -> list[str]:
        """Item ids the plugin revoked on `worker`."""
        return [i for msg in self.stream_comms[worker].sent if msg["op"] == "shoal-revoke" for i in msg["items"]]


# -- waiting -------------------------------------------------------------------------------


def wait_for(condition: Callable[[], object], timeout: float = 60, what: str = "", step: float = 0.02):
    """Poll `condition` until it is true; its value. Fails with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(step)
    return value


async def async_wait_for(condition: Callable[[], object], timeout: float = 10, what: str = "", step: float = 0.005):
    """`wait_for` inside a coroutine: the event loop runs on while it waits."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        await asyncio.sleep(step)
    return value


@pytest.fixture(scope="session")
def demo_texts() -> list[str]:
    shards = sorted(DEMO.glob("part-*.parquet"))
    return [t for shard in shards for t in pq.read_table(shard).column("text").to_pylist()]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_embedder(tmp_path_factory.mktemp("tiny-embedder"))


@pytest.fixture(scope="session")
def tiny_reranker(tmp_path_factory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny-reranker"))


@pytest.fixture(scope="session")
def tiny_catalog(tmp_path_factory, tiny_model, tiny_reranker) -> Path:
    path = tmp_path_factory.mktemp("catalog") / "catalog.yaml"
    entry = {
        "kind": "embedder",
        "source": str(tiny_model),
        "dim": TINY_DIM,
        "max_seq_length": TINY_MAX_SEQ,
        "normalize": True,
        "memory_bytes": 10_000_000,
        "token_budget": {"cpu": 4096},
    }
    reranker = {
        "kind": "reranker",
        "source": str(tiny_reranker),
        "dim": 1,
        "max_seq_length": TINY_MAX_SEQ,
        "memory_bytes": 10_000_000,
        "token_budget": {"cpu": 2048},
        "max_batch_size": 64,
    }
    path.write_text(yaml.safe_dump({"models": {"tiny": entry, "tiny-reranker": reranker}}))
    return path


def write_profile(directory: Path, **fields) -> Path:
    profile = {
        "name": "test",
        "device": "cpu",
        "workers": 2,
        "threads_per_worker": 1,
        "prefetch": 2,
        "rows_per_item": 200,
        "lease_seconds": 20,
        "max_attempts": 3,
        "pull_timeout_seconds": 0.5,
        **fields,
    }
    path = directory / f"{profile['name']}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


@pytest.fixture(scope="session")
def test_profile(tmp_path_factory) -> Path:
    return write_profile(tmp_path_factory.mktemp("profile"))


@pytest.fixture(scope="module")
def cluster(test_profile, tiny_catalog):
    """Two worker processes with Shoal's plugins, shared by a test module."""
    from distributed import Client

    from configs import load_profile
    from pipeline.cluster import start_local_cluster

    with start_local_cluster(load_profile(str(test_profile)), str(tiny_catalog)) as local, Client(local) as client:
        client.wait_for_workers(2)
        yield local, client


def write_shards(directory: Path, texts: list, shards: int, row_group_size: int, **extra) -> list[str]:
    """Split texts over Parquet shards with ids `doc-N`; returns all ids in order."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [f"doc-{i}" for i in range(len(texts))]
    per = -(-len(texts) // shards)
    for s in range(shards):
        lo, hi = s * per, min((s + 1) * per, len(texts))
        columns = {"id": ids[lo:hi], "text": pa.array(texts[lo:hi], type=pa.string())}
        for name, values in extra.items():
            columns[name] = values[lo:hi]
        pq.write_table(pa.table(columns), directory / f"shard-{s:03d}.parquet", row_group_size=row_group_size)
    return ids


def run_shoal(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The `shoal` command in a process of its own; `env` is laid over this process's environment."""
    return subprocess.run(
        [SHOAL, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})}
    )


def embed_args(
    source, output, catalog, *extra: str, scheduler: str | None = None, profile=None, model: str = "tiny"
) -> list[str]:
    """The arguments of a `shoal embed` of `source` into `output` with `model` of `catalog`, on `scheduler`
    with `profile` where given, then `extra`: for `run_shoal(*embed_args(...))` or `invoke_shoal`."""
    return ["embed", str(source), str(output), "--model", model, *shoal_options(catalog, scheduler, profile), *extra]


def shoal_options(catalog, scheduler: str | None = None, profile=None) -> list[str]:
    """A `shoal` command's `--catalog`, and `--scheduler` and `--profile` where given."""
    options = ["--catalog", str(catalog)]
    if scheduler is not None:
        options += ["--scheduler", scheduler]
    if profile is not None:
        options += ["--profile", str(profile)]
    return options


def reindex_job(source, output, catalog, scheduler: str, /, **fields) -> dict:
    """A `shoal reindex` job (write it with `yaml.safe_dump`): job `docs` from `source` into `output` with
    model `tiny` of `catalog` on `scheduler`, its lock settling in 0.1 s; `fields` added or laid over."""
    job = {"name": "docs", "input": str(source), "output": str(output), "model": "tiny", "catalog": str(catalog)}
    return {**job, "scheduler": scheduler, "lock": {"settle_seconds": 0.1}, **fields}


def read_output(directory) -> pa.Table:
    return pq.read_table(str(directory))


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1, shared by every test that needs a real S3 API."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_options(endpoint: str) -> dict:
    # No region_name: with it, moto refuses bucket creation (InvalidLocationConstraint).
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}


def invoke_shoal(*args: str) -> subprocess.CompletedProcess:
    """The `shoal` CLI run in this process: what `run_shoal` returns, without a process start per call."""
    from click.testing import CliRunner

    from pipeline.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(["shoal", *args], result.exit_code, result.stdout, result.stderr)


def kill_busy_worker(cluster, job) -> str:
    """SIGKILL a worker process that holds leased items, once the job has acked one; its address.

    `job`: the job's process; the wait ends if it exits first (then the test cannot kill anything).
    """
    import time

    plugin = cluster.scheduler.extensions["shoal-pull-queue"]
    victim = None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
        if plugin.events["acked"] >= 1:
            busy = [w for w, items in plugin.leased_by_worker.items() if items]
            victim = busy[0] if busy else None
    assert victim is not None, "the job ended before a worker could be killed"
    kill_worker(cluster, victim)
    return victim


# A simulated model slow enough (about 0.5 s per 100-row item) for a worker to be killed while a job runs.
SLOW_SIM = {
    "kind": "sim",
    "dim": 8,
    "max_seq_length": 256,
    "memory_bytes": 10**6,
    "load_seconds": 0.1,
    "batch_fixed_seconds": 0.05,
    "per_token_seconds": 1e-4,
}


def embed_killing_a_worker(
    tmp_path: Path, name: str, texts: list[str], output: str, write: Callable[..., list[str]] = write_shards
) -> tuple[list[str], int, str, int]:
    """Shards of `texts` in tmp_path/in (written by `write`, as `write_shards` does) embedded into `output`
    by `shoal embed` with SLOW_SIM, on a local cluster of two workers (profile `name`, 100 rows an item), one
    busy worker SIGKILLed mid-job (`kill_busy_worker`). Returns the ids, the job's exit status and stderr, and the scheduler's count of lost
    workers. Integration tests only: it starts a cluster and a process."""
    from distributed import Client

    from configs import load_profile
    from pipeline.cluster import start_local_cluster

    profile = load_profile(str(write_profile(tmp_path, name=name, rows_per_item=100, lease_seconds=30)))
    ids = write(tmp_path / "in", texts, shards=4, row_group_size=50)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"slow-sim": SLOW_SIM}}))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        on_cluster = {"scheduler": cluster.scheduler_address, "profile": profile.path, "model": "slow-sim"}
        job = subprocess.Popen(
            [SHOAL, *embed_args(tmp_path / "in", output, catalog, **on_cluster)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        kill_busy_worker(cluster, job)
        _, stderr = job.communicate(timeout=300)
        return ids, job.returncode, stderr, plugin.events["lost"]


def kill_worker(cluster, address: str) -> None:
    """SIGKILL the process of the worker at `address` (its nanny starts a new one)."""
    import signal

    nanny = next(n for n in cluster.workers.values() if n.worker_address == address)
    os.kill(nanny.process.process.pid, signal.SIGKILL)


# -- a cluster of `dask` CLI processes (integration tests only: it starts processes) -------


def wait_for_address(scheduler_file: Path, timeout: float = 60) -> str:
    """The address a `dask scheduler` wrote to its `--scheduler-file`, once it has."""
    wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size, timeout, "dask scheduler to start", 0.2)
    return json.loads(scheduler_file.read_text())["address"]


def stop_processes(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM the processes still running, last started first; SIGKILL one that has not exited in 30 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def dask_cli_cluster(
    folder: Path,
    profile=None,
    *,
    workers: int = 1,
    port: int = 0,
    plugins: bool = True,
    scheduler_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    tag: str = "",
) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """`dask scheduler` (with `--preload scheduler_plugins` unless not `plugins`) on 127.0.0.1:`port` and, when
    `workers`, one `dask worker --nworkers workers --preload workers --shoal-profile profile`, as in the README.

    Yields the scheduler address and the processes, scheduler first (append more: they are stopped first);
    on exit every one still running is stopped. `env` is laid over this process's environment; `tag` names
    the scheduler file in `folder`, for more than one cluster there.
    """
    scheduler_file = folder / f"scheduler{'-' + tag if tag else ''}.json"
    popen = {"cwd": ROOT, "env": {**os.environ, **(env or {})}}
    popen.update(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    scheduler = [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"]
    scheduler += ["--scheduler-file", str(scheduler_file), *(["--preload", "scheduler_plugins"] if plugins else [])]
    procs = [subprocess.Popen([*scheduler, *scheduler_args], **popen)]
    try:
        address = wait_for_address(scheduler_file)
        if workers:
            # The address comes first: dask passes the options it does not know to the preload.
            worker = [DASK, "worker", address, "--nthreads", "1", "--nworkers", str(workers), *worker_args]
            procs.append(subprocess.Popen([*worker, "--preload", "workers", "--shoal-profile", str(profile)], **popen))
        yield address, procs
    finally:
        stop_processes(procs)
