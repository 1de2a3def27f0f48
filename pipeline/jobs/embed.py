"""Batch embed jobs: Parquet text in, one vector per row (or per chunk) out.

An `EmbedRequest` becomes a `BatchJob` of the operation the model's kind
computes (configs/kinds: the kinds `shoal embed` runs): `embed` for a dense
embedder, `sparse` for a SPLADE model, `multivector` for a ColBERT one
(workers/operations/); the engine plans, submits, follows and writes the
manifest. Several models over
one input share the cluster at once: a dense and a sparse model give both
halves of a hybrid index in one command.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from distributed import Client
from rich.console import Console

from ...configs import Catalog, ConfigError, ModelSpec, Profile
from ...configs.kinds import DEFAULT, JobOptions, for_command, kind_of
from ...configs.prompts import model_prompts
from ...scheduler_plugins.protocol import ImagePayload, StorageOptions
from ...workers.data.chunking import ChunkSettings
from ...workers.data.vector_precision import VectorFormat
from . import image_files
from .engine import (
    BatchJob,
    JobOutcome,
    model_for,
    model_output,
    plan_job,
    run_job,
    run_jobs,
    text_rows_job,
    text_rows_payload,
)
from .planner import Plan

COMMAND = "embed"


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
    top_k: int | None = None  # sparse: each row's largest terms kept; None: the model's own setting (all)
    input_type: Literal["query", "document"] | None = None  # multivector: ColBERT's query encoding; None: document
    # An image kind's images: a column of image bytes or URIs; None: INPUT's image files, else `text_column`'s texts
    image_column: str | None = None
    max_image_pixels: int | None = None  # an image with more is its row's rejection; None: Pillow's default limit


def embed_options(request: EmbedRequest) -> JobOptions:
    """The options `request` asks for, each only when given: what the model's kind must take."""
    options: dict[str, object] = {}
    if request.chunk:
        options["chunk"] = request.chunk
    if not request.vectors.is_default:
        options["vectors"] = request.vectors
    if request.prompt is not None or request.prompt_name is not None:
        options["prompt"] = request.prompt_name or request.prompt
    if request.top_k is not None:
        options["top_k"] = request.top_k
    if request.input_type is not None:
        options["input_type"] = request.input_type
    return options


def check_embed_options(request: EmbedRequest, spec: ModelSpec) -> None:
    """Refuse options the model's kind does not take, and chunk and vector settings the model cannot meet,
    before any work (ConfigError: exit 2)."""
    kind_of(spec).check_job(embed_options(request), spec)
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


def with_images(request: EmbedRequest, spec: ModelSpec) -> EmbedRequest:
    """`request` reading INPUT as image files when the model takes images, no column is named and INPUT holds
    images (image_files.holds_images); options of images refused for a model without an image tower."""
    takes_images = "images" in kind_of(spec).inputs
    if not takes_images and (request.image_column or request.input_format == image_files.FORMAT):
        raise ConfigError(f"model {spec.name!r} is of kind {spec.kind!r}: it embeds no images")
    if not takes_images or request.image_column or request.input_format not in (None, image_files.FORMAT):
        return request
    if request.input_format == image_files.FORMAT or image_files.holds_images(request.input, request.storage_options):
        return replace(request, input_format=image_files.FORMAT)
    return request


def embed_job(request: EmbedRequest, operation: str = DEFAULT.operation) -> BatchJob:
    """`operation`: the model's kind's."""
    payload: ImagePayload = {**text_rows_payload(request)}
    if request.image_column or request.input_format == image_files.FORMAT:
        payload.pop("text_column", None)
        if request.image_column:
            payload["image_column"] = request.image_column
        if request.max_image_pixels:
            payload["max_image_pixels"] = request.max_image_pixels
    # Only when asked for: the options digest (params) of existing outputs stays as it was.
    if not request.vectors.is_default:
        payload["vectors"] = request.vectors.payload()
    if request.prompt is not None:  # the text, not the name: a prompt asked for is in the digest, a change re-embeds
        payload["prompt"] = request.prompt
    if request.top_k is not None:
        payload["top_k"] = request.top_k
    if request.input_type is not None:
        payload["input_type"] = request.input_type
    job = text_rows_job(request, operation, payload)
    if request.input_format == image_files.FORMAT:
        job.required_columns, job.manifest_columns = [], {"id": request.id_column or image_files.ID_COLUMN}
    elif request.image_column:
        job.required_columns[0] = request.image_column
        job.manifest_columns = {"image": request.image_column, "id": request.id_column, "keep": request.keep_columns}
    return job


def plan_embed(request: EmbedRequest, profile: Profile) -> Plan:
    return plan_job(embed_job(request), profile)


def run_embed(
    client: Client, request: EmbedRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, for_command(COMMAND))
    check_embed_options(request, spec)
    request = with_images(with_prompt(request, spec), spec)
    return run_job(client, embed_job(request, kind_of(spec).operation), spec, profile, console)


def run_embed_models(
    client: Client, request: EmbedRequest, models: list[str], profile: Profile, catalog: Catalog, console: Console
) -> list[JobOutcome]:
    """Several models over one input, an output folder each (OUTPUT/<model>/): engine.run_jobs."""
    specs = [model_for(catalog, profile, name, for_command(COMMAND)) for name in models]  # refuse before any work
    for spec in specs:
        check_embed_options(request, spec)
    jobs = [
        (embed_job(with_prompt(replace(request, model=spec.name, output=model_output(request.output, name)), spec),
                   kind_of(spec).operation), spec)
        for name, spec in zip(models, specs)
    ]  # fmt: skip
    return run_jobs(client, jobs, profile, console)
