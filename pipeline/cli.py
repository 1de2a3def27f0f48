"""The `shoal` command line."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import click  # noqa: E402
from rich.console import Console  # noqa: E402

from configs import ConfigError, load_catalog, load_profile  # noqa: E402

from .batch_jobs import EmbedRequest, model_for, run_embed  # noqa: E402
from .cluster import ClusterError, connect  # noqa: E402
from .planner import PlanError  # noqa: E402
from .rerank_jobs import DEFAULT_MAX_CANDIDATES, RerankRequest, run_rerank  # noqa: E402
from .beir import load_beir  # noqa: E402
from .evaluation import print_report, run_eval  # noqa: E402
from .job_spec import load_job_spec  # noqa: E402
from .runs import run_pipeline  # noqa: E402

USER_ERRORS = (ConfigError, PlanError, ClusterError)


def _columns(value: str | None) -> list[str]:
    return [c.strip() for c in (value or "").split(",") if c.strip()]


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


@click.group()
@click.version_option(package_name="shoal")
def main() -> None:
    """Shoal: many small embedding and reranking models on one Dask cluster."""


@main.command()
@click.argument("input_url", metavar="INPUT")
@click.argument("output_url", metavar="OUTPUT")
@click.option("--model", required=True, help="Catalog name of the embedding model.")
@click.option("--text-column", default="text", show_default=True)
@click.option("--id-column", default="id", show_default=True, help="Passed through unchanged; '' for none.")
@click.option("--keep-columns", default="", help="Comma-separated input columns to copy to the output.")
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--storage-options", default=None, help="JSON object passed to fsspec (credentials, endpoint).")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def embed(input_url, output_url, model, text_column, id_column, keep_columns, scheduler, storage_options, profile, catalog):
    """Embed the TEXT column of every row of INPUT into Parquet parts under OUTPUT.

    INPUT is a Parquet file, a directory or a glob on any fsspec filesystem
    (local, s3://, gs://…); OUTPUT is a directory there.
    """
    console = Console(stderr=True, soft_wrap=True)
    try:
        profile_config = load_profile(profile)
        catalog_config = load_catalog(catalog)
        catalog_config.get(model)
        request = EmbedRequest(
            input=input_url,
            output=output_url,
            model=model,
            text_column=text_column,
            id_column=id_column or None,
            keep_columns=_columns(keep_columns),
            storage_options=_storage_options(storage_options),
        )
        with connect(scheduler, profile_config, catalog) as client:
            outcome = run_embed(client, request, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(outcome.exit_code)


@main.command()
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local); its `gateway:` section sets the limits.")
@click.option("--models", default="", help="Comma-separated models to pin (load at start, never evict) on the embedded cluster.")
@click.option("--host", default=None, help="Address to listen on. Default: the profile's, 127.0.0.1 (loopback only).")
@click.option("--port", type=int, default=None, help="Port to listen on (0: any free one). Default: the profile's, 8790.")
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster: the gateway starts in its scheduler.")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def serve(profile, models, host, port, scheduler, catalog):
    """Answer online requests (MessagePack or JSON over HTTP) until stopped.

    Same workers and queue as batch jobs; online requests go first. SIGINT or
    SIGTERM stops accepting, finishes what is in flight, and exits 0. The
    protocol is in docs/PROTOCOL.md.
    """
    from .serve import serve as run_serve

    console = Console(stderr=True, soft_wrap=True)
    try:
        code = run_serve(
            load_profile(profile), load_catalog(catalog), catalog, _columns(models), host, port, scheduler, console
        )
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(code)


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
@click.option("--max-candidates", default=DEFAULT_MAX_CANDIDATES, show_default=True, help="Rows with more candidates are rejected.")
@click.option("--scheduler", default=None, help="tcp://host:port of a running cluster; default: an embedded one.")
@click.option("--storage-options", default=None, help="JSON object passed to fsspec (credentials, endpoint).")
@click.option("--profile", default=None, help="Cluster profile name or YAML path (default: cpu-local).")
@click.option("--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML.")
def rerank(input_url, output_url, model, query_column, passage_column, candidates_column, candidate_ids_column,
           id_column, keep_columns, max_candidates, scheduler, storage_options, profile, catalog):
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
        with connect(scheduler, profile_config, catalog) as client:
            outcome = run_rerank(client, request, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    sys.exit(outcome.exit_code)


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
        with connect(scheduler, profile_config, catalog) as client:
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
@click.option("--output", default=None, help="Where inputs, stage outputs and metrics.json go. [default: out/eval-<dataset>]")
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
        with connect(scheduler, profile_config, catalog) as client:
            report, outcome = run_eval(client, data, output or f"out/eval-{data.name}", model, reranker, top_k,
                                       rerank_k, profile_config, catalog_config, console)
    except USER_ERRORS as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    print_report(report, Console(soft_wrap=True))
    sys.exit(outcome.exit_code)
