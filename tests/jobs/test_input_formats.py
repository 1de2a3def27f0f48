"""JSON Lines and CSV inputs: split like Parquet, the same vectors, bad lines named and the rest kept."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.pipeline.jobs.planner import PlanError, PlannedItem, list_shards, plan_items, read_footers
from shoal.scheduler_plugins.protocol import EmbedPayload
from shoal.workers.data.input_formats import INDEX_LINES, read_input
from shoal.workers.data.parquet_slices import InputError
from tests.support.cli import embed_args, invoke_shoal, run_shoal
from tests.support.files import read_output, write_profile, write_shards
from tests.support.s3 import s3_options
from tests.support.worker_loss import embed_killing_a_worker


def write_jsonl(directory: Path, texts: list, shards: int, row_group_size: int = 0, gz: bool = False) -> list[str]:
    """`write_shards` as JSON Lines (row_group_size unused): ids `doc-N`; returns all ids in order."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [f"doc-{i}" for i in range(len(texts))]
    per = -(-len(texts) // shards)
    for s in range(shards):
        rows = [{"id": ids[i], "text": texts[i]} for i in range(s * per, min((s + 1) * per, len(texts)))]
        data = "".join(json.dumps(row) + "\n" for row in rows).encode()
        name = f"shard-{s:03d}.jsonl"
        if gz:
            (directory / f"{name}.gz").write_bytes(gzip.compress(data))
        else:
            (directory / name).write_bytes(data)
    return ids


def write_csv(directory: Path, texts: list, shards: int) -> list[str]:
    """`write_shards` as CSV with a header: columns id, text; returns all ids in order."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [f"doc-{i}" for i in range(len(texts))]
    per = -(-len(texts) // shards)
    for s in range(shards):
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["id", "text"])
        writer.writerows([ids[i], texts[i]] for i in range(s * per, min((s + 1) * per, len(texts))))
        (directory / f"shard-{s:03d}.csv").write_text(buffer.getvalue())
    return ids


def planned(url: str, rows_per_item: int, **listing) -> list[PlannedItem]:
    shards = list_shards(url, **listing)
    read_footers(shards)
    assert all(shard.error is None for shard in shards)
    payload: EmbedPayload = {"text_column": "text"}
    return plan_items(shards, "/unused/out", rows_per_item, "tiny", "embed", payload)


def read_items(items: list[dict], columns=("id", "text")) -> tuple[list, dict[str, str]]:
    """Every item's rows of `columns` (as dicts) in plan order, and the rejections by id-less message."""
    rows, rejected = [], {}
    for item in items:
        bad: dict[int, str] = {}
        table = read_input(item["payload"], list(columns), bad, strings=("text",))
        assert table.num_rows == item["rows"]
        rows += table.to_pylist()
        rejected.update({item["payload"]["row_range"][0] + row: message for row, message in bad.items()})
    return rows, rejected


# -- unit: planning and reading ------------------------------------------------------------


@pytest.mark.parametrize("rows_per_item", [1, 7, INDEX_LINES, 40, 1000])
def test_text_files_split_into_items_that_read_back_every_row_once(tmp_path, rows_per_item):
    texts = [f'row {i}, with a comma and a "quote" and ünïcode' for i in range(101)]
    write_jsonl(tmp_path / "j", texts, shards=2)
    write_csv(tmp_path / "c", texts, shards=2)
    expected = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    for folder in ("j", "c"):
        items = planned(str(tmp_path / folder), rows_per_item)
        assert all(0 < item["rows"] <= rows_per_item for item in items)
        rows, rejected = read_items(items)
        assert rows == expected and rejected == {}
        ranges = [item["payload"]["row_range"] for item in items]
        assert ranges[0] == [0, min(rows_per_item, 51)] and ranges[-1][1] == 50  # rows numbered within each file


def test_line_ends_a_missing_last_newline_and_gzip(tmp_path):
    (tmp_path / "crlf.jsonl").write_bytes(b'{"id": 1, "text": "a"}\r\n{"id": 2, "text": "b"}\r\n')
    (tmp_path / "open.csv").write_bytes(b"id,text\r\n1,a\r\n2,b")
    (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(b"".join(b'{"id": %d, "text": "t"}\n' % i for i in range(50))))
    for name in ("crlf.jsonl", "open.csv"):
        rows, rejected = read_items(planned(str(tmp_path / name), 1))
        assert [r["text"] for r in rows] == ["a", "b"] and rejected == {}
    items = planned(str(tmp_path / "z.jsonl.gz"), 10)
    assert len(items) == 1 and items[0]["rows"] == 50  # no random access into a gzip stream: one item
    assert [r["id"] for r in read_items(items)[0]] == list(range(50))


def test_bad_json_lines_are_named_by_line_and_the_others_read(tmp_path):
    lines = [json.dumps({"id": f"doc-{i}", "text": f"text {i}"}) for i in range(40)]
    lines[3] = '{"id": "doc-3", "text": "unclosed}'
    lines[9] = '{"id": "doc-9"}'  # no text field
    lines[11] = ""
    lines[20] = '{"id": "doc-20", "text": 5}'
    lines[25] = '{"id": "doc-25", "text": "a"} {"id": "x", "text": "b"}'
    lines[30] = '{"id": "doc-30", "text": null}'  # a null, as in Parquet: not an error
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    rows, rejected = read_items(planned(str(tmp_path / "docs.jsonl"), 8))
    url = (tmp_path / "docs.jsonl").as_uri()
    assert sorted(rejected) == [3, 9, 11, 20, 25]
    assert rejected[3].startswith(f"{url} line 4: not valid JSON Lines")
    assert rejected[9] == f"{url} line 10, column 'text': no such field"
    assert rejected[11] == f"{url} line 12: empty line"
    assert rejected[20].startswith(f"{url} line 21: ") and "/text" in rejected[20]
    assert rejected[25] == f"{url} line 26: 2 rows on one line"
    assert all(rows[i] == {"id": None, "text": None} for i in rejected)  # all null: no half-read row
    kept = [i for i in range(40) if i not in rejected]
    assert [rows[i]["id"] for i in kept] == [f"doc-{i}" for i in kept]
    assert rows[30]["text"] is None and rows[31]["text"] == "text 31"


def test_bad_csv_lines_are_named_by_line_and_a_missing_column_by_the_header(tmp_path):
    text = "id,text,extra\n" + "".join(f"doc-{i},text {i},e\n" for i in range(30))
    text = text.replace("doc-4,text 4,e", "doc-4,text 4").replace("doc-7,text 7,e", 'doc-7,"text 7,e')
    (tmp_path / "docs.csv").write_text(text)
    rows, rejected = read_items(planned(str(tmp_path / "docs.csv"), 5))
    url = (tmp_path / "docs.csv").as_uri()
    assert rejected == {
        4: f"{url} line 6: 2 fields, expected 3",
        7: f"{url} line 9: a quoted value is not closed on its line (line breaks inside values are not read)",
    }
    assert [r["id"] for r in rows] == [None if i in rejected else f"doc-{i}" for i in range(30)]
    items = planned(str(tmp_path / "docs.csv"), 5)
    with pytest.raises(InputError, match=r"docs\.csv line 1: no column 'body' \(columns are: id, text, extra\)"):
        read_input(items[0]["payload"], ["body"], {})


def test_listing_picks_one_format_by_name_or_as_told(tmp_path):
    for name in ("a.jsonl", "b.jsonl.gz", "c.csv", "notes.txt"):
        (tmp_path / "text" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "text" / name).write_bytes(b"")
    names = lambda shards: [(s.url.rsplit("/", 1)[1], s.format) for s in shards]  # noqa: E731
    with pytest.raises(PlanError, match="holds both JSON Lines and CSV files: give --input-format"):
        list_shards(str(tmp_path / "text"))
    assert names(list_shards(str(tmp_path / "text"), input_format="jsonl")) == [
        ("a.jsonl", "jsonl"),
        ("b.jsonl.gz", "jsonl"),
    ]
    assert names(list_shards(str(tmp_path / "text" / "*.csv"))) == [("c.csv", "csv")]
    assert names(list_shards(str(tmp_path / "text" / "notes.txt"), input_format="csv")) == [("notes.txt", "csv")]
    (tmp_path / "text" / "d.parquet").write_bytes(b"")
    assert names(list_shards(str(tmp_path / "text"))) == [("d.parquet", "parquet")]  # as before: Parquet first
    with pytest.raises(PlanError, match="matches no CSV files"):
        list_shards(str(tmp_path / "text" / "*.tsv"), input_format="csv")


# -- the whole job -------------------------------------------------------------------------


def vectors_by_id(table) -> dict:
    return dict(zip(table.column("id").to_pylist(), table.column("embedding").to_pylist()))


def test_jsonl_and_csv_on_s3_embed_like_the_same_rows_in_parquet(
    cluster, tiny_catalog, test_profile, demo_texts, s3_server, tmp_path
):
    import s3fs

    _, client = cluster
    options = s3_options(s3_server)
    fs = s3fs.S3FileSystem(**options)
    fs.mkdir("shoal-formats")
    texts = demo_texts[:700]
    ids = write_shards(tmp_path / "parquet", texts, shards=2, row_group_size=100)
    write_jsonl(tmp_path / "jsonl", texts, shards=2)
    write_jsonl(tmp_path / "jsonl-gz", texts, shards=2, gz=True)
    write_csv(tmp_path / "csv", texts, shards=2)
    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile}
    local = invoke_shoal(*embed_args(tmp_path / "parquet", tmp_path / "parquet-out", tiny_catalog, **on_cluster))
    assert local.returncode == 0, local.stderr
    expected = vectors_by_id(read_output(tmp_path / "parquet-out"))
    for kind in ("jsonl", "jsonl-gz", "csv"):
        for path in sorted((tmp_path / kind).iterdir()):
            fs.put_file(str(path), f"shoal-formats/{kind}/{path.name}")
        result = invoke_shoal(
            *embed_args(
                f"s3://shoal-formats/{kind}/",
                f"s3://shoal-formats/{kind}-out/",
                tiny_catalog,
                "--storage-options",
                json.dumps(options),
                **on_cluster,
            )
        )
        assert result.returncode == 0, result.stderr
        table = pq.read_table(f"shoal-formats/{kind}-out", filesystem=fs)
        ours = vectors_by_id(table)
        assert sorted(table.column("id").to_pylist()) == sorted(ids)  # each row once
        np.testing.assert_allclose(np.array([ours[i] for i in ids]), np.array([expected[i] for i in ids]), atol=1e-6)
        manifest = json.loads(fs.cat_file(f"shoal-formats/{kind}-out/_manifest.json"))
        assert manifest["complete"] and manifest["rows"] == len(ids)
        assert all(i["version"].startswith("ETag") and i["rows"] == 350 for i in manifest["inputs"])
        assert len(manifest["parts"]) == (2 if kind == "jsonl-gz" else 4)  # 200 rows an item; a .gz file is one


