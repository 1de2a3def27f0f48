"""SIGTERM is a retirement, not a loss; SIGKILL is a loss: `dask scheduler` and `dask worker` processes, as deployed.

Workers run as users start them: `dask worker ADDRESS --preload shoal.workers`, with and without a nanny, no
profile; their grace (Dask config `shoal.worker.termination-grace`) is shorter than the long items take.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from distributed import Client

from shoal.pipeline.cluster import pull_queue
from tests.support.cli import embed_args
from tests.support.dask_cli import wait_for_address
from tests.support.files import read_output, write_profile, write_shards
from tests.support.paths import DASK, SHOAL
from tests.support.processes import Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # every test here starts processes (conftest.py, "Two tiers")

GRACE_SECONDS = 1.0
# A simulated model: an item of 10 texts of 512 tokens takes about 2.5 s, one of 10 short texts a few ms.
CHURN = {
    "kind": "sim",
    "dim": 8,
    "max_seq_length": 512,
    "memory_bytes": 10**6,
    "load_seconds": 0.1,
    "batch_fixed_seconds": 0.0,
    "per_token_seconds": 5e-4,
}
LONG, SHORT = "x" * 4096, "short text"


class Cluster:
    """A `dask scheduler` and `dask worker` processes (each one worker, nanny or not) started and stopped here."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {**os.environ, "DASK_SHOAL__WORKER__TERMINATION_GRACE": f"{GRACE_SECONDS}s"}
        self.log = folder / "scheduler.log"
        self.procs = Processes()
        self.workers: dict[str, subprocess.Popen] = {}  # worker name -> its `dask worker` process
        self._names = itertools.count()

    def start(self) -> str:
        scheduler_file = self.folder / "scheduler.json"
        command = [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"]
        command += ["--scheduler-file", str(scheduler_file), "--preload", "shoal.scheduler_plugins"]
        self.procs.start(command, log=self.log, env=self.env)
        self.address = wait_for_address(scheduler_file)
        return self.address

    def add_worker(self, nanny: bool) -> str:
        name = f"w{next(self._names)}-{'nanny' if nanny else 'alone'}"
        command = [DASK, "worker", self.address, "--nthreads", "1", "--name", name]
        command += [*([] if nanny else ["--no-nanny"]), "--preload", "shoal.workers"]
        self.workers[name] = self.procs.start(command, log=self.folder / f"{name}.log", env=self.env)
        return name

    def stop(self) -> None:
        self.procs.stop()


def names_by_address(client: Client) -> dict[str, str]:
    return {address: str(info["name"]) for address, info in client.scheduler_info()["workers"].items()}


def leased_names(client: Client) -> list[str]:
    """Names of the workers holding leased items now, most items first."""
    leased = client.sync(pull_queue(client).overview)["leased"]
    names = names_by_address(client)
    return [names[a] for a in sorted(leased, key=leased.get, reverse=True) if a in names]


def churn_job(folder: Path, max_attempts: int) -> tuple[Path, Path, list[str]]:
    """8 long items (about 2.5 s each) first, then 24 short ones, 10 rows an item: (profile, catalog, ids)."""
    profile = write_profile(folder, name="churn", rows_per_item=10, lease_seconds=30, max_attempts=max_attempts)
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"churn": CHURN}}))
    ids = write_shards(folder / "in", [LONG] * 80 + [SHORT] * 240, shards=4, row_group_size=10)
    return profile, catalog, ids


def start_job(cluster: Cluster, folder: Path, profile: Path, catalog: Path) -> subprocess.Popen:
    """`shoal embed` on `cluster`, among its processes (stopped with them)."""
    args = embed_args(folder / "in", folder / "out", catalog, scheduler=cluster.address, profile=profile, model="churn")
    return cluster.procs.start([SHOAL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_workers_sigtermed_every_few_seconds_retire_without_spending_an_attempt_and_sigkill_is_a_loss(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        address = cluster.start()
        for nanny in (True, False, True):
            cluster.add_worker(nanny)
        with Client(address, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)
            # One attempt per item: a retirement that spent one would fail the job.
            job_folder = tmp_path / "retire"
            job_folder.mkdir()
            profile, catalog, ids = churn_job(job_folder, max_attempts=1)
            job = start_job(cluster, job_folder, profile, catalog)
            terminated = []
            for round_ in range(3):  # the first part of the job: a SIGTERM every 3 s, and a worker joins
                busy = wait_for(lambda: [n for n in leased_names(client) if n not in terminated], 120, "a busy worker")
                victim = busy[0]
                cluster.workers[victim].send_signal(signal.SIGTERM)
                terminated.append(victim)
                cluster.add_worker(nanny=round_ % 2 == 1)
                time.sleep(3)
            _, stderr = job.communicate(timeout=300)
            assert job.returncode == 0, stderr
            for name in terminated:  # each left by itself, within its grace, without being killed
                assert cluster.workers[name].wait(timeout=60) == 0
            overview = client.sync(pull_queue(client).overview)
            assert overview["counts"].get("lost", 0) == 0 and overview["counts"].get("expired", 0) == 0
            assert overview["counts"].get("handed_back", 0) >= 1
            assert sorted(read_output(job_folder / "out").column("id").to_pylist()) == sorted(ids)  # each id once
            log = cluster.log.read_text()
            assert log.count("shoal.scheduler - INFO - retiring") >= len(terminated)
            assert " lost; " not in log

            # SIGKILL is a loss: the attempt counts (two here), and no row is lost.
            job_folder = tmp_path / "kill"
            job_folder.mkdir()
            profile, catalog, ids = churn_job(job_folder, max_attempts=2)
            job = start_job(cluster, job_folder, profile, catalog)
            victim = wait_for(lambda: leased_names(client), 120, "a busy worker")[0]
            addresses = [a for a, name in names_by_address(client).items() if name == victim]
            cluster.workers[victim].send_signal(signal.SIGKILL)  # a no-nanny worker, or a nanny: its child goes too
            _, stderr = job.communicate(timeout=300)
            assert job.returncode == 0, stderr
            assert client.sync(pull_queue(client).overview)["counts"]["lost"] >= 1
            assert sorted(read_output(job_folder / "out").column("id").to_pylist()) == sorted(ids)
            lost = [line for line in cluster.log.read_text().splitlines() if " lost; " in line]
            assert lost and all(any(a in line for a in addresses) for line in lost)
    finally:
        cluster.stop()
