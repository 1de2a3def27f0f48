"""Following a job: a progress bar while it runs, a summary when it ends."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from distributed import Client
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table

from ...scheduler_plugins.protocol import JobStatus, WorkerSummary
from ..cluster import pull_queue
from .stages import STAGES

POLL_SECONDS = 0.5
LAST_POLL_SECONDS = 0.05  # near the end the poll tightens: the command ends within this of the last ack
NO_WORKER_WARNING_SECONDS = 30


def job_status(client: Client, job: str, results: bool = False) -> JobStatus:
    return client.sync(pull_queue(client).job_status, job, results)


def follow(client: Client, job: str, console: Console, label: str) -> JobStatus:
    """Poll the scheduler until the job completes; the final status has results."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} rows"),
        TextColumn("{task.fields[rate]:,.0f} rows/s"),
        TextColumn("{task.fields[failed]}"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        status = job_status(client, job)
        task = progress.add_task(label, total=max(status["rows_total"], 1), rate=0.0, failed="")
        first_seen = bool(status["rows_done"])
        warned = False
        while not status["complete"]:
            time.sleep(poll_seconds(status))
            status = job_status(client, job)
            if status["rows_done"] and not first_seen:
                first_seen = True
                STAGES.mark("first item")
            # Asked only while nothing is done: the overview lists every worker and job.
            idle = not status["rows_done"] and status["elapsed"] > NO_WORKER_WARNING_SECONDS
            if not warned and idle and not _pulling_workers(client):
                progress.console.print(
                    "[yellow]warning:[/yellow] no Shoal worker has asked for work; were the "
                    "workers started with `--preload shoal.workers`?"
                )
                warned = True
            rate = status["rows_done"] / status["elapsed"] if status["elapsed"] else 0.0
            failed = f"[red]{status['failed']} failed parts" if status["failed"] else ""
            progress.update(task, completed=status["rows_done"], rate=rate, failed=failed)
        STAGES.mark("last ack")
        final = job_status(client, job, results=True)
        rate = final["rows_done"] / final["elapsed"] if final["elapsed"] else 0.0
        progress.update(
            task, completed=final["rows_done"], total=max(final["rows_total"], final["rows_done"], 1), rate=rate
        )
    return final


def poll_seconds(status: JobStatus) -> float:
    """POLL_SECONDS, shortened to the time the rows left should take at the rate so far (LAST_POLL_SECONDS at least)."""
    done, elapsed = status["rows_done"], status["elapsed"]
    if not done or not elapsed:
        return POLL_SECONDS
    remaining = (status["rows_total"] - done) * elapsed / done
    return min(POLL_SECONDS, max(LAST_POLL_SECONDS, remaining))


def _pulling_workers(client: Client) -> dict[str, WorkerSummary]:
    return client.sync(pull_queue(client).overview)["workers"]


def summarize(status: JobStatus, console: Console, output: str, chosen: Sequence[tuple[str, str]] = ()) -> None:
    """The job's figures, and (`chosen`) what ran it and why."""
    results = status.get("results", [])
    seconds = status["elapsed"]
    table = Table(title="shoal: job summary", show_header=False)
    table.add_row("rows", f"{status['rows_done']:,}")
    table.add_row("parts", f"{len(results):,}")
    table.add_row("failed parts", f"{status['failed']:,}")
    table.add_row("seconds", f"{seconds:.1f}")
    table.add_row("rows/s", f"{status['rows_done'] / seconds:,.1f}" if seconds else "-")
    for worker, rows in sorted(status["rows_by_worker"].items()):
        table.add_row(f"rows on {worker}", f"{rows:,}")
    for key, label in (
        ("null_texts", "null texts (null embedding)"),
        ("null_images", "null images (null embedding)"),
        ("empty_texts", "empty texts"),
        ("truncated", "texts truncated to max_seq_length"),
    ):
        count = sum(cast("dict[str, int]", r).get(key, 0) for r in results)  # an ItemResult's text counts
        if count:
            table.add_row(label, f"{count:,}")
    table.add_row("output", output)
    for label, why in chosen:
        table.add_row(label, why)
    console.print(table)
    for letter in status["dead_letters"]:
        payload = letter["payload"]
        where = payload["input"]
        if payload.get("row_range") and payload.get("row_groups") is not None:
            where += f" rows {payload['row_range'][0]}-{payload['row_range'][1]}"
        console.print(f"[red]failed:[/red] {where} after {letter['attempts']} attempt(s): {letter['errors'][-1]}")
