"""Running a batch job: plan, submit to the pull queue, follow, write the manifest.

Every operation (embed, rerank) goes through the same path: a `BatchJob`
says what differs (the operation, its payload, the columns it needs), and
`run_job` plans, submits, follows, releases and writes the manifest.

Every run resumes (see resume): planned parts the output already holds,
current, are skipped, stale parts are deleted, only the rest is submitted,
and the parts written are checked again before the manifest lists them.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Protocol, cast

from distributed import Client
from rich.console import Console

from ...configs import Catalog, ConfigError, ModelSpec, Profile
from ...configs.auto import LAYOUT
from ...configs.fingerprints import model_fingerprint
from ...configs.kinds import Kind, kind_of
from ...scheduler_plugins.protocol import (
    DeadLetter,
    EmbedPayload,
    ImagePayload,
    ItemResult,
    JobStatus,
    RerankPayload,
    StorageOptions,
    SubmittedItem,
    VectorFields,
)
from ...workers.data.chunking import ChunkSettings
from ...workers.data.vector_precision import VectorFormat
from ..cluster import ClusterError, pull_queue, worker_runtimes
from . import image_files
from .calibration import calibrate, stored_ranges, with_ranges
from .follower import follow, summarize
from .lance_output import commit_parts
from .manifest import (
    Columns,
    LanceRecord,
    Manifest,
    build_manifest,
    read_manifest,
    remove_manifest,
    write_manifest,
)
from .planner import (
    Plan,
    PlannedItem,
    check_columns,
    check_output,
    list_shards,
    plan_items,
    read_footers,
)
from .resume import Inventory, PartStore, current_parts, job_params, stamp_items
from .stages import STAGES

SHOWN_REJECTIONS = 10
WORKERS_NAMED = 3  # a summary line names this many workers that ran a model alike, then counts the rest


@dataclass
class BatchJob:
    """One submission: what every operation's job has, plus its own payload."""

    operation: str
    input: str
    output: str
    model: str
    payload: EmbedPayload | RerankPayload  # the operation's options, copied into every item
    required_columns: list[str]
    manifest_columns: Columns
    storage_options: StorageOptions = field(default_factory=dict)
    output_root: str | None = None  # where all of this job's outputs live (a reindex's versions); never input


class TextRows(Protocol):
    """What a job over a text column (embed's, classify's and extract's requests) says of its rows."""

    input: str
    output: str
    model: str
    text_column: str
    id_column: str | None
    keep_columns: list[str]
    storage_options: StorageOptions
    chunk: ChunkSettings | None
    lance: str | None
    input_format: str | None


def text_rows_payload(request: TextRows) -> EmbedPayload:
    """The item options every text-column job has, each only when asked for: the options digest (params) of
    existing outputs stays as it was."""
    payload: EmbedPayload = {
        "text_column": request.text_column,
        "id_column": request.id_column,
        "keep_columns": request.keep_columns,
    }
    if request.chunk:
        payload["chunk"] = {"tokens": request.chunk.tokens, "overlap": request.chunk.overlap}
    if request.lance:
        payload["lance"] = request.lance
    if request.input_format:
        payload["input_format"] = request.input_format
    return payload


def text_rows_job(request: TextRows, operation: str, payload: EmbedPayload) -> BatchJob:
    """`operation` over `request`'s rows with `payload` (text_rows_payload's and the operation's own options)."""
    return BatchJob(
        operation=operation,
        input=request.input,
        output=request.output,
        model=request.model,
        payload=payload,
        required_columns=[request.text_column, *filter(None, [request.id_column]), *request.keep_columns],
        manifest_columns={"text": request.text_column, "id": request.id_column, "keep": request.keep_columns},
        storage_options=request.storage_options,
    )


@dataclass
class JobOutcome:
    job: str
    status: JobStatus
    manifest: Manifest
    manifest_url: str
    work: dict[str, int] = field(default_factory=dict)  # items, reused, run, removed

    @property
    def exit_code(self) -> int:
        return 1 if not self.manifest["complete"] or self.manifest["rejected_rows"] else 0


def model_for(catalog: Catalog, profile: Profile, name: str, kinds: Sequence[Kind]) -> ModelSpec:
    """The catalog entry with the profile's tuning, refused if it is not of one of `kinds` (the registry's
    `for_command`, `for_operation`).

    On `auto` the model's runtime is the one `connect` chose for an embedded cluster's models.
    """
    spec = profile.tuned(catalog.get(name))
    if kind_of(spec) not in kinds:
        needed = " or ".join(repr(k.name) for k in kinds)
        raise ConfigError(f"model {spec.name!r} is of kind {spec.kind!r}; this job needs a model of kind {needed}")
    return spec


