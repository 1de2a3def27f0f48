#!/usr/bin/env python
"""Chaos: batch jobs and a steady online load on two workers while workers are killed and frozen.

For --minutes, on an embedded cluster of two worker processes (this process
holds the scheduler and the gateway, as `shoal serve` does):

- batch: the same embed job runs again and again, each time into a fresh
  output folder; a run that ends with failed parts is run again (resumed),
  as a user would. Every finished output is compared with a clean run made
  before any fault: rows lost, duplicated, or with a different vector.
- online: an open loop of --rate requests/s to /v1/encode (JSON), each with a
  deadline (X-Shoal-Timeout); 5 % carry a lone surrogate (poison, must be
  400), 3 % are over the body limit (must be 413). Counted: answered, 4xx,
  429, 503, and unanswered within the deadline (504 or no answer: must be 0).
- faults: every 5-15 s (random, --seed) one worker process is killed
  (SIGKILL; its nanny starts a new one) or frozen (SIGSTOP for 1-5 s, then
  SIGCONT). Requests sent while a fault lasts, or within --settle seconds
  after it, are "during faults"; their p99 is reported.

The model is `sim` by default (deterministic vectors from each text's digest,
a fixed cost per forward batch) so faults, not compute, dominate; --model
minilm uses the real model (slower jobs, fewer of them).

    .venv/bin/python benchmarks/chaos.py --minutes 10
    .venv/bin/python benchmarks/chaos.py --minutes 2 --json /tmp/chaos.json

Prints a summary and writes it as JSON to --json.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from distributed import Client
from harness import ROOT
from rich.console import Console

from shoal.configs import load_catalog, load_profile
from shoal.pipeline.cluster import pull_queue, start_local_cluster
from shoal.pipeline.jobs.embed import EmbedRequest, run_embed

DEMO = ROOT / "datasets" / "demo"
SIM = {
    "kind": "sim",
    "dim": 16,
    "max_seq_length": 128,
    "memory_bytes": 1000,
    "batch_fixed_seconds": 0.01,
    "max_batch_size": 32,
}
POISON = "\ud800"
BODY_LIMIT = 64 * 1024


@dataclass
class Answer:
    kind: str  # legit, poison, oversized
    sent: float
    latency: float | None  # None: no answer at all
    status: int | None
    message: str = ""  # the error's message, for answers a legitimate request should not get


@dataclass
class Faults:
    windows: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, kill or freeze)
    log: list[dict[str, Any]] = field(default_factory=list)

    def during(self, t: float, settle: float, kind: str | None = None) -> bool:
        return any(start <= t <= end + settle for start, end, k in self.windows if kind in (None, k))


def corpus(directory: Path, rows: int) -> list[str]:
    texts = [
        t for shard in sorted(DEMO.glob("part-*.parquet")) for t in pq.read_table(shard).column("text").to_pylist()
    ]
    chosen = [texts[i % len(texts)] + (f" #{i // len(texts)}" if i >= len(texts) else "") for i in range(rows)]
    directory.mkdir(parents=True)
    per = -(-rows // 4)
    for s in range(4):
        part = slice(s * per, min((s + 1) * per, rows))
        ids = [f"doc-{i}" for i in range(rows)][part]
        pq.write_table(
            pa.table({"id": ids, "text": chosen[part]}), directory / f"shard-{s}.parquet", row_group_size=250
        )
    return chosen


def vectors_by_id(directory: Path) -> tuple[dict[str, np.ndarray | None], int]:
    table = pq.read_table(str(directory), columns=["id", "embedding"])
    ids = table.column("id").to_pylist()
    vectors = table.column("embedding").to_pylist()
    return {i: None if v is None else np.asarray(v) for i, v in zip(ids, vectors)}, len(ids) - len(set(ids))


def run_batch(client: Client, source: Path, output: Path, model: str, profile, catalog) -> dict[str, Any]:
    """One job into `output`, resumed until it exits 0 (at most 5 runs)."""
    request = EmbedRequest(input=str(source), output=str(output), model=model)
    quiet = Console(file=io.StringIO())
    started = time.monotonic()
    for attempt in range(1, 6):
        outcome = run_embed(client, request, profile, catalog, quiet)
        if outcome.exit_code == 0:
            return {"runs": attempt, "seconds": round(time.monotonic() - started, 1), "complete": True}
    return {"runs": attempt, "seconds": round(time.monotonic() - started, 1), "complete": False}


def compare(clean: dict[str, np.ndarray], output: Path) -> dict[str, int]:
    got, duplicated = vectors_by_id(output)
    lost = len(set(clean) - set(got))
    differing = sum(1 for i, v in got.items() if i in clean and (v is None or not np.allclose(v, clean[i], atol=1e-6)))
    return {"lost": lost, "duplicated": duplicated, "differing": differing, "extra": len(set(got) - set(clean))}


async def online_load(
    url: str, texts: list[str], rate: float, deadline: float, stop: threading.Event, rng: random.Random
) -> list[Answer]:
    answers: list[Answer] = []
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(kind: str, body: bytes, scheduled: float) -> None:
            headers = {"Content-Type": "application/json", "X-Shoal-Timeout": str(deadline)}
            try:
                async with session.post(
                    f"{url}/v1/encode/chaos",
                    data=body,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=deadline + 5),
                ) as response:
                    raw = await response.read()
                    latency = time.monotonic() - scheduled
                    message = ""
                    if kind == "legit" and response.status != 200:
                        message = json.loads(raw)["error"]["message"] if raw else ""
                    answers.append(Answer(kind, scheduled, latency, response.status, message))
            except (TimeoutError, aiohttp.ClientError):
                answers.append(Answer(kind, scheduled, None, None))

        tasks = []
        start = time.monotonic()
        n = 0
        while not stop.is_set():
            scheduled = start + n / rate
            n += 1
            await asyncio.sleep(max(0.0, scheduled - time.monotonic()))
            draw = rng.random()
            if draw < 0.05:
                kind, body = "poison", json.dumps({"texts": ["fine", "bad " + POISON]}).encode()
            elif draw < 0.08:
                kind, body = "oversized", json.dumps({"texts": ["x" * (BODY_LIMIT + 10)]}).encode()
            else:
                kind, body = "legit", json.dumps({"texts": [rng.choice(texts)]}).encode()
            tasks.append(asyncio.create_task(one(kind, body, scheduled)))
        await asyncio.gather(*tasks)
    return answers


def inject_faults(client: Client, faults: Faults, stop: threading.Event, rng: random.Random) -> None:
    while not stop.wait(rng.uniform(5, 15)):
        pids = client.run(os.getpid)
        if not pids:
            continue
        address, pid = rng.choice(sorted(pids.items()))
        start = time.monotonic()
        kind = "kill" if rng.random() < 0.5 else "freeze"
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)
            faults.log.append({"at": round(start, 1), "fault": "SIGKILL", "worker": address})
            replaced(client, address, stop)  # the fault lasts until the nanny's new worker has joined
        else:
            frozen = rng.uniform(1, 5)
            os.kill(pid, signal.SIGSTOP)
            stop.wait(frozen)
            os.kill(pid, signal.SIGCONT)
            faults.log.append({"at": round(start, 1), "fault": f"SIGSTOP {frozen:.1f} s", "worker": address})
        faults.windows.append((start, time.monotonic(), kind))


def replaced(client: Client, address: str, stop: threading.Event, timeout: float = 120) -> None:
    """Wait until the scheduler has dropped the killed worker and two workers are connected again.

    Waiting for two workers alone returns at once (the dead one is still
    registered), and the next fault could then leave no worker at all.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        workers = client.scheduler_info()["workers"]
        if address not in workers and len(workers) >= 2:
            return
        time.sleep(0.2)


