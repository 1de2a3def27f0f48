"""A cluster of `dask` CLI processes, started as the README starts one (integration tests only: it starts processes)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.support.paths import DASK
from tests.support.processes import Processes
from tests.support.waiting import wait_for


def wait_for_address(scheduler_file: Path, timeout: float = 60) -> str:
    """The address a `dask scheduler` wrote to its `--scheduler-file`, once it has."""
    wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size, timeout, "dask scheduler to start", 0.2)
    return json.loads(scheduler_file.read_text())["address"]


@contextmanager
def dask_cli_cluster(
    folder: Path,
    profile: Path | str | None = None,
    *,
    workers: int = 1,
    port: int = 0,
    plugins: bool = True,
    scheduler_args: Sequence[str] = (),
    worker_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    tag: str = "",
) -> Iterator[tuple[str, Processes]]:
    """`dask scheduler` (with `--preload shoal.scheduler_plugins` unless not `plugins`) on 127.0.0.1:`port` and, when
    `workers`, one `dask worker --nworkers workers --preload shoal.workers --shoal-profile profile` (no
    `--shoal-profile` when `profile` is None: the workers' own `auto`), as in the README.

    Yields the scheduler address and the processes, scheduler first (`procs.start` more: they are stopped
    first); on exit every one still running is stopped, with what it started. `env` is laid over this
    process's environment; `tag` names the scheduler file in `folder`, for more than one cluster there.
    """
    scheduler_file = folder / f"scheduler{'-' + tag if tag else ''}.json"
    environment = {**os.environ, **(env or {})}
    quiet: dict[str, Any] = {"env": environment, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = [DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"]
    scheduler += [
        "--scheduler-file",
        str(scheduler_file),
        *(["--preload", "shoal.scheduler_plugins"] if plugins else []),
    ]
    with Processes() as procs:
        procs.start([*scheduler, *scheduler_args], **quiet)
        address = wait_for_address(scheduler_file)
        if workers:
            # The address comes first: dask passes the options it does not know to the preload.
            worker = [DASK, "worker", address, "--nthreads", "1", "--nworkers", str(workers), *worker_args]
            worker += [
                "--preload",
                "shoal.workers",
                *(["--shoal-profile", str(profile)] if profile is not None else []),
            ]
            procs.start(worker, **quiet)
        yield address, procs
