"""A `shoal` command, run in a process of its own (`run_shoal`) or in this one (`invoke_shoal`), and its arguments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from tests.support.paths import SHOAL
from tests.support.processes import run


def run_shoal(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The `shoal` command in a process (and session) of its own, stopped with what it started however it ends;
    `env` is laid over this process's environment."""
    return run([SHOAL, *args], timeout=timeout, env={**os.environ, **(env or {})})


def invoke_shoal(*args: str) -> subprocess.CompletedProcess:
    """The `shoal` CLI run in this process: what `run_shoal` returns, without a process start per call."""
    from click.testing import CliRunner

    from shoal.pipeline.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(["shoal", *args], result.exit_code, result.stdout, result.stderr)


def embed_args(
    source: Path | str,
    output: Path | str,
    catalog: Path | str,
    *extra: str,
    scheduler: str | None = None,
    profile: Path | str | None = None,
    model: str = "tiny",
) -> list[str]:
    """The arguments of a `shoal embed` of `source` into `output` with `model` of `catalog`, on `scheduler`
    with `profile` where given, then `extra`: for `run_shoal(*embed_args(...))` or `invoke_shoal`."""
    return ["embed", str(source), str(output), "--model", model, *shoal_options(catalog, scheduler, profile), *extra]


def shoal_options(catalog: Path | str, scheduler: str | None = None, profile: Path | str | None = None) -> list[str]:
    """A `shoal` command's `--catalog`, and `--scheduler` and `--profile` where given."""
    options = ["--catalog", str(catalog)]
    if scheduler is not None:
        options += ["--scheduler", scheduler]
    if profile is not None:
        options += ["--profile", str(profile)]
    return options


def reindex_job(source: Path | str, output: Path | str, catalog: Path | str, scheduler: str, /, **fields: Any) -> dict:
    """A `shoal reindex` job (write it with `yaml.safe_dump`): job `docs` from `source` into `output` with
    model `tiny` of `catalog` on `scheduler`, its lock settling in 0.1 s; `fields` added or laid over."""
    job = {"name": "docs", "input": str(source), "output": str(output), "model": "tiny", "catalog": str(catalog)}
    return {**job, "scheduler": scheduler, "lock": {"settle_seconds": 0.1}, **fields}
