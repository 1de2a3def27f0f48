"""Dask's adaptive scaling on a real LocalCluster of worker processes, with and without Shoal's queue telling it
what it needs; churn under batch and online load; scale to zero and wake."""

from __future__ import annotations

import threading
import time

import pytest
from distributed import Client

from shoal.configs import load_profile
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import AdaptRange, local_cluster, pull_queue
from tests.support.elastic import SECOND_ITEMS, WorkerCounts, second_items_job, start_embed
from tests.support.files import read_output
from tests.support.processes import Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # every test here starts a cluster and processes (conftest.py, "Two tiers")


def dask_alone(dask_scheduler) -> None:
    """Give the scheduler back Dask's own scaling methods: adaptive scaling as it was without Shoal's target."""
    from distributed.scheduler import Scheduler

    for name in ("adaptive_target", "workers_to_close", "retire_workers"):
        method = getattr(Scheduler, name).__get__(dask_scheduler)
        setattr(dask_scheduler, name, method)
        dask_scheduler.handlers[name] = method


def test_dask_alone_retires_busy_workers_and_the_queue_makes_adapt_grow_to_four_and_shrink_back(tmp_path):
    profile, catalog, ids = second_items_job(tmp_path, rows=60 * 20)  # 60 items of about a second
    # Dask alone, starting from 4 workers: it sees no tasks, so it retires workers in the middle of the job,
    # down to its minimum, and never adds one for the backlog.
    with (
        local_cluster(load_profile(str(profile)), str(catalog)) as cluster,
        Client(cluster) as client,
        Processes() as procs,
    ):
        client.run_on_scheduler(dask_alone)
        cluster.scale(4)
        client.wait_for_workers(4)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        job = start_embed(procs, tmp_path, cluster.scheduler_address, profile, catalog, output="alone")
        wait_for(lambda: plugin.state.counts["acked"] >= 2, 60, "the first acks")
        cluster.adapt(minimum=1, maximum=4)
        with WorkerCounts(cluster.scheduler) as counts:
            wait_for(lambda: len(cluster.scheduler.workers) == 1, 60, "Dask to retire its workers")
            shrunk_with = plugin.batch.job_status(next(iter(plugin.batch.jobs)))["queued"]
            _, stderr = job.communicate(timeout=300)
        assert job.returncode == 0, stderr
    assert shrunk_with > 0  # items were still waiting when Dask had retired all but one worker
    assert max(count for at, count in counts.samples[len(counts.samples) // 2 :]) == 1  # and it never grew again
    assert sorted(read_output(tmp_path / "alone").column("id").to_pylist()) == sorted(ids)

    # With the queue's target: from 1 worker it grows to 4 while the backlog lasts, then back to 1.
    adapt = AdaptRange(1, 4)
    with (
        local_cluster(load_profile(str(profile)), str(catalog), adapt=adapt) as cluster,
        Client(cluster) as client,
        Processes() as procs,
    ):
        client.wait_for_workers(1)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        with WorkerCounts(cluster.scheduler) as counts:
            job = start_embed(procs, tmp_path, cluster.scheduler_address, profile, catalog, output="elastic")
            _, stderr = job.communicate(timeout=300)
            assert job.returncode == 0, stderr
            wait_for(lambda: len(cluster.scheduler.workers) == 1, 60, "adapt to shrink back to one worker")
        status = client.sync(pull_queue(client).scaling)
    assert counts.most() == 4
    assert status["target"] == 0 and status["reason"].startswith("idle")  # adapt's minimum keeps the one
    assert status["asked_seconds_ago"] < 5
    assert (
        plugin.state.counts["lost"] == 0 and plugin.state.counts["expired"] == 0
    )  # retired gracefully, never killed busy
    assert sorted(read_output(tmp_path / "elastic").column("id").to_pylist()) == sorted(ids)


def test_workers_retired_and_added_every_few_seconds_lose_nothing_under_batch_and_online_load(tmp_path):
    profile, catalog, ids = second_items_job(tmp_path, rows=60 * 20)  # long enough for two churns at high load
    spec = {"name": "slow", **SECOND_ITEMS, "batch_fixed_seconds": 0.2}
    with (
        local_cluster(load_profile(str(profile)), str(catalog)) as cluster,
        Client(cluster) as client,
        Processes() as procs,
    ):
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        url = client.sync(
            pull_queue(client).gateway_start,
            settings={"port": 0, "request_timeout_seconds": 20},
            models={"slow-online": spec},
        )["url"]
        stop = threading.Event()
        answered: list[float] = []
        failures: list[str] = []

        def ask() -> None:
            with OnlineClient(url, timeout=30) as online:
                while not stop.is_set():
                    began = time.monotonic()
                    try:
                        assert online.encode("slow-online", ["a question"]).shape == (1, 8)
                        answered.append(time.monotonic() - began)
                    except Exception as exc:  # noqa: BLE001 - counted, and the test fails on it
                        failures.append(repr(exc))

        callers = [threading.Thread(target=ask) for _ in range(2)]
        for caller in callers:
            caller.start()
        job = start_embed(procs, tmp_path, cluster.scheduler_address, profile, catalog)
        churned = 0
        while job.poll() is None:
            time.sleep(3)
            busy = [w for w, held in plugin.state.leases.by_worker.items() if held]
            if busy and len(cluster.scheduler.workers) >= 2:
                name = cluster.scheduler.workers[busy[0]].name
                cluster.sync(cluster.scale_down, [name])  # Dask's retirement, as adapt does it
                churned += 1
            cluster.scale(len(cluster.worker_spec) + 1 if len(cluster.worker_spec) < 3 else 3)
        stop.set()
        for caller in callers:
            caller.join(60)
        _, stderr = job.communicate(timeout=60)
        client.sync(pull_queue(client).gateway_stop)
    assert job.returncode == 0, stderr
    assert churned >= 2
    assert failures == [] and answered and max(answered) < 20
    # Retired, never lost: no attempt spent. (Whether a retired worker had unstarted items to hand back depends on
    # timing: a pull leases at most its fair share, often just the item it starts; tests/scheduler/test_elastic.py
    # holds the hand-back itself.)
    assert plugin.state.counts["lost"] == 0 and plugin.state.counts["expired"] == 0
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)  # none lost, none twice


def test_a_cluster_at_zero_workers_answers_its_first_request_once_a_worker_started(tmp_path):
    profile, catalog, _ = second_items_job(tmp_path, rows=20)
    spec = {"name": "quick", **SECOND_ITEMS, "batch_fixed_seconds": 0.01}
    adapt = AdaptRange(0, 2)
    with (
        local_cluster(load_profile(str(profile)), str(catalog), online=True, adapt=adapt) as cluster,
        Client(cluster) as client,
    ):
        url = client.sync(
            pull_queue(client).gateway_start,
            settings={"port": 0, "request_timeout_seconds": 60},
            models={"quick": spec},
        )["url"]
        assert len(cluster.scheduler.workers) == 0
        wait_for(lambda: cluster.scheduler.extensions["shoal-pull-queue"].elastic.workers_coming(), 10, "adapt")
        with OnlineClient(url, timeout=90) as online:
            began = time.monotonic()
            assert online.encode("quick", ["wake up"]).shape == (1, 8)
            first = time.monotonic() - began
            later = []
            for _ in range(5):
                began = time.monotonic()
                online.encode("quick", ["and again"])
                later.append(time.monotonic() - began)
        client.sync(pull_queue(client).gateway_stop)
    print(f"first request at zero workers: {first:.2f} s; later ones: {max(later):.3f} s at most")
    assert first > max(later)  # the first waited for a worker to start and load the model
    assert max(later) < 1.0  # then normal latency: the worker stays while requests keep coming


def test_a_dask_worker_stopped_by_sigterm_hands_back_what_it_did_not_start_and_finishes_the_rest(tmp_path):
    """`dask worker` gets SIGTERM (a Kubernetes pod deletion, a jobqueue job's end) in the middle of a job."""
    import os
    import signal
    import subprocess

    from tests.support.dask_cli import dask_cli_cluster
    from tests.support.paths import DASK

    profile, catalog, ids = second_items_job(tmp_path, rows=24 * 20)
    env = {"SHOAL_CATALOG": str(catalog)}
    with dask_cli_cluster(tmp_path, profile, workers=1, env=env) as (address, procs), Client(address) as client:
        second = [DASK, "worker", address, "--nthreads", "1", "--preload", "shoal.workers"]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        joined = procs.start([*second, "--shoal-profile", str(profile)], env={**os.environ, **env}, **quiet)
        client.wait_for_workers(2, timeout=120)
        job = start_embed(procs, tmp_path, address, profile, catalog)

        def started_on_the_second() -> str | None:
            leased = client.run_on_scheduler(
                lambda dask_scheduler: {
                    w: [item.started for item in held.values()]
                    for w, held in dask_scheduler.extensions["shoal-pull-queue"].state.leases.by_worker.items()
                }
            )
            parents = client.run(os.getppid)  # a worker process's parent: its nanny, the `dask worker` process
            return next(
                (
                    w
                    for w, started in leased.items()
                    if any(started) and len(started) > 1 and parents.get(w) == joined.pid
                ),
                None,
            )

        wait_for(started_on_the_second, 120, "the second worker to start an item with more leased behind it")
        joined.send_signal(signal.SIGTERM)
        assert joined.wait(30) == 0
        _, stderr = job.communicate(timeout=300)
        events = client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.extensions["shoal-pull-queue"].state.counts)
        )
    assert job.returncode == 0, stderr
    assert events.get("handed_back", 0) >= 1 and events.get("lost", 0) == 0 and events.get("expired", 0) == 0
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)


