"""The `shoal` command line: the `main` group, and the commands it gathers.

The commands live by group in `cli_batch` (embed, rerank, reindex, run,
eval), `cli_classify` (classify, extract), `cli_online` (status, serve,
gateway, models) and `cli_tuning` (tune, check-precision); the options
several of them share, and the user-error exit (code 2), in `cli_options`. Exit codes: 0 done, 1 failed parts or
rejected rows, 2 a user error, 3 a reindex whose lock another run holds,
130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Before anything imports tokenizers: its thread pool stays off (the library warns, and can hang, when a
# process forks after the pool has run; the embedded cluster starts worker processes). A Hub id that is not
# cached is downloaded unless HF_HUB_OFFLINE is set, or --offline given (configs/hub.py).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import click  # noqa: E402
from rich.console import Console  # noqa: E402

from . import cli_batch, cli_classify, cli_online, cli_tuning  # noqa: E402


class _Interruptible(click.Group):
    """Ctrl-C ends a command with 130 (128 + SIGINT), as shells expect, never 1 (the code of failed parts)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            resumable = ctx.invoked_subcommand in cli_batch.RESUMABLE
            hint = ": the parts already written are kept, and the same command resumes" if resumable else ""
            Console(stderr=True).print(f"[yellow]interrupted[/yellow]{hint}")
            sys.exit(130)


@click.group(cls=_Interruptible)
@click.version_option(package_name="shoal")
def main() -> None:
    """Shoal: many small embedding and reranking models on one Dask cluster."""


for _command in (
    cli_batch.embed,
    cli_batch.rerank,
    cli_classify.classify,
    cli_classify.extract,
    cli_batch.reindex,
    cli_batch.run_job_file,
    cli_batch.evaluate,
    cli_online.status,
    cli_online.serve,
    cli_online.gateway,
    cli_online.models,
    cli_tuning.tune,
    cli_tuning.check_precision,
):
    main.add_command(_command)
