"""Resume: a crashed `shoal embed` run again with the same command finishes only what is missing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from tests.support.cli import embed_args, invoke_shoal
from tests.support.dask_cli import dask_cli_cluster
from tests.support.files import read_output, write_profile, write_shards
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started
from tests.support.s3 import s3_options
from tests.support.waiting import wait_for


def sorted_vectors(table):
    table = table.sort_by("id")
    return table.column("id").to_pylist(), np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


class Store:
    """The same checks on local files and on the moto S3 server."""

    def __init__(self, kind: str, tmp_path, endpoint: str | None) -> None:
        self.kind = kind
        if kind == "s3":
            assert endpoint, "an S3 store needs the moto server's endpoint"
            self.options = s3_options(endpoint)
            self.fs = s3fs.S3FileSystem(**self.options)
            self.root = f"resume-{tmp_path.name.lower().replace('_', '-')}"[:60]
            self.fs.mkdir(self.root)
        else:
            self.options, self.fs, self.root = {}, None, str(tmp_path)

    def url(self, name: str) -> str:
        return f"s3://{self.root}/{name}" if self.kind == "s3" else f"{self.root}/{name}"

    def upload(self, local_dir) -> str:
        if self.kind == "local":
            return str(local_dir)
        for path in sorted(local_dir.iterdir()):
            self.fs.put_file(str(path), f"{self.root}/docs/{path.name}")
        return self.url("docs/*.parquet")

    def parts(self, name: str) -> list[str]:
        if self.kind == "s3":
            self.fs.invalidate_cache()
            paths = self.fs.ls(f"{self.root}/{name}") if self.fs.exists(f"{self.root}/{name}") else []
            return sorted(p.rsplit("/", 1)[1] for p in paths if "/part-" in p)
        directory = os.path.join(self.root, name)
        return sorted(p for p in os.listdir(directory) if p.startswith("part-")) if os.path.isdir(directory) else []

    def manifest(self, name: str) -> dict | None:
        path = f"{self.root}/{name}/_manifest.json"
        if self.kind == "s3":
            self.fs.invalidate_cache()
            return json.loads(self.fs.cat_file(path)) if self.fs.exists(path) else None
        return json.loads(open(path).read()) if os.path.exists(path) else None

    def table(self, name: str):
        if self.kind == "s3":
            return pq.read_table(f"{self.root}/{name}", filesystem=self.fs)
        return read_output(os.path.join(self.root, name))

    def cli_options(self) -> list[str]:
        return ["--storage-options", json.dumps(self.options)] if self.options else []


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_client_killed_mid_job_then_same_command_completes(kind, cluster, tiny_catalog, demo_texts, tmp_path, request):
    local, client = cluster
    plugin = local.scheduler.extensions["shoal-pull-queue"]
    store = Store(kind, tmp_path, request.getfixturevalue("s3_server") if kind == "s3" else None)
    ids = write_shards(tmp_path / "in", demo_texts[:300], shards=2, row_group_size=5)
    profile = write_profile(tmp_path, name="resume", rows_per_item=5)  # 60 small items: a long enough job
    args = embed_args(
        store.upload(tmp_path / "in"),
        store.url("out"),
        tiny_catalog,
        *store.cli_options(),
        scheduler=client.scheduler.address,
        profile=profile,
    )

    acked = plugin.state.counts["acked"]
    jobs_before = set(plugin.batch.jobs)
    with started([SHOAL, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as job:
        wait_for(
            lambda: plugin.state.counts["acked"] >= acked + 2 or job.poll() is not None,
            240,
            "two acks of the job",
            0.01,
        )
        job.send_signal(signal.SIGKILL)
        assert job.wait() == -signal.SIGKILL, "the job ended before it could be killed"
    # Until the scheduler sees the client gone and drops its job, workers still ack that job's items:
    # the count below must start after that, or it counts the killed run's last acks as the rerun's.
    wait_for(lambda: set(plugin.batch.jobs) <= jobs_before, 240, "the killed client's job dropped", 0.01)
    at_kill = store.parts("out")
    assert 2 <= len(at_kill) < 60 and store.manifest("out") is None

    acked = plugin.state.counts["acked"]
    result = invoke_shoal(*args)
    assert result.returncode == 0, result.stderr
    manifest = store.manifest("out")
    work = manifest["work"]
    assert manifest["complete"] and work["items"] == 60
    assert work["reused"] >= len(at_kill) and work["run"] == 60 - work["reused"] > 0
    assert plugin.state.counts["acked"] - acked == work["run"]  # the scheduler ran only the missing items
    assert sorted(store.table("out").column("id").to_pylist()) == sorted(ids)  # every row exactly once
    assert {p["name"] for p in manifest["parts"]} == set(store.parts("out"))


def test_rerun_redoes_changed_inputs_and_removes_stale_parts(cluster, tiny_catalog, demo_texts, tmp_path):
    _, client = cluster
    profile = write_profile(tmp_path, name="resume-tiny", rows_per_item=100)
    write_shards(tmp_path / "in", demo_texts[:600], shards=3, row_group_size=50)  # 3 shards × 2 items
    out = tmp_path / "out"

    def embed(output):
        return invoke_shoal(
            *embed_args(tmp_path / "in", output, tiny_catalog, scheduler=client.scheduler.address, profile=profile)
        )

    assert embed(out).returncode == 0

    # A later run that crashed: no manifest, one part missing, a shard rewritten since, a stray part.
    (out / "_manifest.json").unlink()
    parts = sorted(out.glob("part-shard-000-*"))
    parts[1].unlink()
    changed = pa.table({"id": [f"doc-{i}" for i in range(200, 400)], "text": demo_texts[1000:1200]})
    pq.write_table(changed, tmp_path / "in" / "shard-001.parquet", row_group_size=50)
    ids = [f"doc-{i}" for i in range(600)]
    stray = out / "part-gone-0123abcd-0000000000-0000000100.parquet"
    shutil.copy(parts[0], stray)

    result = embed(out)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["work"] == {"items": 6, "reused": 3, "run": 3, "removed": 1}
    assert not stray.exists()

    fresh = embed(tmp_path / "fresh")
    assert fresh.returncode == 0, fresh.stderr
    ours, theirs = sorted_vectors(read_output(out)), sorted_vectors(read_output(tmp_path / "fresh"))
    assert ours[0] == theirs[0] == sorted(ids)
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5)

    again = embed(out)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "_manifest.json").read_text())["work"] == {"items": 6, "reused": 6, "run": 0, "removed": 0}


def test_scheduler_killed_mid_job_then_new_cluster_and_same_command_complete(
    test_profile, tiny_catalog, demo_texts, tmp_path, cluster
):
    ids = write_shards(tmp_path / "in", demo_texts[:300], shards=2, row_group_size=5)
    profile = write_profile(tmp_path, name="resume-dask", rows_per_item=5)  # 60 items
    out = tmp_path / "out"
    args = embed_args(tmp_path / "in", out, tiny_catalog, profile=profile)
    embedding = [SHOAL, *args]
    with dask_cli_cluster(tmp_path, test_profile, tag="first") as (address, procs):
        with started(
            [*embedding, "--scheduler", address], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        ) as job:
            wait_for(
                lambda: len(list(out.glob("part-*"))) >= 2 or job.poll() is not None, 240, "two parts written", 0.01
            )
            procs[0].send_signal(signal.SIGKILL)
            assert job.poll() is None, "the job ended before the scheduler could be killed"
            for proc in [job, *procs]:  # the rest of the cluster and the client die with it, not in order
                proc.kill()
    at_kill = list(out.glob("part-*"))
    assert 2 <= len(at_kill) < 60 and not (out / "_manifest.json").exists()

    _, client = cluster  # another cluster: the session's, whose workers run the same profile
    result = invoke_shoal(*args, "--scheduler", client.scheduler.address)
    assert result.returncode == 0, result.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["work"]["reused"] >= len(at_kill)
    assert manifest["work"]["run"] == 60 - manifest["work"]["reused"]
    assert sorted(read_output(out).column("id").to_pylist()) == sorted(ids)
