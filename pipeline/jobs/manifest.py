"""The job manifest, `_manifest.json`, written last into the output location.

It records what produced the output (model and fingerprint, columns, the
options digest `params`), what went in (each shard with size and version),
and what came out (each part with its rows), so readers know the output is
complete and re-runs know what is already done without reading the parts.
A run that changes the output removes the manifest first, so a manifest is
never older than the parts beside it.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import TypedDict

from ...scheduler_plugins.protocol import DeadLetter, PartRecord, StorageOptions, VectorFields
from ...workers.data.storage import atomic_write, open_fs
from .planner import Shard

MANIFEST_NAME = "_manifest.json"
FORMAT_VERSION = 1

# The job's column options as named on the command line (text, id, keep; query, passage, ...).
Columns = dict[str, str | list[str] | int | None]


class ModelRecord(TypedDict):
    name: str
    fingerprint: str
    dim: int
    normalize: bool
    max_seq_length: int


class InputRecord(TypedDict):
    url: str
    size: int
    version: str
    rows: int
    error: str | None


class PartEntry(TypedDict):
    name: str
    input: str
    row_range: list[int]
    rows: int
    bytes: int


class FailedEntry(TypedDict):
    input: str
    row_range: list[int] | None
    errors: list[str]


class LanceRecord(TypedDict):
    dataset: str
    version: int | None  # None: not committed (the run was incomplete, or the store refused)


class Manifest(TypedDict, total=False):
    """``_manifest.json``; a reader of an older file gets only the keys it had."""

    format: int
    job: str
    operation: str
    created: str
    complete: bool
    model: ModelRecord
    columns: Columns
    rows: int
    inputs: list[InputRecord]
    parts: list[PartEntry]
    failed: list[FailedEntry]
    params: str  # the options digest (pipeline/jobs/resume)
    work: dict[str, int]  # items, reused, run, removed
    vectors: VectorFields
    lance: LanceRecord
    rejected_rows: int
    rejected: list[str]
    version: str  # a reindex's output version (pipeline/jobs/reindex)


def build_manifest(
    job: str,
    operation: str,
    model: ModelRecord,
    columns: Columns,
    shards: list[Shard],
    results: list[PartRecord],
    dead_letters: list[DeadLetter],
) -> Manifest:
    """`results` are ack-shaped part records; the caller adds params, work, vectors and the like."""
    parts = sorted(
        (
            PartEntry(name=r["part"], input=r["input"], row_range=r["row_range"], rows=r["rows"], bytes=r["bytes"])
            for r in results
        ),
        key=lambda p: (p["input"], p["row_range"][0]),
    )
    return {
        "format": FORMAT_VERSION,
        "job": job,
        "operation": operation,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "complete": not dead_letters,
        "model": model,
        "columns": columns,
        "rows": sum(p["rows"] for p in parts),
        "inputs": [
            {"url": s.url, "size": s.size, "version": s.version, "rows": s.rows, "error": s.error} for s in shards
        ],
        "parts": parts,
        "failed": [
            {"input": d["payload"]["input"], "row_range": d["payload"].get("row_range"), "errors": d["errors"]}
            for d in dead_letters
        ],
    }


def write_manifest(output_url: str, manifest: Manifest, storage_options: StorageOptions | None) -> str:
    url = f"{output_url.rstrip('/')}/{MANIFEST_NAME}"
    atomic_write(url, json.dumps(manifest, indent=1).encode(), storage_options)
    return url


def read_manifest(output_url: str, storage_options: StorageOptions | None) -> Manifest | None:
    """The output's manifest, or None if there is none or it is unreadable."""
    fs, path = open_fs(f"{output_url.rstrip('/')}/{MANIFEST_NAME}", storage_options)
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError):
        return None


def remove_manifest(output_url: str, storage_options: StorageOptions | None) -> None:
    fs, path = open_fs(f"{output_url.rstrip('/')}/{MANIFEST_NAME}", storage_options)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
