"""A cluster started the Dask way, with no profile: each worker runs what the gate passed on its device."""

from __future__ import annotations

import contextlib
import json
import os
import signal

import pytest

from shoal.configs import load_catalog
from shoal.configs.fingerprints import model_fingerprint
from shoal.configs.verdicts import MEASUREMENT, SHIPPED, choose, read_record
from tests.support.cli import embed_args, run_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_shards
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # `dask scheduler` and `dask worker` processes

# The client has no profile either (as in the issue: `shoal embed --scheduler` with none): one left in the
# environment would pin its runtime in the job's spec, and the workers would run that pin ("pinned by the
# model's spec"), not their own choice.
CLIENT = {"COLUMNS": "400", "SHOAL_PROFILE": ""}  # COLUMNS: the summary's rows on one line each


def measured_on_every_cpu(catalog) -> None:
    """tiny is measured by the worker whatever the CPU's class (AVX2 here, AMX or AVX-512 in CI): no shipped
    verdict has its fingerprint, so none decides its first use on any class."""
    fingerprint = model_fingerprint(load_catalog(catalog).get("tiny"))
    shipped = [read_record(path) for path in SHIPPED.glob("*.json")]
    assert shipped and fingerprint not in {record.get("fingerprint") for record in shipped if record}


def test_dask_workers_without_a_profile_run_the_runtime_the_gate_passed_here_and_the_summary_names_it(
    tmp_path, tiny_catalog, demo_texts
):
    measured_on_every_cpu(tiny_catalog)
    ids = write_shards(tmp_path / "in", demo_texts[:300], shards=1, row_group_size=100)
    cache = tmp_path / "worker-cache"  # the workers' own: what they measure is theirs
    env = {"SHOAL_CACHE_DIR": str(cache), "SHOAL_PROFILE": "", "SHOAL_AUTO_MEASURE": "wait"}
    with dask_cli_cluster(tmp_path, None, env=env) as (address, _):
        args = embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, scheduler=address)
        done = run_shoal(*args, env=CLIENT)
        assert done.returncode == 0, done.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
    (verdicts,) = (cache / "verdicts").glob("*.json")  # measured once, on the worker's device
    record = json.loads(verdicts.read_text())
    assert record["device"] == "cpu" and record["fingerprint"] and record["device_class"].startswith("cpu:")
    choice, why = choose(record)
    chosen = next(r for r in record["candidates"] if (r["runtime"], r["dtype"]) == (choice.runtime, choice.dtype))
    assert chosen["verdict"] == "pass"
    (line,) = [line for line in done.stderr.splitlines() if "runtime of tiny on tcp://127.0.0.1:" in line]
    assert line.split("│")[2].strip() == why  # what the worker ran, and why, in the gate's words


@pytest.mark.timeout(900)
def test_a_first_use_runs_fp32_while_the_worker_measures_then_its_loaded_model_is_swapped_for_the_verdict(
    tmp_path, tiny_catalog, demo_texts
):
    """In the background (a CPU's default): the first job runs fp32 torch; the child's verdict reaches the model
    already loaded (reloaded on the verdict's runtime and swapped in while idle), so the next job runs it."""
    from distributed import Client

    from shoal.pipeline.cluster import worker_runtimes

    measured_on_every_cpu(tiny_catalog)
    write_shards(tmp_path / "in", demo_texts[:200], shards=1, row_group_size=100)
    cache = tmp_path / "worker-cache"
    env = {"SHOAL_CACHE_DIR": str(cache), "SHOAL_PROFILE": "", "SHOAL_AUTO_MEASURE": "background"}
    try:
        with dask_cli_cluster(tmp_path, None, env=env) as (address, _):
            args = embed_args(tmp_path / "in", tmp_path / "first", tiny_catalog, scheduler=address)
            first = run_shoal(*args, env=CLIENT)
            assert first.returncode == 0, first.stderr
            (line,) = [line for line in first.stderr.splitlines() if "runtime of tiny on tcp://" in line]
            assert "torch float32: fp32 torch, the safe choice, on first use" in line
            wait_for(lambda: list((cache / "verdicts").glob("*.json")), 600, "the background measurement", 2)
            (verdicts,) = (cache / "verdicts").glob("*.json")
            choice, why = choose(json.loads(verdicts.read_text()))
            with Client(address, timeout="30s") as client:
                wait_for(lambda: list(worker_runtimes(client).values())[0].get("tiny") == why, 120, "the swap", 1)
            args = embed_args(tmp_path / "in", tmp_path / "second", tiny_catalog, scheduler=address)
            second = run_shoal(*args, env=CLIENT)
            assert second.returncode == 0, second.stderr
            (line,) = [line for line in second.stderr.splitlines() if "runtime of tiny on tcp://" in line]
            assert line.split("│")[2].strip() == why and f"{choice.runtime} {choice.dtype}" in why
    finally:
        for lock in cache.glob("verdicts/*.measuring"):  # a measurement that outlived a failed test
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(lock.read_text()), signal.SIGKILL)


async def test_verdicts_published_by_one_worker_reach_another_through_a_real_scheduler_s_metadata():
    """workers/shared_verdicts.py against Dask's own get_metadata/set_metadata handlers, over its comms."""
    import asyncio

    from distributed import Scheduler
    from distributed.core import rpc

    from shoal.workers.shared_verdicts import SharedVerdicts

    record = {"measurement": MEASUREMENT, "model": "tiny", "candidates": []}
    loop = asyncio.get_running_loop()
    async with Scheduler(host="127.0.0.1", dashboard_address=":0") as scheduler:
        async with rpc(scheduler.address) as a_link, rpc(scheduler.address) as b_link:
            a, b = SharedVerdicts(a_link, loop, "tcp://a"), SharedVerdicts(b_link, loop, "tcp://b")
            assert await asyncio.to_thread(b.fetch, "key") is None
            assert await asyncio.to_thread(a.claim, "key") is None
            assert await asyncio.to_thread(b.claim, "key") == "tcp://a"
            await asyncio.to_thread(a.publish, "key", record)
            assert await asyncio.to_thread(b.fetch, "key") == record
        assert scheduler.get_metadata(["shoal-verdicts", "key"])["model"] == "tiny"  # held by the scheduler