@pytest.mark.integration
def test_killed_worker_then_rerun_leave_each_jsonl_row_once(demo_texts, tmp_path):
    out = tmp_path / "out"
    ids, returncode, stderr, lost = embed_killing_a_worker(
        tmp_path, "kill-jsonl", demo_texts[:1600], str(out), write_jsonl
    )
    assert returncode == 0, stderr
    assert lost >= 1
    assert sorted(read_output(out).column("id").to_pylist()) == sorted(ids)
    catalog = tmp_path / "catalog.yaml"  # written by embed_killing_a_worker; the rerun needs no cluster
    again = run_shoal(
        *embed_args(tmp_path / "in", out, catalog, profile=tmp_path / "kill-jsonl.yaml", model="slow-sim")
    )
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["work"]["run"] == 0 and manifest["work"]["reused"] == manifest["work"]["items"] == 16
    assert sorted(read_output(out).column("id").to_pylist()) == sorted(ids)


def test_bad_line_and_missing_field_exit_1_named_and_no_other_row_lost(cluster, tiny_catalog, test_profile, tmp_path):
    _, client = cluster
    on_cluster = {"scheduler": client.scheduler.address, "profile": test_profile}
    texts = [f"sentence number {i} about input formats" for i in range(500)]
    ids = write_jsonl(tmp_path / "in", texts, shards=2)
    shard = tmp_path / "in" / "shard-001.jsonl"
    lines = shard.read_text().splitlines()
    lines[10] = '{"id": "doc-260", "text": "broken'
    lines[20] = '{"id": "doc-270", "body": "no text field"}'
    shard.write_text("\n".join(lines) + "\n")
    result = invoke_shoal(*embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, **on_cluster))
    assert result.returncode == 1
    assert f"{shard.as_uri()} line 11: not valid JSON Lines" in result.stderr
    assert f"{shard.as_uri()} line 21, column 'text': no such field" in result.stderr
    table = read_output(tmp_path / "out")
    written = table.filter(table.column("embedding").is_valid()).column("id").to_pylist()
    assert sorted(written) == sorted(set(ids) - {"doc-260", "doc-270"})
    assert table.num_rows == len(ids)  # the two rejected rows are there too, all null, as the manifest counts them
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rejected_rows"] == 2

    write_csv(tmp_path / "csv", texts[:300], shards=2)
    (tmp_path / "csv" / "shard-001.csv").write_text("id,body\n" + "".join(f"x-{i},b\n" for i in range(150)))
    result = invoke_shoal(*embed_args(tmp_path / "csv", tmp_path / "csv-out", tiny_catalog, **on_cluster))
    assert result.returncode == 1
    assert f"{(tmp_path / 'csv' / 'shard-001.csv').as_uri()} line 1: no column 'text'" in result.stderr
    assert sorted(read_output(tmp_path / "csv-out").column("id").to_pylist()) == sorted(ids[:150])


