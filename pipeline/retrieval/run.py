"""`shoal run`: a job spec's stages, one after another, on one cluster.

1. embed the corpus and 2. embed the queries: batch embed jobs (the cluster),
   each with the model's prompt for its role (TextSource);
3. exact top-k by cosine over the vectors read back (this process, numpy);
4. rerank each query's top candidates: a batch rerank job (the cluster);
5. write the ranked results, one row per (query, document), and `_run.json`.

Everything goes under the spec's `output`:

    corpus-embeddings/  query-embeddings/   embed outputs with their manifests
    rerank-input/candidates.parquet          one row per query: its candidates
    reranked/                                rerank output with its manifest
    ranked.parquet                           the final ranking (see README)
    _run.json                                stages, counts, timings
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from distributed import Client
from rich.console import Console

from ...configs import Catalog, Profile
from ...configs.kinds import for_operation
from ...configs.prompts import ModelPrompts, Role, model_prompts
from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.storage import atomic_write, open_fs
from ..jobs.embed import EmbedRequest, run_embed
from ..jobs.engine import JobOutcome, model_for
from ..jobs.planner import PlanError
from ..jobs.rerank import RerankRequest, run_rerank
from .spec import JobSpec, RerankStage, TextSource
from .top_k import read_texts, read_vectors, top_k, top_k_documents

PAIRS_PER_ITEM = 2048  # rerank work items are sized by pairs, not rows
RANKED_NAME = "ranked.parquet"
RUN_NAME = "_run.json"


class JobStageRecord(TypedDict):
    """An embed or rerank stage: its manifest and what it says."""

    manifest: str
    rows: int
    complete: bool
    rejected_rows: int
    seconds: float


class RetrieveRecord(TypedDict):
    queries: int
    corpus: int
    corpus_rows: int
    top_k: int
    skipped_queries: int
    skipped_corpus_rows: int
    seconds: float


class RankedRecord(TypedDict):
    url: str | None
    rows: int


class RunRecord(TypedDict, total=False):
    """``_run.json``: what a `shoal run` did, stage by stage."""

    name: str
    spec: dict[str, object]  # the job file's fields, storage options left out
    stages: dict[str, JobStageRecord | RetrieveRecord]
    failed: list[str]  # the stages that did not complete
    rejected_rows: int
    prompts: dict[str, str]  # the prompt text each embed stage used
    ranked: RankedRecord


@dataclass
class RunOutcome:
    ranked_url: str | None
    record: RunRecord
    stages: dict[str, JobOutcome] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.record["failed"] or self.record["rejected_rows"] else 0


def run_pipeline(client: Client, spec: JobSpec, profile: Profile, catalog: Catalog, console: Console) -> RunOutcome:
    output = spec.output.rstrip("/")
    record: RunRecord = {
        "name": spec.name,
        "spec": spec.model_dump(exclude={"storage_options"}),  # no credentials in the record
        "stages": {},
        "failed": [],
        "rejected_rows": 0,
    }
    outcome = RunOutcome(None, record)
    prompts = model_prompts(model_for(catalog, profile, spec.embed.model, for_operation("embed")))
    requests = embed_requests(spec, prompts)
    record["prompts"] = {stage: prompts.text(prompt=request.prompt) for stage, request in requests.items()}
    for stage, request in requests.items():
        _stage(outcome, stage, lambda r=request: run_embed(client, r, profile, catalog, console))
    if record["failed"]:
        console.print(f"[red]stopping:[/red] {', '.join(record['failed'])} failed; retrieval needs every vector")
        return _finish(outcome, spec)

    started = time.perf_counter()
    corpus = read_vectors(f"{output}/corpus-embeddings", spec.corpus.id_column, spec.storage_options)
    queries = read_vectors(f"{output}/query-embeddings", spec.queries.id_column, spec.storage_options)
    if not len(corpus.ids):
        raise PlanError(f"{spec.corpus.input}: no corpus row has a text to retrieve")
    if spec.embed.chunk:  # rows are windows: rank documents by their best window
        documents, nearest, cosine = top_k_documents(queries.matrix, corpus, spec.retrieve.top_k)
    else:
        documents = corpus.ids
        nearest, cosine = top_k(queries.matrix, corpus.matrix, spec.retrieve.top_k)
    record["stages"]["retrieve"] = {
        "queries": len(queries.ids),
        "corpus": len(documents),
        "corpus_rows": len(corpus.ids),
        "top_k": int(nearest.shape[1]),
        "skipped_queries": queries.nulls,
        "skipped_corpus_rows": corpus.nulls,
        "seconds": round(time.perf_counter() - started, 3),
    }
    for label, vectors in (("queries", queries), ("corpus rows", corpus)):
        if vectors.nulls:
            console.print(
                f"[yellow]warning:[/yellow] {vectors.nulls} {label} have a null text and take no part in retrieval"
            )

    reranked: dict[Any, list[dict]] = {}
    if (rerank := spec.rerank) is not None:
        rerank_input = _write_candidates(spec, rerank, queries.ids, [[documents[i] for i in row] for row in nearest])
        _stage(
            outcome,
            "reranked",
            lambda: run_rerank(
                client,
                _rerank_request(spec, rerank, rerank_input),
                _sized_by_pairs(profile, rerank.top_k),
                catalog,
                console,
            ),
        )
        if "reranked" not in record["failed"]:
            reranked = _read_rankings(f"{output}/reranked", spec.storage_options)

    ranked = _ranked_table(queries.ids, [[documents[i] for i in row] for row in nearest], cosine, reranked)
    outcome.ranked_url = f"{output}/{RANKED_NAME}"
    buffer = io.BytesIO()
    pq.write_table(ranked, buffer, compression="zstd")
    atomic_write(outcome.ranked_url, buffer.getvalue(), spec.storage_options)
    record["ranked"] = {"url": outcome.ranked_url, "rows": ranked.num_rows}
    console.print(f"ranked results: {outcome.ranked_url} ({ranked.num_rows:,} rows, {len(queries.ids):,} queries)")
    return _finish(outcome, spec)


def _stage(outcome: RunOutcome, name: str, run) -> None:
    started = time.perf_counter()
    result: JobOutcome = run()
    outcome.stages[name] = result
    outcome.record["stages"][name] = {
        "manifest": result.manifest_url,
        "rows": result.manifest["rows"],
        "complete": result.manifest["complete"],
        "rejected_rows": result.manifest["rejected_rows"],
        "seconds": round(time.perf_counter() - started, 3),
    }
    outcome.record["rejected_rows"] += result.manifest["rejected_rows"]
    if not result.manifest["complete"]:
        outcome.record["failed"].append(name)


def _finish(outcome: RunOutcome, spec: JobSpec) -> RunOutcome:
    atomic_write(
        f"{spec.output.rstrip('/')}/{RUN_NAME}",
        json.dumps(outcome.record, indent=1, default=str).encode(),
        spec.storage_options,
    )
    return outcome


def embed_requests(spec: JobSpec, prompts: ModelPrompts) -> dict[str, EmbedRequest]:
    """The corpus and query embed jobs by stage, each with its prompt's text (PromptError: an unknown name)."""
    requests = {}
    stages: tuple[tuple[str, TextSource, Role], ...] = (
        ("corpus-embeddings", spec.corpus, "document"),
        ("query-embeddings", spec.queries, "query"),
    )
    for stage, source, role in stages:
        request = _embed_request(spec, source, stage, prompts, role)
        if request.prompt_name is not None:  # else the model's default, as a job without a prompt has it
            request = replace(request, prompt=prompts.text(request.prompt_name, request.prompt), prompt_name=None)
        requests[stage] = request
    return requests