def image_scheduler_routes() -> str:
    """The scheduler's HTTP routes in the image's Dask settings (deploy/dask.yaml: Dask's own and its API), as
    the environment variable Dask reads."""
    import yaml

    from tests.support.paths import ROOT

    settings = yaml.safe_load((ROOT / "deploy" / "dask.yaml").read_text())
    return repr(settings["distributed"]["scheduler"]["http"]["routes"])


def test_the_kubernetes_operators_calls_over_http_and_rpc_get_the_queues_answers(tmp_path):
    """What the Dask operator's autoscaler asks a `dask scheduler`: `/api/v1/adaptive_target` (else the RPC),
    and scaling down `/api/v1/retire_workers` with `{"n": 1}` (else the RPCs `workers_to_close` with
    `attribute="name"` and `retire_workers(names=...)`); Dask alone would answer 0 and retire busy workers."""
    import json
    import urllib.request

    from distributed.core import rpc

    from tests.support.dask_cli import dask_cli_cluster

    profile, catalog, ids = second_items_job(tmp_path, rows=40 * 20)
    env = {"SHOAL_CATALOG": str(catalog), "DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES": image_scheduler_routes()}
    with dask_cli_cluster(tmp_path, profile, workers=3, env=env) as (address, procs), Client(address) as client:
        client.wait_for_workers(3, timeout=120)
        dashboard = json.loads((tmp_path / "scheduler.json").read_text())["services"]["dashboard"]
        api = f"http://127.0.0.1:{dashboard}/api/v1"
        job = start_embed(procs, tmp_path, address, profile, catalog)

        def holding() -> int:
            return len(
                client.run_on_scheduler(
                    lambda dask_scheduler: dask_scheduler.extensions["shoal-pull-queue"].state.leases.by_worker
                )
            )

        wait_for(lambda: holding() == 3, 120, "every worker to hold leased items")
        with urllib.request.urlopen(f"{api}/adaptive_target", timeout=10) as response:
            assert json.load(response)["workers"] >= 3  # the queue's backlog and leases; Dask alone: 0
        request = urllib.request.Request(f"{api}/retire_workers", data=b'{"n": 1}', method="POST")
        with urllib.request.urlopen(request, timeout=120) as response:
            retired = json.load(response)
        assert len(retired) == 1 and all("name" in info for info in retired.values())  # the operator deletes by name

        async def rpc_scale_down() -> list:
            async with rpc(address) as scheduler:
                names = await scheduler.workers_to_close(n=1, attribute="name")
                await scheduler.retire_workers(names=names)
                return names

        assert len(client.sync(rpc_scale_down)) == 1
        _, stderr = job.communicate(timeout=300)
        events = client.run_on_scheduler(
            lambda dask_scheduler: dict(dask_scheduler.extensions["shoal-pull-queue"].state.counts)
        )
        assert len(client.scheduler_info()["workers"]) == 1
    assert job.returncode == 0, stderr
    assert events.get("lost", 0) == 0 and events.get("expired", 0) == 0  # drained, never killed busy
    assert events.get("handed_back", 0) > 0  # their unstarted items went back at once
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
