"""`shoal run`: the job spec, and embed -> top-k -> rerank end to end on a two-process cluster."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from shoal.configs import ConfigError
from shoal.pipeline.retrieval.spec import load_job_spec
from shoal.pipeline.retrieval.top_k import top_k
from tests.support.cli import invoke_shoal

TOLERANCE = 1e-4


def write_job(path, **fields) -> str:
    job = {
        "output": "out",
        "corpus": {"input": "corpus.parquet"},
        "queries": {"input": "queries.parquet", "text_column": "question", "id_column": "qid"},
        "embed": {"model": "tiny"},
        "retrieve": {"top_k": 10},
        "rerank": {"model": "tiny-reranker", "top_k": 5},
        **fields,
    }
    path.write_text(yaml.safe_dump(job))
    return str(path)


def test_job_spec_paths_and_validation(tmp_path):
    spec = load_job_spec(write_job(tmp_path / "job.yaml"))
    assert spec.name == "job" and spec.corpus.input == str(tmp_path / "corpus.parquet")
    assert (
        spec.output == str(tmp_path / "out") and spec.queries.id_column == "qid" and spec.rerank.max_candidates == 1000
    )
    s3 = load_job_spec(write_job(tmp_path / "s3.yaml", output="s3://bucket/run"))
    assert s3.output == "s3://bucket/run"
    with pytest.raises(
        ConfigError, match=r"bad\.yaml: job: Value error, rerank\.top_k \(50\) is more than retrieve\.top_k \(10\)"
    ):
        load_job_spec(write_job(tmp_path / "bad.yaml", rerank={"model": "tiny-reranker", "top_k": 50}))
    with pytest.raises(ConfigError, match=r"typo\.yaml: retrieve\.topk: Extra inputs are not permitted"):
        load_job_spec(write_job(tmp_path / "typo.yaml", retrieve={"topk": 3}))
    with pytest.raises(ConfigError, match=r"noembed\.yaml: embed: Field required"):
        load_job_spec(_without(tmp_path / "noembed.yaml", "embed"))


def _without(path, key: str) -> str:
    write_job(path)
    job = yaml.safe_load(path.read_text())
    del job[key]
    path.write_text(yaml.safe_dump(job))
    return str(path)


def test_top_k_is_exact_and_breaks_ties_by_position():
    rng = np.random.default_rng(1)
    corpus, queries = rng.normal(size=(50, 8)), rng.normal(size=(7, 8))
    corpus[10] = corpus[3] * 2  # same direction: a tie, the earlier row first
    queries[0] = corpus[3]
    indices, scores = top_k(queries, corpus, 5)
    cosine = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (
        corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    ).T
    assert list(indices[0][:2]) == [3, 10]
    for row in range(7):
        assert list(indices[row]) == list(np.argsort(-cosine[row], kind="stable")[:5])
        assert np.allclose(scores[row], cosine[row][indices[row]], atol=1e-6)
    assert top_k(queries, corpus[:3], 5)[0].shape == (7, 3)


def test_run_embeds_retrieves_and_reranks(cluster, tiny_model, tiny_reranker, tiny_catalog, demo_texts, tmp_path):
    from sentence_transformers import CrossEncoder, SentenceTransformer

    _, client = cluster
    passages = demo_texts[:300]
    questions = [demo_texts[1000 + i][:80] for i in range(20)] + [None]
    pq.write_table(
        pa.table({"id": [f"d{i}" for i in range(300)], "text": passages}),
        tmp_path / "corpus.parquet",
        row_group_size=100,
    )
    pq.write_table(
        pa.table({"qid": list(range(21)), "question": pa.array(questions, pa.string())}), tmp_path / "queries.parquet"
    )
    result = invoke_shoal(
        "run", write_job(tmp_path / "job.yaml"), "--catalog", str(tiny_catalog), "--scheduler", client.scheduler.address
    )
    assert result.returncode == 0, result.stderr
    assert "1 queries have a null text" in result.stderr
    ranked = pq.read_table(tmp_path / "out" / "ranked.parquet")
    assert ranked.column_names == ["query_id", "rank", "doc_id", "retrieval_rank", "retrieval_score", "rerank_score"]
    assert ranked.num_rows == 20 * 10

    embedder = SentenceTransformer(str(tiny_model), device="cpu")
    direct_nearest, direct_cosine = top_k(embedder.encode(questions[:20]), embedder.encode(passages), 10)
    reranker = CrossEncoder(str(tiny_reranker), device="cpu", local_files_only=True)
    rows = ranked.to_pylist()
    for qid in range(20):
        mine = sorted((r for r in rows if r["query_id"] == qid), key=lambda r: r["rank"])
        assert [r["rank"] for r in mine] == list(range(1, 11))
        by_retrieval = sorted(mine, key=lambda r: r["retrieval_rank"])
        assert np.abs(np.array([r["retrieval_score"] for r in by_retrieval]) - direct_cosine[qid]).max() <= TOLERANCE
        if np.diff(direct_cosine[qid]).max(initial=-1) < -2 * TOLERANCE:  # no near-ties: same documents, same order
            assert [r["doc_id"] for r in by_retrieval] == [f"d{i}" for i in direct_nearest[qid]]
        head, tail = mine[:5], mine[5:]
        assert sorted(r["retrieval_rank"] for r in head) == [1, 2, 3, 4, 5]
        direct = reranker.predict([(questions[qid], passages[int(r["doc_id"][1:])]) for r in head])
        assert np.abs(np.array([r["rerank_score"] for r in head]) - direct).max() <= TOLERANCE
        assert np.all(np.diff([r["rerank_score"] for r in head]) <= 0)
        assert [r["retrieval_rank"] for r in tail] == [6, 7, 8, 9, 10] and all(r["rerank_score"] is None for r in tail)

    record = json.loads((tmp_path / "out" / "_run.json").read_text())
    assert set(record["stages"]) == {"corpus-embeddings", "query-embeddings", "retrieve", "reranked"}
    assert record["stages"]["retrieve"]["skipped_queries"] == 1 and not record["failed"]
    assert json.loads((tmp_path / "out" / "reranked" / "_manifest.json").read_text())["rows"] == 20


def test_run_refuses_a_bad_spec_before_starting(tiny_catalog, tmp_path):
    result = invoke_shoal(
        "run", write_job(tmp_path / "job.yaml", embed={"model": "tiny-reranker"}), "--catalog", str(tiny_catalog)
    )
    assert result.returncode == 2 and "kind 'reranker'" in result.stderr
