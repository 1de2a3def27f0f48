"""The Lance sink: workers write fragments, the client commits one dataset version per run."""

from __future__ import annotations

import json
import signal
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from shoal.workers.data.lance_fragments import lance_storage_options
from tests.support.cli import embed_args, invoke_shoal, reindex_job
from tests.support.files import write_profile, write_shards
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started
from tests.support.s3 import s3_options
from tests.support.waiting import wait_for
from tests.support.worker_loss import embed_killing_a_worker

lance = pytest.importorskip("lance")


def rows(dataset: str) -> list[dict]:
    return lance.dataset(dataset).to_table().to_pylist()


def test_lance_output_every_row_once_and_lancedb_finds_the_nearest_neighbour(
    cluster, tiny_model, tiny_catalog, demo_texts, tmp_path
):
    import lancedb
    from sentence_transformers import SentenceTransformer

    _, client = cluster
    texts = demo_texts[:400]
    ids = write_shards(tmp_path / "in", texts, shards=2, row_group_size=100)
    dataset = str(tmp_path / "db" / "docs.lance")
    result = invoke_shoal(
        *embed_args(tmp_path / "in", f"lance://{dataset}", tiny_catalog, scheduler=client.scheduler.address)
    )
    assert result.returncode == 0, result.stderr
    table = rows(dataset)
    assert sorted(r["id"] for r in table) == sorted(ids)  # every row once
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(texts)
    by_id = {r["id"]: r["embedding"] for r in table}
    np.testing.assert_allclose([by_id[i] for i in ids], direct, atol=2e-5)
    assert lance.dataset(dataset).version == 1

    again = invoke_shoal(
        *embed_args(tmp_path / "in", f"lance://{dataset}", tiny_catalog, scheduler=client.scheduler.address)
    )
    assert again.returncode == 0 and lance.dataset(dataset).version == 1  # nothing changed: no new version

    hits = (
        lancedb.connect(str(tmp_path / "db")).open_table("docs").search(direct[123]).metric("cosine").limit(3).to_list()
    )
    assert hits[0]["id"] == ids[123]


def test_client_killed_then_rerun_commits_every_row_once(cluster, tiny_catalog, demo_texts, tmp_path):
    local, client = cluster
    plugin = local.scheduler.extensions["shoal-pull-queue"]
    ids = write_shards(tmp_path / "in", demo_texts[:300], shards=2, row_group_size=5)
    profile = write_profile(tmp_path, name="lance-resume", rows_per_item=5)  # 60 small items
    dataset = str(tmp_path / "docs.lance")
    args = embed_args(
        tmp_path / "in", dataset, tiny_catalog, "--format", "lance", scheduler=client.scheduler.address, profile=profile
    )
    acked = plugin.state.counts["acked"]
    with started([SHOAL, *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as job:
        wait_for(
            lambda: plugin.state.counts["acked"] >= acked + 2 or job.poll() is not None,
            120,
            "two acks of the job",
            step=0.01,
        )
        job.send_signal(signal.SIGKILL)
        assert job.wait() == -signal.SIGKILL, "the job ended before it could be killed"
    with pytest.raises((ValueError, OSError)):  # fragments written, no version committed: no half dataset
        lance.dataset(dataset)
    result = invoke_shoal(*args)
    assert result.returncode == 0, result.stderr
    assert sorted(r["id"] for r in rows(dataset)) == sorted(ids)
    assert lance.dataset(dataset).version == 1


@pytest.mark.integration  # starts its own cluster
def test_worker_killed_mid_job_loses_no_row_and_duplicates_none(demo_texts, tmp_path):
    dataset = str(tmp_path / "docs.lance")
    ids, returncode, stderr, lost = embed_killing_a_worker(
        tmp_path, "lance-kill", demo_texts[:1600], f"lance://{dataset}"
    )
    assert returncode == 0, stderr
    assert lost >= 1
    assert sorted(r["id"] for r in rows(dataset)) == sorted(ids)  # every row exactly once


def test_reindex_into_lance_adds_a_version_when_inputs_change(cluster, tiny_catalog, demo_texts, tmp_path):
    _, client = cluster
    ids = write_shards(tmp_path / "in", demo_texts[:200], shards=2, row_group_size=50)
    dataset = str(tmp_path / "docs.lance")
    job = reindex_job(tmp_path / "in", dataset, tiny_catalog, client.scheduler.address, format="lance")
    (tmp_path / "docs.yaml").write_text(yaml.safe_dump(job))
    assert invoke_shoal("reindex", str(tmp_path / "docs.yaml")).returncode == 0
    assert lance.dataset(dataset).version == 1 and sorted(r["id"] for r in rows(dataset)) == sorted(ids)
    more = [f"new-{i}" for i in range(60)]
    pq.write_table(pa.table({"id": more, "text": demo_texts[200:260]}), tmp_path / "in" / "shard-new.parquet")
    result = invoke_shoal("reindex", str(tmp_path / "docs.yaml"))
    assert result.returncode == 0, result.stderr
    assert lance.dataset(dataset).version == 2  # a reindex is a new version
    assert sorted(r["id"] for r in rows(dataset)) == sorted(ids + more)
    assert sorted(r["id"] for r in lance.dataset(dataset, version=1).to_table().to_pylist()) == sorted(ids)


def test_lance_dataset_on_s3(cluster, tiny_catalog, demo_texts, tmp_path, s3_server):
    import s3fs

    _, client = cluster
    options = s3_options(s3_server)
    s3fs.S3FileSystem(**options).mkdir("lance-bucket")
    ids = write_shards(tmp_path / "in", demo_texts[:200], shards=2, row_group_size=50)
    result = invoke_shoal(
        "embed",
        str(tmp_path / "in"),
        "s3://lance-bucket/docs.lance",
        "--format",
        "lance",
        "--model",
        "tiny",
        "--catalog",
        str(tiny_catalog),
        "--scheduler",
        client.scheduler.address,
        "--storage-options",
        json.dumps(options),
    )
    assert result.returncode == 0, result.stderr
    dataset = lance.dataset("s3://lance-bucket/docs.lance", storage_options=lance_storage_options(options))
    assert dataset.version == 1 and sorted(dataset.to_table().column("id").to_pylist()) == sorted(ids)


def test_int8_chunked_rows_into_lance(cluster, tiny_catalog, demo_texts, tmp_path):
    _, client = cluster
    ids = write_shards(
        tmp_path / "in", [" ".join(demo_texts[i : i + 6]) for i in range(0, 240, 6)], shards=1, row_group_size=20
    )
    dataset = str(tmp_path / "docs.lance")
    result = invoke_shoal(
        *embed_args(
            tmp_path / "in",
            f"lance://{dataset}",
            tiny_catalog,
            "--chunk",
            "tokens=32,overlap=4",
            "--precision",
            "int8",
            scheduler=client.scheduler.address,
        )
    )
    assert result.returncode == 0, result.stderr
    table = lance.dataset(dataset).to_table()
    assert table.schema.field("embedding").type == pa.list_(pa.int8(), 32)
    keys = list(zip(table.column("id").to_pylist(), table.column("chunk").to_pylist()))
    assert len(keys) == len(set(keys)) > len(ids) and {k[0] for k in keys} == set(ids)
    manifest = json.loads((tmp_path / "docs.lance" / "_shoal" / "_manifest.json").read_text())
    assert len(manifest["vectors"]["ranges"][0]) == 32 and manifest["lance"]["version"] == 1
