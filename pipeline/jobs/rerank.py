"""A batch rerank job: (query, passage) rows, or a query with its candidates.

The request is turned into a `BatchJob` of the `rerank` operation (see
workers/operations/rerank_operation.py for the output schema) and run through the same
submit/follow/manifest path as embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from distributed import Client
from rich.console import Console

from ...configs import Catalog, ConfigError, Profile
from ...configs.kinds import for_command
from ...scheduler_plugins.protocol import RerankPayload, StorageOptions
from .engine import BatchJob, JobOutcome, model_for, model_output, run_job, run_jobs

DEFAULT_MAX_CANDIDATES = 1000


@dataclass
class RerankRequest:
    input: str
    output: str
    model: str
    query_column: str = "query"
    passage_column: str | None = None  # pairs mode; "passage" when no candidates column is given
    candidates_column: str | None = None  # candidates mode
    candidate_ids_column: str | None = None
    id_column: str | None = "id"
    keep_columns: list[str] = field(default_factory=list)
    max_candidates: int = DEFAULT_MAX_CANDIDATES
    storage_options: StorageOptions = field(default_factory=dict)
    input_format: str | None = None  # parquet, jsonl or csv; None: by each file's name (workers/data/input_formats.py)

    def __post_init__(self) -> None:
        if self.passage_column and self.candidates_column:
            raise ConfigError("give either a passage column (pairs) or a candidates column, not both")
        if self.candidate_ids_column and not self.candidates_column:
            raise ConfigError("a candidate ids column needs a candidates column")
        if self.max_candidates < 1:
            raise ConfigError(f"max candidates must be at least 1, got {self.max_candidates}")
        if not self.candidates_column:
            self.passage_column = self.passage_column or "passage"

    @property
    def mode(self) -> Literal["pairs", "candidates"]:
        return "candidates" if self.candidates_column else "pairs"

    @property
    def item_column(self) -> str:
        """What is scored against the query: the candidates column, else the passage column."""
        return self.candidates_column or self.passage_column or "passage"


def rerank_job(request: RerankRequest) -> BatchJob:
    item_columns = [request.item_column]
    if request.candidate_ids_column:
        item_columns.append(request.candidate_ids_column)
    payload: RerankPayload = {
        "mode": request.mode,
        "query_column": request.query_column,
        "passage_column": request.passage_column,
        "candidates_column": request.candidates_column,
        "candidate_ids_column": request.candidate_ids_column,
        "id_column": request.id_column,
        "keep_columns": request.keep_columns,
        "max_candidates": request.max_candidates,
        **({"input_format": request.input_format} if request.input_format else {}),
    }
    return BatchJob(
        operation="rerank",
        input=request.input,
        output=request.output,
        model=request.model,
        payload=payload,
        required_columns=[
            request.query_column,
            *item_columns,
            *filter(None, [request.id_column]),
            *request.keep_columns,
        ],
        manifest_columns={
            "mode": request.mode,
            "query": request.query_column,
            "passage": request.passage_column,
            "candidates": request.candidates_column,
            "candidate_ids": request.candidate_ids_column,
            "id": request.id_column,
            "keep": request.keep_columns,
            "max_candidates": request.max_candidates,
        },
        storage_options=request.storage_options,
    )


def run_rerank(
    client: Client, request: RerankRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, for_command("rerank"))
    return run_job(client, rerank_job(request), spec, profile, console)


def run_rerank_models(
    client: Client, request: RerankRequest, models: list[str], profile: Profile, catalog: Catalog, console: Console
) -> list[JobOutcome]:
    """Several rerankers over one input, OUTPUT/<model>/ each (engine.run_jobs): a base's LoRA adapters share
    its forward passes."""
    specs = [model_for(catalog, profile, name, for_command("rerank")) for name in models]  # before any work
    jobs = [
        (rerank_job(replace(request, model=spec.name, output=model_output(request.output, name))), spec)
        for name, spec in zip(models, specs)
    ]
    return run_jobs(client, jobs, profile, console)
