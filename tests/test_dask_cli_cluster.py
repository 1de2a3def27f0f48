"""The deployment from the README: `dask scheduler` and `dask worker` processes, preloaded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, read_output, run_shoal, write_shards

DASK = str(Path(sys.executable).parent / "dask")

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


def wait_for_address(scheduler_file: Path) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if scheduler_file.exists() and scheduler_file.stat().st_size:
            return json.loads(scheduler_file.read_text())["address"]
        time.sleep(0.2)
    raise TimeoutError("dask scheduler did not start")


@pytest.fixture
def dask_processes(tmp_path, test_profile):
    scheduler_file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                DASK,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--scheduler-file",
                str(scheduler_file),
                "--preload",
                "scheduler_plugins",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    ]
    address = wait_for_address(scheduler_file)
    # The address comes first: dask passes the options it does not know to the preload.
    procs.append(
        subprocess.Popen(
            [
                DASK,
                "worker",
                address,
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--preload",
                "workers",
                "--shoal-profile",
                str(test_profile),
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    )
    yield address
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def test_job_on_dask_cli_cluster(dask_processes, tiny_catalog, test_profile, demo_texts, tmp_path):
    ids = write_shards(tmp_path / "in", demo_texts[:500], shards=2, row_group_size=100)
    result = run_shoal(
        "embed",
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--catalog",
        str(tiny_catalog),
        "--scheduler",
        dask_processes,
        "--profile",
        str(test_profile),
    )
    assert result.returncode == 0, result.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)


def test_scheduler_without_plugin_is_refused(tmp_path, tiny_catalog):
    scheduler_file = tmp_path / "plain.json"
    proc = subprocess.Popen(
        [
            DASK,
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            ":0",
            "--scheduler-file",
            str(scheduler_file),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = wait_for_address(scheduler_file)
        (tmp_path / "a.parquet").write_bytes(b"")
        result = run_shoal(
            "embed",
            str(tmp_path),
            str(tmp_path / "out"),
            "--model",
            "tiny",
            "--catalog",
            str(tiny_catalog),
            "--scheduler",
            address,
        )
        assert result.returncode == 2
        assert "has no Shoal plugin" in result.stderr and "--preload scheduler_plugins" in result.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
