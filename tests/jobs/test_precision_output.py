"""Compact vectors: each precision equals quantize_embeddings on the same vectors with the job's calibration."""

from __future__ import annotations

import json
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.workers.data.vector_precision import PRECISIONS
from tests.support.cli import embed_args, invoke_shoal, reindex_job
from tests.support.files import read_output, write_shards


def embeddings(directory, ids: list[str]) -> np.ndarray:
    table = read_output(directory)
    row = {i: n for n, i in enumerate(table.column("id").to_pylist())}
    assert sorted(row) == sorted(ids)
    return np.stack(table.column("embedding").to_numpy(zero_copy_only=False))[[row[i] for i in ids]]


def quantize(vectors: np.ndarray, precision: str, ranges) -> np.ndarray:
    from sentence_transformers.util.quantization import quantize_embeddings

    if precision == "float16":
        return vectors.astype(np.float16)
    return np.asarray(
        quantize_embeddings(
            vectors, precision=cast(Any, precision), ranges=None if ranges is None else np.asarray(ranges, np.float32)
        )
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, demo_texts):
    directory = tmp_path_factory.mktemp("precision")
    ids = write_shards(directory / "in", demo_texts[:400], shards=2, row_group_size=100)
    return directory, ids


def embed(cluster, tiny_catalog, source, output, *options: str):
    _, client = cluster
    return invoke_shoal(*embed_args(source, output, tiny_catalog, *options, scheduler=client.scheduler.address))


@pytest.fixture(scope="module")
def full(cluster, tiny_catalog, corpus) -> np.ndarray:
    """The corpus's float32 vectors, as a job without --precision stores them."""
    directory, ids = corpus
    assert embed(cluster, tiny_catalog, directory / "in", directory / "float32").returncode == 0
    return embeddings(directory / "float32", ids)


def test_each_precision_equals_quantize_embeddings_with_the_jobs_calibration(cluster, tiny_catalog, corpus, full):
    directory, ids = corpus
    first_part = sorted((directory / "float32").glob("part-*.parquet"))[0]
    sample = np.stack(pq.read_table(first_part).column("embedding").to_numpy(zero_copy_only=False))
    for precision in PRECISIONS[1:]:
        result = embed(cluster, tiny_catalog, directory / "in", directory / precision, "--precision", precision)
        assert result.returncode == 0, result.stderr
        manifest = json.loads((directory / precision / "_manifest.json").read_text())
        ranges = manifest["vectors"].get("ranges")
        if precision in ("int8", "uint8"):  # calibrated once, on the job's first item
            np.testing.assert_allclose(ranges, [sample.min(0), sample.max(0)], rtol=1e-6)
        else:
            assert ranges is None
        ours = embeddings(directory / precision, ids)
        assert ours.dtype == quantize(full[:2], precision, ranges).dtype
        np.testing.assert_array_equal(ours, quantize(full, precision, ranges))
    assert read_output(directory / "binary").schema.field("embedding").type == pa.list_(pa.int8(), 32 // 8)


def test_dim_gives_unit_vectors_of_that_length(cluster, tiny_catalog, corpus, full):
    directory, ids = corpus
    result = embed(cluster, tiny_catalog, directory / "in", directory / "short", "--dim", "16")
    assert result.returncode == 0, result.stderr
    short = embeddings(directory / "short", ids)
    assert short.shape == (len(ids), 16)
    np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1, atol=1e-5)
    cut = full[:, :16]
    np.testing.assert_allclose(short, cut / np.linalg.norm(cut, axis=1, keepdims=True), atol=1e-6)


def test_resumed_int8_parts_use_the_stored_ranges(cluster, tiny_catalog, corpus):
    directory, ids = corpus
    output = directory / "int8-resume"
    args = ("--precision", "int8", "--dim", "24")
    assert embed(cluster, tiny_catalog, directory / "in", output, *args).returncode == 0
    stored = json.loads((output / "_calibration.json").read_text())
    before = embeddings(output, ids)
    lost = sorted(output.glob("part-*.parquet"))[-1]
    lost.unlink()
    (output / "_manifest.json").unlink()
    result = embed(cluster, tiny_catalog, directory / "in", output, *args)
    assert result.returncode == 0, result.stderr
    assert "calibrating" not in result.stderr  # the stored ranges were reused
    assert json.loads((output / "_manifest.json").read_text())["vectors"]["ranges"] == stored["ranges"]
    np.testing.assert_array_equal(embeddings(output, ids), before)


def test_bad_vector_options_exit_2(cluster, tiny_catalog, tmp_path):
    write_shards(tmp_path / "in", ["a text"], shards=1, row_group_size=1)
    too_wide = embed(cluster, tiny_catalog, tmp_path / "in", tmp_path / "wide", "--dim", "64")
    assert too_wide.returncode == 2 and "dim 64 is more than model 'tiny' gives (32)" in too_wide.stderr
    # int8 needs a sample with text: the job's first item has none.
    (tmp_path / "empty").mkdir()
    pq.write_table(
        pa.table({"id": ["a", "b"], "text": pa.array([None, None], pa.string())}), tmp_path / "empty" / "s.parquet"
    )
    empty = embed(cluster, tiny_catalog, tmp_path / "empty", tmp_path / "out", "--precision", "int8")
    assert empty.returncode == 2, empty.stderr
    assert "has no text to embed" in " ".join(empty.stderr.split())
    assert not list((tmp_path / "out").glob("part-*"))


def test_reindexed_int8_parts_use_the_versions_ranges(cluster, tiny_catalog, demo_texts, tmp_path):
    import yaml

    _, client = cluster
    ids = write_shards(tmp_path / "in", demo_texts[:200], shards=2, row_group_size=100)
    job = reindex_job(tmp_path / "in", tmp_path / "out", tiny_catalog, client.scheduler.address, precision="int8")
    (tmp_path / "docs.yaml").write_text(yaml.safe_dump(job))
    first = invoke_shoal("reindex", str(tmp_path / "docs.yaml"))
    assert first.returncode == 0 and "calibrating" in first.stderr, first.stderr
    version = tmp_path / "out" / (tmp_path / "out" / "_CURRENT").read_text().strip()
    ranges = json.loads((version / "_manifest.json").read_text())["vectors"]["ranges"]
    pq.write_table(
        pa.table({"id": [f"new-{i}" for i in range(50)], "text": demo_texts[300:350]}), tmp_path / "in" / "new.parquet"
    )
    second = invoke_shoal("reindex", str(tmp_path / "docs.yaml"))
    assert second.returncode == 0 and "calibrating" not in second.stderr, second.stderr
    manifest = json.loads((version / "_manifest.json").read_text())
    assert manifest["vectors"]["ranges"] == ranges and manifest["work"]["run"] == 1
    table = read_output(version)
    assert sorted(table.column("id").to_pylist()) == sorted(ids + [f"new-{i}" for i in range(50)])
