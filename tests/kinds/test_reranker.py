"""Batch reranking: the cross-encoder runtime and `shoal rerank` on a two-process cluster."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shoal.configs import ModelSpec
from shoal.workers.devices import DevicePlan
from tests.support.cli import invoke_shoal, shoal_options
from tests.support.files import read_output

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def direct(tiny_reranker):
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_reranker), device="cpu", local_files_only=True)
    return lambda pairs: model.predict(pairs, batch_size=32, show_progress_bar=False)


def tiny_spec(path, budget: int) -> ModelSpec:
    return ModelSpec(
        name="tiny-reranker",
        kind="reranker",
        source=str(path),
        dim=1,
        max_seq_length=128,
        token_budget={"cpu": budget},
        max_batch_size=16,
    )


def assert_same_order(ranked: list, scores: np.ndarray) -> None:
    """`ranked` (indices, best first) is the direct order, except among scores closer than the tolerance."""
    ranked_scores = scores[ranked]
    assert (np.diff(ranked_scores) <= TOLERANCE).all()
    expected = np.argsort(-scores, kind="stable")
    separated = np.abs(np.diff(np.sort(scores))).min(initial=1.0) > 2 * TOLERANCE
    if separated:
        assert list(ranked) == list(expected)


def test_scorer_batches_by_tokens_and_equals_direct(tiny_reranker, direct, demo_texts):
    from shoal.workers.runtimes.cross_encoder import CrossEncoderScorer

    scorer = CrossEncoderScorer(tiny_spec(tiny_reranker, budget=600), DevicePlan("cpu", "cpu", "float32", 10**9))
    queries = [demo_texts[i][:80] for i in range(0, 300, 3)]
    passages = [demo_texts[i + 1] + (" more" * 200 if i % 50 == 0 else "") for i in range(0, 300, 3)]
    scores, truncated = scorer.score(queries, passages)
    assert scores.dtype == np.float32 and scores.shape == (100,)
    assert np.abs(scores - direct(list(zip(queries, passages)))).max() <= TOLERANCE
    assert truncated >= 2  # the padded-out passages
    assert scorer.score([], [])[0].shape == (0,)


def rerank_on(cluster, catalog, source, output, *options: str) -> subprocess.CompletedProcess:
    """`shoal rerank` of `source` into `output` with tiny-reranker of `catalog` on the shared cluster."""
    _, client = cluster
    options = (*options, *shoal_options(catalog, client.scheduler.address))
    return invoke_shoal("rerank", str(source), str(output), "--model", "tiny-reranker", *options)


def test_pairs_job_scores_equal_direct(cluster, tiny_catalog, direct, demo_texts, tmp_path):
    n = 600
    queries = [demo_texts[i][:60] for i in range(n)]
    passages = [demo_texts[n + i] for i in range(n)]
    (tmp_path / "in").mkdir()
    for s in range(2):
        lo, hi = s * n // 2, (s + 1) * n // 2
        table = pa.table(
            {
                "pid": [f"p{i}" for i in range(lo, hi)],
                "query": queries[lo:hi],
                "passage": passages[lo:hi],
                "tag": list(range(lo, hi)),
            }
        )
        pq.write_table(table, tmp_path / "in" / f"pairs-{s}.parquet", row_group_size=100)
    result = rerank_on(
        cluster, tiny_catalog, tmp_path / "in", tmp_path / "out", "--id-column", "pid", "--keep-columns", "tag"
    )
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    assert table.column_names == ["pid", "score", "tag"]
    assert table.schema.field("score").type == pa.float32()
    assert sorted(table.column("pid").to_pylist()) == sorted(f"p{i}" for i in range(n))
    order = np.argsort(table.column("tag").to_numpy())
    ours = table.column("score").to_numpy()[order]
    assert np.abs(ours - direct(list(zip(queries, passages)))).max() <= TOLERANCE
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["operation"] == "rerank" and manifest["complete"] and manifest["rows"] == n
    assert manifest["rejected_rows"] == 0 and manifest["columns"]["mode"] == "pairs"


def test_candidates_job_ranks_like_direct(cluster, tiny_catalog, direct, demo_texts, tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for q in range(120):
        count = int(rng.integers(1, 15))
        picks = rng.choice(2000, size=count, replace=False)
        rows.append(
            {
                "qid": f"q{q}",
                "query": demo_texts[3000 + q][:70],
                "cands": [demo_texts[int(i)] for i in picks],
                "cand_ids": [int(i) for i in picks],
            }
        )
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "cands.parquet", row_group_size=40)
    result = rerank_on(
        cluster,
        tiny_catalog,
        tmp_path / "cands.parquet",
        tmp_path / "out",
        "--query-column",
        "query",
        "--candidates-column",
        "cands",
        "--candidate-ids-column",
        "cand_ids",
        "--id-column",
        "qid",
    )
    assert result.returncode == 0, result.stderr
    table = read_output(tmp_path / "out")
    assert table.schema.field("ranking").type == pa.list_(
        pa.struct([("rank", pa.int32()), ("index", pa.int32()), ("id", pa.int64()), ("score", pa.float32())])
    )
    got = dict(zip(table.column("qid").to_pylist(), table.column("ranking").to_pylist()))
    assert len(got) == table.num_rows == len(rows)
    for row in rows:
        ranking = got[row["qid"]]
        scores = direct([(row["query"], c) for c in row["cands"]])
        assert [r["rank"] for r in ranking] == list(range(1, len(row["cands"]) + 1))
        assert [r["id"] for r in ranking] == [row["cand_ids"][r["index"]] for r in ranking]
        assert (
            np.abs(np.array([r["score"] for r in ranking]) - scores[[r["index"] for r in ranking]]).max() <= TOLERANCE
        )
        assert_same_order([r["index"] for r in ranking], scores)


def test_bad_rows_are_rejected_and_named_the_rest_kept(cluster, tiny_catalog, demo_texts, tmp_path):
    good = [demo_texts[i] for i in range(3)]
    rows = [
        ("ok-1", "a query", good, [1, 2, 3]),
        ("no-cands", "a query", None, None),
        ("empty", "a query", [], []),
        ("too-many", "a query", good * 2, [1, 2, 3, 4, 5, 6]),
        ("null-query", None, good, [1, 2, 3]),
        ("null-cand", "a query", [good[0], None], [1, 2]),
        ("bad-ids", "a query", good, [1]),
        ("ok-2", "another query", good[:2], [7, 8]),
    ]
    table = pa.table(
        {
            "qid": [r[0] for r in rows],
            "q": [r[1] for r in rows],
            "cands": pa.array([r[2] for r in rows], pa.list_(pa.string())),
            "ids": pa.array([r[3] for r in rows], pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "bad.parquet", row_group_size=3)
    result = rerank_on(
        cluster,
        tiny_catalog,
        tmp_path / "bad.parquet",
        tmp_path / "out",
        "--query-column",
        "q",
        "--candidates-column",
        "cands",
        "--candidate-ids-column",
        "ids",
        "--id-column",
        "qid",
        "--max-candidates",
        "5",
    )
    assert result.returncode == 1, result.stderr
    out = read_output(tmp_path / "out")
    ranking = dict(zip(out.column("qid").to_pylist(), out.column("ranking").to_pylist()))
    assert len(ranking) == len(rows) == out.num_rows
    assert [r["id"] for r in ranking["ok-1"]] and sorted(r["id"] for r in ranking["ok-2"]) == [7, 8]
    assert all(ranking[q] is None for q in ("no-cands", "empty", "too-many", "null-query", "null-cand", "bad-ids"))
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert manifest["complete"] and manifest["rejected_rows"] == 6
    messages = "\n".join(manifest["rejected"])
    for expected in (
        "row 1, column 'cands': the query has no candidates",
        "row 2, column 'cands': the query has no candidates",
        "row 3, column 'cands': 6 candidates, over the limit of 5",
        "row 4, column 'q': the query is null",
        "row 5, column 'cands': candidate 1 is null",
        "row 6, column 'ids': 1 ids for 3 candidates",
    ):
        assert expected in messages
    assert "bad.parquet row 1, column 'cands'" in result.stderr and "rejected row" in result.stderr


def test_null_pairs_and_a_shard_missing_a_column(cluster, tiny_catalog, tmp_path):
    (tmp_path / "in").mkdir()
    pq.write_table(
        pa.table({"id": [1, 2, 3], "query": ["q", None, "q"], "passage": ["p one", "p two", None]}),
        tmp_path / "in" / "a.parquet",
    )
    pq.write_table(
        pa.table({"id": [4], "query": ["q"], "text": ["no passage column here"]}), tmp_path / "in" / "b.parquet"
    )
    result = rerank_on(cluster, tiny_catalog, tmp_path / "in", tmp_path / "out")
    assert result.returncode == 1
    out = read_output(tmp_path / "out")
    assert out.column("id").to_pylist() == [1, 2, 3]
    scores = out.column("score").to_pylist()
    assert scores[0] is not None and scores[1] is None and scores[2] is None
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    assert not manifest["complete"] and manifest["rejected_rows"] == 2
    assert (
        "no column 'passage'" in manifest["failed"][0]["errors"][-1] and "b.parquet" in manifest["failed"][0]["input"]
    )
    assert "a.parquet row 2, column 'passage': the passage is null" in "\n".join(manifest["rejected"])


def test_usage_errors_exit_2(cluster, tiny_catalog, tmp_path):
    pq.write_table(pa.table({"id": [1], "query": ["q"], "passage": ["p"]}), tmp_path / "x.parquet")
    missing = rerank_on(cluster, tiny_catalog, tmp_path / "x.parquet", tmp_path / "out", "--candidates-column", "cands")
    assert missing.returncode == 2 and "no column 'cands' (columns are: id, query, passage)" in missing.stderr
    wrong_kind = invoke_shoal(
        "rerank", str(tmp_path / "x.parquet"), str(tmp_path / "out"), "--model", "tiny", "--catalog", str(tiny_catalog)
    )
    assert wrong_kind.returncode == 2 and "kind 'embedder'" in wrong_kind.stderr
    both = invoke_shoal(
        "rerank",
        str(tmp_path / "x.parquet"),
        str(tmp_path / "out"),
        "--model",
        "tiny-reranker",
        "--passage-column",
        "passage",
        "--candidates-column",
        "cands",
        "--catalog",
        str(tiny_catalog),
    )
    assert both.returncode == 2 and "not both" in both.stderr
