"""Running a batch job: plan, submit to the pull queue, follow, write the manifest."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from distributed import Client
from rich.console import Console

from configs import Catalog, ConfigError, Profile

from .fingerprints import model_fingerprint
from .follower import follow, summarize
from .manifest import build_manifest, write_manifest
from .planner import Plan, check_columns, list_shards, plan_items, read_footers


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
        return 1 if self.status["failed"] else 0


def plan_embed(request: EmbedRequest, profile: Profile) -> Plan:
    shards = list_shards(request.input, request.storage_options)
    read_footers(shards, request.storage_options)
    check_columns(shards, [request.text_column, *filter(None, [request.id_column]), *request.keep_columns])
    payload = {
        "text_column": request.text_column,
        "id_column": request.id_column,
        "keep_columns": request.keep_columns,
    }
    items = plan_items(shards, request.output, profile.rows_per_item, request.model, "embed", payload)
    return Plan(shards, items)


def run_embed(
    client: Client, request: EmbedRequest, profile: Profile, catalog: Catalog, console: Console
) -> JobOutcome:
    spec = profile.tuned(catalog.get(request.model))
    if spec.kind != "embedder":
        raise ConfigError(f"model {spec.name!r} is a {spec.kind}, not an embedder")
    fingerprint = model_fingerprint(spec)
    plan = plan_embed(request, profile)
    job = f"embed-{uuid.uuid4().hex[:12]}"
    client.sync(
        client.scheduler.shoal_submit,
        job=job,
        items=plan.items,
        settings={
            "lease_seconds": profile.lease_seconds,
            "max_attempts": profile.max_attempts,
            "models": {request.model: spec.model_dump()},
            "context": {"storage_options": request.storage_options},
            "client": client.id,
        },
    )
    try:
        status = follow(client, job, console, f"embed {request.model}")
    finally:
        client.sync(client.scheduler.shoal_job_release, job=job)
    manifest = build_manifest(
        job,
        "embed",
        {
            "name": spec.name,
            "fingerprint": fingerprint,
            "dim": spec.dim,
            "normalize": spec.normalize,
            "max_seq_length": spec.max_seq_length,
        },
        {"text": request.text_column, "id": request.id_column, "keep": request.keep_columns},
        plan.shards,
        status["results"],
        status["dead_letters"],
    )
    manifest_url = write_manifest(request.output, manifest, request.storage_options)
    summarize(status, console, request.output)
    return JobOutcome(job, status, manifest, manifest_url)
