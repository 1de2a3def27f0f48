"""`shoal eval`: retrieval quality on a BEIR-format set, with and without reranking.

The dataset's corpus and judged queries are written as Parquet under the
output directory and run through the same pipeline as `shoal run` (embed on
the cluster with the model's query and document prompts, exact top-k,
optional rerank). nDCG@k and recall@k follow
trec_eval (BEIR's metrics): linear gains, ideal ranking from the judgments,
averaged over the queries that have at least one relevant document.
"""

from __future__ import annotations

import io
import json
import math
from typing import TypedDict

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from distributed import Client
from rich.console import Console
from rich.table import Table

from ...configs import Catalog, Profile
from ...workers.data.storage import atomic_write, open_fs
from .beir import RetrievalSet
from .run import RunOutcome, run_pipeline
from .spec import EmbedStage, JobSpec, RerankStage, RetrieveStage, TextSource


class EvalReport(TypedDict, total=False):
    """``metrics.json`` of `shoal eval`, and what it prints."""

    dataset: str
    corpus: int  # passages
    queries: int  # judged queries
    judgments: int
    model: str
    reranker: str | None
    top_k: int
    rerank_k: int | None
    prompts: dict[str, str]  # queries, corpus: the prompt text each was embedded with
    metrics: dict[str, dict[str, float]]  # retrieval, reranked: nDCG@10, recall@100
    complete: bool
    metrics_url: str


METRICS_NAME = "metrics.json"


def ndcg_at_k(ranking: list[str], judged: dict[str, int], k: int) -> float:
    gains = [judged.get(doc, 0) for doc in ranking[:k]]
    dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains) if g > 0)
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg else 0.0


def recall_at_k(ranking: list[str], judged: dict[str, int], k: int) -> float:
    relevant = {doc for doc, grade in judged.items() if grade > 0}
    return len(relevant.intersection(ranking[:k])) / len(relevant) if relevant else 0.0


def evaluate(
    rankings: dict[str, list[str]], qrels: dict[str, dict[str, int]], ndcg_k: int = 10, recall_k: int = 100
) -> dict[str, float]:
    """Mean nDCG@ndcg_k and recall@recall_k; a judged query with no ranking scores 0."""
    judged = {q: j for q, j in qrels.items() if any(g > 0 for g in j.values())}
    if not judged:
        return {f"ndcg@{ndcg_k}": 0.0, f"recall@{recall_k}": 0.0}
    ndcg = sum(ndcg_at_k(rankings.get(q, []), j, ndcg_k) for q, j in judged.items()) / len(judged)
    recall = sum(recall_at_k(rankings.get(q, []), j, recall_k) for q, j in judged.items()) / len(judged)
    return {f"ndcg@{ndcg_k}": ndcg, f"recall@{recall_k}": recall}


def run_eval(
    client: Client,
    dataset: RetrievalSet,
    output: str,
    model: str,
    reranker: str | None,
    top_k: int,
    rerank_k: int,
    profile: Profile,
    catalog: Catalog,
    console: Console,
    query_prompt: dict[str, str] | None = None,
    document_prompt: dict[str, str] | None = None,
) -> tuple[EvalReport, RunOutcome]:
    """`query_prompt`, `document_prompt`: {"prompt_name": …} or {"prompt": …} in place of the model's own."""
    output = output.rstrip("/")
    judged = {q for q, j in dataset.qrels.items() if any(g > 0 for g in j.values())}
    queries = dataset.queries.filter(pa.array([q in judged for q in dataset.queries.column("id").to_pylist()]))
    _write_parquet(f"{output}/inputs/corpus.parquet", dataset.corpus)
    _write_parquet(f"{output}/inputs/queries.parquet", queries)
    spec = JobSpec(
        name=f"eval-{dataset.name}",
        output=output,
        corpus=TextSource(input=f"{output}/inputs/corpus.parquet", **(document_prompt or {})),
        queries=TextSource(input=f"{output}/inputs/queries.parquet", **(query_prompt or {})),
        embed=EmbedStage(model=model),
        retrieve=RetrieveStage(top_k=top_k),
        rerank=RerankStage(model=reranker, top_k=min(rerank_k, top_k)) if reranker else None,
    )
    outcome = run_pipeline(client, spec, profile, catalog, console)
    prompts = outcome.record["prompts"]
    report: EvalReport = {
        "dataset": dataset.name,
        "corpus": dataset.corpus.num_rows,
        "queries": queries.num_rows,
        "judgments": sum(len(j) for j in dataset.qrels.values()),
        "model": model,
        "reranker": reranker,
        "top_k": top_k,
        "rerank_k": spec.rerank.top_k if spec.rerank else None,
        "prompts": {"queries": prompts["query-embeddings"], "corpus": prompts["corpus-embeddings"]},
        "metrics": {},
        "complete": outcome.exit_code == 0,
    }
    if outcome.ranked_url:
        ranked = _read_parquet(outcome.ranked_url)
        report["metrics"]["retrieval"] = evaluate(_rankings(ranked, "retrieval_rank"), dataset.qrels)
        if reranker:
            report["metrics"]["reranked"] = evaluate(_rankings(ranked, "rank"), dataset.qrels)
    report["metrics_url"] = f"{output}/{METRICS_NAME}"
    atomic_write(report["metrics_url"], json.dumps(report, indent=1).encode())
    return report, outcome


def _rankings(ranked: pa.Table, rank_column: str) -> dict[str, list[str]]:
    """query id -> doc ids in `rank_column` order."""
    order = pc.sort_indices(ranked, [("query_id", "ascending"), (rank_column, "ascending")])
    rows = ranked.take(order)
    rankings: dict[str, list[str]] = {}
    for query, doc in zip(rows.column("query_id").to_pylist(), rows.column("doc_id").to_pylist()):
        rankings.setdefault(str(query), []).append(str(doc))
    return rankings


def print_report(report: EvalReport, console: Console) -> None:
    table = Table(title=f"shoal eval: {report['dataset']} ({report['queries']} queries, {report['corpus']:,} passages)")
    table.add_column("system")
    names = sorted(
        {name for metrics in report["metrics"].values() for name in metrics},
        key=lambda n: (n.split("@")[0] != "ndcg", n),
    )
    for name in names:
        table.add_column(name, justify="right")
    labels = {
        "retrieval": f"{report['model']} top-{report['top_k']}",
        "reranked": f"+ {report['reranker']} rerank top-{report['rerank_k']}",
    }
    for system, metrics in report["metrics"].items():
        table.add_row(labels[system], *(f"{metrics[n]:.4f}" for n in names))
    console.print(table)
    console.print(f"saved: {report['metrics_url']}")


def _write_parquet(url: str, table: pa.Table) -> None:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", row_group_size=256)
    atomic_write(url, buffer.getvalue())


def _read_parquet(url: str) -> pa.Table:
    fs, path = open_fs(url)
    with fs.open(path, "rb") as f:
        return pq.read_table(f)
