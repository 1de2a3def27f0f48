"""The cluster and online commands: `shoal status`, `serve`, `gateway` and `models`."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console

from ..configs import load_catalog, load_profile
from .cli_options import (
    GATEWAY_PROFILE,
    adapt_option,
    catalog_option,
    json_option,
    listen_options,
    model_names,
    offline_option,
    parse_columns,
    parse_storage_options,
    profile_option,
    scheduler_option,
    storage_options_option,
    user_errors,
)
from .cluster import AdaptRange, connect
from .jobs.reindex import load_job
from .status import StatusState, cluster_state, output_state, render_cluster, render_output


@click.command()
@click.argument("job", required=False)
@scheduler_option("tcp://host:port of the cluster.", envvar="DASK_SCHEDULER_ADDRESS")
@json_option("Print the raw state as JSON.")
@profile_option()
@user_errors()
def status(job: str | None, scheduler: str | None, as_json: bool, profile: str | None) -> None:
    """Show running jobs (item states per model), workers and their loaded models.

    JOB filters the jobs by id. A job file (JOB.yaml) shows that job's runs
    and its output too: _CURRENT, versions, lock holder, last manifest.
    """
    state: StatusState = {}
    pattern = job
    if job and job.endswith((".yaml", ".yml")):
        job_file = load_job(job)
        pattern, scheduler = f"reindex-{job_file.name}-", scheduler or job_file.scheduler
        state["output"] = output_state(job_file)
    elif not scheduler:
        raise click.UsageError("give --scheduler (or DASK_SCHEDULER_ADDRESS), or a job file")
    if scheduler:
        with connect(scheduler, load_profile(profile)) as client:
            state["cluster"] = cluster_state(client, pattern)
    if as_json:
        click.echo(json.dumps(state, indent=1, default=str))
        return
    console = Console(soft_wrap=True)
    if "output" in state:
        render_output(state["output"], console)
    if "cluster" in state:
        render_cluster(state["cluster"], console)


@click.command()
@profile_option(GATEWAY_PROFILE)
@click.option(
    "--models",
    default=None,
    callback=model_names,
    help="Comma-separated models to pin (load at start, never evict) on the embedded cluster.",
)
@listen_options
@scheduler_option("tcp://host:port of a running cluster: the gateway starts in its scheduler.")
@adapt_option
@catalog_option
@storage_options_option
@offline_option
@user_errors()
def serve(
    profile: str | None,
    models: str | None,
    host: str | None,
    port: int | None,
    scheduler: str | None,
    adapt: AdaptRange | None,
    catalog: str | None,
    storage_options: str | None,
) -> None:
    """Answer online requests (MessagePack or JSON over HTTP) until stopped.

    Same workers and queue as batch jobs; online requests go first. SIGINT or
    SIGTERM stops accepting, finishes what is in flight, and exits 0. The
    protocol is in docs/PROTOCOL.md.
    """
    from .serve import serve as run_serve

    console = Console(stderr=True, soft_wrap=True)
    profile_config = load_profile(profile)
    catalog_config = load_catalog(catalog).reading_with(parse_storage_options(storage_options))  # --models s3://…/
    sys.exit(
        run_serve(profile_config, catalog_config, catalog, parse_columns(models), host, port, scheduler, console, adapt)
    )


@click.command(name="gateway")
@scheduler_option("tcp://host:port of the cluster's scheduler.", required=True, envvar="DASK_SCHEDULER_ADDRESS")
@profile_option(GATEWAY_PROFILE)
@listen_options
@catalog_option
@user_errors()
def gateway(scheduler: str, profile: str | None, host: str | None, port: int | None, catalog: str | None) -> None:
    """Serve the online endpoint in this process, for a running cluster.

    The same routes as `shoal serve`, with HTTP handled here instead of in the
    scheduler: run several, behind any load balancer, to serve one cluster.
    Waits for the scheduler if it is not up yet; SIGINT or SIGTERM exits 0.
    """
    from .gateway_process import gateway as run_gateway

    console = Console(stderr=True, soft_wrap=True)
    sys.exit(run_gateway(load_profile(profile), load_catalog(catalog), scheduler, host, port, console))


@click.group(name="models", invoke_without_command=True)
@catalog_option
@click.option("--catalog-only", is_flag=True, help="Only the catalog's entries, not the Hugging Face cache.")
@json_option("Print the rows as JSON.")
@profile_option("Cluster profile name or YAML path (default: auto): its tuned token budgets and batch caps.")
@click.pass_context
@user_errors()
def models(ctx: click.Context, catalog: str | None, catalog_only: bool, as_json: bool, profile: str | None) -> None:
    """List catalog models and cached Hugging Face models with their resolved kind, dim, window, normalize.

    `shoal models pull MODEL` fetches one ahead of its first use.
    """
    if ctx.invoked_subcommand is not None:
        return
    from .model_listing import model_rows, render_models

    rows = model_rows(load_catalog(catalog), load_profile(profile), include_cache=not catalog_only)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    else:
        render_models(rows, Console(soft_wrap=True))


@models.command(name="pull")
@click.argument("model")
@click.option("--revision", default=None, help="Hugging Face ids: a branch, tag or commit. [default: main]")
@storage_options_option
@catalog_option
@user_errors()
def pull_model(model: str, revision: str | None, storage_options: str | None, catalog: str | None) -> None:
    """Fetch MODEL ahead of its first use and print what was fetched: a Hugging Face id (ORG/NAME) into the
    Hugging Face cache, a folder in object storage (s3://…, any fsspec URL) into the Shoal cache, or a catalog
    name's source. Needs the network (HF_HUB_OFFLINE unset)."""
    from .model_pull import pull

    pull(model, revision, load_catalog(catalog), parse_storage_options(storage_options), Console(soft_wrap=True))
