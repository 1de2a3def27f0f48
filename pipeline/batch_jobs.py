"""Running a batch job: plan, submit to the pull queue, follow, write the manifest.

Every operation (embed, rerank) goes through the same path: a `BatchJob`
says what differs (the operation, its payload, the columns it needs), and
`run_job` plans, submits, follows, releases and writes the manifest.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from distributed import Client
from rich.console import Console

from configs import Catalog, ConfigError, ModelSpec, Profile

from .fingerprints import model_fingerprint
from .follower import follow, summarize
from .manifest import build_manifest, write_manifest
from .planner import Plan, check_columns, list_shards, plan_items, read_footers

SHOWN_REJECTIONS = 10


@dataclass
class BatchJob:
    """One submission: what every operation's job has, plus its own payload."""

    operation: str
    input: str
    output: str
    model: str
    payload: dict[str, Any]  # the operation's options, copied into every item
    required_columns: list[str]
    manifest_columns: dict[str, Any]
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class EmbedRequest:
    input: str
    output: str
    model: str
    text_column: str = "text"
    id_column: str | None = "id"
    keep_columns: list[str] = field(default_factory=list)
    storage_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobOutcome:
    job: str
    status: dict[str, Any]
    manifest: dict[str, Any]
    manifest_url: str

    @property
    def exit_code(self) -> int:
        return 1 if self.status["failed"] or self.manifest["rejected_rows"] else 0


def model_for(catalog: Catalog, profile: Profile, name: str, kind: str) -> ModelSpec:
    """The catalog entry with the profile's tuning, refused if it is the wrong kind."""
    spec = profile.tuned(catalog.get(name))
    if spec.kind != kind:
        raise ConfigError(f"model {spec.name!r} is of kind {spec.kind!r}; this job needs a model of kind {kind!r}")
    return spec


def plan_job(job: BatchJob, profile: Profile) -> Plan:
    shards = list_shards(job.input, job.storage_options)
    read_footers(shards, job.storage_options)
    check_columns(shards, job.required_columns)
    items = plan_items(shards, job.output, profile.rows_per_item, job.model, job.operation, job.payload)
    return Plan(shards, items)


def run_job(client: Client, job: BatchJob, spec: ModelSpec, profile: Profile, console: Console) -> JobOutcome:
    fingerprint = model_fingerprint(spec)
    plan = plan_job(job, profile)
    job_id = f"{job.operation}-{uuid.uuid4().hex[:12]}"
    client.sync(
        client.scheduler.shoal_submit,
        job=job_id,
        items=plan.items,
        settings={
            "lease_seconds": profile.lease_seconds,
            "max_attempts": profile.max_attempts,
            "models": {job.model: spec.model_dump()},
            "context": {"storage_options": job.storage_options},
            "client": client.id,
        },
    )
    try:
        status = follow(client, job_id, console, f"{job.operation} {job.model}")
    finally:
        client.sync(client.scheduler.shoal_job_release, job=job_id)
    manifest = build_manifest(
        job_id,
        job.operation,
        {
            "name": spec.name,
            "fingerprint": fingerprint,
            "dim": spec.dim,
            "normalize": spec.normalize,
            "max_seq_length": spec.max_seq_length,
        },
        job.manifest_columns,
        plan.shards,
        status["results"],
        status["dead_letters"],
    )
    rejections = [message for result in status["results"] for message in result.get("rejections", [])]
    manifest["rejected_rows"] = sum(result.get("rejected", 0) for result in status["results"])
    manifest["rejected"] = sorted(rejections)
    manifest_url = write_manifest(job.output, manifest, job.storage_options)
    summarize(status, console, job.output)
    _report_rejections(manifest, console)
    return JobOutcome(job_id, status, manifest, manifest_url)


def _report_rejections(manifest: dict[str, Any], console: Console) -> None:
    for message in manifest["rejected"][:SHOWN_REJECTIONS]:
        console.print(f"[red]rejected row:[/red] {message}")
    hidden = manifest["rejected_rows"] - min(len(manifest["rejected"]), SHOWN_REJECTIONS)
    if hidden:
        console.print(f"[red]… and {hidden} more rejected rows[/red] (up to 20 per part are listed in _manifest.json)")


def embed_job(request: EmbedRequest) -> BatchJob:
    return BatchJob(
        operation="embed",
        input=request.input,
        output=request.output,
        model=request.model,
        payload={
            "text_column": request.text_column,
            "id_column": request.id_column,
            "keep_columns": request.keep_columns,
        },
        required_columns=[request.text_column, *filter(None, [request.id_column]), *request.keep_columns],
        manifest_columns={"text": request.text_column, "id": request.id_column, "keep": request.keep_columns},
        storage_options=request.storage_options,
    )


def plan_embed(request: EmbedRequest, profile: Profile) -> Plan:
    return plan_job(embed_job(request), profile)


def run_embed(
    client: Client, request: EmbedRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = model_for(catalog, profile, request.model, "embedder")
    return run_job(client, embed_job(request), spec, profile, console)
