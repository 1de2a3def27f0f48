"""Batch classify and extract jobs: a text column in, labels or entities per row out.

A `ClassifyRequest` becomes a `BatchJob` of the `classify` operation (a
sequence classifier: workers/operations/classify_operation.py) or the
`extract` operation (a token classifier, or a GLiNER span extractor:
extract_operation.py); the engine
plans, submits, follows, resumes and writes the manifest as for `embed`.
Options are refused here, before any work, when the model cannot meet them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from distributed import Client
from rich.console import Console

from ...configs import Catalog, ConfigError, ModelSpec, Profile
from ...configs.kinds import JobOptions, for_command, kind_of
from ...configs.kinds.token_classifier import Aggregation
from ...scheduler_plugins.protocol import ClassifyPayload, StorageOptions
from ...workers.data.chunking import ChunkSettings
from .engine import (
    BatchJob,
    JobOutcome,
    model_for,
    model_output,
    run_job,
    run_jobs,
    text_rows_job,
    text_rows_payload,
)

Operation = Literal["classify", "extract"]  # the command, and the operation of the kinds it runs (configs/kinds)


@dataclass
class ClassifyRequest:
    operation: Operation
    input: str
    output: str
    model: str
    text_column: str = "text"
    id_column: str | None = "id"
    keep_columns: list[str] = field(default_factory=list)
    storage_options: StorageOptions = field(default_factory=dict)
    chunk: ChunkSettings | None = None  # classify: one row per window; extract: windows read as one text
    lance: str | None = None  # a Lance dataset URI: rows go there, `output` holds the markers (lance_output)
    input_format: str | None = None  # parquet, jsonl or csv; None: by each file's name
    top_k: int | None = None  # classify: the best labels kept; None: all
    threshold: float | None = None  # labels (entities) scoring below it are dropped
    labels: list[str] = field(default_factory=list)  # classify: zero-shot labels; extract: the entity labels kept
    template: str | None = None  # classify, zero-shot: the hypothesis, {} standing for the label
    multi_label: bool = False  # classify, zero-shot: each label scored on its own
    aggregation: Aggregation | None = None  # extract: how token labels become spans; None: simple

    def options(self) -> JobOptions:
        """The options asked for, each only when given: what the model's kind must take."""
        given = {
            "chunk": self.chunk,
            "top_k": self.top_k,
            "threshold": self.threshold,
            "labels": self.labels or None,
            "template": self.template,
            "multi_label": self.multi_label or None,
            "aggregation": self.aggregation,
        }
        return {name: value for name, value in given.items() if value is not None}

    def payload(self) -> ClassifyPayload:
        """The item options, each only when asked for: the options digest of existing outputs stays as it was."""
        payload: ClassifyPayload = {**text_rows_payload(self)}
        if self.top_k is not None:
            payload["top_k"] = self.top_k
        if self.threshold is not None:
            payload["threshold"] = self.threshold
        if self.labels:
            payload["labels"] = self.labels
        if self.template is not None:
            payload["template"] = self.template
        if self.multi_label:
            payload["multi_label"] = True
        if self.aggregation is not None:
            payload["aggregation"] = self.aggregation
        return payload


def check_classify_options(request: ClassifyRequest, spec: ModelSpec) -> None:
    """Refuse what the model cannot do, before any work (ConfigError: exit 2): options its kind does not take,
    and the checks its kind makes (configs/kinds)."""
    if request.chunk:
        try:
            request.chunk.check_window(spec.max_seq_length, spec.name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if request.top_k is not None and request.top_k < 1:
        raise ConfigError(f"top-k must be at least 1, got {request.top_k}")
    kind_of(spec).check_job(request.options(), spec)


def classify_job(request: ClassifyRequest) -> BatchJob:
    return text_rows_job(request, request.operation, request.payload())


def run_classify(
    client: Client, request: ClassifyRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, for_command(request.operation))
    check_classify_options(request, spec)
    return run_job(client, classify_job(request), spec, profile, console)


def run_classify_models(
    client: Client, request: ClassifyRequest, models: list[str], profile: Profile, catalog: Catalog, console: Console
) -> list[JobOutcome]:
    """Several models over one input, OUTPUT/<model>/ each (engine.run_jobs): a base's LoRA adapters share
    its forward passes."""
    specs = [model_for(catalog, profile, name, for_command(request.operation)) for name in models]
    for spec in specs:  # refused before any work
        check_classify_options(request, spec)
    jobs = [
        (classify_job(replace(request, model=spec.name, output=model_output(request.output, name))), spec)
        for name, spec in zip(models, specs)
    ]
    return run_jobs(client, jobs, profile, console)
