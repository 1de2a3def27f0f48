"""The files a test feeds a command (Parquet shards of texts, cluster profiles), a folder no write can land in,
and reading an output back."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
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


# fp32 torch pinned for the tiny catalog's models (tests/fixtures/models.py): a profile that pins no runtime runs
# `auto`'s choice, which on bf16 hardware may be bf16 once a measurement is cached, and the tests compare with a
# direct fp32 encode to 1e-5. A test about `auto`'s choice writes its own `runtimes`.
FP32 = {"runtime": "torch", "dtype": "float32"}
PINNED_FP32 = {"tiny": FP32, "tiny-reranker": FP32}


def write_profile(directory: Path, **fields: Any) -> Path:
    """A cluster profile `test` (two one-thread CPU workers, 200 rows an item, fp32 torch for the tiny models) in
    `directory`, `fields` laid over."""
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
        "runtimes": PINNED_FP32,
        **fields,
    }
    path = directory / f"{profile['name']}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def write_rows(directory: Path, rows: int = 20) -> Path:
    """`directory` holding one shard a.parquet of `rows` rows: ids 0.. and texts "text N"."""
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table({"id": list(range(rows)), "text": [f"text {i}" for i in range(rows)]}), directory / "a.parquet"
    )
    return directory


@contextmanager
def read_only_folder(path: Path) -> Iterator[Path]:
    """A folder no write can land in: a read-only tmpfs for root (whom mode bits do not stop), else mode 0555."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield path
        finally:
            path.chmod(0o755)
        return
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "shoal-ro", str(path)], capture_output=True
    ).returncode:
        pytest.skip("running as root where a read-only tmpfs cannot be mounted")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=True)
