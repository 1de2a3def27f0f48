"""The central queue at cluster scale: scheduler cost per batch item and per online request.

(a) The plugin alone: ``ShoalScheduler`` on a stand-in scheduler object (no
    comms), driven by simulated workers in one event loop. Each worker pulls
    with room 2, keeps an LRU of 3 models, and keeps one online pull waiting,
    as real workers do; its "compute" is instant, so every CPU second spent is
    the queue's (plus the stand-in workers' few lines per item, counted in
    the figure: it is conservative). For workers x models in a grid:
    CPU us per batch item and per online request, pull-reply p50/p99 (a
    pull that finds work never suspends, so its wall time is its CPU time),
    and the items/s and requests/s one core sustains (1 / CPU per event).
(b) A real ``dask scheduler`` process with simulated workers (``sim``
    models, ``sim`` operation: no Parquet) in one other process, over TCP:
    the scheduler process's CPU per item, comms included.
(c) Online requests/s through the embedded gateway of ``shoal serve``, and
    through 1 and 2 ``shoal gateway`` processes against one scheduler, with
    the same load generator (its CPU reported beside).

Run ``--code PATH`` to drive another checkout's plugin in (a) (for example
the code before the scale rework, from ``git worktree add``), side by side.

    .venv/bin/python benchmarks/scheduler_scale.py --parts a
    .venv/bin/python benchmarks/scheduler_scale.py --parts a --code /tmp/oldtree --workers 16,128 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "scheduler_scale.json"


# -- (a) the plugin alone ------------------------------------------------------------------


class StandInScheduler:
    def __init__(self, workers: list[str]) -> None:
        self.workers = {w: type("State", (), {"resources": {}})() for w in workers}
        self.handlers: dict = {}
        self.extensions: dict = {}
        self.periodic_callbacks: dict = {}


class SimWorker:
    """A worker's pull loop without the model: pulls with room 2, an LRU of 3 models, one online pull waiting."""

    def __init__(self, plugin, address: str, models: list[str]) -> None:
        self.plugin = plugin
        self.address = address
        self.lru: OrderedDict[str, None] = OrderedDict((m, None) for m in models)
        self.done = 0
        self.pull_seconds: list[float] = []
        self.stop = False  # the online loop's
        self.batch_stop = False

    def hold(self, model: str) -> None:
        self.lru[model] = None
        self.lru.move_to_end(model)
        while len(self.lru) > 3:
            self.lru.popitem(last=False)

    async def batch(self) -> None:
        while not self.batch_stop:
            began = time.perf_counter()
            reply = await self.plugin.pull(
                self.address, resident=list(self.lru), ready=list(self.lru), room=2, held=0, timeout=0.5,
                budget=None, load_seconds={},
            )
            if reply["items"]:
                self.pull_seconds.append(time.perf_counter() - began)
            for message in reply["items"]:
                self.hold(message["model"])
                if self.plugin.start_item(self.address, message["id"])["ok"]:
                    self.plugin.ack(self.address, message["id"], {"rows": 1024, "compute_seconds": 0.05})
                    self.done += 1
            await asyncio.sleep(0)

    async def online(self) -> None:
        while not self.stop:
            reply = await self.plugin.pull_online(
                self.address, resident=list(self.lru), ready=list(self.lru), timeout=0.5, busy=False
            )
            if reply["items"]:
                self.hold(reply["items"][0]["model"])
                self.plugin.ack_many(self.address, [[m["id"], {"n": 1}] for m in reply["items"]], 0.001)


class Zipf:
    """Model names drawn with Zipf weights (the popular few and a long tail)."""

    def __init__(self, models: int, skew: float = 1.1) -> None:
        self.names = [f"m{i}" for i in range(models)]
        self.cum_weights = list(itertools.accumulate(1 / (i + 1) ** skew for i in range(models)))

    def draw(self, rng: random.Random, count: int = 1) -> list[str]:
        return rng.choices(self.names, cum_weights=self.cum_weights, k=count)


