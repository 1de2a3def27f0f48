"""The `shoal` command line."""

from __future__ import annotations

import json
import logging
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import click  # noqa: E402
from rich.console import Console  # noqa: E402

from configs import ConfigError, load_catalog, load_profile  # noqa: E402
from pipeline.cluster import ClusterError, connect  # noqa: E402
from pipeline.jobs.embed import EmbedRequest, check_embed_options, run_embed, run_embed_models  # noqa: E402
from pipeline.jobs.engine import model_for, preflight  # noqa: E402
from pipeline.jobs.lance_output import LanceTarget  # noqa: E402
from pipeline.jobs.lock import LockHeld  # noqa: E402
from pipeline.jobs.planner import PlanError, check_output  # noqa: E402
from pipeline.jobs.reindex import job_config, load_job, plan_reindex, run_reindex  # noqa: E402
from pipeline.jobs.rerank import DEFAULT_MAX_CANDIDATES, RerankRequest, run_rerank  # noqa: E402
from pipeline.jobs.schedule import check_expression, run_on_schedule  # noqa: E402
from pipeline.retrieval.beir import load_beir  # noqa: E402
from pipeline.retrieval.evaluation import print_report, run_eval  # noqa: E402
from pipeline.retrieval.run import run_pipeline  # noqa: E402
from pipeline.retrieval.spec import load_job_spec  # noqa: E402
from pipeline.status import cluster_state, output_state, render_cluster, render_output  # noqa: E402
from pipeline.tuning.derived import GPUS  # noqa: E402
from pipeline.tuning.derived import derive as derive_gpu
from pipeline.tuning.profile import profile_path, write_profile  # noqa: E402
from pipeline.tuning.tune import DEMO_INPUT, TuneRequest  # noqa: E402
from pipeline.tuning.tune import tune as tune_profile
from workers.chunking import ChunkSettings  # noqa: E402
from workers.vector_precision import PRECISIONS, VectorFormat  # noqa: E402

USER_ERRORS = (ConfigError, PlanError, ClusterError)


def _columns(value: str | None) -> list[str]:
    """A comma-separated list, each name once (`--model minilm,minilm` is one job, not two into one folder)."""
    return list(dict.fromkeys(c.strip() for c in (value or "").split(",") if c.strip()))


def _chunk(value: str | None) -> ChunkSettings | None:
    if not value:
        return None
    try:
        return ChunkSettings.parse(value)
    except ValueError as exc:  # pydantic's ValidationError is one
        reasons = "; ".join(e["msg"] for e in exc.errors()) if hasattr(exc, "errors") else str(exc)
        raise click.BadParameter(reasons, param_hint="--chunk") from None


def _storage_options(value: str | None) -> dict:
    if not value:
        return {}
    try:
        options = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise click.BadParameter("must be a JSON object")
    return options


