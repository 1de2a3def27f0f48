"""`shoal reindex job.yaml`: minimal work after input changes, versions after a model change, one run at a time."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import yaml
from rich.console import Console

from shoal.pipeline.jobs.lock import JobLock, LockHeld
from shoal.pipeline.jobs.reindex import load_job, run_reindex
from shoal.pipeline.jobs.schedule import run_on_schedule
from tests.support.cli import invoke_shoal, reindex_job, run_shoal
from tests.support.files import read_output, write_profile, write_shards
from tests.support.s3 import s3_options


@pytest.fixture(scope="module")
def catalog(tmp_path_factory, tiny_catalog):
    """`tiny`, and `tiny-raw`: other settings (normalize), so another fingerprint."""
    models = yaml.safe_load(tiny_catalog.read_text())["models"]
    models["tiny-raw"] = {**models["tiny"], "normalize": False}
    path = tmp_path_factory.mktemp("reindex-catalog") / "catalog.yaml"
    path.write_text(yaml.safe_dump({"models": models}))
    return path


@pytest.fixture
def job_file(tmp_path, cluster, catalog):
    """Writes a job file for the shared cluster; returns its path."""
    _, client = cluster
    profile = write_profile(tmp_path, name="reindex", rows_per_item=100)

    def write(name: str = "docs", **fields) -> str:
        job = reindex_job(
            tmp_path / "in",
            tmp_path / "out",
            catalog,
            client.scheduler.address,
            name=name,
            profile=str(profile),
            **fields,
        )
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job))
        return str(path)

    return write


def reindex(path: str, *args: str) -> subprocess.CompletedProcess:
    return invoke_shoal("reindex", path, *args)


def current(fs_root, fs=None) -> str:
    path = f"{fs_root}/_CURRENT"
    return (fs.cat_file(path) if fs else open(path, "rb").read()).decode().strip()


def vectors(table: pa.Table) -> tuple[list, np.ndarray]:
    table = table.sort_by("id")
    return table.column("id").to_pylist(), np.stack(table.column("embedding").to_numpy(zero_copy_only=False))


def change_inputs(directory, texts: list[str], remove) -> list[str]:
    """shard-000 kept, shard-001 rewritten, shard-002 removed, shard-003 added; the ids now present."""
    pq.write_table(
        pa.table({"id": [f"doc-{i}" for i in range(200, 400)], "text": texts[1000:1200]}),
        directory / "shard-001.parquet",
        row_group_size=50,
    )
    remove(directory / "shard-002.parquet")
    pq.write_table(
        pa.table({"id": [f"doc-{i}" for i in range(600, 800)], "text": texts[600:800]}),
        directory / "shard-003.parquet",
        row_group_size=50,
    )
    return [f"doc-{i}" for i in [*range(400), *range(600, 800)]]


def test_reindex_after_added_changed_removed_shards_does_minimal_work(job_file, cluster, demo_texts, tmp_path):
    local, _ = cluster
    plugin = local.scheduler.extensions["shoal-pull-queue"]
    write_shards(tmp_path / "in", demo_texts[:600], shards=3, row_group_size=50)  # 3 shards × 2 items
    job = job_file()
    first = reindex(job)
    assert first.returncode == 0, first.stderr
    version = current(tmp_path / "out")
    assert version.startswith("v-") and "first build" in first.stderr

    ids = change_inputs(tmp_path / "in", demo_texts, lambda p: p.unlink())
    before = sorted((tmp_path / "out" / version).iterdir())
    dry = reindex(job, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "1 unchanged, 1 new, 1 changed, 1 removed" in dry.stderr
    assert "items: 4 to run, 2 already done, 2 stale parts to remove" in dry.stderr
    assert sorted((tmp_path / "out" / version).iterdir()) == before  # a dry run changes nothing

    acked = plugin.state.counts["acked"]
    second = reindex(job)
    assert second.returncode == 0, second.stderr
    manifest = json.loads((tmp_path / "out" / version / "_manifest.json").read_text())
    assert manifest["work"] == {"items": 6, "reused": 2, "run": 4, "removed": 2}
    assert plugin.state.counts["acked"] - acked == 4  # exactly the new and changed shards' items ran
    assert current(tmp_path / "out") == version

    fresh = reindex(job_file("fresh", output=str(tmp_path / "fresh")))
    assert fresh.returncode == 0, fresh.stderr
    ours = vectors(read_output(tmp_path / "out" / version))
    theirs = vectors(read_output(tmp_path / "fresh" / current(tmp_path / "fresh")))
    assert ours[0] == theirs[0] == sorted(ids)
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5)

    third = reindex(job)  # nothing changed: no cluster needed, no item run
    assert third.returncode == 0, third.stderr
    assert json.loads((tmp_path / "out" / version / "_manifest.json").read_text())["work"]["run"] == 0


def test_model_change_builds_a_new_version_and_moves_current_when_complete(job_file, demo_texts, tmp_path):
    write_shards(tmp_path / "in", demo_texts[:400], shards=2, row_group_size=50)
    assert reindex(job_file()).returncode == 0
    old = current(tmp_path / "out")

    changed = reindex(job_file(model="tiny-raw"))
    assert changed.returncode == 0, changed.stderr
    new = current(tmp_path / "out")
    assert new != old and "the model or options changed" in changed.stderr
    new_dir = tmp_path / "out" / new
    assert json.loads((new_dir / "_manifest.json").read_text())["work"]["run"] == 4
    pointer = (tmp_path / "out" / "_CURRENT").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= pointer for p in new_dir.iterdir())  # switched after the last write
    assert (tmp_path / "out" / old).is_dir()  # kept for readers still on it

    back = reindex(job_file(keep_previous=False))  # back to `tiny`: its version is still there, complete
    assert back.returncode == 0, back.stderr
    assert current(tmp_path / "out") == old
    assert json.loads((tmp_path / "out" / old / "_manifest.json").read_text())["work"]["run"] == 0
    assert not new_dir.exists()  # keep_previous: false


def test_second_run_of_the_same_job_exits_with_a_clear_message(job_file, demo_texts, tmp_path):
    write_shards(tmp_path / "in", demo_texts[:200], shards=1, row_group_size=50)
    job = job_file()
    holder = JobLock(str(tmp_path / "out" / "_lock.json"), expiry_seconds=60, settle_seconds=0, job="docs")
    with holder:
        blocked = reindex(job)
    assert blocked.returncode == 3
    assert "job 'docs' is already running" in blocked.stderr and "_lock.json" in blocked.stderr
    assert not (tmp_path / "out" / "_CURRENT").exists()
    assert reindex(job).returncode == 0  # released: the next run goes ahead


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.integration)])  # s3: the moto server
def test_lock_admits_one_holder_and_lapses_after_expiry(kind, tmp_path, request):
    if kind == "s3":
        options = s3_options(request.getfixturevalue("s3_server"))
        s3fs.S3FileSystem(**options).mkdir("locks")
        url = f"s3://locks/{tmp_path.name.lower().replace('_', '-')}/_lock.json"
    else:
        options, url = {}, str(tmp_path / "_lock.json")
    locks = [JobLock(url, options, expiry_seconds=30, settle_seconds=0.3, job="race") for _ in range(4)]
    winners, losers = [], []

    def take(lock):
        try:
            lock.acquire()
            winners.append(lock)
        except LockHeld:
            losers.append(lock)

    threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1 and len(losers) == 3
    winners[0].release()
    crashed = JobLock(url, options, expiry_seconds=0.5, settle_seconds=0)
    crashed._write()  # a holder that died without releasing
    with pytest.raises(LockHeld):
        JobLock(url, options, settle_seconds=0).acquire()
    time.sleep(0.6)  # the dead holder's 0.5 s lock lapses by time: what is tested
    with JobLock(url, options, settle_seconds=0) as successor:
        assert successor.read()["owner"] == successor.owner


def test_reindex_on_s3(cluster, catalog, s3_server, demo_texts, tmp_path):
    _, client = cluster
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("reindex")
    write_shards(tmp_path / "in", demo_texts[:600], shards=3, row_group_size=50)
    for path in sorted((tmp_path / "in").iterdir()):
        fs.put_file(str(path), f"reindex/docs/{path.name}")
    profile = write_profile(tmp_path, name="reindex-s3", rows_per_item=100)

    def job(name: str, output: str, **fields) -> str:
        on_cluster = {"name": name, "profile": str(profile), "storage_options": options}
        spec = reindex_job(
            "s3://reindex/docs/*.parquet", output, catalog, client.scheduler.address, **on_cluster, **fields
        )
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return str(path)

    assert reindex(job("vectors", "s3://reindex/vectors")).returncode == 0
    version = current("reindex/vectors", fs)
    ids = change_inputs(tmp_path / "in", demo_texts, lambda p: fs.rm_file(f"reindex/docs/{p.name}"))
    for name in ("shard-001.parquet", "shard-003.parquet"):
        fs.put_file(str(tmp_path / "in" / name), f"reindex/docs/{name}")

    second = reindex(job("vectors", "s3://reindex/vectors"))
    assert second.returncode == 0, second.stderr
    manifest = json.loads(fs.cat_file(f"reindex/vectors/{version}/_manifest.json"))
    assert manifest["work"] == {"items": 6, "reused": 2, "run": 4, "removed": 2}
    fresh = reindex(job("fresh", "s3://reindex/fresh"))
    assert fresh.returncode == 0, fresh.stderr
    ours = vectors(pq.read_table(f"reindex/vectors/{version}", filesystem=fs))
    theirs = vectors(pq.read_table(f"reindex/fresh/{current('reindex/fresh', fs)}", filesystem=fs))
    assert ours[0] == theirs[0] == sorted(ids)
    np.testing.assert_allclose(ours[1], theirs[1], atol=1e-5)

    changed = reindex(job("vectors", "s3://reindex/vectors", model="tiny-raw"))
    assert changed.returncode == 0, changed.stderr
    new = current("reindex/vectors", fs)
    assert new != version and fs.exists(f"reindex/vectors/{new}/_manifest.json")
    assert (
        fs.info("reindex/vectors/_CURRENT")["LastModified"]
        >= fs.info(f"reindex/vectors/{new}/_manifest.json")["LastModified"]
    )


def test_schedule_runs_repeatedly_and_survives_a_failed_run(job_file, demo_texts, tmp_path, caplog):
    job = job_file()
    results = []

    def run() -> int:
        try:
            outcome = run_reindex(load_job(job), Console(stderr=True))
            results.append(outcome.outcome.work["run"])
            return outcome.exit_code
        finally:
            if not results:  # the first run failed: no input yet. Give the next one some.
                results.append("failed")
                write_shards(tmp_path / "in", demo_texts[:200], shards=1, row_group_size=50)

    caplog.set_level("INFO", logger="shoal.schedule")
    failed = run_on_schedule("* * * * * *", run, runs=3)  # every second
    assert failed == 1 and results == ["failed", 2, 0]
    assert "run 1 failed" in caplog.text and "run 3 finished with exit code 0" in caplog.text


def test_schedule_from_the_command_line(job_file, demo_texts, tmp_path):
    write_shards(tmp_path / "in", demo_texts[:100], shards=1, row_group_size=50)
    job = job_file()
    assert reindex(job).returncode == 0
    looped = run_shoal("reindex", job, "--schedule", "* * * * * *", "--runs", "2")
    assert looped.returncode == 0, looped.stderr
    assert "run 2 finished with exit code 0" in looped.stderr and "next run at" in looped.stderr
    bad = invoke_shoal("reindex", job, "--schedule", "every hour")
    assert bad.returncode == 2 and "not a valid cron expression" in bad.stderr


def test_job_file_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"input": "x", "model": "tiny", "colums": {}}))
    result = invoke_shoal("reindex", str(path), "--dry-run")
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr and "output" in result.stderr and "colums" in result.stderr