def test_a_changed_line_is_redone_by_resume_and_by_reindex(cluster, tiny_catalog, demo_texts, tmp_path):
    import yaml

    from tests.support.cli import reindex_job

    _, client = cluster
    profile = write_profile(tmp_path, name="formats-resume", rows_per_item=100)
    write_jsonl(tmp_path / "in", demo_texts[:400], shards=2)
    on_cluster = {"scheduler": client.scheduler.address, "profile": profile}
    job = tmp_path / "docs.yaml"
    job.write_text(
        yaml.safe_dump(
            reindex_job(tmp_path / "in", tmp_path / "indexed", tiny_catalog, client.scheduler.address)
            | {"profile": str(profile), "input_format": "jsonl"}
        )
    )
    assert invoke_shoal(*embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, **on_cluster)).returncode == 0
    assert invoke_shoal("reindex", str(job)).returncode == 0
    before = vectors_by_id(read_output(tmp_path / "out"))

    shard = tmp_path / "in" / "shard-001.jsonl"
    lines = shard.read_text().splitlines()
    lines[50] = json.dumps({"id": "doc-250", "text": "an entirely different sentence"})
    shard.write_text("\n".join(lines) + "\n")

    result = invoke_shoal(*embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, **on_cluster))
    assert result.returncode == 0, result.stderr
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["work"] == {"items": 4, "reused": 2, "run": 2, "removed": 0}  # shard-001's items only
    after = vectors_by_id(read_output(tmp_path / "out"))
    assert not np.allclose(after["doc-250"], before["doc-250"])
    assert all(np.allclose(after[i], before[i], atol=1e-6) for i in before if i != "doc-250")

    result = invoke_shoal("reindex", str(job))
    assert result.returncode == 0, result.stderr
    assert "1 unchanged, 0 new, 1 changed, 0 removed" in result.stderr
    current = (tmp_path / "indexed" / "_CURRENT").read_text().strip()
    indexed = vectors_by_id(read_output(tmp_path / "indexed" / current))
    np.testing.assert_allclose(indexed["doc-250"], after["doc-250"], atol=1e-6)


