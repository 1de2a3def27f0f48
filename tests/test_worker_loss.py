"""A worker process killed mid-job loses no rows, and no online request: its leased items go back to the queue."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import yaml
from conftest import SHOAL, ROOT, read_output, write_profile, write_shards
from distributed import Client

from configs import load_profile
from pipeline.cluster import start_local_cluster


def test_killed_worker_loses_no_rows(demo_texts, tmp_path):
    profile = load_profile(str(write_profile(tmp_path, name="kill", rows_per_item=100, lease_seconds=30)))
    ids = write_shards(tmp_path / "in", demo_texts[:1600], shards=4, row_group_size=50)
    # A simulated model (about 0.5 s per item) keeps the job long enough to kill a worker mid-way.
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"slow-sim": {
        "kind": "sim", "dim": 8, "max_seq_length": 256, "memory_bytes": 10**6,
        "load_seconds": 0.1, "batch_fixed_seconds": 0.05, "per_token_seconds": 1e-4,
    }}}))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal"]
        job = subprocess.Popen(
            [SHOAL, "embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "slow-sim",
             "--catalog", str(catalog), "--scheduler", cluster.scheduler_address, "--profile", profile.path],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        victim = None
        deadline = time.monotonic() + 240
        while victim is None and time.monotonic() < deadline and job.poll() is None:
            time.sleep(0.2)
            if plugin.events["acked"] >= 1:
                busy = [w for w, items in plugin.leased_by_worker.items() if items]
                victim = busy[0] if busy else None
        assert victim is not None, "the job ended before a worker could be killed"
        nanny = next(n for n in cluster.workers.values() if n.worker_address == victim)
        os.kill(nanny.process.process.pid, signal.SIGKILL)
        _, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
        assert plugin.events["lost"] >= 1
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(ids)  # every row exactly once


def test_online_request_of_a_killed_worker_is_answered_by_another(tmp_path):
    """kill -9 of the worker computing a request: the gateway's caller still gets the right answer."""
    import numpy as np

    from configs import ModelSpec
    from pipeline.online_client import OnlineClient
    from workers.sim_runtime import SimulatedRuntime

    slow = {"name": "slow-online", "kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 10**6,
            "batch_fixed_seconds": 3.0}
    profile = load_profile(str(write_profile(tmp_path, name="kill-online", lease_seconds=30)))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal"]
        reply = client.sync(client.scheduler.shoal_gateway_start,
                            settings={"port": 0, "request_timeout_seconds": 120}, models={"slow-online": slow})
        answer: dict = {}

        def ask() -> None:
            with OnlineClient(reply["url"], timeout=120) as online:
                answer["vectors"] = online.encode("slow-online", ["a question", "another one"])

        caller = threading.Thread(target=ask)
        caller.start()
        victim = None
        deadline = time.monotonic() + 60
        while victim is None and time.monotonic() < deadline:
            time.sleep(0.05)
            busy = [w for w, items in plugin.leased_by_worker.items() if items]
            victim = busy[0] if busy else None
        assert victim is not None, "the request was never leased"
        nanny = next(n for n in cluster.workers.values() if n.worker_address == victim)
        os.kill(nanny.process.process.pid, signal.SIGKILL)
        caller.join(120)
        assert plugin.events["lost"] >= 1
        client.sync(client.scheduler.shoal_gateway_stop)
    runtime = SimulatedRuntime(ModelSpec(**{**slow, "batch_fixed_seconds": 0.0}))
    expected, _ = runtime.embed(["a question", "another one"])
    assert np.array_equal(answer["vectors"], expected)
