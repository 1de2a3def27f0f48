"""The same job through a real S3 API (moto's server on 127.0.0.1, reached by s3fs)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import s3fs

from tests.support.cli import embed_args, invoke_shoal
from tests.support.files import read_output, write_shards
from tests.support.s3 import s3_options


def test_s3_job_equals_local_job(cluster, tiny_catalog, test_profile, demo_texts, s3_server, tmp_path):
    _, client = cluster
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("shoal-test")
    ids = write_shards(tmp_path / "in", demo_texts[:900], shards=3, row_group_size=120)
    for path in sorted((tmp_path / "in").iterdir()):
        fs.put_file(str(path), f"shoal-test/docs/{path.name}")

    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile}
    local = invoke_shoal(*embed_args(tmp_path / "in", tmp_path / "local-out", tiny_catalog, **on_cluster))
    assert local.returncode == 0, local.stderr
    remote = invoke_shoal(
        *embed_args(
            "s3://shoal-test/docs/*.parquet",
            "s3://shoal-test/vectors/",
            tiny_catalog,
            "--storage-options",
            json.dumps(options),
            **on_cluster,
        )
    )
    assert remote.returncode == 0, remote.stderr

    local_table = read_output(tmp_path / "local-out").sort_by("id")
    remote_table = pq.read_table("shoal-test/vectors", filesystem=fs).sort_by("id")
    assert remote_table.column("id").to_pylist() == local_table.column("id").to_pylist() == sorted(ids)
    np.testing.assert_allclose(
        np.stack(remote_table.column("embedding").to_numpy(zero_copy_only=False)),
        np.stack(local_table.column("embedding").to_numpy(zero_copy_only=False)),
        atol=1e-6,
    )
    manifest = json.loads(fs.cat_file("shoal-test/vectors/_manifest.json"))
    assert manifest["complete"] and manifest["rows"] == len(ids)
    assert all(
        i["url"].startswith("s3://shoal-test/docs/") and i["version"].startswith("ETag") for i in manifest["inputs"]
    )
    local_parts = {p.name for p in (tmp_path / "local-out").glob("part-*")}
    remote_parts = {p.rsplit("/", 1)[1] for p in fs.ls("shoal-test/vectors") if "/part-" in p}
    assert len(remote_parts) == len(local_parts) == len(manifest["parts"])
