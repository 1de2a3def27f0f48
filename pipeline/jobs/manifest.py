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
from typing import Any

from pipeline.jobs.planner import Shard
from workers.storage import atomic_write, open_fs

MANIFEST_NAME = "_manifest.json"
FORMAT_VERSION = 1


def build_manifest(
    job: str,
    operation: str,
    model: dict[str, Any],
    columns: dict[str, Any],
    shards: list[Shard],
    results: list[dict[str, Any]],
    dead_letters: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`results` are ack-shaped part records; `extra` adds top-level fields (params, work, version)."""
    parts = sorted(
        (
            {
                "name": r["part"],
                "input": r["input"],
                "row_range": r["row_range"],
                "rows": r["rows"],
                "bytes": r["bytes"],
            }
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
            {
                "input": d["payload"]["input"],
                "row_range": d["payload"].get("row_range"),
                "errors": d["errors"],
            }
            for d in dead_letters
        ],
        **(extra or {}),
    }


def write_manifest(output_url: str, manifest: dict[str, Any], storage_options: dict[str, Any] | None) -> str:
    url = f"{output_url.rstrip('/')}/{MANIFEST_NAME}"
    atomic_write(url, json.dumps(manifest, indent=1).encode(), storage_options)
    return url


def read_manifest(output_url: str, storage_options: dict[str, Any] | None) -> dict[str, Any] | None:
    """The output's manifest, or None if there is none or it is unreadable."""
    fs, path = open_fs(f"{output_url.rstrip('/')}/{MANIFEST_NAME}", storage_options)
    try:
        return json.loads(fs.cat_file(path))
    except (FileNotFoundError, ValueError):
        return None


def remove_manifest(output_url: str, storage_options: dict[str, Any] | None) -> None:
    fs, path = open_fs(f"{output_url.rstrip('/')}/{MANIFEST_NAME}", storage_options)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass
