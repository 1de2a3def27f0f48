"""Many models per worker on a real Dask cluster, with the simulated runtime.

Workers are in-process Dask workers with different resource tags (a SpecCluster),
so budgets and GPU tags differ per worker; jobs come from the real CLI.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

import pytest
import yaml
from distributed import Client, Scheduler, SpecCluster, Worker

from tests.support.cli import embed_args
from tests.support.files import read_output, write_profile, write_shards
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import run, started

MB = 10**6

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


def sim(memory_mb: int, **extra) -> dict:
    return {
        "kind": "sim",
        "dim": 8,
        "max_seq_length": 128,
        "memory_bytes": memory_mb * MB,
        "load_seconds": 0.2,
        "batch_fixed_seconds": 0.01,
        "per_token_seconds": 2e-5,
        **extra,
    }


@pytest.fixture(scope="module")
def sim_catalog(tmp_path_factory):
    path = tmp_path_factory.mktemp("sim") / "catalog.yaml"
    models = {f"sim-{n}": sim(40) for n in "abc"}
    models["sim-gpu"] = sim(40, requires={"GPU": 1})
    models["sim-slow"] = sim(40, per_token_seconds=2e-4)
    models["sim-huge"] = sim(10_000)
    path.write_text(yaml.safe_dump({"models": models}))
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, demo_texts):
    directory = tmp_path_factory.mktemp("corpus")
    ids = write_shards(directory / "in", demo_texts[:800], shards=2, row_group_size=100)
    return directory / "in", ids


@contextmanager
def start(profile_path, catalog, workers: dict[str, dict]) -> Iterator[SpecCluster]:
    """The cluster, with SHOAL_PROFILE and SHOAL_CATALOG set while it runs (its in-process workers and the
    `shoal` commands the test starts read them), and restored after: left set, they would pin the runtime
    of every later test's `shoal` command (fp32 torch for tiny, tests/support/files.write_profile)."""
    scheduler = {"cls": Scheduler, "options": {"preload": ["shoal.scheduler_plugins"], "dashboard_address": ":0"}}
    spec = {
        name: {"cls": Worker, "options": {"nthreads": 1, "preload": ["shoal.workers"], "resources": resources}}
        for name, resources in workers.items()
    }
    environment = {"SHOAL_PROFILE": str(profile_path), "SHOAL_CATALOG": str(catalog)}
    with mock.patch.dict(os.environ, environment), SpecCluster(scheduler=scheduler, workers=spec) as cluster:
        yield cluster


class JobWatch:
    """When each job's first rows and last rows were acked, seen by the scheduler plugin as it records them (its
    state's `ack`, wrapped while the watch lasts), so no job is missed however briefly it lives."""

    def __init__(self, plugin) -> None:
        self.plugin = plugin
        self.seen: dict[str, dict] = {}
        self._ack = plugin.state.ack
        plugin.state.ack = self._acked  # the plugin's own calls (worker_events) find the wrapper first

    def _acked(self, worker: str, item_id: str, result: dict) -> bool:
        item = self.plugin.state.items.get(item_id)
        job = self.plugin.batch.jobs.get(item.owner.id) if item is not None else None
        recorded = self._ack(worker, item_id, result)
        if recorded and job is not None:
            snap = self.seen.setdefault(job.id, {"model": item.model, "first_rows_at": time.monotonic()})
            snap["rows_by_worker"] = dict(job.rows_by_worker)
            if job.complete:
                snap.setdefault("done_at", time.monotonic())
        return recorded

    def stop(self) -> dict:
        del self.plugin.state.ack
        return {s["model"]: s for s in self.seen.values()}


def run_jobs(
    address: str, catalog, profile, corpus_dir, out, models: list[str]
) -> dict[str, subprocess.CompletedProcess]:
    results = {}
    with ExitStack() as running:  # every command stopped, however this ends
        procs = {
            m: running.enter_context(
                started(
                    [SHOAL, *embed_args(corpus_dir, out / m, catalog, scheduler=address, profile=profile, model=m)],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            for m in models
        }
        for m, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=240)
            results[m] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return results


def worker_pools(client: Client) -> dict[str, dict]:
    def pool_state(dask_worker):
        pool = dask_worker.plugins["shoal-worker"].pool
        return {"loads": pool.loads, "evictions": list(pool.evictions), "loaded": pool.loaded()}

    return client.run(pool_state)


def test_budget_for_two_of_three_models(sim_catalog, corpus, tmp_path):
    profile = write_profile(tmp_path, name="two-of-three", workers=1, memory_fraction=1.0, rows_per_item=100)
    corpus_dir, ids = corpus
    with start(profile, sim_catalog, {"w": {"MEMORY": 100 * MB}}) as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        watch = JobWatch(cluster.scheduler.extensions["shoal-pull-queue"])
        results = run_jobs(
            cluster.scheduler_address, sim_catalog, profile, corpus_dir, tmp_path / "out", ["sim-a", "sim-b", "sim-c"]
        )
        seen = watch.stop()
        for model, result in results.items():
            assert result.returncode == 0, result.stderr
            table = read_output(tmp_path / "out" / model)
            assert sorted(table.column("id").to_pylist()) == sorted(ids)
        (pool,) = worker_pools(client).values()
    # each model loaded once; the third load evicted exactly one of the first two
    assert pool["loads"] == 3 and len(pool["evictions"]) == 1, pool
    assert len(pool["loaded"]) == 2 and pool["evictions"][0] not in pool["loaded"], pool
    # three concurrent jobs all progressed before the last one finished
    last_done = max(s["done_at"] for s in seen.values())
    assert all(s["first_rows_at"] < last_done for s in seen.values()), seen


def test_pinned_model_stays_and_a_model_too_large_fails_alone(sim_catalog, corpus, tmp_path):
    profile = write_profile(
        tmp_path,
        name="pinned",
        workers=1,
        memory_fraction=1.0,
        rows_per_item=200,
        pinned=["sim-a"],
        unplaceable_seconds=1,
    )
    corpus_dir, ids = corpus
    with start(profile, sim_catalog, {"w": {"MEMORY": 100 * MB}}) as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        results = run_jobs(
            cluster.scheduler_address,
            sim_catalog,
            profile,
            corpus_dir,
            tmp_path / "out",
            ["sim-a", "sim-b", "sim-c", "sim-huge"],
        )
        (pool,) = worker_pools(client).values()
    assert "sim-a" in pool["loaded"] and "sim-a" not in pool["evictions"]
    assert results["sim-huge"].returncode == 1
    assert "no worker can host model 'sim-huge'" in results["sim-huge"].stderr
    assert "10.00 GB" in results["sim-huge"].stderr and "largest worker budget is 0.10 GB" in results["sim-huge"].stderr
    for model in ("sim-a", "sim-b", "sim-c"):
        assert results[model].returncode == 0, results[model].stderr
        assert sorted(read_output(tmp_path / "out" / model).column("id").to_pylist()) == sorted(ids)


def test_idle_worker_steals_and_gpu_models_stay_on_gpu_workers(sim_catalog, corpus, tmp_path):
    profile = write_profile(tmp_path, name="tags", workers=2, memory_fraction=1.0, rows_per_item=50)
    corpus_dir, ids = corpus
    workers = {"cpu": {"MEMORY": 100 * MB}, "gpu": {"MEMORY": 100 * MB, "GPU": 1}}
    with start(profile, sim_catalog, workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        watch = JobWatch(cluster.scheduler.extensions["shoal-pull-queue"])
        results = run_jobs(
            cluster.scheduler_address, sim_catalog, profile, corpus_dir, tmp_path / "out", ["sim-slow", "sim-gpu"]
        )
        seen = watch.stop()
        gpu_address = next(a for a, w in cluster.scheduler.workers.items() if w.resources.get("GPU"))
    for result in results.values():
        assert result.returncode == 0, result.stderr
    assert set(seen["sim-gpu"]["rows_by_worker"]) == {gpu_address}
    # both workers worked on sim-slow: the GPU worker, once idle, stole part of its backlog
    assert len(seen["sim-slow"]["rows_by_worker"]) == 2, seen
    assert sum(seen["sim-slow"]["rows_by_worker"].values()) == len(ids)


def test_one_command_several_models(sim_catalog, corpus, tmp_path):
    profile = write_profile(tmp_path, name="multi", workers=1, memory_fraction=1.0, rows_per_item=200)
    corpus_dir, ids = corpus
    with start(profile, sim_catalog, {"w": {"MEMORY": 100 * MB}}) as cluster, Client(cluster) as client:
        client.wait_for_workers(1)
        args = embed_args(
            corpus_dir,
            tmp_path / "out",
            sim_catalog,
            scheduler=cluster.scheduler_address,
            profile=profile,
            model="sim-a,sim-b",
        )
        result = run([SHOAL, *args], timeout=240)
        (pool,) = worker_pools(client).values()
    assert result.returncode == 0, result.stderr
    for model in ("sim-a", "sim-b"):
        table = read_output(tmp_path / "out" / model)
        assert sorted(table.column("id").to_pylist()) == sorted(ids)
        assert (tmp_path / "out" / model / "_manifest.json").exists()
    assert sorted(pool["loaded"]) == ["sim-a", "sim-b"] and not pool["evictions"]  # both fit: both stay
    assert result.stderr.count("job summary") == 2
    result = run([SHOAL, *embed_args(corpus_dir, tmp_path / "out2", sim_catalog, model="sim-a,nope")], timeout=120)
    assert result.returncode == 2 and "unknown model 'nope'" in result.stderr
