"""The job manifest, `_manifest.json`, written last into the output location.

It records what produced the output (model and fingerprint, columns), what
went in (each shard with size and version), and what came out (each part
with its rows), so readers know the output is complete and re-runs know
what is already done.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from workers.storage import atomic_write

from .planner import Shard

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
) -> dict[str, Any]:
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
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": not dead_letters,
        "model": model,
        "columns": columns,
        "rows": sum(p["rows"] for p in parts),
        "inputs": [
            {"url": s.url, "size": s.size, "version": s.version, "rows": s.rows, "error": s.error}
            for s in shards
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
    }


def write_manifest(output_url: str, manifest: dict[str, Any], storage_options: dict[str, Any] | None) -> str:
    url = f"{output_url.rstrip('/')}/{MANIFEST_NAME}"
    atomic_write(url, json.dumps(manifest, indent=1).encode(), storage_options)
    return url