def test_rerank_reads_csv_pairs_and_jsonl_candidates_as_it_reads_parquet(cluster, tiny_catalog, demo_texts, tmp_path):
    from tests.support.cli import shoal_options

    _, client = cluster
    options = shoal_options(tiny_catalog, client.scheduler.address)
    queries, passages = [t[:60] for t in demo_texts[:120]], demo_texts[120:240]
    pairs = [{"id": f"p{i}", "query": q, "passage": p} for i, (q, p) in enumerate(zip(queries, passages))]
    candidates = [{"id": f"q{i}", "query": queries[i], "docs": passages[i : i + 5]} for i in range(0, 120, 5)]
    for name, rows in (("pairs", pairs), ("candidates", candidates)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / name / f"{name}.parquet")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, ["id", "query", "passage"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(pairs)
    (tmp_path / "pairs.csv").write_text(buffer.getvalue())
    (tmp_path / "candidates.jsonl").write_text("".join(json.dumps(c) + "\n" for c in candidates))

    def rerank(source, *extra) -> list[dict]:
        output = tmp_path / f"out-{source.name}"
        result = invoke_shoal("rerank", str(source), str(output), "--model", "tiny-reranker", *options, *extra)
        assert result.returncode == 0, result.stderr
        return read_output(output).sort_by("id").to_pylist()

    for expected, ours in (
        (rerank(tmp_path / "pairs"), rerank(tmp_path / "pairs.csv")),
        (
            rerank(tmp_path / "candidates", "--candidates-column", "docs"),
            rerank(tmp_path / "candidates.jsonl", "--candidates-column", "docs"),
        ),
    ):
        assert [row["id"] for row in ours] == [row["id"] for row in expected] and len(ours) in (120, 24)
        for mine, theirs in zip(ours, expected):
            if "score" in mine:
                assert mine["score"] == pytest.approx(theirs["score"], abs=1e-5)
            else:
                assert [e["index"] for e in mine["ranking"]] == [e["index"] for e in theirs["ranking"]]
                assert [e["score"] for e in mine["ranking"]] == pytest.approx(
                    [e["score"] for e in theirs["ranking"]], abs=1e-5
                )
