"""A cluster started the Dask way, with no profile: each worker runs what the gate passed on its device."""

from __future__ import annotations

import json

import pytest

from shoal.configs.verdicts import choose
from tests.support.cli import embed_args, run_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_shards

pytestmark = pytest.mark.integration  # `dask scheduler` and `dask worker` processes


def test_dask_workers_without_a_profile_run_the_runtime_the_gate_passed_here_and_the_summary_names_it(
    tmp_path, tiny_catalog, demo_texts
):
    ids = write_shards(tmp_path / "in", demo_texts[:300], shards=1, row_group_size=100)
    cache = tmp_path / "worker-cache"  # the workers' own: what they measure is theirs
    env = {"SHOAL_CACHE_DIR": str(cache), "SHOAL_PROFILE": "", "SHOAL_AUTO_MEASURE": "wait"}
    with dask_cli_cluster(tmp_path, None, env=env) as (address, _):
        args = embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, scheduler=address)
        done = run_shoal(*args, env={"COLUMNS": "400"})  # the summary's rows on one line each
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
