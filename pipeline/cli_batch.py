"""The batch commands: `shoal embed`, `rerank`, `reindex`, `run` and `eval`.

Each reads its options, checks what it can before starting a cluster (the
profile, catalog, models, input and output), then runs on the cluster and
exits with its outcome's code: 0 all done, 1 some parts failed or rows were
rejected, 2 a user error (nothing ran), 3 (reindex) another run holds the lock.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

import click
from rich.console import Console

from ..configs import ConfigError, load_catalog, load_profile
from ..configs.kinds import for_command, for_operation
from ..configs.prompts import model_prompts
from ..workers.data.input_formats import INPUT_FORMATS
from ..workers.data.vector_precision import PRECISIONS, Precision, VectorFormat
from .cli_options import (
    USER_ERRORS,
    adapt_option,
    cluster_options,
    model_names,
    parse_chunk,
    parse_columns,
    parse_storage_options,
    passthrough_options,
    print_error,
    profile_option,
    scheduler_option,
    text_column_option,
    user_errors,
)
from .cluster import AdaptRange, connect
from .jobs import image_files
from .jobs.embed import COMMAND as EMBED
from .jobs.embed import EmbedRequest, check_embed_options, run_embed, run_embed_models, with_images
from .jobs.engine import model_for, preflight
from .jobs.lance_output import LanceTarget
from .jobs.lock import LockHeld
from .jobs.planner import check_apart, check_output
from .jobs.reindex import ReindexJob, job_config, load_job, plan_reindex, run_reindex
from .jobs.rerank import DEFAULT_MAX_CANDIDATES, RerankRequest, run_rerank, run_rerank_models
from .jobs.schedule import check_expression, run_on_schedule
from .retrieval.beir import load_beir
from .retrieval.evaluation import print_report, run_eval
from .retrieval.run import embed_requests, run_pipeline
from .retrieval.spec import load_job_spec

RESUMABLE = ("embed", "rerank", "classify", "extract", "run", "reindex", "eval")
"""The commands whose interrupted run keeps its written parts: the same command again resumes it."""

input_format_option = click.option(
    "--input-format",
    type=click.Choice([*INPUT_FORMATS, image_files.FORMAT]),
    default=None,
    help="How INPUT's files are read; images: one row per image file (an image model's). "
    "[default: by name: .parquet, .jsonl, .jsonl.gz, .csv, .csv.gz; an image model's INPUT of image files: images]",
)
output_format_option = click.option(
    "--format",
    "output_format",
    type=click.Choice(["parquet", "lance"]),
    default="parquet",
    show_default=True,
    help="lance: OUTPUT is a Lance dataset (also OUTPUT=lance://PATH), committed as one version per run.",
)


@click.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option(
    "--model",
    required=True,
    callback=model_names,
    help="Catalog name, model folder, Hugging Face id (downloaded on first use) or fsspec URL of a model folder "
    "(s3://…/bge-small/); several, comma-separated, write OUTPUT/<model>/ each.",
)
@text_column_option
@input_format_option
@passthrough_options
@cluster_options(storage=True)
@click.option(
    "--chunk",
    default=None,
    metavar="tokens=N[,overlap=K]",
    help="Split texts longer than N tokens into windows overlapping by K; one row per window.",
)
@click.option(
    "--precision",
    type=click.Choice(PRECISIONS),
    default="float32",
    show_default=True,
    help="Stored vector type; int8/uint8 calibrate on a sample.",
)
@click.option(
    "--dim",
    type=click.IntRange(min=1),
    default=None,
    help="Keep the first N dimensions, re-normalised (Matryoshka models).",
)
@output_format_option
@click.option(
    "--prompt-name",
    default=None,
    help="One of the model's named prompts (e.g. query, document; `shoal models` lists them) before every text.",
)
@click.option("--prompt", default=None, help='The text before every text, e.g. "query: "; "" for none.')
@click.option(
    "--top-k",
    type=click.IntRange(min=1),
    default=None,
    help="Sparse models: keep each row's N largest term weights. [default: the model's own setting, else all]",
)
@click.option(
    "--input-type",
    type=click.Choice(["document", "query"]),
    default=None,
    help="Multi-vector (ColBERT) models: encode as documents or as queries. [default: document]",
)
@click.option(
    "--image-column",
    default=None,
    help="Image models: a column of image bytes or URIs (s3://…, https://…, data:…) to embed. "
    "[default: INPUT's image files, one row each; else --text-column's texts, through the text tower]",
)
@click.option(
    "--max-image-pixels",
    type=click.IntRange(min=1),
    default=None,
    help="Image models: an image of more pixels is its row's rejection (decompression bombs). [default: 89,478,485]",
)
@user_errors()
def embed(
    input_url: str,
    output_url: str,
    model: str,
    text_column: str,
    input_format: str | None,
    id_column: str,
    keep_columns: str,
    scheduler: str | None,
    adapt: AdaptRange | None,
    storage_options: str | None,
    profile: str | None,
    catalog: str | None,
    chunk: str | None,
    precision: Precision,
    dim: int | None,
    output_format: str,
    prompt_name: str | None,
    prompt: str | None,
    top_k: int | None,
    input_type: Literal["query", "document"] | None,
    image_column: str | None,
    max_image_pixels: int | None,
) -> None:
    """Embed the TEXT column of every row of INPUT into Parquet parts under OUTPUT.

    INPUT is a Parquet file, a directory or a glob on any fsspec filesystem
    (local, s3://, gs://…); OUTPUT is a directory there. What a row holds
    follows the model's kind: a dense vector (`embedding`), a sparse one's
    terms (`sparse`, SPLADE models) or a vector per token (`embedding`, a
    list of them: ColBERT models). An image model (CLIP, SigLIP) embeds
    INPUT's image files (a folder or a glob: one row per file, its id the
    path under the folder), or an --image-column, or texts through its text
    tower, into one space.
    """
    console = Console(stderr=True, soft_wrap=True)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog).reading_with(parse_storage_options(storage_options))
    models = parse_columns(model)
    warm = [model_for(catalog_config, profile_config, name, for_command(EMBED)).name for name in models]
    lance = LanceTarget.of(output_url, output_format)
    if lance and len(models) > 1:
        raise ConfigError("a Lance OUTPUT is one dataset: give one model (or one OUTPUT per model)")
    request = EmbedRequest(
        input=input_url,
        output=lance.staging if lance else output_url,
        lance=lance.dataset if lance else None,
        model=models[0],
        text_column=text_column,
        id_column=id_column or None,
        keep_columns=parse_columns(keep_columns),
        storage_options=parse_storage_options(storage_options),
        input_format=input_format,
        chunk=parse_chunk(chunk),
        vectors=VectorFormat(precision=precision, dim=dim),
        prompt_name=prompt_name,
        prompt=prompt,
        top_k=top_k,
        input_type=input_type,
        image_column=image_column,
        max_image_pixels=max_image_pixels,
    )
    for name in models:
        check_embed_options(request, model_for(catalog_config, profile_config, name, for_command(EMBED)))
    for name in models:  # INPUT read as image files for an image model
        request = with_images(request, model_for(catalog_config, profile_config, name, for_command(EMBED)))
    if lance:  # named as given: preflight checks the staging folder inside it
        check_apart(request.input, lance.dataset, request.storage_options)
    preflight(request.input, request.output, request.storage_options, request.input_format)
    with connect(scheduler, profile_config, catalog, adapt=adapt, warm=warm) as client:
        if len(models) == 1:
            outcomes = [run_embed(client, request, profile_config, catalog_config, console)]
        else:
            outcomes = run_embed_models(client, request, models, profile_config, catalog_config, console)
    sys.exit(max(outcome.exit_code for outcome in outcomes))


@click.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option(
    "--model",
    required=True,
    callback=model_names,
    help="The reranker (kind: reranker); several, comma-separated (LoRA adapters of one base: BASE+ADAPTER), "
    "write OUTPUT/<model>/ each.",
)
@click.option("--query-column", default="query", show_default=True)
@click.option("--passage-column", default=None, help="Pairs mode: one passage per row. [default: passage]")
@click.option("--candidates-column", default=None, help="Candidates mode: a list of passages per row.")
@click.option("--candidate-ids-column", default=None, help="Candidates mode: a list of ids, one per candidate.")
@input_format_option
@passthrough_options
@click.option(
    "--max-candidates",
    default=DEFAULT_MAX_CANDIDATES,
    show_default=True,
    help="Rows with more candidates are rejected.",
)
@cluster_options(storage=True)
@user_errors()
def rerank(
    input_url: str,
    output_url: str,
    model: str,
    query_column: str,
    passage_column: str | None,
    candidates_column: str | None,
    candidate_ids_column: str | None,
    id_column: str,
    keep_columns: str,
    max_candidates: int,
    input_format: str | None,
    scheduler: str | None,
    adapt: AdaptRange | None,
    storage_options: str | None,
    profile: str | None,
    catalog: str | None,
) -> None:
    """Score (query, passage) rows of INPUT with a cross-encoder, or rank each query's candidates.

    Pairs mode (default): each row is a query and one passage; the output has
    a `score` per row. Candidates mode (--candidates-column): each row is a
    query and a list of passages; the output has `ranking`, the candidates in
    score order with ranks. Rows that cannot be scored get a null result, are
    listed as rejected, and make the exit code 1.
    """
    console = Console(stderr=True, soft_wrap=True)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog).reading_with(parse_storage_options(storage_options))
    models = parse_columns(model)
    warm = [model_for(catalog_config, profile_config, name, for_operation("rerank")).name for name in models]
    request = RerankRequest(
        input=input_url,
        output=output_url,
        model=models[0],
        query_column=query_column,
        passage_column=passage_column or None,
        candidates_column=candidates_column or None,
        candidate_ids_column=candidate_ids_column or None,
        id_column=id_column or None,
        keep_columns=parse_columns(keep_columns),
        max_candidates=max_candidates,
        storage_options=parse_storage_options(storage_options),
        input_format=input_format,
    )
    preflight(request.input, request.output, request.storage_options, request.input_format)
    with connect(scheduler, profile_config, catalog, adapt=adapt, warm=warm) as client:
        if len(models) == 1:
            outcomes = [run_rerank(client, request, profile_config, catalog_config, console)]
        else:
            outcomes = run_rerank_models(client, request, models, profile_config, catalog_config, console)
    sys.exit(max(outcome.exit_code for outcome in outcomes))


@click.command()
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print what a run would do; change nothing.")
@click.option(
    "--schedule",
    "cron",
    default=None,
    help='Run at every slot of this cron expression, e.g. "0 * * * *" (a sixth field is seconds).',
)
@click.option("--runs", type=click.IntRange(min=1), default=None, help="With --schedule: stop after this many runs.")
@scheduler_option("tcp://host:port of a running cluster; overrides the job file.")
@adapt_option
@profile_option("Cluster profile name or YAML path; overrides the job file's.")
def reindex(
    job_file: str,
    dry_run: bool,
    cron: str | None,
    runs: int | None,
    scheduler: str | None,
    adapt: AdaptRange | None,
    profile: str | None,
) -> None:
    """Bring the output of JOB.yaml in step with its inputs and model.

    New and changed shards are redone, removed shards' parts removed; after a
    model change everything is redone into a new version directory and
    OUTPUT/_CURRENT moves to it when it is complete. Exit 3: another run of
    the job holds its lock.
    """
    console = Console(stderr=True, soft_wrap=True)
    with user_errors(ValueError):  # besides USER_ERRORS: a bad cron expression
        job = _job(job_file, profile)
        if cron:
            check_expression(cron)
        if dry_run:
            plan_reindex(job, *job_config(job)).render(console)
            sys.exit(0)
    if cron is None:
        sys.exit(_reindex_once(job_file, console, scheduler, profile, adapt))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    failed = run_on_schedule(cron, lambda: _reindex_once(job_file, console, scheduler, profile, adapt), runs)
    sys.exit(1 if failed else 0)


def _job(job_file: str, profile: str | None) -> ReindexJob:
    """The job file, with --profile (if given) in place of its own."""
    job = load_job(job_file)
    return job.model_copy(update={"profile": profile}) if profile else job


def _reindex_once(
    job_file: str, console: Console, scheduler: str | None, profile: str | None = None, adapt: AdaptRange | None = None
) -> int:
    """One run; the job file is read again, so edits apply to the next scheduled run. Its exit code."""
    try:
        job = _job(job_file, profile)
        check_apart(job.input, job.request(job.output).lance or job.output, job.storage_options)  # before the lock
        check_output(job.output, job.storage_options)
        return run_reindex(job, console, scheduler, adapt).exit_code
    except USER_ERRORS as exc:  # reported, and a scheduled run goes on to its next slot
        print_error(exc)
        return 2
    except LockHeld as exc:
        console.print(f"[yellow]not run:[/yellow] {exc}")
        return 3


@click.command(name="run")
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@cluster_options()
@user_errors()
def run_job_file(
    job_file: str, scheduler: str | None, adapt: AdaptRange | None, profile: str | None, catalog: str | None
) -> None:
    """Run a retrieval pipeline: embed corpus and queries, exact top-k by cosine, rerank, write ranked results."""
    console = Console(stderr=True, soft_wrap=True)
    spec = load_job_spec(job_file)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog)
    embed_requests(
        spec, model_prompts(model_for(catalog_config, profile_config, spec.embed.model, for_operation("embed")))
    )
    if spec.rerank:
        model_for(catalog_config, profile_config, spec.rerank.model, for_operation("rerank"))
    warm = [spec.embed.model, *([spec.rerank.model] if spec.rerank else [])]
    for stage_input in (spec.corpus.input, spec.queries.input):
        preflight(stage_input, spec.output, spec.storage_options)
    with connect(scheduler, profile_config, catalog, adapt=adapt, warm=warm) as client:
        outcome = run_pipeline(client, spec, profile_config, catalog_config, console)
    sys.exit(outcome.exit_code)


@click.command(name="eval")
@click.argument("dataset", metavar="DATASET")
@click.option(
    "--model", default="minilm", show_default=True, callback=model_names, help="Catalog name of the embedder."
)
@click.option(
    "--reranker", default=None, callback=model_names, help="Catalog name of a reranker; without it, retrieval alone."
)
@click.option("--top-k", default=100, show_default=True, help="Passages retrieved per query.")
@click.option("--rerank-k", default=100, show_default=True, help="Of those, how many the reranker reorders.")
@click.option("--split", default="test", show_default=True, help="qrels/<split>.tsv, for BEIR's own layout.")
@click.option(
    "--output", default=None, help="Where inputs, stage outputs and metrics.json go. [default: out/eval-<dataset>]"
)
@click.option("--query-prompt-name", default=None, help="Prompt of the queries. [default: the model's query prompt]")
@click.option(
    "--document-prompt-name", default=None, help="Prompt of the corpus. [default: the model's document prompt]"
)
@click.option("--query-prompt", default=None, help='Or the queries\' prompt text ("" for none).')
@click.option("--document-prompt", default=None, help='Or the corpus\'s prompt text ("" for none).')
@cluster_options()
@user_errors()
def evaluate(
    dataset: str,
    model: str,
    reranker: str | None,
    top_k: int,
    rerank_k: int,
    split: str,
    output: str | None,
    query_prompt_name: str | None,
    document_prompt_name: str | None,
    query_prompt: str | None,
    document_prompt: str | None,
    scheduler: str | None,
    adapt: AdaptRange | None,
    profile: str | None,
    catalog: str | None,
) -> None:
    """nDCG@10 and recall@100 on a BEIR-format DATASET, for retrieval alone and with reranking."""
    console = Console(stderr=True, soft_wrap=True)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog)
    prompts = model_prompts(model_for(catalog_config, profile_config, model, for_operation("embed")))
    overrides: dict[str, dict[str, str]] = {}
    for role, name, text in (
        ("query", query_prompt_name, query_prompt),
        ("document", document_prompt_name, document_prompt),
    ):
        prompts.text(name, text)  # an unknown name, or a name and a text: refused before any work
        overrides[role] = {k: v for k, v in (("prompt_name", name), ("prompt", text)) if v is not None}
    if reranker:
        model_for(catalog_config, profile_config, reranker, for_operation("rerank"))
    data = load_beir(dataset, split)
    with connect(
        scheduler, profile_config, catalog, adapt=adapt, warm=[model, *([reranker] if reranker else [])]
    ) as client:
        report, outcome = run_eval(
            client,
            data,
            output or f"out/eval-{data.name}",
            model,
            reranker,
            top_k,
            rerank_k,
            profile_config,
            catalog_config,
            console,
            overrides["query"],
            overrides["document"],
        )
    print_report(report, Console(soft_wrap=True))
    sys.exit(outcome.exit_code)
