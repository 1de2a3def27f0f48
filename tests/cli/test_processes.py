"""What `shoal`'s commands start, seen from outside: nothing listens beyond loopback, and Ctrl-C on `shoal embed`
exits 130 and the same command run again finishes the job."""

from __future__ import annotations

import functools
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support.cli import embed_args, invoke_shoal
from tests.support.files import read_output, write_profile, write_shards
from tests.support.gateway import SIM
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started
from tests.support.waiting import wait_for

LOOPBACK = {"127.0.0.1", "::1"}


def _listeners(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening TCP socket of the process and its descendants."""
    found = set()
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                found |= {
                    (c.laddr.ip, c.laddr.port) for c in proc.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                }
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    except psutil.NoSuchProcess:
        pass
    return found


@pytest.fixture(scope="module")
def sim_catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "catalog.yaml"
    models = {"slowish": {**SIM, "batch_fixed_seconds": 0.2, "max_batch_size": 8}}  # a few seconds per job
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    seen = []
    assert proc.stderr is not None, "stderr is not piped"
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen.append(line)
        if marker in line:
            return
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {marker!r} in {seen}")


@pytest.mark.integration  # starts `shoal serve` and `shoal embed` processes
def test_nothing_shoal_serve_or_shoal_embed_starts_listens_beyond_loopback(sim_catalog, tmp_path, demo_texts):
    profile = write_profile(tmp_path, name="two", workers=2, rows_per_item=50)
    serving = [SHOAL, "serve", "--catalog", str(sim_catalog), "--profile", str(profile), "--port", "0"]
    with started(serving, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as serve:
        _wait_for(serve, "serving")
        listening = _listeners(serve.pid)
    # the scheduler, its dashboard, the gateway, two nannies and two workers
    assert len(listening) >= 5 and {ip for ip, _ in listening} <= LOOPBACK, listening

    write_shards(tmp_path / "in", demo_texts[:400], shards=2, row_group_size=50)
    embedding = [SHOAL, *embed_args(tmp_path / "in", tmp_path / "out", sim_catalog, profile=profile, model="slowish")]
    seen: set[tuple[str, int]] = set()
    with started(embedding, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as embed:
        while embed.poll() is None:  # sampled for the whole run: every listener it opens, however briefly
            seen |= _listeners(embed.pid)
            time.sleep(0.2)
    assert embed.returncode == 0
    assert len(seen) >= 4 and {ip for ip, _ in seen} <= LOOPBACK, seen


def test_ctrl_c_exits_130_and_the_rerun_finishes_the_job(cluster, sim_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    # 16 parts: the job runs for seconds after its first part is written, however fast the workers start.
    ids = write_shards(tmp_path / "in", demo_texts[:1600], shards=16, row_group_size=25)
    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile, "model": "slowish"}
    args = [SHOAL, *embed_args(tmp_path / "in", tmp_path / "out", sim_catalog, **on_cluster)]
    # SIGINT as in a terminal, even when the tests run in the background (which starts them with it ignored).
    interruptible = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    with started(
        args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible
    ) as proc:
        wait_for(  # interrupted mid-job, once a part is written
            lambda: list((tmp_path / "out").glob("part-*.parquet")) or proc.poll() is not None,
            timeout=120,
            what="a first part written",
        )
        assert proc.poll() is None, "the job ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    rerun = invoke_shoal(*args[1:])  # in this process: no second interpreter start
    assert rerun.returncode == 0, rerun.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)