def choice_lines(
    profile: Profile, specs: list[ModelSpec], ran: dict[str, dict[str, str]] | None = None
) -> list[tuple[str, str]]:
    """What ran a job or serves a gateway, and why: the profile's layout, and each model's runtime on each
    worker, as the workers chose it for their devices (`ran`: pipeline.cluster.worker_runtimes)."""
    layout = profile.reasons.get(LAYOUT) or (
        f"{profile.workers} workers x {profile.threads_per_worker or 'all'} threads, from "
        f"{'--profile' if profile.path else 'the default'} {profile.name}"
    )
    rows = [(f"profile {profile.name}", layout)]
    for spec in specs:
        workers: dict[str, list[str]] = {}  # what ran -> the workers it ran on
        for worker, models in sorted((ran or {}).items()):
            if spec.name in models:
                workers.setdefault(models[spec.name], []).append(worker)
        for why, where in workers.items():
            shown = ", ".join(where[:WORKERS_NAMED]) + (
                f" and {len(where) - WORKERS_NAMED} more" if len(where) > WORKERS_NAMED else ""
            )
            rows.append((f"runtime of {spec.name} on {shown}", why))
        if not workers:
            rows.append((f"runtime of {spec.name}", "chosen by each worker for its device when it loads the model"))
    return rows


def output_folder(model: str) -> str:
    """A model's folder name under a several-model output: a path's last part, an HF id as the hub caches it."""
    if model.startswith((".", "/", "~")) or "://" in model:  # a folder, here or in object storage
        return model.rstrip("/").rsplit("/", 1)[-1]
    return model.replace("/", "--")


def run_jobs(
    client: Client, jobs: list[tuple[BatchJob, ModelSpec]], profile: Profile, console: Console
) -> list[JobOutcome]:
    """Several models' jobs at once (OUTPUT/<model>/ each: `output_folder`), each resumed and summed up alone.

    Every job is in the queue at once, so workers keep several models held and share the cluster between
    them; the LoRA adapters of one base share its forward passes. The first job shows the progress bar; the
    others' summaries follow it.
    """
    buffers = [io.StringIO() for _ in jobs[1:]]  # the other jobs' summaries, printed after the first's
    consoles = [console, *(Console(file=buffer, soft_wrap=True, width=console.width) for buffer in buffers)]
    with ThreadPoolExecutor(max(1, len(jobs))) as pool:
        futures = [
            pool.submit(run_job, client, job, spec, profile, shown) for (job, spec), shown in zip(jobs, consoles)
        ]
        outcomes = [future.result() for future in futures]
    for buffer in buffers:
        console.print(buffer.getvalue(), end="", highlight=False, markup=False)
    return outcomes


def model_output(output: str, model: str) -> str:
    """A model's output under a several-model job's OUTPUT."""
    return f"{output.rstrip('/')}/{output_folder(model)}"


def plan_job(job: BatchJob, profile: Profile) -> Plan:
    rows = profile.rows_per_item
    if job.payload.get("input_format") == image_files.FORMAT:  # one row per file
        return image_files.plan_image_job(
            job.input,
            job.output,
            job.storage_options,
            rows,
            job.model,
            job.operation,
            cast(ImagePayload, job.payload),
            job.output_root,
        )
    shards = list_shards(job.input, job.storage_options, job.output_root or job.output, job.payload.get("input_format"))
    read_footers(shards, job.storage_options)
    check_columns(shards, job.required_columns)
    if job.payload.get("image_column"):
        rows = image_files.images_per_item(rows)
    return Plan(shards, plan_items(shards, job.output, rows, job.model, job.operation, job.payload))


@dataclass
class PreparedJob:
    """A planned job split by what its output already holds: all a dry run shows."""

    job: BatchJob
    spec: ModelSpec
    fingerprint: str
    params: str
    plan: Plan
    store: PartStore
    previous: Manifest | None  # the manifest found in the output
    inventory: Inventory


def prepare_job(job: BatchJob, spec: ModelSpec, profile: Profile) -> PreparedJob:
    """Plan the job and find which of its parts the output already holds, current."""
    job = replace(job, model=spec.name)  # items and queues name the resolved model, however it was given
    fingerprint = model_fingerprint(spec)
    params = job_params(job.operation, job.payload)
    plan = plan_job(job, profile)
    stamp_items(plan, fingerprint, params)
    store = PartStore(job.output, job.storage_options)
    previous = read_manifest(job.output, job.storage_options)
    inventory = store.inventory(plan.items, current_parts(previous, fingerprint, params, plan.shards))
    STAGES.mark("plan")
    return PreparedJob(job, spec, fingerprint, params, plan, store, previous, inventory)


