#!/usr/bin/env python
"""A bursty batch workload on an adaptive cluster (1 to 4 workers) against a fixed 4-worker cluster.

The same schedule runs on both, one after the other, in this process's
embedded cluster (`shoal.pipeline.cluster.local_cluster`, the one ``--adapt``
starts): --bursts embed jobs of --items items each, the first at 0 s and the
next --gap seconds after the previous one finished, as a night of reindexing
or a daytime queue of uploads arrives. Items are the simulated model's
(about --item-seconds of device sleep each, nothing else), so four workers
do four times the work of one on this 2-core machine, as four GPUs would.

Reported per cluster: the makespan (first job's start to last job's end),
each job's time, the worker-seconds used over the makespan (SpecCluster's
workers, starting and closing ones included, sampled every 0.1 s), and
whether every job's output holds every id once. The goal (issue 34): the
adaptive makespan within 15 % of the fixed one's, with at most 60 % of its
worker-seconds.

``--parts cold`` measures scale to zero with a real model as a user runs it:
``shoal serve --adapt 0:1`` (no pinned model, so nothing keeps a worker),
at 0 workers; the first request for --cold-model (the shipped MiniLM by
default) waits while Dask's adaptive loop starts a worker process and it
loads the model; then --later requests one after the other at normal
latency. Reported: the first request's seconds, the later ones' p50 and max,
--rounds times (the cluster is left to scale back to 0 between rounds).

    .venv/bin/python benchmarks/elastic.py
    .venv/bin/python benchmarks/elastic.py --bursts 2 --items 24 --gap 20 --json /tmp/elastic.json
    .venv/bin/python benchmarks/elastic.py --parts cold --rounds 2
"""

from __future__ import annotations

import argparse
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from distributed import Client
from rich.console import Console

from shoal.configs import load_catalog, load_profile
from shoal.pipeline.client import OnlineClient
from shoal.pipeline.cluster import AdaptRange, local_cluster
from shoal.pipeline.jobs.embed import EmbedRequest, run_embed

ROWS_PER_ITEM = 20
MAXIMUM = 4


def sim_model(item_seconds: float) -> dict[str, Any]:
    return {
        "kind": "sim",
        "dim": 8,
        "max_seq_length": 64,
        "memory_bytes": 10**6,
        "load_seconds": 0.1,
        "batch_fixed_seconds": item_seconds,
        "per_token_seconds": 0.0,
    }


class WorkerSeconds:
    """The cluster's workers (SpecCluster's, starting and closing ones too), sampled every 0.1 s in a thread."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.samples.append((time.monotonic(), len(self.cluster.workers)))

    def between(self, start: float, end: float) -> float:
        return sum(0.1 * count for at, count in self.samples if start <= at <= end)

    def most(self) -> int:
        return max((count for _, count in self.samples), default=0)


def write_input(folder: Path, items: int) -> list[str]:
    folder.mkdir(parents=True)
    ids = [f"doc-{i}" for i in range(items * ROWS_PER_ITEM)]
    table = pa.table({"id": ids, "text": [f"text {i}" for i in range(len(ids))]})
    pq.write_table(table, folder / "shard.parquet", row_group_size=ROWS_PER_ITEM)
    return ids


def run_schedule(folder: Path, name: str, adapt: AdaptRange | None, args: argparse.Namespace) -> dict[str, Any]:
    profile_path = folder / f"{name}.yaml"
    fields = {"name": name, "device": "cpu", "workers": MAXIMUM, "threads_per_worker": 1, "prefetch": 2}
    profile_path.write_text(yaml.safe_dump({**fields, "rows_per_item": ROWS_PER_ITEM, "pull_timeout_seconds": 0.5}))
    profile = load_profile(str(profile_path))
    catalog = load_catalog(str(folder / "catalog.yaml"))
    ids = write_input(folder / f"in-{name}", args.items)
    quiet = Console(file=open("/dev/null", "w"))  # noqa: SIM115 - the job's progress bar, unwanted here
    jobs: list[dict[str, Any]] = []
    with local_cluster(profile, str(folder / "catalog.yaml"), adapt=adapt) as cluster, Client(cluster) as client:
        client.wait_for_workers(adapt.minimum if adapt else MAXIMUM)
        meter = WorkerSeconds(cluster)
        meter.start()
        began = time.monotonic()
        for burst in range(args.bursts):
            if burst:
                time.sleep(args.gap)
            output = folder / f"out-{name}-{burst}"
            request = EmbedRequest(input=str(folder / f"in-{name}"), output=str(output), model="slow")
            start = time.monotonic()
            outcome = run_embed(client, request, profile, catalog, quiet)
            written = pq.read_table(output).column("id").to_pylist()
            jobs.append(
                {
                    "seconds": time.monotonic() - start,
                    "exit_code": outcome.exit_code,
                    "every_id_once": sorted(written) == sorted(ids),
                }
            )
        ended = time.monotonic()
        meter.stop()
        events = dict(cluster.scheduler.extensions["shoal-pull-queue"].state.counts)
    return {
        "cluster": f"adaptive {adapt}" if adapt else f"fixed {MAXIMUM}",
        "makespan_seconds": ended - began,
        "job_seconds": [job["seconds"] for job in jobs],
        "worker_seconds": meter.between(began, ended),
        "most_workers": meter.most(),
        "every_id_once": all(job["every_id_once"] and job["exit_code"] == 0 for job in jobs),
        "lost": events.get("lost", 0),
        "handed_back": events.get("handed_back", 0),
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def idle_and_ready(url: str) -> bool:
    """`/readyz` says 200 (an autoscaler sizes the cluster: a request wakes a worker) with 0 workers."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
            return int(json.load(response)["workers"]) == 0
    except (urllib.error.HTTPError, OSError):  # 503 until the first adaptive ask; refused until it listens
        return False