async def plugin_alone(workers: int, models: int, seconds: float, seed: int = 0) -> dict:
    from configs import GatewaySettings
    from scheduler_plugins.pull_queue import ShoalScheduler

    rng = random.Random(seed)
    names = [f"w{i}" for i in range(workers)]
    specs = {f"m{i}": {"name": f"m{i}", "kind": "sim", "load_seconds": 2.0} for i in range(models)}
    plugin = ShoalScheduler(models=specs)
    await plugin.start(StandInScheduler(names))
    sims = [SimWorker(plugin, w, [f"m{(i * 3 + k) % models}" for k in range(3)]) for i, w in enumerate(names)]
    online_tasks = [asyncio.create_task(s.online()) for s in sims]
    await asyncio.sleep(0.05)

    # Batch: a backlog far larger than what workers take per pull, Zipf over the models.
    per_job = max(20_000, workers * 40)
    items = [
        {"key": str(i), "model": m, "op": "sim", "rows": 1024, "payload": {}}
        for i, m in enumerate(Zipf(models).draw(rng, per_job))
    ]
    plugin.submit("batch", items, {"lease_seconds": 600})
    batch_tasks = [asyncio.create_task(s.batch()) for s in sims]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - wall0 < seconds and sum(s.done for s in sims) < per_job * 0.9:
        await asyncio.sleep(0.05)
    batch_cpu = time.process_time() - cpu0
    batch_items = sum(s.done for s in sims)
    for s in sims:
        s.batch_stop = True
    await asyncio.gather(*batch_tasks, return_exceptions=True)
    pulls = sorted(x for s in sims for x in s.pull_seconds)
    plugin.job_release("batch")

    # Online: a closed loop of 64 requests in flight, Zipf over the models.
    settings = GatewaySettings(request_timeout_seconds=60, max_attempts=2)
    stop_at = time.perf_counter() + seconds
    answered = 0

    zipf = Zipf(models)

    async def client(client_seed: int) -> None:
        nonlocal answered
        crng = random.Random(client_seed)
        while time.perf_counter() < stop_at:
            model = zipf.draw(crng)[0]
            _, future = plugin.submit_online(model, "encode", {"texts": ["q"]}, 1, settings)
            await future
            answered += 1

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client(seed * 1000 + c) for c in range(64)))
    online_cpu = time.process_time() - cpu0
    online_wall = time.perf_counter() - wall0
    for s in sims:
        s.stop = True
    for t in online_tasks:
        t.cancel()
    await asyncio.gather(*online_tasks, return_exceptions=True)
    await plugin.close()
    per_item = batch_cpu / max(batch_items, 1)
    per_request = online_cpu / max(answered, 1)
    return {
        "workers": workers, "models": models,
        "batch_items": batch_items, "batch_cpu_us_per_item": per_item * 1e6,
        "batch_items_per_cpu_second": 1 / per_item if batch_items else 0.0,
        "pull_reply_p50_us": statistics.median(pulls) * 1e6 if pulls else None,
        "pull_reply_p99_us": pulls[int(0.99 * (len(pulls) - 1))] * 1e6 if pulls else None,
        "online_requests": answered, "online_cpu_us_per_request": per_request * 1e6,
        "online_requests_per_cpu_second": 1 / per_request if answered else 0.0,
        "online_requests_per_second_wall": answered / online_wall,
    }


def part_a(args) -> list[dict]:
    if args.code:
        sys.path.insert(0, str(Path(args.code).resolve()))
    import scheduler_plugins

    print(f"(a) plugin alone, code from {Path(scheduler_plugins.__file__).parent.parent}", flush=True)
    rows = []
    for workers in args.workers:
        for models in args.models:
            row = asyncio.run(plugin_alone(workers, models, args.seconds))
            rows.append(row)
            print(
                f"  {workers:>5} workers x {models:>5} models: batch {row['batch_cpu_us_per_item']:8.1f} us/item "
                f"({row['batch_items_per_cpu_second']:9.0f} items/s), pull p50/p99 "
                f"{row['pull_reply_p50_us'] or 0:7.1f}/{row['pull_reply_p99_us'] or 0:8.1f} us; online "
                f"{row['online_cpu_us_per_request']:9.1f} us/request ({row['online_requests_per_cpu_second']:8.0f}/s)",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="a", help="comma-separated: a, b, c")
    parser.add_argument("--workers", default="16,128,1024,4096", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--models", default="24,100,1000", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--seconds", type=float, default=4.0, help="per phase and configuration")
    parser.add_argument("--code", default=None, help="a checkout whose scheduler_plugins (a) drives instead")
    parser.add_argument("--json", default=str(RESULTS))
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    results: dict = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:]}
    if "a" in parts:
        results["a"] = part_a(args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