def p99(values: list[float]) -> float | None:
    return round(float(np.percentile(values, 99)) * 1000, 1) if values else None


def summarize_online(answers: list[Answer], faults: Faults, settle: float, deadline: float) -> dict[str, Any]:
    def count(kind: str) -> dict[str, int]:
        mine = [a for a in answers if a.kind == kind]
        statuses: dict[str, int] = {}
        for a in mine:
            key = "unanswered" if a.status is None or a.status == 504 else str(a.status)
            statuses[key] = statuses.get(key, 0) + 1
        return {"sent": len(mine), **dict(sorted(statuses.items()))}

    legit = [(a.sent, a.latency) for a in answers if a.kind == "legit" and a.status == 200 and a.latency is not None]
    during = [latency for sent, latency in legit if faults.during(sent, settle)]
    by_kind = {
        kind: [latency for sent, latency in legit if faults.during(sent, settle, kind)] for kind in ("kill", "freeze")
    }
    calm = [latency for sent, latency in legit if not faults.during(sent, settle)]
    late = sum(1 for a in answers if a.latency is not None and a.latency > deadline + 1)
    errors: dict[str, int] = {}
    for a in answers:
        if a.kind == "legit" and a.status != 200:
            key = f"{a.status}: {a.message[:100]}"
            errors[key] = errors.get(key, 0) + 1
    return {
        "legit_errors": errors,
        "legit": count("legit"),
        "poison": count("poison"),
        "oversized": count("oversized"),
        "legit_p99_ms_during_faults": p99(during),
        "legit_requests_during_faults": len(during),
        "legit_p99_ms_during_kills": p99(by_kind["kill"]),
        "legit_p99_ms_during_freezes": p99(by_kind["freeze"]),
        "legit_max_ms_during_kills": round(max(by_kind["kill"], default=0) * 1000, 1),
        "legit_p99_ms_calm": p99(calm),
        "legit_p50_ms_calm": round(float(np.median(calm)) * 1000, 1) if calm else None,
        "answered_after_deadline": late,
    }


