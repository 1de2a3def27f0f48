"""`shoal reindex job.yaml`: keep an embedded (or classified) output in step with its inputs and model.

Output layout::

    OUTPUT/_CURRENT          the name of the version directory readers use ("v-1a2b3c4d5e6f")
    OUTPUT/_lock.json        the run lock (pipeline/jobs/lock.py)
    OUTPUT/v-<12 hex>/       parts and _manifest.json of one version

A version is the model fingerprint plus the options that change the vectors
(text, id and kept columns, chunking, precision and dimension). A run for the current version redoes only new
and changed shards and removes the parts of removed shards, in place (the
resume path). A run after a model or option change builds the new version's
directory beside the current one and rewrites ``_CURRENT`` only once that
version is complete, so a reader that resolves ``_CURRENT`` first never sees
two models' vectors mixed. The version ``_CURRENT`` named before a switch is
kept (readers may still be on it) unless `keep_previous` is false; every
other version directory is deleted after a switch.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.console import Console

from ...configs import Catalog, ConfigError, ModelSpec, Profile, explain, load_catalog, load_profile, read_yaml
from ...configs.fingerprints import model_fingerprint
from ...configs.kinds import for_command, kind_of
from ...configs.kinds.token_classifier import Aggregation
from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.chunking import ChunkSettings
from ...workers.data.storage import atomic_write, open_fs
from ...workers.data.vector_precision import Precision, VectorFormat
from ..cluster import AdaptRange, connect
from .classify import ClassifyRequest, Operation, check_classify_options, classify_job
from .embed import COMMAND as EMBED
from .embed import EmbedRequest, check_embed_options, embed_job, with_images
from .engine import BatchJob, JobOutcome, PreparedJob, model_for, prepare_job, run_prepared
from .lance_output import LanceTarget
from .lock import JobLock, LockHeld
from .resume import job_params

CURRENT = "_CURRENT"
LOCK = "_lock.json"
VERSION_PREFIX = "v-"
REINDEXED = (*for_command(EMBED), *for_command("classify"), *for_command("extract"))  # the kinds a reindex runs
SHOWN_SHARDS = 20


class Columns(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = "text"
    id: str | None = "id"
    keep: list[str] = Field(default_factory=list)
    image: str | None = None  # an image model's column of image bytes or URIs (else INPUT's image files, or texts)


class LockSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expiry_seconds: float = Field(default=300.0, gt=0)
    settle_seconds: float = Field(default=1.0, ge=0)


class ReindexJob(BaseModel):
    """A job file: what to keep embedded (or classified, by the model's kind), where, with what."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    input: str
    # None: by each file's name (an image model's INPUT of image files: images)
    input_format: Literal["parquet", "jsonl", "csv", "images"] | None = None
    output: str
    model: str
    columns: Columns = Field(default_factory=Columns)
    chunk: ChunkSettings | None = None  # {tokens: N, overlap: K}: windows instead of truncation
    precision: Precision = "float32"
    dim: int | None = Field(default=None, gt=0)
    top_k: int | None = Field(default=None, gt=0)  # a sparse model's largest terms per row
    input_type: Literal["query", "document"] | None = None  # a multi-vector model's encoding (document)
    max_image_pixels: int | None = Field(default=None, gt=0)  # an image model's: more is a row's rejection
    # A classifier's (shoal classify and extract: pipeline/jobs/classify.py); top_k is a sequence classifier's too.
    threshold: float | None = None
    labels: list[str] = Field(default_factory=list)
    template: str | None = None
    multi_label: bool = False
    aggregation: Aggregation | None = None
    format: Literal["parquet", "lance"] = "parquet"  # lance: OUTPUT is a Lance dataset, a version per changed run
    storage_options: StorageOptions = Field(default_factory=dict)
    profile: str | None = None
    catalog: str | None = None
    scheduler: str | None = None
    lock: LockSettings = Field(default_factory=LockSettings)
    keep_previous: bool = True

    def request(self, output: str) -> EmbedRequest:
        return EmbedRequest(
            input=self.input,
            output=output,
            model=self.model,
            text_column=self.columns.text,
            id_column=self.columns.id or None,
            keep_columns=self.columns.keep,
            storage_options=self.storage_options,
            chunk=self.chunk,
            vectors=VectorFormat(precision=self.precision, dim=self.dim),
            lance=LanceTarget.at(self.output).dataset if self.format == "lance" else None,
            input_format=self.input_format,
            top_k=self.top_k,
            input_type=self.input_type,
            image_column=self.columns.image,
            max_image_pixels=self.max_image_pixels,
        )

    def batch_job(self, output: str, spec: ModelSpec) -> BatchJob:
        """The job into `output` by the model's kind, its options checked: an embed or a classifier's."""
        kind = kind_of(spec)
        classifying = {"threshold", "labels", "template", "multi_label", "aggregation"} & self.model_fields_set
        if kind.command != EMBED:
            embedding = {"precision", "dim", "input_type"} & self.model_fields_set
            if embedding:
                raise ConfigError(f"{', '.join(sorted(embedding))}: options of an embedding, not of {spec.kind!r}")
            request = ClassifyRequest(
                **{k: v for k, v in vars(self.request(output)).items() if k in CLASSIFY_SHARED},
                operation=cast(Operation, kind.command),
                top_k=self.top_k,
                threshold=self.threshold,
                labels=self.labels,
                template=self.template,
                multi_label=self.multi_label,
                aggregation=self.aggregation,
            )
            check_classify_options(request, spec)
            return classify_job(request)
        if classifying:
            raise ConfigError(f"{', '.join(sorted(classifying))}: options of a classifier, not of {spec.kind!r}")
        check_embed_options(self.request(output), spec)
        return embed_job(with_images(self.request(output), spec), kind.operation)


# What an embed request and a classifier's share: where rows come from and go, and the columns they carry.
CLASSIFY_SHARED = (
    "input",
    "output",
    "model",
    "text_column",
    "id_column",
    "keep_columns",
    "storage_options",
    "chunk",
    "lance",
    "input_format",
)


def load_job(path: str | os.PathLike) -> ReindexJob:
    """The job file, validated; `name` defaults to the file's stem, paths are relative to it."""
    path = Path(path)
    data = read_yaml(path)
    data.setdefault("name", path.stem)
    for key in ("profile", "catalog"):
        value = data.get(key)
        if isinstance(value, str) and value.endswith((".yaml", ".yml")) and not os.path.isabs(value):
            data[key] = str(path.parent / value)
    try:
        return ReindexJob(**data)
    except ValidationError as exc:
        raise explain(path, exc) from None


def version_name(fingerprint: str, params: str) -> str:
    return VERSION_PREFIX + hashlib.sha256(f"{fingerprint}|{params}".encode()).hexdigest()[:12]


class VersionedOutput:
    """OUTPUT/_CURRENT and the version directories beside it."""

    def __init__(self, url: str, storage_options: StorageOptions | None = None) -> None:
        self.url = url.rstrip("/")
        self.storage_options = storage_options
        self.fs, path = open_fs(self.url, storage_options)
        self.path = path.rstrip("/")

    def version_url(self, version: str) -> str:
        return f"{self.url}/{version}"

    @property
    def lock_url(self) -> str:
        return f"{self.url}/{LOCK}"

    def current(self) -> str | None:
        try:
            return self.fs.cat_file(f"{self.path}/{CURRENT}").decode().strip() or None
        except FileNotFoundError:
            return None

    def switch(self, version: str) -> None:
        atomic_write(f"{self.url}/{CURRENT}", f"{version}\n".encode(), self.storage_options)

    def versions(self) -> list[str]:
        self.fs.invalidate_cache(self.path)
        try:
            entries = self.fs.ls(self.path, detail=True)
        except FileNotFoundError:
            return []
        names = (posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory")
        return sorted(n for n in names if n.startswith(VERSION_PREFIX))

    def prune(self, keep: set[str]) -> list[str]:
        gone = [v for v in self.versions() if v not in keep]
        for version in gone:
            self.fs.rm(f"{self.path}/{version}", recursive=True)
        return gone


@dataclass
class ReindexPlan:
    """What a run will do: printed by --dry-run and before every run."""

    job: ReindexJob
    version: str
    current: str | None
    prepared: PreparedJob
    new: list[str]
    changed: list[str]
    removed: list[str]
    unchanged: list[str]

    @property
    def switches(self) -> bool:
        return self.current != self.version

    def render(self, console: Console) -> None:
        inventory = self.prepared.inventory
        if not self.switches:
            where = f"version {self.version} (current)"
        elif self.current is None:
            where = f"version {self.version} (first build; _CURRENT is set when it is complete)"
        else:
            where = (
                f"version {self.version}: the model or options changed since {self.current}; "
                "everything is redone there and _CURRENT moves when it is complete"
            )
        console.print(f"reindex [bold]{self.job.name}[/bold]: {self.job.output} {where}")
        if self.prepared.previous is None:
            console.print(f"shards: {len(self.prepared.plan.shards)} (no manifest in {self.version} to compare with)")
        else:
            console.print(
                f"shards: {len(self.unchanged)} unchanged, {len(self.new)} new, {len(self.changed)} changed, "
                f"{len(self.removed)} removed"
            )
        for label, urls in (("new", self.new), ("changed", self.changed), ("removed", self.removed)):
            for url in urls[:SHOWN_SHARDS]:
                console.print(f"  {label}: {url}")
            if len(urls) > SHOWN_SHARDS:
                console.print(f"  … and {len(urls) - SHOWN_SHARDS} more {label}")
        console.print(
            f"items: {len(inventory.todo)} to run, {len(inventory.done)} already done, "
            f"{len(inventory.stale)} stale parts to remove"
        )


@dataclass
class ReindexOutcome:
    plan: ReindexPlan
    outcome: JobOutcome
    switched: bool

    @property
    def exit_code(self) -> int:
        return self.outcome.exit_code


def job_config(job: ReindexJob) -> tuple[Profile, Catalog]:
    return load_profile(job.profile), load_catalog(job.catalog)


def plan_reindex(job: ReindexJob, profile: Profile, catalog: Catalog) -> ReindexPlan:
    """Compare inputs and model with the target version's manifest; touches nothing."""
    layout = VersionedOutput(job.output, job.storage_options)
    spec = model_for(catalog, profile, job.model, REINDEXED)
    probe = job.batch_job(job.output, spec)
    version = version_name(model_fingerprint(spec), job_params(probe.operation, probe.payload))
    versioned = job.batch_job(layout.version_url(version), spec)
    versioned.output_root = job.output  # the versions beside it are never input either (OUTPUT inside INPUT)
    prepared = prepare_job(versioned, spec, profile)
    recorded = {i["url"]: (i["size"], i["version"]) for i in (prepared.previous or {}).get("inputs", [])}
    now = {s.url: (s.size, s.version) for s in prepared.plan.shards}
    return ReindexPlan(
        job=job,
        version=version,
        current=layout.current(),
        prepared=prepared,
        new=sorted(u for u in now if u not in recorded),
        changed=sorted(u for u in now if u in recorded and recorded[u] != now[u]),
        removed=sorted(u for u in recorded if u not in now),
        unchanged=sorted(u for u in now if recorded.get(u) == now[u]),
    )


def run_reindex(
    job: ReindexJob, console: Console, scheduler: str | None = None, adapt: AdaptRange | None = None
) -> ReindexOutcome:
    """One run under the job's lock; raises LockHeld if another run holds it. `adapt`: the embedded
    cluster's worker range (``--adapt``)."""
    profile, catalog = job_config(job)
    layout = VersionedOutput(job.output, job.storage_options)
    lock = JobLock(layout.lock_url, job.storage_options, job.lock.expiry_seconds, job.lock.settle_seconds, job.name)
    with lock:
        plan = plan_reindex(job, profile, catalog)
        plan.render(console)
        needs_cluster = bool(plan.prepared.inventory.todo)
        address = scheduler or job.scheduler
        cluster = connect(address, profile, job.catalog, [job.model], adapt) if needs_cluster else nullcontext()
        with cluster as client:
            outcome = run_prepared(client, plan.prepared, profile, console, f"reindex-{job.name}", plan.version)
        if lock.lost:
            raise LockHeld(f"lost the lock {layout.lock_url} during the run; _CURRENT was left unchanged")
        switched = plan.switches and outcome.manifest["complete"]
        if switched:
            layout.switch(plan.version)
            keep = {plan.version} | ({plan.current} if plan.current and job.keep_previous else set())
            for version in layout.prune(keep):
                console.print(f"removed old version {version}")
            console.print(f"_CURRENT now names {plan.version}")
        elif plan.switches:
            console.print(f"[red]_CURRENT still names {plan.current}:[/red] {plan.version} is not complete")
    return ReindexOutcome(plan, outcome, switched)
