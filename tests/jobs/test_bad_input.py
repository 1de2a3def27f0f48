"""Bad input gets a clear message naming the file, column or model; nothing else is lost."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.support.cli import embed_args, invoke_shoal, run_shoal
from tests.support.files import read_only_folder, read_output, write_rows, write_shards


@pytest.fixture
def shoal(cluster, tiny_catalog, test_profile):
    _, client = cluster

    def run(source, output, *extra: str, model: str = "tiny"):
        """`shoal embed` of `source` into `output` on the cluster, with the test profile."""
        on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile, "model": model}
        return invoke_shoal(*embed_args(source, output, tiny_catalog, *extra, **on_cluster))

    return run


def test_missing_text_column_names_file_and_column(shoal, tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "body": ["a", "b"]}), tmp_path / "docs.parquet")
    result = shoal(tmp_path / "docs.parquet", tmp_path / "out")
    assert result.returncode == 2  # refused before any work is submitted
    assert "docs.parquet" in result.stderr and "no column 'text'" in result.stderr
    assert "body" in result.stderr  # the columns that are there
    result = shoal(
        tmp_path / "docs.parquet",
        tmp_path / "out",
        "--text-column",
        "body",
        "--id-column",
        "doc_id",
    )
    assert result.returncode == 2 and "no column 'doc_id'" in result.stderr


def test_shard_missing_the_column_fails_alone(shoal, demo_texts, tmp_path):
    ids = write_shards(tmp_path / "in", demo_texts[:400], shards=2, row_group_size=100)
    pq.write_table(pa.table({"id": ["x"], "body": ["b"]}), tmp_path / "in" / "shard-zzz.parquet")
    result = shoal(tmp_path / "in", tmp_path / "out")
    assert result.returncode == 1
    assert "shard-zzz.parquet: no column 'text'" in result.stderr
    assert sorted(read_output(tmp_path / "out").column("id").to_pylist()) == sorted(ids)


def test_without_id_column_rows_are_identified_by_source(shoal, tmp_path):
    pq.write_table(
        pa.table({"text": [f"sentence number {i}" for i in range(250)]}), tmp_path / "noid.parquet", row_group_size=100
    )
    result = shoal(tmp_path / "noid.parquet", tmp_path / "out", "--id-column", "")
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    assert sorted(table.column("source_row").to_pylist()) == list(range(250))
    assert set(table.column("source_file").to_pylist()) == {(tmp_path / "noid.parquet").as_uri()}


def test_unreachable_scheduler(tiny_catalog, tmp_path):
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), tmp_path / "a.parquet")
    result = run_shoal(
        *embed_args(tmp_path / "a.parquet", tmp_path / "out", tiny_catalog, scheduler="tcp://127.0.0.1:9"),
        env={"DASK_SHOAL__CONNECT_TIMEOUT": "2s"},  # Dask config: the wait before giving up
    )
    assert result.returncode == 2 and "cannot reach the scheduler at tcp://127.0.0.1:9" in result.stderr


def test_corrupt_shard_is_reported_and_the_rest_finishes(shoal, demo_texts, tmp_path):
    ids = write_shards(tmp_path / "in", demo_texts[:600], shards=3, row_group_size=100)
    (tmp_path / "in" / "shard-001.parquet").write_bytes(b"PAR1 this is not parquet at all" * 10)
    kept = set(ids[:200] + ids[400:])
    result = shoal(tmp_path / "in", tmp_path / "out")
    assert result.returncode == 1
    assert "shard-001.parquet" in result.stderr and "failed" in result.stderr
    table = read_output(tmp_path / "out")
    assert sorted(table.column("id").to_pylist()) == sorted(kept)
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert not manifest["complete"]
    assert [f["input"].rsplit("/", 1)[1] for f in manifest["failed"]] == ["shard-001.parquet"]
    assert "Parquet" in manifest["failed"][0]["errors"][-1]


def test_truncated_shard_body_goes_to_dead_letters_after_retries(shoal, demo_texts, tmp_path):
    write_shards(tmp_path / "in", demo_texts[:300], shards=1, row_group_size=100)
    shard = tmp_path / "in" / "shard-000.parquet"
    data = shard.read_bytes()
    shard.write_bytes(data[:200] + b"\0" * (len(data) - 400) + data[-200:])  # footer intact, pages not
    result = shoal(tmp_path / "in", tmp_path / "out")
    assert result.returncode == 1
    assert "shard-000.parquet" in result.stderr
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["failed"] and all(f["input"].endswith("shard-000.parquet") for f in manifest["failed"])


def test_null_and_empty_texts_keep_their_rows(shoal, tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    texts = ["a real sentence about parquet files", None, "", "   ", "another one", None]
    pq.write_table(pa.table({"id": list(range(6)), "text": pa.array(texts, pa.string())}), tmp_path / "n.parquet")
    result = shoal(tmp_path / "n.parquet", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "null texts" in result.stderr and "empty texts" in result.stderr
    table = read_output(tmp_path / "out").sort_by("id")
    assert table.column("id").to_pylist() == list(range(6))
    embeddings = table.column("embedding").to_pylist()
    assert embeddings[1] is None and embeddings[5] is None
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(["", "another one"])
    np.testing.assert_allclose(embeddings[2], direct[0], atol=1e-5)
    np.testing.assert_allclose(embeddings[4], direct[1], atol=1e-5)


def test_texts_longer_than_max_seq_length_are_truncated_and_counted(shoal, tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    long_text = "parquet shards stream through the workers " * 200
    texts = [long_text, "short", long_text + " tail"]
    pq.write_table(pa.table({"id": [0, 1, 2], "text": texts}), tmp_path / "long.parquet")
    result = shoal(tmp_path / "long.parquet", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert "truncated" in result.stderr
    table = read_output(tmp_path / "out").sort_by("id")
    direct = SentenceTransformer(str(tiny_model), device="cpu").encode(texts)
    np.testing.assert_allclose(np.stack(table.column("embedding").to_pylist()), direct, atol=1e-5)


def test_input_that_matches_nothing(shoal, tmp_path):
    result = shoal(tmp_path / "nothing-*.parquet", tmp_path / "out")
    assert result.returncode == 2
    assert "matches no Parquet files" in result.stderr and "nothing-*.parquet" in result.stderr
    result = shoal(tmp_path / "absent", tmp_path / "out")
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_unknown_model_names_the_known_ones(shoal, tmp_path):
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), tmp_path / "a.parquet")
    result = shoal(tmp_path / "a.parquet", tmp_path / "out", model="no-such-model")
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in result.stderr and "tiny" in result.stderr and "minilm" in result.stderr


def test_non_string_text_column(shoal, tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": [1.5, 2.5]}), tmp_path / "nums.parquet")
    result = shoal(tmp_path / "nums.parquet", tmp_path / "out")
    assert result.returncode == 1
    assert "nums.parquet" in result.stderr and "column 'text' has type double" in result.stderr


def direct(model_path, texts: list[str]):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_path), device="cpu").encode(texts)


def test_a_refused_part_write_is_permanent_and_a_refused_manifest_still_ends_with_a_summary(tmp_path):
    from shoal.pipeline.jobs.engine import BatchJob, _write_manifest
    from shoal.workers.data.parquet_slices import write_part
    from shoal.workers.data.storage import OutputRefused
    from shoal.workers.operations import PERMANENT_ERRORS

    with read_only_folder(tmp_path / "ro") as ro:
        with pytest.raises(OutputRefused) as info:
            write_part(str(ro / "out" / "part-1.parquet"), pa.table({"a": [1]}), None)
        assert isinstance(info.value, PERMANENT_ERRORS) and "part-1.parquet: cannot write" in str(info.value)
        manifest = {"complete": True}
        url, error = _write_manifest(BatchJob("embed", "in", str(ro), "tiny", {}, [], {}), manifest)
        assert url == "" and "cannot write the manifest" in error and manifest["complete"] is False
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputRefused):  # a file where a folder should be
        write_part(str(tmp_path / "a-file" / "part.parquet"), pa.table({"a": [1]}), None)
    if os.geteuid() == 0:  # a full disk: a 64 KiB tmpfs and a part of incompressible bytes
        full = tmp_path / "full"
        full.mkdir()
        if (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=64k", "shoal-full", str(full)], capture_output=True
            ).returncode
            == 0
        ):
            try:
                with pytest.raises(OutputRefused, match="No space left"):
                    write_part(str(full / "part.parquet"), pa.table({"a": [os.urandom(1 << 20)]}), None)
                assert not list(full.iterdir())  # the temporary file is gone too
            finally:
                subprocess.run(["umount", str(full)], check=True)


def test_underscore_and_dot_folders_in_the_input_are_not_input(tmp_path):
    from shoal.pipeline.jobs.planner import PlanError, list_shards

    for folder in ("", "_staging/", ".cache/", "keep/"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"text": ["x"]}), tmp_path / folder / "a.parquet")
    names = [s.url.split(str(tmp_path), 1)[1] for s in list_shards(str(tmp_path))]
    assert names == ["/a.parquet", "/keep/a.parquet"]
    # A file named on its own is input even inside OUTPUT (parts written beside their source).
    assert len(list_shards(str(tmp_path / "keep" / "a.parquet"), None, str(tmp_path / "keep"))) == 1
    with pytest.raises(PlanError, match="is inside output"):
        list_shards(str(tmp_path / "keep"), None, str(tmp_path))


def test_a_row_that_is_not_utf8_is_a_named_rejection_and_every_other_row_is_embedded(shoal, tiny_model, tmp_path):
    texts = [f"sentence {i}".encode() for i in range(30)]
    texts[7] = b"broken \xed\xa0\x80 surrogate"
    texts[21] = b"\xff\xfe"
    column = pa.array(texts, type=pa.binary()).view(pa.string())  # written as a careless writer would
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"id": list(range(30)), "text": column}), tmp_path / "in" / "bad.parquet", row_group_size=10
    )
    result = shoal(tmp_path / "in", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert "bad.parquet row 7, column 'text': not valid UTF-8 (byte 0xed at offset 7)" in result.stderr
    assert "bad.parquet row 21, column 'text': not valid UTF-8 (byte 0xff at offset 0)" in result.stderr
    table = read_output(tmp_path / "out").sort_by("id")
    assert table.column("id").to_pylist() == list(range(30))
    vectors = table.column("embedding").to_pylist()
    assert vectors[7] is None and vectors[21] is None
    good = [i for i in range(30) if i not in (7, 21)]
    np.testing.assert_allclose(
        [vectors[i] for i in good], direct(tiny_model, [texts[i].decode() for i in good]), atol=1e-5
    )
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["rejected_rows"] == 2 and manifest["complete"]


def test_a_model_named_twice_runs_once(shoal, tmp_path):
    source = write_rows(tmp_path / "in")
    result = shoal(source, tmp_path / "out", model="tiny,tiny")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "_manifest.json").exists() and not (tmp_path / "out" / "tiny").exists()