def figures(report: dict) -> list[harness.Figure]:
    """Rows lost or wrong under faults (none allowed), and online p99 while workers are killed or frozen."""
    batch, online = report["batch"], report["online"]
    wrong = batch["lost"] + batch["duplicated"] + batch["differing"]
    unanswered = online["legit"].get("unanswered", 0)
    return [
        harness.Figure(f"rows lost, duplicated or differing over {batch['jobs']} jobs", wrong, "", "0", wrong == 0),
        harness.Figure("legitimate requests unanswered", unanswered, "", "0", unanswered == 0),
        harness.Figure("online p99 during faults", online["legit_p99_ms_during_faults"], "ms"),
        harness.Figure("online p99 calm", online["legit_p99_ms_calm"], "ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0, help="online requests per second")
    parser.add_argument("--rows", type=int, default=5000, help="rows of the batch corpus")
    parser.add_argument("--model", default="chaos", help="`chaos` (simulated) or a catalog model such as minilm")
    parser.add_argument("--deadline", type=float, default=10.0, help="each online request's deadline, seconds")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after a fault still counted as during it")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--json", default=str(harness.result_path("chaos")))
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="shoal-chaos-") as tmp:
        work = Path(tmp)
        catalog_path = work / "catalog.yaml"
        catalog_path.write_text(yaml.safe_dump({"models": {"chaos": SIM}}))
        profile_path = work / "chaos.yaml"
        profile_path.write_text(
            yaml.safe_dump(
                {
                    "name": "chaos",
                    "device": "cpu",
                    "workers": 2,
                    "threads_per_worker": 1,
                    "prefetch": 2,
                    "rows_per_item": 250,
                    "lease_seconds": 10,
                    "max_attempts": 3,
                    "pull_timeout_seconds": 1.0,
                    "gateway": {"port": 0, "max_body_bytes": BODY_LIMIT, "request_timeout_seconds": args.deadline},
                }
            )
        )
        profile, catalog = load_profile(str(profile_path)), load_catalog(str(catalog_path))
        texts = corpus(work / "in", args.rows)
        with start_local_cluster(profile, str(catalog_path), n_workers=2) as cluster, Client(cluster) as client:
            client.wait_for_workers(2)
            specs = {name: profile.tuned(spec).model_dump() for name, spec in catalog.models.items()}
            if args.model not in specs:
                specs[args.model] = profile.tuned(catalog.get(args.model)).model_dump()
            url = client.sync(pull_queue(client).gateway_start, settings=profile.gateway.model_dump(), models=specs)[
                "url"
            ]
            clean = run_batch(client, work / "in", work / "clean", args.model, profile, catalog)
            clean_vectors, _ = vectors_by_id(work / "clean")
            expected = {i: v for i, v in clean_vectors.items() if v is not None}
            print(f"clean run: {len(expected)} rows in {clean['seconds']} s; chaos for {args.minutes} min", flush=True)

            stop, faults = threading.Event(), Faults()
            answers: list[Answer] = []
            loader = threading.Thread(
                target=lambda: answers.extend(
                    asyncio.run(online_load(url, texts, args.rate, args.deadline, stop, random.Random(args.seed + 1)))
                )
            )
            injector = threading.Thread(target=inject_faults, args=(client, faults, stop, random.Random(args.seed + 2)))
            loader.start()
            injector.start()
            runs: list[dict[str, Any]] = []
            end = time.monotonic() + args.minutes * 60
            while time.monotonic() < end:
                output = work / f"out-{len(runs)}"
                result = run_batch(client, work / "in", output, args.model, profile, catalog)
                result.update(compare(expected, output))
                runs.append(result)
                print(f"batch run {len(runs)}: {result}", flush=True)
            stop.set()
            injector.join()
            loader.join()
            client.sync(pull_queue(client).gateway_stop)

    online = summarize_online(answers, faults, args.settle, args.deadline)
    totals = {key: sum(r[key] for r in runs) for key in ("lost", "duplicated", "differing", "extra")}
    report = {
        "conditions": harness.conditions(
            minutes=args.minutes,
            rate=args.rate,
            rows=args.rows,
            model=args.model,
            deadline_s=args.deadline,
            seed=args.seed,
        ),
        "faults": {
            "count": len(faults.windows),
            "kills": sum(1 for f in faults.log if f["fault"] == "SIGKILL"),
            "freezes": sum(1 for f in faults.log if f["fault"] != "SIGKILL"),
        },
        "batch": {
            "jobs": len(runs),
            "incomplete_jobs": sum(1 for r in runs if not r["complete"]),
            "resumed_jobs": sum(1 for r in runs if r["runs"] > 1),
            "rows_per_job": len(expected),
            **totals,
        },
        "online": online,
        "runs": runs,
        "fault_log": faults.log,
    }
    harness.write_result("chaos", report, args.json, figures(report))
    print(json.dumps({k: report[k] for k in ("conditions", "faults", "batch", "online")}, indent=1))
    failed = totals["lost"] or totals["duplicated"] or totals["differing"] or online["legit"].get("unanswered", 0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
