"""The files a test feeds a command: Parquet shards of texts and cluster profiles; and reading an output back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml


def write_shards(directory: Path, texts: list, shards: int, row_group_size: int, **extra: Any) -> list[str]:
    """Split texts over Parquet shards with ids `doc-N`; returns all ids in order."""
    directory.mkdir(parents=True, exist_ok=True)
    ids = [f"doc-{i}" for i in range(len(texts))]
    per = -(-len(texts) // shards)
    for s in range(shards):
        lo, hi = s * per, min((s + 1) * per, len(texts))
        columns = {"id": ids[lo:hi], "text": pa.array(texts[lo:hi], type=pa.string())}
        for name, values in extra.items():
            columns[name] = values[lo:hi]
        pq.write_table(pa.table(columns), directory / f"shard-{s:03d}.parquet", row_group_size=row_group_size)
    return ids


def read_output(directory: Path | str) -> pa.Table:
    return pq.read_table(str(directory))


def write_profile(directory: Path, **fields: Any) -> Path:
    """A cluster profile `test` (two one-thread CPU workers, 200 rows an item) in `directory`, `fields` laid over."""
    profile = {
        "name": "test",
        "device": "cpu",
        "workers": 2,
        "threads_per_worker": 1,
        "prefetch": 2,
        "rows_per_item": 200,
        "lease_seconds": 20,
        "max_attempts": 3,
        "pull_timeout_seconds": 0.5,
        **fields,
    }
    path = directory / f"{profile['name']}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path
