"""`shoal serve` as a process: signals, drain and exit 0; uvloop in a served cluster; a worker in the server's
own process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import yaml

from shoal.pipeline.client import OnlineClient, OnlineError
from tests.support.cli import embed_args
from tests.support.files import read_output, write_profile, write_shards
from tests.support.gateway import SIM, requests_in_flight
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started, wait_for_line
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


@pytest.fixture(scope="module")
def sim_catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "catalog.yaml"
    models = {"simzero": SIM, "slow": {**SIM, "batch_fixed_seconds": 1.5}}
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def refuses(url: str) -> bool:
    """The server at `url` no longer takes a request."""
    try:
        OnlineClient(url).encode("simzero", ["late"])
    except (ConnectionError, OnlineError):
        return True
    return False


@contextmanager
def shoal_serve(catalog: Path, profile: Path, model: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """`shoal serve` on a free port, and its "serving ..." line once it is up; stopped if a test leaves it running."""
    command = [SHOAL, "serve", "--catalog", str(catalog), "--profile", str(profile), "--port", "0", "--models", model]
    with started(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        yield proc, wait_for_line(proc.stderr, "serving")


def test_serve_runs_uvloop_answers_until_sigterm_then_finishes_in_flight_and_exits_0(sim_catalog, tmp_path):
    from distributed import Client

    def loop_module() -> str:  # nested: sent by value, so a process that cannot import tests/ runs it
        import asyncio

        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    profile = write_profile(tmp_path, name="serve", workers=1)
    with shoal_serve(sim_catalog, profile, "simzero") as (proc, line):
        url = line.split(" on ")[1].split()[0]
        scheduler = re.search(r"scheduler (\S+),", line).group(1)
        with Client(scheduler) as client:  # a served cluster runs uvloop, scheduler and workers
            assert client.run_on_scheduler(loop_module) == "uvloop"
            assert set(client.run(loop_module).values()) == {"uvloop"}
        with OnlineClient(url) as online:
            assert online.encode("simzero", ["hello"]).shape == (1, 8)
            assert {m["id"] for m in online.models()} >= {"simzero", "slow", "minilm"}
        in_flight: dict = {}
        slow = threading.Thread(target=lambda: in_flight.update(v=OnlineClient(url).encode("slow", ["x"])))
        slow.start()
        wait_for(lambda: requests_in_flight(url) == 1, timeout=30, what="the slow request in flight")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: refuses(url), timeout=30, what="no longer accepting after SIGTERM")
        slow.join(30)
        assert in_flight["v"].shape == (1, 8)  # answered although the stop came first
        assert proc.wait(60) == 0


def test_a_batch_cluster_keeps_dasks_loop(cluster):
    """Batch commands start their cluster as the tests' session cluster is started: Dask's own asyncio loop
    (the served one's uvloop: the test above)."""

    def loop_module() -> str:  # nested: sent by value, so a process that cannot import tests/ runs it
        import asyncio

        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    _, batch = cluster
    assert batch.run_on_scheduler(loop_module) == "asyncio"
    assert set(batch.run(loop_module).values()) == {"asyncio"}


def test_serve_with_the_worker_in_the_server_process_answers_online_while_a_batch_job_from_another_process_runs(
    tiny_catalog, tiny_model, demo_texts, tmp_path
):
    from distributed import Client
    from sentence_transformers import SentenceTransformer

    profile = write_profile(tmp_path, name="in-process", workers=1, in_process_workers=True)
    with shoal_serve(tiny_catalog, profile, "tiny") as (proc, line):
        url = line.split(" on ")[1].split()[0]
        scheduler = re.search(r"scheduler (tcp://[^,\s]+)", line).group(1)  # TCP, for other processes
        with Client(scheduler, timeout="30s") as client:
            assert list(client.run(os.getpid).values()) == [proc.pid]  # the worker lives in the server's process
        queries = demo_texts[3000:3040]
        direct = SentenceTransformer(str(tiny_model), device="cpu").encode(queries, normalize_embeddings=True)
        ids = write_shards(tmp_path / "in", demo_texts[:1200], shards=3, row_group_size=200)
        embedding = [
            SHOAL,
            *embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, scheduler=scheduler, profile=profile),
        ]
        with started(embedding, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
            answered = 0
            with OnlineClient(url) as online:
                while job.poll() is None or answered < len(queries):
                    i = answered % len(queries)
                    np.testing.assert_allclose(online.encode("tiny", [queries[i]])[0], direct[i], atol=1e-5)
                    answered += 1
            _, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
        assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