def _embed_request(spec: JobSpec, source: TextSource, stage: str, prompts: ModelPrompts, role: Role) -> EmbedRequest:
    """The stage's embed job; its prompt is the source's override, else the model's for `role` if it has one."""
    overridden = source.prompt_name is not None or source.prompt is not None
    return EmbedRequest(
        input=source.input,
        output=f"{spec.output.rstrip('/')}/{stage}",
        model=spec.embed.model,
        text_column=source.text_column,
        id_column=source.id_column,
        storage_options=spec.storage_options,
        chunk=spec.embed.chunk if source is spec.corpus else None,  # queries are short: one vector each
        prompt_name=source.prompt_name if overridden else prompts.for_role(role),
        prompt=source.prompt,
    )


def _write_candidates(spec: JobSpec, rerank: RerankStage, query_ids: list, candidate_ids: list[list]) -> str:
    """One row per query: its text and its first `rerank.top_k` candidates' ids and texts."""
    queries = read_texts(spec.queries.input, spec.queries.id_column, spec.queries.text_column, spec.storage_options)
    passages = read_texts(spec.corpus.input, spec.corpus.id_column, spec.corpus.text_column, spec.storage_options)
    keep = rerank.top_k
    table = pa.table(
        {
            "query_id": query_ids,
            "query": [queries[q] for q in query_ids],
            "candidate_ids": [ids[:keep] for ids in candidate_ids],
            "candidates": [[passages[c] for c in ids[:keep]] for ids in candidate_ids],
        }
    )
    url = f"{spec.output.rstrip('/')}/rerank-input/candidates.parquet"
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", row_group_size=max(1, PAIRS_PER_ITEM // keep))
    atomic_write(url, buffer.getvalue(), spec.storage_options)
    return url