def run_job(client: Client, job: BatchJob, spec: ModelSpec, profile: Profile, console: Console) -> JobOutcome:
    return run_prepared(client, prepare_job(job, spec, profile), profile, console)


def run_prepared(
    client: Client | None,
    prepared: PreparedJob,
    profile: Profile,
    console: Console,
    job_prefix: str | None = None,
    version: str | None = None,
) -> JobOutcome:
    """Run only what the output lacks, check what was written, write the manifest.

    `client` may be None when the inventory has nothing to run; `version`: a reindex's output version.
    """
    job, inventory, store = prepared.job, prepared.inventory, prepared.store
    spec = profile.tuned(prepared.spec)  # with the runtime `connect` chose for it on `auto`
    job_id = f"{job_prefix or job.operation}-{uuid.uuid4().hex[:12]}"
    if inventory.todo or inventory.stale or prepared.previous is None:
        # From here until the new manifest the output has none: a crash leaves no stale one.
        remove_manifest(job.output, job.storage_options)
    removed = store.remove(inventory.stale)
    final, status = inventory, _idle_status(job_id)
    vectors = _vector_format(client, prepared, job_id, profile, console)
    if inventory.todo:
        assert client is not None, "a job with items to run is given a client"
        status = _submit_and_follow(client, job_id, inventory.todo, job, spec, profile, console)
        # Trust only what is in the store now: a part acked but since overwritten is redone next run.
        final = store.inventory(prepared.plan.items, trusted=inventory.done)
        removed += store.remove(final.stale)
    dead_letters, results = _delivered(status)
    dead_parts = {letter["payload"]["part"] for letter in dead_letters}
    unverified: list[DeadLetter] = [
        {"payload": item["payload"], "errors": ["part missing or not current after the run; run again to redo it"]}
        for item in final.todo
        if item["payload"]["part"] not in dead_parts
    ]
    work = {
        "items": len(prepared.plan.items),
        "reused": len(inventory.done),
        "run": len(inventory.todo),
        "removed": removed,
    }
    manifest = build_manifest(
        job_id,
        job.operation,
        {
            "name": spec.name,
            "fingerprint": prepared.fingerprint,
            "dim": spec.dim,
            "normalize": spec.normalize,
            "max_seq_length": spec.max_seq_length,
        },
        job.manifest_columns,
        prepared.plan.shards,
        list(final.done.values()),
        [*dead_letters, *unverified],
    )
    manifest["params"] = prepared.params
    manifest["work"] = work
    if vectors:
        manifest["vectors"] = vectors
    if version is not None:
        manifest["version"] = version
    if job.payload.get("lance"):
        manifest["lance"] = _commit_lance(job, manifest, console)
    rejections = [message for result in results for message in result.get("rejections", [])]
    manifest["rejected_rows"] = sum(result.get("rejected", 0) for result in results)
    manifest["rejected"] = sorted(rejections)
    manifest_url, manifest_error = _write_manifest(job, manifest)
    STAGES.mark("manifest")
    if inventory.todo:
        summarize(status, console, job.output, choice_lines(profile, [spec], worker_runtimes(client) if client else {}))
    console.print(
        f"resume: {work['reused']} of {work['items']} parts already done, {work['run']} run, "
        f"{work['removed']} stale parts removed"
    )
    for entry in unverified:
        console.print(f"[red]failed:[/red] {entry['payload']['part']}: {entry['errors'][0]}")
    _report_rejections(manifest, console)
    if manifest_error:
        console.print(f"[red]error:[/red] {manifest_error}")
    return JobOutcome(job_id, status, manifest, manifest_url, work)


def _write_manifest(job: BatchJob, manifest: Manifest) -> tuple[str, str | None]:
    """(its URL, None), or ("", why) when the store refuses it: the run still ends with its summary.

    An output without a manifest is not known to be complete, so the job is
    marked incomplete (exit 1; a reindex keeps _CURRENT where it was). The
    parts written stay, and the next run checks and reuses them.
    """
    try:
        return write_manifest(job.output, manifest, job.storage_options), None
    except OSError as exc:
        manifest["complete"] = False
        return "", (
            f"cannot write the manifest into {job.output!r} ({exc}); "
            "the parts written are kept: run again once it is writable"
        )


def preflight(
    input_url: str, output_url: str, storage_options: StorageOptions, input_format: str | None = None
) -> None:
    """What can be refused before a cluster starts: an INPUT with no shards or not apart from OUTPUT, then
    an OUTPUT that cannot be written (checked last: its write probe would create an OUTPUT inside INPUT)."""
    if input_format == image_files.FORMAT:
        image_files.list_image_groups(input_url, storage_options, output_url)
    else:
        list_shards(input_url, storage_options, output_url, input_format)
    check_output(output_url, storage_options)


