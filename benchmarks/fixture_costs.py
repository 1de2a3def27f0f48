"""What the test suite's fixtures save, side by side in one run (docs/BENCHMARKS.md, "Test suite").

A local cluster's start and stop (what a module-scoped `cluster` fixture paid per module, before one
cluster served the session), and one `shoal embed` of 400 rows on that cluster as a process of its own
(`run_shoal`) against the same command in this process (`invoke_shoal`), alternated three times.

    .venv/bin/python -m benchmarks.fixture_costs
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import yaml
from distributed import Client

from shoal.configs import load_profile
from shoal.pipeline.cluster import start_local_cluster
from tests.support.cli import embed_args, invoke_shoal, run_shoal
from tests.support.files import write_profile, write_shards
from tests.support.gateway import SIM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"sim": SIM}}))
    profile = write_profile(folder)
    write_shards(folder / "in", [f"text {i}" for i in range(400)], shards=2, row_group_size=100)
    starts: list[tuple[float, float]] = []
    runs: dict[str, list[float]] = {"process": [], "in-process": []}
    for attempt in range(2):
        began = time.perf_counter()
        with start_local_cluster(load_profile(str(profile)), str(catalog)) as local, Client(local) as client:
            client.wait_for_workers(2)
            up = time.perf_counter() - began
            for k in range(3 if attempt == 0 else 0):
                for kind, command in (("process", run_shoal), ("in-process", invoke_shoal)):
                    args = embed_args(folder / "in", folder / f"out-{kind}-{k}", catalog, model="sim")
                    began = time.perf_counter()
                    done = command(*args, "--scheduler", local.scheduler_address, "--profile", str(profile))
                    assert done.returncode == 0, done.stderr
                    runs[kind].append(round(time.perf_counter() - began, 1))
            began = time.perf_counter()
        starts.append((round(up, 1), round(time.perf_counter() - began, 1)))
    print(f"cluster start, stop (s): {starts}")
    print(f"shoal embed of 400 rows (s): {runs}")


if __name__ == "__main__":
    main()
