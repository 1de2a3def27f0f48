"""Batch classify and extract jobs: a text column in, labels or entities per row out.

A `ClassifyRequest` becomes a `BatchJob` of the `classify` operation (a
sequence classifier: workers/operations/classify_operation.py) or the
`extract` operation (a token classifier, or a GLiNER span extractor:
extract_operation.py); the engine
plans, submits, follows, resumes and writes the manifest as for `embed`.
Options are refused here, before any work, when the model cannot meet them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from distributed import Client
from rich.console import Console

from shoal.configs import Catalog, ConfigError, ModelSpec, Profile
from shoal.pipeline.jobs.engine import BatchJob, JobOutcome, model_for, run_job, text_rows_job, text_rows_payload
from shoal.scheduler_plugins.protocol import Aggregation, ClassifyPayload, StorageOptions
from shoal.workers.data.chunking import ChunkSettings

Operation = Literal["classify", "extract"]
# The kinds each one runs: extract, a token classifier's spans or a span extractor's (GLiNER).
KIND: dict[Operation, tuple[str, ...]] = {
    "classify": ("classifier",),
    "extract": ("token_classifier", "span_extractor"),
}
OPERATION_OF: dict[str, Operation] = {kind: operation for operation, kinds in KIND.items() for kind in kinds}
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)


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
    """Refuse what the model cannot do, before any work (ConfigError: exit 2)."""
    if request.chunk:
        try:
            request.chunk.check_window(spec.max_seq_length, spec.name)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if request.top_k is not None and request.top_k < 1:
        raise ConfigError(f"top-k must be at least 1, got {request.top_k}")
    if request.operation == "extract":
        if spec.kind == "span_extractor":
            check_span_options(request, spec)
        elif request.multi_label:
            raise ConfigError(f"model {spec.name!r} labels each token once: multi-label is a span extractor's")
        if request.chunk and request.aggregation == "none":
            raise ConfigError("chunked windows are merged into spans: give an aggregation other than none")
        return
    if (request.template is not None or request.multi_label) and not request.labels:
        raise ConfigError("a template or multi-label scores zero-shot labels: give the labels too")
    if request.labels:
        check_template(request.template)
        if not has_entailment(spec):
            raise ConfigError(
                f"model {spec.name!r} has no entailment label: zero-shot labels need an NLI model "
                "(one with a label named entailment); without labels it scores its own"
            )


def check_span_options(request: ClassifyRequest, spec: ModelSpec) -> None:
    """A span extractor (GLiNER) finds the labels it is given, in texts it reads whole up to its word limit."""
    if not request.labels:
        raise ConfigError(f"model {spec.name!r} is a span extractor (GLiNER): name the entities with --labels")
    if request.chunk:
        raise ConfigError(f"model {spec.name!r} reads each text whole up to its max_len words: no --chunk windows")


def check_template(template: str | None) -> None:
    """A zero-shot hypothesis template must hold the label: ``{}``."""
    if template is not None and template.format("X") == template:
        raise ConfigError(f"the template {template!r} has no {{}} for the label")


def has_entailment(spec: ModelSpec) -> bool:
    """Whether the model's config.json names an entailment label; True when the folder is not here to read."""
    config = Path(spec.resolve_path()) / "config.json"
    if not config.is_file():  # a folder only the workers have: they refuse it themselves
        return True
    labels = json.loads(config.read_text()).get("id2label") or {}
    return any(str(label).lower().startswith("entail") for label in labels.values())


def classify_job(request: ClassifyRequest) -> BatchJob:
    return text_rows_job(request, request.operation, request.payload())


def run_classify(
    client: Client, request: ClassifyRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, KIND[request.operation])
    check_classify_options(request, spec)
    return run_job(client, classify_job(request), spec, profile, console)
