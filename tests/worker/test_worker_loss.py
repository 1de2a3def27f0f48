"""A worker process killed mid-job loses no rows, and no online request: its leased items go back to the queue."""

from __future__ import annotations

import threading
import time

import pytest
from distributed import Client

from shoal.configs import load_profile
from shoal.pipeline.cluster import pull_queue, start_local_cluster
from tests.support.files import read_output, write_profile
from tests.support.waiting import wait_for
from tests.support.worker_loss import (
    embed_killing_a_worker,
    holder_of_an_online_request,
    kill_worker,
    serving_pinned,
)

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


def test_killed_worker_loses_no_rows(demo_texts, tmp_path):
    # A simulated model (about 0.5 s per item) keeps the job long enough to kill a worker mid-way.
    ids, returncode, stderr, lost = embed_killing_a_worker(tmp_path, "kill", demo_texts[:1600], str(tmp_path / "out"))
    assert returncode == 0, stderr
    assert lost >= 1
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(ids)  # every row exactly once


def test_online_request_of_a_killed_worker_is_answered_by_another(tmp_path):
    """kill -9 of the worker computing a request: the gateway's caller still gets the right answer."""
    import numpy as np

    from shoal.configs import ModelSpec
    from shoal.pipeline.client import OnlineClient
    from shoal.workers.runtimes.sim_runtime import SimulatedRuntime

    slow = {
        "name": "slow-online",
        "kind": "sim",
        "dim": 8,
        "max_seq_length": 64,
        "memory_bytes": 10**6,
        "batch_fixed_seconds": 3.0,
    }
    profile = load_profile(str(write_profile(tmp_path, name="kill-online", lease_seconds=30)))
    with start_local_cluster(profile) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        reply = client.sync(
            pull_queue(client).gateway_start,
            settings={"port": 0, "request_timeout_seconds": 120},
            models={"slow-online": slow},
        )
        answer: dict = {}

        def ask() -> None:
            with OnlineClient(reply["url"], timeout=120) as online:
                answer["vectors"] = online.encode("slow-online", ["a question", "another one"])

        caller = threading.Thread(target=ask)
        caller.start()
        victim = wait_for(
            lambda: next((w for w, items in plugin.state.leases.by_worker.items() if items), None),
            timeout=60,
            what="the request leased to a worker",
        )
        kill_worker(cluster, victim)
        caller.join(120)
        assert plugin.state.counts["lost"] >= 1
        client.sync(pull_queue(client).gateway_stop)
    runtime = SimulatedRuntime(ModelSpec(**{**slow, "batch_fixed_seconds": 0.0}))
    expected, _ = runtime.embed(["a question", "another one"])
    assert np.array_equal(answer["vectors"], expected)


def test_requests_in_flight_on_a_killed_worker_are_answered_by_the_survivor_within_two_seconds(tmp_path):
    """Two workers; requests leased to one of them when it is SIGKILLed: the survivor answers
    them at once (its waiting online pull is woken by the requeue), not at its next pull timeout."""
    from concurrent.futures import ThreadPoolExecutor

    from shoal.pipeline.client import OnlineClient

    model = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 10**6, "batch_fixed_seconds": 0.2}
    # A long pull timeout: a survivor that learned of requeued requests only when its waiting
    # online pull timed out would answer them seconds late.
    fields = {"name": "kill-burst", "lease_seconds": 30, "pull_timeout_seconds": 10}
    with serving_pinned(tmp_path, model, request_timeout=30, **fields) as (cluster, client, plugin, url):
        # Batch work fills every worker's batch slots: its waiting online pull takes the requeued requests.
        batch = [
            {"key": str(i), "model": "steady", "op": "sim", "rows": 8, "payload": {"tokens": [16] * 8}}
            for i in range(400)
        ]
        client.sync(pull_queue(client).submit, job="background", items=batch, options={"lease_seconds": 30})
        wait_for(
            lambda: sum(len(items) for items in plugin.state.leases.by_worker.values()) >= 4,
            timeout=60,
            what="batch items leased to both workers",
        )

        def ask(n: int) -> float:
            with OnlineClient(url, timeout=60) as online:
                assert online.encode("steady", [f"request {n}"]).shape == (1, 8)
            return time.monotonic()

        with ThreadPoolExecutor(6) as pool:
            answers = [pool.submit(ask, n) for n in range(6)]
            victim = holder_of_an_online_request(plugin)
            killed_at = time.monotonic()
            kill_worker(cluster, victim)
            answered_at = [a.result(timeout=60) for a in answers]
        client.sync(pull_queue(client).job_release, job="background")
    assert plugin.state.counts["lost"] >= 1
    assert max(answered_at) - killed_at < 2.0, [round(t - killed_at, 2) for t in answered_at]


def test_a_killed_worker_is_restarted_even_when_its_restart_is_slower_than_dasks_lost_worker_check(tmp_path):
    """Dask's SpecCluster closed a worker's nanny when no worker of its name had joined within
    lost-worker-timeout of a removal: a worker killed again soon after a restart was never replaced
    (chaos lost a worker slot for good). Shortened here so that any worker start is slower than it."""
    import dask

    profile = load_profile(str(write_profile(tmp_path, name="restarted", workers=1)))
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0.1s"}):
        with start_local_cluster(profile) as cluster, Client(cluster) as client:
            client.wait_for_workers(1)
            (killed,) = client.scheduler_info()["workers"]
            kill_worker(cluster, killed)
            wait_for(
                lambda: set(client.scheduler_info()["workers"]) - {killed},
                timeout=60,
                what="the nanny's new worker",
                step=0.2,
            )
            assert len(cluster.workers) == 1  # the nanny is still the cluster's