class _Interruptible(click.Group):
    """Ctrl-C ends a command with 130 (128 + SIGINT), as shells expect, never 1 (the code of failed parts)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            resumable = ctx.invoked_subcommand in ("embed", "rerank", "run", "reindex", "eval")
            hint = ": the parts already written are kept, and the same command resumes" if resumable else ""
            Console(stderr=True).print(f"[yellow]interrupted[/yellow]{hint}")
            sys.exit(130)


@click.group(cls=_Interruptible)
@click.version_option(package_name="shoal")
def main() -> None:
    """Shoal: many small embedding and reranking models on one Dask cluster."""


@main.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option(
    "--model",
    required=True,
    help="Catalog name, model folder or cached Hugging Face id; several, comma-separated, write OUTPUT/<model>/ each.",
)
@click.option("--text-column", default="text", show_default=True)
@click.option("--id-column", default="id", show_default=True, help="Passed through unchanged; '' for none.")
@click.option("--keep-columns", default="", help="Comma-separated input columns to copy to the output.")
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--storage-options", default=None, help="JSON object passed to fsspec (credentials, endpoint).")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
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
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["parquet", "lance"]),
    default="parquet",
    show_default=True,
    help="lance: OUTPUT is a Lance dataset (also OUTPUT=lance://PATH), committed as one version per run.",
)
def embed(
    input_url,
    output_url,
    model,
    text_column,
    id_column,
    keep_columns,
    scheduler,
    storage_options,
    profile,
    catalog,
    chunk,
    precision,
    dim,
    output_format,
):
    """Embed the TEXT column of every row of INPUT into Parquet parts under OUTPUT.

    INPUT is a Parquet file, a directory or a glob on any fsspec filesystem
    (local, s3://, gs://…); OUTPUT is a directory there.
    """
    console = Console(stderr=True, soft_wrap=True)
    try:
        profile_config = load_profile(profile)
        catalog_config = load_catalog(catalog)
        models = _columns(model)
        warm = [model_for(catalog_config, profile_config, name, "embedder").name for name in models]
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
            keep_columns=_columns(keep_columns),
            storage_options=_storage_options(storage_options),
            chunk=_chunk(chunk),
            vectors=VectorFormat(precision=precision, dim=dim),
        )
        for name in models:
            check_embed_options(request, model_for(catalog_config, profile_config, name, "embedder"))
        preflight(request.input, request.output, request.storage_options)
        with connect(scheduler, profile_config, catalog, warm=warm) as client:
            if len(models) == 1:
                outcomes = [run_embed(client, request, profile_config, catalog_config, console)]
            else:
                outcomes = run_embed_models(client, request, models, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(max(outcome.exit_code for outcome in outcomes))


@main.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option("--model", required=True, help="Catalog name of the reranker (kind: reranker).")
@click.option("--query-column", default="query", show_default=True)
@click.option("--passage-column", default=None, help="Pairs mode: one passage per row. [default: passage]")
@click.option("--candidates-column", default=None, help="Candidates mode: a list of passages per row.")
@click.option("--candidate-ids-column", default=None, help="Candidates mode: a list of ids, one per candidate.")
@click.option("--id-column", default="id", show_default=True, help="Passed through unchanged; '' for none.")
@click.option("--keep-columns", default="", help="Comma-separated input columns to copy to the output.")
@click.option(
    "--max-candidates",
    default=DEFAULT_MAX_CANDIDATES,
    show_default=True,
    help="Rows with more candidates are rejected.",
)
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--storage-options", default=None, help="JSON object passed to fsspec (credentials, endpoint).")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def rerank(
    input_url,
    output_url,
    model,
    query_column,
    passage_column,
    candidates_column,
    candidate_ids_column,
    id_column,
    keep_columns,
    max_candidates,
    scheduler,
    storage_options,
    profile,
    catalog,
):
    """Score (query, passage) rows of INPUT with a cross-encoder, or rank each query's candidates.

    Pairs mode (default): each row is a query and one passage; the output has
    a `score` per row. Candidates mode (--candidates-column): each row is a
    query and a list of passages; the output has `ranking`, the candidates in
    score order with ranks. Rows that cannot be scored get a null result, are
    listed as rejected, and make the exit code 1.
    """
    console = Console(stderr=True, soft_wrap=True)
    try:
        profile_config = load_profile(profile)
        catalog_config = load_catalog(catalog)
        model_for(catalog_config, profile_config, model, "reranker")
        request = RerankRequest(
            input=input_url,
            output=output_url,
            model=model,
            query_column=query_column,
            passage_column=passage_column or None,
            candidates_column=candidates_column or None,
            candidate_ids_column=candidate_ids_column or None,
            id_column=id_column or None,
            keep_columns=_columns(keep_columns),
            max_candidates=max_candidates,
            storage_options=_storage_options(storage_options),
        )
        preflight(request.input, request.output, request.storage_options)
        with connect(scheduler, profile_config, catalog, warm=[model]) as client:
            outcome = run_rerank(client, request, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(outcome.exit_code)


@main.command()
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print what a run would do; change nothing.")
@click.option(
    "--schedule",
    "cron",
    default=None,
    help='Run at every slot of this cron expression, e.g. "0 * * * *" (a sixth field is seconds).',
)
@click.option("--runs", type=click.IntRange(min=1), default=None, help="With --schedule: stop after this many runs.")
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; overrides the job file.")
@click.option("--profile", default=None, help="Cluster profile name or YAML path; overrides the job file's.")
def reindex(job_file, dry_run, cron, runs, scheduler, profile):
    """Bring the output of JOB.yaml in step with its inputs and model.

    New and changed shards are redone, removed shards' parts removed; after a
    model change everything is redone into a new version directory and
    OUTPUT/_CURRENT moves to it when it is complete. Exit 3: another run of
    the job holds its lock.
    """
    console = Console(stderr=True, soft_wrap=True)
    try:
        job = _job(job_file, profile)
        if cron:
            check_expression(cron)
        if dry_run:
            plan_reindex(job, *job_config(job)).render(console)
            sys.exit(0)
    except (ValueError, ClusterError) as exc:  # ValueError: ConfigError, PlanError, a bad cron expression
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    if cron is None:
        sys.exit(_reindex_once(job_file, console, scheduler, profile))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    failed = run_on_schedule(cron, lambda: _reindex_once(job_file, console, scheduler, profile), runs)
    sys.exit(1 if failed else 0)


def _job(job_file: str, profile: str | None):
    """The job file, with --profile (if given) in place of its own."""
    job = load_job(job_file)
    return job.model_copy(update={"profile": profile}) if profile else job


def _reindex_once(job_file: str, console: Console, scheduler: str | None, profile: str | None = None) -> int:
    """One run; the job file is read again, so edits apply to the next scheduled run."""
    try:
        job = _job(job_file, profile)
        check_output(job.output, job.storage_options)
        return run_reindex(job, console, scheduler).exit_code
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 2
    except LockHeld as exc:
        console.print(f"[yellow]not run:[/yellow] {exc}")
        return 3


@main.command()
@click.argument("job", required=False)
@click.option("--scheduler", default=None, envvar="DASK_SCHEDULER_ADDRESS", help="tcp://host:port of the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw state as JSON.")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
def status(job, scheduler, as_json, profile):
    """Show running jobs (item states per model), workers and their resident models.

    JOB filters the jobs by id. A job file (JOB.yaml) shows that job's runs
    and its output too: _CURRENT, versions, lock holder, last manifest.
    """
    console = Console(soft_wrap=True)
    state: dict = {}
    pattern = job
    try:
        if job and job.endswith((".yaml", ".yml")):
            job_file = load_job(job)
            pattern, scheduler = f"reindex-{job_file.name}-", scheduler or job_file.scheduler
            state["output"] = output_state(job_file)
        elif not scheduler:
            raise click.UsageError("give --scheduler (or DASK_SCHEDULER_ADDRESS), or a job file")
        if scheduler:
            with connect(scheduler, load_profile(profile)) as client:
                state["cluster"] = cluster_state(client, pattern)
    except USER_ERRORS as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(state, indent=1, default=str))
        return
    if "output" in state:
        render_output(state["output"], console)
    if "cluster" in state:
        render_cluster(state["cluster"], console)


@main.command()
@click.option(
    "--profile",
    default=None,
    help="Cluster profile name or YAML path (default: cpu-local); its `gateway:` section sets the limits.",
)
@click.option(
    "--models", default="", help="Comma-separated models to pin (load at start, never evict) on the embedded cluster."
)
@click.option("--host", default=None, help="Address to listen on. Default: the profile's, 127.0.0.1 (loopback only).")
@click.option(
    "--port", type=int, default=None, help="Port to listen on (0: any free one). Default: the profile's, 8790."
)
@click.option(
    "--scheduler", default=None, help="tcp://host:port of a running cluster: the gateway starts in its scheduler."
)
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def serve(profile, models, host, port, scheduler, catalog):
    """Answer online requests (MessagePack or JSON over HTTP) until stopped.

    Same workers and queue as batch jobs; online requests go first. SIGINT or
    SIGTERM stops accepting, finishes what is in flight, and exits 0. The
    protocol is in docs/PROTOCOL.md.
    """
    from pipeline.serve import serve as run_serve

    console = Console(stderr=True, soft_wrap=True)
    try:
        code = run_serve(
            load_profile(profile), load_catalog(catalog), catalog, _columns(models), host, port, scheduler, console
        )
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(code)


@main.command(name="gateway")
@click.option(
    "--scheduler", required=True, envvar="DASK_SCHEDULER_ADDRESS", help="tcp://host:port of the cluster's scheduler."
)
@click.option(
    "--profile",
    default=None,
    help="Cluster profile name or YAML path (default: cpu-local); its `gateway:` section sets the limits.",
)
@click.option("--host", default=None, help="Address to listen on. Default: the profile's, 127.0.0.1 (loopback only).")
@click.option(
    "--port", type=int, default=None, help="Port to listen on (0: any free one). Default: the profile's, 8790."
)
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def gateway(scheduler, profile, host, port, catalog):
    """Serve the online endpoint in this process, for a running cluster.

    The same routes as `shoal serve`, with HTTP handled here instead of in the
    scheduler: run several, behind any load balancer, to serve one cluster.
    Waits for the scheduler if it is not up yet; SIGINT or SIGTERM exits 0.
    """
    from pipeline.gateway_process import gateway as run_gateway

    console = Console(stderr=True, soft_wrap=True)
    try:
        code = run_gateway(load_profile(profile), load_catalog(catalog), scheduler, host, port, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(code)


@main.command(name="models")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
@click.option("--catalog-only", is_flag=True, help="Only the catalog's entries, not the Hugging Face cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@click.option(
    "--profile",
    default=None,
    help="Cluster profile name or YAML path (default: cpu-local): its tuned token budgets and batch caps.",
)
def list_models(catalog, catalog_only, as_json, profile):
    """List catalog models and cached Hugging Face models with their resolved kind, dim, window, normalize."""
    from pipeline.model_listing import model_rows, render_models

    try:
        rows = model_rows(load_catalog(catalog), load_profile(profile), include_cache=not catalog_only)
    except USER_ERRORS as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        render_models(rows, Console(soft_wrap=True))


@main.command(name="run")
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def run_job_file(job_file, scheduler, profile, catalog):
    """Run a retrieval pipeline: embed corpus and queries, exact top-k by cosine, rerank, write ranked results."""
    console = Console(stderr=True, soft_wrap=True)
    try:
        spec = load_job_spec(job_file)
        profile_config = load_profile(profile)
        catalog_config = load_catalog(catalog)
        model_for(catalog_config, profile_config, spec.embed.model, "embedder")
        if spec.rerank:
            model_for(catalog_config, profile_config, spec.rerank.model, "reranker")
        warm = [spec.embed.model, *([spec.rerank.model] if spec.rerank else [])]
        for stage_input in (spec.corpus.input, spec.queries.input):
            preflight(stage_input, spec.output, spec.storage_options)
        with connect(scheduler, profile_config, catalog, warm=warm) as client:
            outcome = run_pipeline(client, spec, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(outcome.exit_code)


@main.command(name="eval")
@click.argument("dataset", metavar="DATASET")
@click.option("--model", default="minilm", show_default=True, help="Catalog name of the embedder.")
@click.option("--reranker", default=None, help="Catalog name of a reranker; without it, retrieval alone.")
@click.option("--top-k", default=100, show_default=True, help="Passages retrieved per query.")
@click.option("--rerank-k", default=100, show_default=True, help="Of those, how many the reranker reorders.")
@click.option("--split", default="test", show_default=True, help="qrels/<split>.tsv, for BEIR's own layout.")
@click.option(
    "--output", default=None, help="Where inputs, stage outputs and metrics.json go. [default: out/eval-<dataset>]"
)
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def evaluate(dataset, model, reranker, top_k, rerank_k, split, output, scheduler, profile, catalog):
    """nDCG@10 and recall@100 on a BEIR-format DATASET, for retrieval alone and with reranking."""
    console = Console(stderr=True, soft_wrap=True)
    try:
        profile_config = load_profile(profile)
        catalog_config = load_catalog(catalog)
        model_for(catalog_config, profile_config, model, "embedder")
        if reranker:
            model_for(catalog_config, profile_config, reranker, "reranker")
        data = load_beir(dataset, split)
        with connect(scheduler, profile_config, catalog, warm=[model, *([reranker] if reranker else [])]) as client:
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
            )
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    print_report(report, Console(soft_wrap=True))
    sys.exit(outcome.exit_code)


@main.command()
@click.option("--profile", "name", required=True, help="Profile to write: a name (configs/NAME.yaml) or a YAML path.")
@click.option("--models", default="minilm", show_default=True, help="Comma-separated catalog models to tune for.")
@click.option("--budget-minutes", default=10.0, show_default=True, help="Stop starting trials after this long.")
@click.option(
    "--input", "input_url", default=None, help="Parquet corpus to sample texts from. [default: the demo corpus]"
)
@click.option("--text-column", default="text", show_default=True)
@click.option(
    "--sample-rows", default=2048, show_default=True, help="Most texts per cluster trial; fewer on a slow machine."
)
@click.option(
    "--online-rate", default=2.0, show_default=True, help="Online requests/s during cluster trials; 0: batch only."
)
@click.option(
    "--p99-ms", type=float, default=None, help="Online p99 target. [default: none on CPU (measured only), 200 on GPU]"
)
@click.option("--base", default=None, help="Profile to start from. [default: NAME if it exists, else cpu-local]")
@click.option(
    "--derive",
    type=click.Choice(sorted(GPUS)),
    default=None,
    help="Write a profile derived from this GPU's published figures instead of measuring.",
)
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def tune(name, models, budget_minutes, input_url, text_column, sample_rows, online_rate, p99_ms, base, derive, catalog):
    """Measure this machine and write a tuned profile (or derive one for a GPU with --derive).

    Sweeps token budget and batch cap per model, then worker layout, prefetch,
    item size and models per device on embedded clusters, by coordinate
    search; the chosen settings and every trial's figures go to the file.
    """
    console = Console(stderr=True, soft_wrap=True)
    try:
        names = _columns(models) or ["minilm"]
        if derive:
            fields, comments = derive_gpu(derive, load_catalog(catalog), names)
            path = profile_path(name)
            write_profile(path, {**fields, "name": path.stem}, comments)
            console.print(f"wrote {path} (derived from published {derive} figures)")
            return
        request = TuneRequest(
            name,
            names,
            budget_minutes,
            input_url or DEMO_INPUT,
            text_column,
            catalog,
            base,
            sample_rows,
            online_rate=online_rate,
            p99_ms=p99_ms,
        )
        tune_profile(request, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


@main.command(name="check-precision")
@click.option("--model", required=True, help="Catalog name of the embedder or reranker to check.")
@click.option("--profile", default=None, help="Profile whose choice is checked and where the verdict is written.")
@click.option(
    "--texts",
    "texts_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Your sample: a .parquet file or one text per line. [default: the demo corpus]",
)
@click.option("--text-column", default="text", show_default=True, help="The text column of a .parquet sample.")
@click.option("--sample", default=512, show_default=True, help="Most texts drawn from the sample.")
@click.option(
    "--runtime",
    type=click.Choice(["torch", "onnx"]),
    default=None,
    help="Candidate runtime. [default: the profile's choice, else every candidate]",
)
@click.option(
    "--dtype",
    type=click.Choice(["auto", "float32", "float16", "bfloat16", "int8"]),
    default=None,
    help="Candidate dtype.",
)
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def check_precision(model, profile, texts_file, text_column, sample, runtime, dtype, catalog):
    """Gate a runtime/dtype against fp32 torch: cosine mean >= 0.999 and min >= 0.99 (and nDCG@10 within 0.005)
    for embedders, Kendall tau >= 0.99 for rerankers. With --profile, one candidate's verdict is written into it.
    Exit 1 when a single candidate is refused."""
    from rich.table import Table

    from pipeline.tuning.gate_record import gate_candidates, record_verdict

    console = Console(stderr=True, soft_wrap=True)
    try:
        verdicts, single = gate_candidates(model, profile, catalog, texts_file, text_column, sample, runtime, dtype)
    except (*USER_ERRORS, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    table = Table(title=f"precision gate: {model} against torch float32 on {verdicts[0].texts} texts")
    names = list(dict.fromkeys(name for v in verdicts for name in v.figures))
    for column in ("runtime", "dtype", "load s", "texts/s", "vs fp32", *names, "verdict"):
        table.add_column(column, justify="left" if column in ("runtime", "dtype", "verdict") else "right")
    for v in verdicts:
        table.add_row(
            v.choice.runtime,
            v.choice.dtype,
            f"{v.load_seconds:.2f}",
            f"{v.texts_per_second:.1f}",
            f"{v.texts_per_second / v.reference_texts_per_second:.2f}x",
            *(f"{v.figures[n]:.4f}" if n in v.figures else "-" for n in names),
            "pass" if v.passed else "[red]refused[/red]",
        )
    out = Console(soft_wrap=True)
    out.print(table)
    for v in verdicts:
        if not v.passed:
            out.print(f"{v.choice.runtime} {v.choice.dtype} refused: " + "; ".join(v.failures))
    if single and profile:
        path = record_verdict(profile, verdicts[0], f"check-precision {verdicts[0].summary()}")
        console.print(f"verdict written into {path} (runtimes.{model})")
    if single and not verdicts[0].passed:
        sys.exit(1)
