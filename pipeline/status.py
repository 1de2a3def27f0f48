"""`shoal status`: what a cluster is doing, and where a reindexed output stands.

The cluster side comes from the scheduler plugin's `shoal_overview` handler
(jobs with item states per model, queues, workers and their loaded
models). A job file adds its output's side: `_CURRENT`, the version
directories, the lock holder and the current version's manifest. Jobs live
on the scheduler only while they run; a finished job's record is its manifest.
"""

from __future__ import annotations

import datetime as dt
from typing import TypedDict

from distributed import Client
from rich.console import Console
from rich.table import Table

from ..scheduler_plugins.protocol import Overview
from .cluster import pull_queue
from .jobs.lock import JobLock, LockRecord
from .jobs.manifest import Manifest, read_manifest
from .jobs.reindex import ReindexJob, VersionedOutput


def cluster_state(client: Client, pattern: str | None = None) -> Overview:
    """The scheduler's overview, keeping the jobs whose id contains `pattern` (all if None)."""
    view = client.sync(pull_queue(client).overview)
    view["jobs"] = {job: status for job, status in view["jobs"].items() if pattern is None or pattern in job}
    return view


def render_cluster(view: Overview, console: Console) -> None:
    jobs = Table(title="jobs", show_lines=False)
    for column in ("job", "model", "queued", "leased", "done", "failed", "rows", "elapsed s"):
        jobs.add_column(column, justify="left" if column in ("job", "model") else "right")
    for job, status in sorted(view["jobs"].items()):
        for model, states in sorted(status.get("models", {}).items()):
            jobs.add_row(
                job,
                model,
                str(states.get("queued", 0)),
                str(states.get("leased", 0)),
                str(states.get("done", 0)),
                str(states.get("dead", 0)),
                f"{status['rows_done']:,}/{status['rows_total']:,}",
                f"{status['elapsed']:.0f}",
            )
    console.print(jobs if jobs.row_count else "no running job")
    workers = Table(title="workers")
    for column in ("worker", "loaded models", "leased items", "free model memory"):
        workers.add_column(column, no_wrap=column == "worker")  # an address is never cut, however many models
    for address, info in sorted(view["workers"].items()):
        free = info.get("free_bytes")
        workers.add_row(
            address,
            ", ".join(info.get("loaded") or []) or "-",
            str(view["leased"].get(address, 0)),
            f"{free / 1e6:,.0f} MB" if free is not None else "-",
        )
    console.print(workers if workers.row_count else "no worker has pulled work yet")
    if view["queues"]:
        queues = Table(title="queues")
        for column in ("model", "online", "batch"):
            queues.add_column(column)
        for model, depth in sorted(view["queues"].items()):
            queues.add_row(model, str(depth["online"]), str(depth["batch"]))
        console.print(queues)


class OutputState(TypedDict):
    """A reindexed output as readers and the next run see it."""

    output: str
    current: str | None  # the version _CURRENT names
    versions: list[str]
    lock: LockRecord | None
    manifest: Manifest | None  # the current version's


class StatusState(TypedDict, total=False):
    """What `shoal status` shows (and prints with --json): a job file's output, the cluster's overview."""

    output: OutputState
    cluster: Overview


def output_state(job: ReindexJob) -> OutputState:
    """The reindexed output as readers and the next run see it."""
    layout = VersionedOutput(job.output, job.storage_options)
    current = layout.current()
    lock = JobLock(layout.lock_url, job.storage_options).read()
    manifest = read_manifest(layout.version_url(current), job.storage_options) if current else None
    return {"output": job.output, "current": current, "versions": layout.versions(), "lock": lock, "manifest": manifest}


def render_output(state: OutputState, console: Console) -> None:
    table = Table(title=f"output {state['output']}", show_header=False)
    table.add_row("_CURRENT", state["current"] or "- (no complete version yet)")
    table.add_row("versions", ", ".join(state["versions"]) or "-")
    lock = state["lock"]
    if lock:
        until = dt.datetime.fromtimestamp(lock.get("expires", 0)).isoformat(timespec="seconds")
        table.add_row("lock", f"held by {lock.get('host')} pid {lock.get('pid')} until {until}")
    else:
        table.add_row("lock", "free")
    manifest = state["manifest"]
    if manifest:
        work = manifest.get("work", {})
        table.add_row("last run", f"{manifest['job']} at {manifest['created']}")
        table.add_row("complete", str(manifest["complete"]))
        table.add_row("model", f"{manifest['model']['name']} ({manifest['model']['fingerprint'][:12]})")
        table.add_row(
            "rows / parts / inputs", f"{manifest['rows']:,} / {len(manifest['parts'])} / {len(manifest['inputs'])}"
        )
        if work:
            table.add_row("last run work", f"{work['run']} run, {work['reused']} reused, {work['removed']} removed")
    console.print(table)