def _rerank_request(spec: JobSpec, rerank: RerankStage, candidates_url: str) -> RerankRequest:
    return RerankRequest(
        input=candidates_url,
        output=f"{spec.output.rstrip('/')}/reranked",
        model=rerank.model,
        query_column="query",
        candidates_column="candidates",
        candidate_ids_column="candidate_ids",
        id_column="query_id",
        max_candidates=rerank.max_candidates,
        storage_options=spec.storage_options,
    )


def _sized_by_pairs(profile: Profile, candidates_per_query: int) -> Profile:
    """The profile with work items of about PAIRS_PER_ITEM pairs each."""
    rows = max(1, min(profile.rows_per_item, PAIRS_PER_ITEM // candidates_per_query))
    return profile.model_copy(update={"rows_per_item": rows})


def _read_rankings(output_url: str, storage_options: StorageOptions) -> dict[Any, list[dict]]:
    """query id -> its reranked candidates (rank, index, id, score), for rows that were scored."""
    fs, root = open_fs(output_url, storage_options)
    manifest = json.loads(fs.cat_file(f"{root}/_manifest.json"))
    rankings: dict[Any, list[dict]] = {}
    for part in manifest["parts"]:
        with fs.open(f"{root}/{part['name']}", "rb") as f:
            table = pq.read_table(f, columns=["query_id", "ranking"])
        for query_id, ranking in zip(table.column("query_id").to_pylist(), table.column("ranking").to_pylist()):
            if ranking is not None:
                rankings[query_id] = ranking
    return rankings


def _ranked_table(
    query_ids: list, candidate_ids: list[list], cosine: np.ndarray, reranked: dict[Any, list[dict]]
) -> pa.Table:
    """Long format: each query's reranked candidates first (by rerank score), then the rest by cosine."""
    columns: dict[str, list] = {
        k: [] for k in ("query_id", "rank", "doc_id", "retrieval_rank", "retrieval_score", "rerank_score")
    }
    for row, query_id in enumerate(query_ids):
        order = [(r["index"], r["score"]) for r in reranked.get(query_id, [])]
        seen = {index for index, _ in order}
        order += [(index, None) for index in range(len(candidate_ids[row])) if index not in seen]
        for rank, (index, score) in enumerate(order, start=1):
            columns["query_id"].append(query_id)
            columns["rank"].append(rank)
            columns["doc_id"].append(candidate_ids[row][index])
            columns["retrieval_rank"].append(index + 1)
            columns["retrieval_score"].append(float(cosine[row, index]))
            columns["rerank_score"].append(score)
    types = {
        "rank": pa.int32(),
        "retrieval_rank": pa.int32(),
        "retrieval_score": pa.float32(),
        "rerank_score": pa.float32(),
    }
    return pa.table({name: pa.array(values, type=types.get(name)) for name, values in columns.items()})
