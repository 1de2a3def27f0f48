"""The fixed sample every tuning trial runs on.

Drawn at random (seeded) across all the input's shards, so its mix of short
and long texts is the corpus's, not that of the first file; every trial sees
the same texts, so trials differ only by their configuration. Cluster trials
read it as Parquet, as a real job would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import StorageOptions
from ..jobs.planner import PlanError, list_shards

ROW_GROUP = 64


@dataclass
class Sample:
    texts: list[str]
    url: str  # a folder holding one Parquet file with columns id, text


def draw_sample(
    input_url: str,
    rows: int,
    folder: Path,
    text_column: str = "text",
    storage_options: StorageOptions | None = None,
    seed: int = 0,
) -> Sample:
    """`rows` non-null texts of INPUT (all of them if it has fewer), written under `folder`."""
    texts: list[str] = []
    for shard in list_shards(input_url, storage_options):
        with fsspec.open(shard.url, "rb", **(storage_options or {})) as f:
            column = pq.read_table(f, columns=[text_column]).column(text_column)
        texts.extend(t for t in column.to_pylist() if t is not None)
    if not texts:
        raise PlanError(f"input {input_url!r} has no non-null {text_column!r} texts to tune on")
    chosen = random.Random(seed).sample(texts, min(rows, len(texts)))
    folder.mkdir(parents=True, exist_ok=True)
    # One file in small row groups: items of any size the trials try are whole row groups.
    table = pa.table({"id": [f"s{i}" for i in range(len(chosen))], "text": pa.array(chosen, pa.string())})
    pq.write_table(table, folder / "sample.parquet", row_group_size=ROW_GROUP)
    return Sample(chosen, str(folder.resolve()))
