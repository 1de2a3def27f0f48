"""Elastic clusters in tests: a simulated model whose items take a second, a job of them run by `shoal embed`
on a given scheduler, and a sampler of the cluster's worker count (integration tests only)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.support.cli import embed_args
from tests.support.files import write_profile, write_shards
from tests.support.paths import SHOAL
from tests.support.processes import Processes

# About a second per 20-row item and nothing else: a job of many such items is work for several workers.
SECOND_ITEMS = {
    "kind": "sim",
    "dim": 8,
    "max_seq_length": 64,
    "memory_bytes": 10**6,
    "load_seconds": 0.1,
    "batch_fixed_seconds": 1.0,
    "per_token_seconds": 0.0,
}


class WorkerCounts:
    """The scheduler's worker count, sampled every 0.1 s in a thread while the block runs: (seconds, count)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._began = time.monotonic()

    def __enter__(self) -> WorkerCounts:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append((time.monotonic() - self._began, len(self.scheduler.workers)))

    def most(self) -> int:
        return max((count for _, count in self.samples), default=0)

    def worker_seconds(self) -> float:
        return sum(count * 0.1 for _, count in self.samples)


def second_items_job(
    tmp_path: Path, rows: int, rows_per_item: int = 20, **profile_fields: Any
) -> tuple[Path, Path, list[str]]:
    """Shards of `rows` short texts, a catalog of model `slow` (SECOND_ITEMS) and a profile of `rows_per_item`
    rows an item: (profile, catalog, ids)."""
    profile = write_profile(tmp_path, name="elastic", rows_per_item=rows_per_item, lease_seconds=30, **profile_fields)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"slow": SECOND_ITEMS}}))
    ids = write_shards(tmp_path / "in", [f"text {i}" for i in range(rows)], shards=4, row_group_size=rows_per_item)
    return profile, catalog, ids


def start_embed(
    procs: Processes, tmp_path: Path, scheduler: str, profile: Path, catalog: Path, output: str = "out"
) -> subprocess.Popen:
    """`shoal embed` of tmp_path/in into tmp_path/`output` with model `slow`, on `scheduler`, among `procs`."""
    args = embed_args(tmp_path / "in", tmp_path / output, catalog, scheduler=scheduler, profile=profile, model="slow")
    return procs.start([SHOAL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