def _commit_lance(job: BatchJob, manifest: Manifest, console: Console) -> LanceRecord:
    """A complete run's fragments as the dataset's next version; an incomplete one commits nothing."""
    dataset = job.payload["lance"]
    if not manifest["complete"]:
        console.print(
            f"[yellow]lance:[/yellow] {dataset} not committed: the run is incomplete; its readers keep the last version"
        )
        return {"dataset": dataset, "version": None}
    try:
        version = commit_parts(dataset, job.output, [part["name"] for part in manifest["parts"]], job.storage_options)
    except OSError as exc:  # the store refused the commit: the parts stay, the next run commits them
        manifest["complete"] = False
        console.print(
            f"[red]lance:[/red] cannot commit {dataset} ({exc}); the parts are kept: run again to commit them"
        )
        return {"dataset": dataset, "version": None}
    console.print(f"lance: {dataset} at version {version}")
    return {"dataset": dataset, "version": version}


def _vector_format(
    client: Client | None, prepared: PreparedJob, job_id: str, profile: Profile, console: Console
) -> VectorFields | None:
    """The job's stored vector format for the manifest; int8/uint8 ranges reused or calibrated, put in every item."""
    given = prepared.job.payload.get("vectors")
    if not given:
        return None
    fmt = VectorFormat(**given)
    if not fmt.needs_ranges:
        return fmt.payload()
    job = prepared.job
    key = {"fingerprint": prepared.fingerprint, "params": prepared.params}
    ranges = stored_ranges(job.output, job.storage_options, key)
    if ranges is None and prepared.inventory.todo:
        assert client is not None, "a job with items to run is given a client"
        console.print(f"{fmt.precision}: calibrating ranges on the job's first item")
        ranges = calibrate(
            prepared.plan.items,
            fmt,
            job.output,
            job.storage_options,
            key,
            lambda items: _submit_and_follow(
                client, f"{job_id}-calibration", items, job, profile.tuned(prepared.spec), profile, console
            ),
        )
    if ranges is None:  # nothing to run, and an older output without the file: the manifest keeps its own
        return (prepared.previous or {}).get("vectors")
    with_ranges(prepared.inventory.todo, ranges)
    return {**fmt.payload(), "ranges": ranges}


def _idle_status(job_id: str) -> JobStatus:
    """The status of a run with nothing to submit."""
    return {"job": job_id, "items": 0, "failed": 0, "rows_done": 0, "elapsed": 0.0, "dead_letters": [], "results": []}


def _submit_and_follow(
    client: Client,
    job_id: str,
    items: list[PlannedItem],
    job: BatchJob,
    spec: ModelSpec,
    profile: Profile,
    console: Console,
) -> JobStatus:
    queue = pull_queue(client)
    client.sync(
        queue.submit,
        job_id,
        cast("list[SubmittedItem]", items),  # a PlannedItem is one, its payload read as the slice it starts from
        {
            "lease_seconds": profile.lease_seconds,
            "max_attempts": profile.max_attempts,
            "unplaceable_seconds": profile.unplaceable_seconds,
            "models": {job.model: spec.model_dump()},
            "context": {"storage_options": job.storage_options},
            "client": client.id,
        },
    )
    try:
        status = follow(client, job_id, console, f"{job.operation} {job.model}")
    except (OSError, TimeoutError) as exc:  # the scheduler is gone, and the job with it
        raise ClusterError(
            f"lost the scheduler ({type(exc).__name__}: {exc}); the parts written so far are kept: "
            "run the same command again to finish the rest"
        ) from exc
    except BaseException:  # Ctrl-C and the like: drop the job's queued work
        client.sync(queue.job_release, job_id)
        raise
    client.sync(queue.job_release, job_id)
    return status


def _delivered(status: JobStatus) -> tuple[list[DeadLetter], list[ItemResult]]:
    """The status's dead letters and results (there when asked for)."""
    return status["dead_letters"], status.get("results", [])


def _report_rejections(manifest: Manifest, console: Console) -> None:
    for message in manifest["rejected"][:SHOWN_REJECTIONS]:
        console.print(f"[red]rejected row:[/red] {message}")
    hidden = manifest["rejected_rows"] - min(len(manifest["rejected"]), SHOWN_REJECTIONS)
    if hidden:
        console.print(f"[red]… and {hidden} more rejected rows[/red] (up to 20 per part are listed in _manifest.json)")
