"""The deployment from the README: `dask scheduler` and `dask worker` processes, preloaded."""

from __future__ import annotations

import pytest

from tests.support.cli import embed_args, run_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_shards

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


@pytest.fixture
def dask_processes(tmp_path, test_profile):
    with dask_cli_cluster(tmp_path, test_profile) as (address, _):
        yield address


def test_job_on_dask_cli_cluster(dask_processes, tiny_catalog, test_profile, demo_texts, tmp_path):
    ids = write_shards(tmp_path / "in", demo_texts[:500], shards=2, row_group_size=100)
    out = tmp_path / "out"
    result = run_shoal(*embed_args(tmp_path / "in", out, tiny_catalog, scheduler=dask_processes, profile=test_profile))
    assert result.returncode == 0, result.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)


def test_scheduler_without_plugin_is_refused(tmp_path, tiny_catalog):
    with dask_cli_cluster(tmp_path, workers=0, plugins=False, tag="plain") as (address, _):
        (tmp_path / "a.parquet").write_bytes(b"")
        result = run_shoal(*embed_args(tmp_path / "a.parquet", tmp_path / "out", tiny_catalog, scheduler=address))
        assert result.returncode == 2
        assert "has no Shoal plugin" in result.stderr and "--preload shoal.scheduler_plugins" in result.stderr