def wait_until(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:.0f} s for {what}")
        time.sleep(0.2)


def cold_start(args: argparse.Namespace) -> dict[str, Any]:
    """`shoal serve --adapt 0:1` at 0 workers: the first request's latency, then the next ones'."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [harness.venv_command("shoal"), "serve", "--adapt", "0:1", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds = []
    try:
        for _ in range(args.rounds):
            wait_until(lambda: idle_and_ready(url), 600, "the cluster at zero workers, an autoscaler asking")
            with OnlineClient(url, timeout=600) as online:
                began = time.monotonic()
                online.encode(args.cold_model, ["the first request wakes a worker"])
                first = time.monotonic() - began
                later = []
                for i in range(args.later):
                    began = time.monotonic()
                    online.encode(args.cold_model, [f"a later request, number {i}"])
                    later.append(time.monotonic() - began)
            rounds.append(
                {"first_seconds": first, "later_p50_seconds": statistics.median(later), "later_max_seconds": max(later)}
            )
            print(
                f"cold start: first request {first:.2f} s; {args.later} later ones p50 "
                f"{statistics.median(later) * 1000:.1f} ms, max {max(later) * 1000:.1f} ms",
                flush=True,
            )
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"model": args.cold_model, "rounds": rounds}


def bursts(args: argparse.Namespace) -> dict[str, Any]:
    """The bursty schedule on a fixed and on an adaptive cluster, and their ratios."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "catalog.yaml").write_text(yaml.safe_dump({"models": {"slow": sim_model(args.item_seconds)}}))
        fixed = run_schedule(folder, "fixed", None, args)
        adaptive = run_schedule(folder, "adaptive", AdaptRange(1, MAXIMUM), args)
    ratio = {
        "makespan": adaptive["makespan_seconds"] / fixed["makespan_seconds"],
        "worker_seconds": adaptive["worker_seconds"] / fixed["worker_seconds"],
    }
    rows = [
        [
            r["cluster"],
            f"{r['makespan_seconds']:.1f}",
            ", ".join(f"{s:.1f}" for s in r["job_seconds"]),
            f"{r['worker_seconds']:.0f}",
            r["most_workers"],
            r["every_id_once"],
        ]
        for r in (fixed, adaptive)
    ]
    columns = ["cluster", "makespan s", "job s", "worker-s", "most workers", "every id once"]
    print("\n".join(harness.markdown_table(columns, rows, right=("makespan s", "worker-s", "most workers"))))
    print(f"adaptive/fixed: makespan {ratio['makespan']:.2f}x, worker-seconds {ratio['worker_seconds']:.2f}x")
    return {"fixed": fixed, "adaptive": adaptive, "ratio": ratio}


def figures(results: dict) -> list[harness.Figure]:
    """Adaptive against fixed: makespan within 15 %, at most 60 % of the worker-seconds; a cold start's first answer."""
    found = []
    if "ratio" in results:
        makespan, seconds = results["ratio"]["makespan"], results["ratio"]["worker_seconds"]
        found += [
            harness.Figure("adaptive / fixed makespan", round(makespan, 2), "x", "<= 1.15x", makespan <= 1.15),
            harness.Figure("adaptive / fixed worker-seconds", round(seconds, 2), "x", "<= 0.6x", seconds <= 0.6),
        ]
    if "cold" in results:
        rounds = results["cold"]["rounds"]
        first = [r["first_seconds"] for r in rounds]
        found.append(
            harness.Figure(
                f"{results['cold']['model']}: first answer from zero workers", f"{min(first):.1f}-{max(first):.1f}", "s"
            )
        )
        found.append(
            harness.Figure("later requests, p50", round(1000 * max(r["later_p50_seconds"] for r in rounds), 1), "ms")
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="bursts", help="comma-separated: bursts, cold")
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--items", type=int, default=48, help="items per job (20 rows each)")
    parser.add_argument("--item-seconds", type=float, default=1.0)
    parser.add_argument("--gap", type=float, default=30.0, help="idle seconds between one job's end and the next")
    parser.add_argument("--cold-model", default="minilm", help="(cold) the catalog model requested")
    parser.add_argument("--later", type=int, default=20, help="(cold) requests after the first")
    parser.add_argument("--rounds", type=int, default=1, help="(cold) scale-to-zero rounds")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {"settings": {k: v for k, v in vars(args).items() if k != "json"}}
    if "bursts" in parts:
        results.update(bursts(args))
    if "cold" in parts:
        results["cold"] = cold_start(args)
    print(f"wrote {harness.write_result('elastic', results, args.json, figures(results))}")


if __name__ == "__main__":
    main()
