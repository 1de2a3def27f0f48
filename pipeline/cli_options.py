"""What the `shoal` commands share: their common options, the parsing of option values, and the user-error exit.

Each option is declared once here with its help text; a command stacks the
ones it takes (`cluster_options` is the usual trio or quartet). Options show
in `--help` in the order they are stacked, so a group of them is one decorator
that applies its parts in order.

`user_errors` turns the errors a user can fix (a bad profile, catalog, job
file, plan or scheduler address) into one red line on stderr and exit 2;
any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console

from ..configs import ConfigError
from ..configs.hub import OFFLINE_ENV
from ..scheduler_plugins.protocol import StorageOptions
from ..workers.data.chunking import ChunkSettings
from .cluster import AdaptRange, ClusterError
from .jobs.planner import PlanError

F = TypeVar("F", bound=Callable[..., Any])

USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, PlanError, ClusterError)
"""What a user can fix; exit 2. Anything else is a bug."""


@contextmanager
def user_errors(*also: type[Exception]) -> Iterator[None]:
    """Exit 2 with `error: <message>` on stderr for USER_ERRORS (and `also`).

    A decorator of a whole command (`@user_errors()`), or `with user_errors(...):`
    around the part of one that checks its input.
    """
    try:
        yield
    except (*USER_ERRORS, *also) as exc:
        print_error(exc)
        sys.exit(2)


def print_error(exc: Exception) -> None:
    """`error: <message>` on stderr, unwrapped (a long path stays on one line)."""
    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {exc}")


def stack(*decorators: Callable[[Any], Any]) -> Callable[[F], F]:
    """One decorator applying `decorators` as if written one above the other, in this order."""

    def apply(function: F) -> F:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


# -- the cluster a command runs on ----------------------------------------------

EMBEDDED_CLUSTER = "tcp://host:port of a running cluster; default: an embedded one."
DEFAULT_PROFILE = "Cluster profile name or YAML path (default: auto, read off this machine)."
GATEWAY_PROFILE = (
    "Cluster profile name or YAML path (default: auto, read off this machine); its `gateway:` section sets the limits."
)


def scheduler_option(help: str = EMBEDDED_CLUSTER, **kwargs: Any) -> Callable[[F], F]:
    """--scheduler; `kwargs` as click.option's (envvar, required)."""
    if not kwargs.get("required"):
        kwargs.setdefault("default", None)
    return click.option("--scheduler", help=help, **kwargs)


def profile_option(help: str = DEFAULT_PROFILE) -> Callable[[F], F]:
    return click.option("--profile", default=None, help=help)


catalog_option = click.option(
    "--catalog", default=None, type=click.Path(exists=True, dir_okay=False), help="Extra model catalog YAML."
)
storage_options_option = click.option(
    "--storage-options", default=None, help="JSON object passed to fsspec (credentials, endpoint)."
)


def _start_stages(ctx: click.Context, param: click.Parameter, verbose: bool) -> None:
    from .jobs.stages import STAGES

    STAGES.start(verbose)


verbose_option = click.option(
    "--verbose",
    is_flag=True,
    expose_value=False,
    callback=_start_stages,
    help="At the end, print the seconds of each stage: imports, cluster start, plan, first item, last ack, stop.",
)


def _go_offline(ctx: click.Context, param: click.Parameter, offline: bool) -> None:
    if offline:  # read at call time by configs/hub.py, and passed on to an embedded cluster's workers
        os.environ[OFFLINE_ENV] = "1"


offline_option = click.option(
    "--offline",
    is_flag=True,
    expose_value=False,
    callback=_go_offline,
    help="Download nothing: a Hugging Face id must be in the local cache (as HF_HUB_OFFLINE=1).",
)


def parse_adapt(ctx: click.Context, param: click.Parameter, value: str | None) -> AdaptRange | None:
    if value is None:
        return None
    try:
        return AdaptRange.parse(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


adapt_option = click.option(
    "--adapt",
    metavar="MIN:MAX",
    default=None,
    callback=parse_adapt,
    help="Embedded cluster: start and retire worker processes between MIN and MAX as the queue needs "
    "(Dask's adaptive scaling); MIN 0 keeps none while idle.",
)


def cluster_options(*, storage: bool = False) -> Callable[[F], F]:
    """--scheduler (default: an embedded cluster), --adapt, --storage-options if `storage`, --profile, --catalog,
    --offline, --verbose."""
    return stack(
        scheduler_option(),
        adapt_option,
        *([storage_options_option] if storage else []),
        profile_option(),
        catalog_option,
        offline_option,
        verbose_option,
    )


# -- the rows of a batch job ------------------------------------------------------

text_column_option = click.option("--text-column", default="text", show_default=True)
passthrough_options = stack(
    click.option("--id-column", default="id", show_default=True, help="Passed through unchanged; '' for none."),
    click.option("--keep-columns", default="", help="Comma-separated input columns to copy to the output."),
)
"""--id-column and --keep-columns: what a job's output carries over from its input."""


# -- the online endpoint ------------------------------------------------------------

listen_options = stack(
    click.option(
        "--host", default=None, help="Address to listen on. Default: the profile's, 127.0.0.1 (loopback only)."
    ),
    click.option(
        "--port", type=int, default=None, help="Port to listen on (0: any free one). Default: the profile's, 8790."
    ),
)


def json_option(help: str) -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


# -- option values ------------------------------------------------------------------


def parse_columns(value: str | None) -> list[str]:
    """A comma-separated list, each name once (`--model minilm,minilm` is one job, not two into one folder)."""
    return list(dict.fromkeys(c.strip() for c in (value or "").split(",") if c.strip()))


def model_names(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """The callback of every --model/--models/--reranker option: a given value must name a model.

    A blank one (`''`, `' '`, `','`) is a usage error (exit 2) naming the
    option, not a model folder '' (the working directory) or an empty list.
    """
    if value is not None and not parse_columns(value):
        raise click.BadParameter(f"{value!r} names no model; give a catalog name, model folder or Hugging Face id")
    return value


def parse_chunk(value: str | None) -> ChunkSettings | None:
    """--chunk tokens=N[,overlap=K]; a bad value is a usage error naming the option."""
    if not value:
        return None
    try:
        return ChunkSettings.parse(value)
    except ValueError as exc:  # pydantic's ValidationError is one
        reasons = "; ".join(e["msg"] for e in exc.errors()) if isinstance(exc, ValidationError) else str(exc)
        raise click.BadParameter(reasons, param_hint="--chunk") from None


def parse_storage_options(value: str | None) -> StorageOptions:
    """--storage-options: a JSON object, or {} when not given."""
    if not value:
        return {}
    try:
        options = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise click.BadParameter("must be a JSON object")
    return options
