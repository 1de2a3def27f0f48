"""Batch embed jobs: Parquet text in, one vector per row (or per chunk) out.

An `EmbedRequest` becomes a `BatchJob` of the `embed` operation (run by
workers/operations/embed_operation.py); the engine plans, submits, follows and writes
the manifest. Several models over one input share the cluster at once.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from distributed import Client
from rich.console import Console

from shoal.configs import Catalog, ConfigError, ModelSpec, Profile
from shoal.configs.prompts import model_prompts
from shoal.pipeline.jobs.engine import BatchJob, JobOutcome, model_for, output_folder, plan_job, run_job
from shoal.pipeline.jobs.planner import Plan
from shoal.scheduler_plugins.protocol import StorageOptions
from shoal.workers.data.chunking import ChunkSettings
from shoal.workers.data.vector_precision import VectorFormat


@dataclass
class EmbedRequest:
    input: str
    output: str
    model: str
    text_column: str = "text"
    id_column: str | None = "id"
    keep_columns: list[str] = field(default_factory=list)
    storage_options: StorageOptions = field(default_factory=dict)
    chunk: ChunkSettings | None = None  # split long texts into token windows
    vectors: VectorFormat = field(default_factory=VectorFormat)  # stored precision and dimension
    lance: str | None = None  # a Lance dataset URI: rows go there, `output` holds the markers (lance_output)
    input_format: str | None = None  # parquet, jsonl or csv; None: by each file's name (workers/data/input_formats.py)
    prompt_name: str | None = None  # one of the model's prompts before every text (configs/prompts.py)
    prompt: str | None = None  # or the prompt text itself; neither: the model's default prompt


def check_embed_options(request: EmbedRequest, spec: ModelSpec) -> None:
    """Refuse chunk and vector settings the model cannot meet, before any work (ConfigError: exit 2)."""
    try:
        if request.chunk:
            request.chunk.check_window(spec.max_seq_length, spec.name)
        request.vectors.check_model(spec.dim, spec.name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    with_prompt(request, spec)


def with_prompt(request: EmbedRequest, spec: ModelSpec) -> EmbedRequest:
    """`request` with its prompt name replaced by that prompt's text for `spec` (PromptError: exit 2)."""
    if request.prompt_name is None:
        return request
    return replace(request, prompt=model_prompts(spec).text(request.prompt_name, request.prompt), prompt_name=None)


def embed_job(request: EmbedRequest) -> BatchJob:
    return BatchJob(
        operation="embed",
        input=request.input,
        output=request.output,
        model=request.model,
        payload={
            "text_column": request.text_column,
            "id_column": request.id_column,
            "keep_columns": request.keep_columns,
            # Only when asked for: the options digest (params) of existing outputs stays as it was.
            **({"chunk": {"tokens": request.chunk.tokens, "overlap": request.chunk.overlap}} if request.chunk else {}),
            **({} if request.vectors.is_default else {"vectors": request.vectors.payload()}),
            **({"lance": request.lance} if request.lance else {}),
            **({"input_format": request.input_format} if request.input_format else {}),
            # The text, not the name: a prompt asked for is part of the options digest, so a change re-embeds.
            **({"prompt": request.prompt} if request.prompt is not None else {}),
        },
        required_columns=[request.text_column, *filter(None, [request.id_column]), *request.keep_columns],
        manifest_columns={"text": request.text_column, "id": request.id_column, "keep": request.keep_columns},
        storage_options=request.storage_options,
    )


def plan_embed(request: EmbedRequest, profile: Profile) -> Plan:
    return plan_job(embed_job(request), profile)


def run_embed(
    client: Client, request: EmbedRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, "embedder")
    check_embed_options(request, spec)
    return run_job(client, embed_job(with_prompt(request, spec)), spec, profile, console)


def run_embed_models(
    client: Client, request: EmbedRequest, models: list[str], profile: Profile, catalog: Catalog, console: Console
) -> list[JobOutcome]:
    """Several models over one input, an output folder each (OUTPUT/<model>/).

    Every model's job is in the queue at once, so workers keep several
    models held and share the cluster between them. The first job shows
    the progress bar; the others' summaries follow it.
    """
    specs = [model_for(catalog, profile, name, "embedder") for name in models]  # refuse before any work
    for spec in specs:
        check_embed_options(request, spec)
    requests = [
        replace(request, model=spec.name, output=f"{request.output.rstrip('/')}/{output_folder(name)}")
        for name, spec in zip(models, specs)
    ]
    buffers = [io.StringIO() for _ in models[1:]]  # the other jobs' summaries, printed after the first's
    consoles = [console, *(Console(file=buffer, soft_wrap=True, width=console.width) for buffer in buffers)]
    with ThreadPoolExecutor(len(models)) as pool:
        futures = [
            pool.submit(run_job, client, embed_job(with_prompt(r, spec)), spec, profile, c)
            for r, spec, c in zip(requests, specs, consoles)
        ]
        outcomes = [future.result() for future in futures]
    for buffer in buffers:
        console.print(buffer.getvalue(), end="", highlight=False, markup=False)
    return outcomes
