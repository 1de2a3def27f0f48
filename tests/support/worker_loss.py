"""Killing a worker process in the middle of a job (integration tests only: it starts a cluster and a process)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import embed_args
from tests.support.files import write_profile, write_shards
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started
from tests.support.waiting import wait_for

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


def kill_worker(cluster, address: str) -> None:
    """SIGKILL the process of the worker at `address` (its nanny starts a new one)."""
    nanny = next(n for n in cluster.workers.values() if n.worker_address == address)
    os.kill(nanny.process.process.pid, signal.SIGKILL)


def kill_busy_worker(cluster, job: subprocess.Popen) -> str:
    """SIGKILL a worker process that holds leased items, once the job has acked one; its address.

    `job`: the job's process; the wait ends if it exits first (then the test cannot kill anything).
    """
    plugin = cluster.scheduler.extensions["shoal-pull-queue"]
    victim = None
    deadline = time.monotonic() + 240
    while victim is None and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
        if plugin.state.counts["acked"] >= 1:
            busy = [w for w, items in plugin.state.leases.by_worker.items() if items]
            victim = busy[0] if busy else None
    assert victim is not None, "the job ended before a worker could be killed"
    kill_worker(cluster, victim)
    return victim


def embed_killing_a_worker(
    tmp_path: Path,
    name: str,
    texts: list[str],
    output: str,
    write: Callable[..., list[str]] = write_shards,
    model: tuple[str, dict[str, Any]] = ("slow-sim", SLOW_SIM),
) -> tuple[list[str], int, str, int]:
    """Shards of `texts` in tmp_path/in (written by `write`, as `write_shards` does) embedded into `output`
    by `shoal embed` with `model` (its name and catalog entry; SLOW_SIM unless given), on a local cluster of
    two workers (profile `name`, 100 rows an item), one busy worker SIGKILLed mid-job (`kill_busy_worker`).
    Returns the ids, the job's exit status and stderr, and the scheduler's count of lost workers."""
    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.cluster import start_local_cluster

    profile = load_profile(str(write_profile(tmp_path, name=name, rows_per_item=100, lease_seconds=30)))
    ids = write(tmp_path / "in", texts, shards=4, row_group_size=50)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": dict([model])}))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        on_cluster = {"scheduler": cluster.scheduler_address, "profile": profile.path, "model": model[0]}
        embedding = [SHOAL, *embed_args(tmp_path / "in", output, catalog, **on_cluster)]
        with started(embedding, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as job:
            kill_busy_worker(cluster, job)
            _, stderr = job.communicate(timeout=300)
        return ids, job.returncode, stderr, plugin.state.counts["lost"]


@contextmanager
def serving_pinned(
    tmp_path: Path, model: dict[str, Any], request_timeout: float, **profile_fields: Any
) -> Iterator[tuple[Any, Any, Any, str]]:
    """A local cluster of two workers that both hold `model` (named "steady", pinned), its gateway serving
    it, warmed by one request: (cluster, client, plugin, gateway url). The gateway stops on exit."""
    from distributed import Client

    from shoal.configs import load_profile
    from shoal.pipeline.client import OnlineClient
    from shoal.pipeline.cluster import pull_queue, start_local_cluster

    profile = load_profile(str(write_profile(tmp_path, **profile_fields)))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"steady": model}}))
    pin = ["--shoal-pin", "steady"]  # both workers hold the model before any fault
    with start_local_cluster(profile, str(catalog), preload_argv=pin) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        url = client.sync(
            pull_queue(client).gateway_start,
            settings={"port": 0, "request_timeout_seconds": request_timeout},
            models={"steady": {"name": "steady", **model}},
        )["url"]
        with OnlineClient(url, timeout=60) as online:
            online.encode("steady", ["warm"])
        yield cluster, client, plugin, url
        client.sync(pull_queue(client).gateway_stop)


def holder_of_an_online_request(plugin: Any) -> str:
    """The address of a worker holding an online request, once one does (polled every 5 ms)."""
    return wait_for(
        lambda: next(
            (str(w) for w, items in plugin.state.leases.by_worker.items() for i in items if i.startswith("online-")), ""
        ),
        timeout=60,
        what="an online request leased to a worker",
        step=0.005,
    )
