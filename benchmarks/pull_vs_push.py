#!/usr/bin/env python
"""Pull vs push (issue 3): Shoal's pull queue against two baselines, on simulated devices.

SIMULATION: every model is catalog kind ``sim`` (workers/runtimes/sim_runtime.py). A
load sleeps the model's ``load_seconds`` and claims ``memory_bytes`` of the
worker's pool; a token-budget batch sleeps ``batch_fixed_seconds +
per_token_seconds x padded tokens``. Batch items use the ``sim`` operation
(workers/operations/sim_operation.py: no storage); online requests use the ``encode``
online operation, as the gateway does. Sleeps release the GIL, so 16 workers
share one process on two cores and only the scheduling differs.

Same workload, same cluster shape (16 workers, 24 models, pool room for 3
models per worker), one run, three variants (push twice):

* pull: Shoal as built. ``scheduler_plugins`` (PullQueue) and ``workers``
  (ShoalWorker) preloaded in a LocalCluster; batch jobs go in through the
  ``shoal_submit`` handler, online requests through ``online.submit`` (the
  gateway's own call, on the scheduler's loop; no HTTP).
* push: routing by model affinity. ``PushScheduler`` below, a PullQueue
  registered under the same plugin name (the workers run unchanged), routes
  each queued item to one of the model's ``--push-replicas`` workers chosen by
  rendezvous hashing of the model over the worker names (the less loaded of
  them), onto that worker's own queue; a worker only ever gets items routed
  to it (online first, then models it holds, then its oldest head) and
  nothing is taken back. ``push`` hashes each model to 2 workers (48
  placements for 48 pool slots, the memory pull has), ``push1`` to 1.
* dask: Dask's own scheduling. One ``client.submit`` per item with
  ``resources={"MEMORY": model bytes}`` (work stealing on, the default); online
  requests with a higher priority. The task keeps a per-worker LRU cache of 3
  SimulatedRuntime objects (same load and batch sleeps); placement knows
  nothing of models.

Batch: a fixed number of items (256 texts each) in jobs arriving in the first
seconds; online: a Poisson stream of small requests (8 texts). Models are
drawn from a Zipf law over a seeded random ranking of the 24 models; arrival
times and models are the same for every variant. Throughput = batch items /
makespan (first submit to last batch item done); online latency = submit to
answer.

    .venv/bin/python benchmarks/pull_vs_push.py            # the main run at real time, sweeps time-scaled
    .venv/bin/python benchmarks/pull_vs_push.py --quick    # everything time-scaled further

Prints a Markdown table; writes benchmarks/results/pull_vs_push.json and .png.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
from distributed import Client, LocalCluster, get_worker
from harness import RESULTS, Meter

from shoal.configs import MAX_ONLINE_BATCH, GatewaySettings, ModelSpec
from shoal.pipeline.cluster import pull_queue  # noqa: E402
from shoal.scheduler_plugins.online_queue import OnlineQueue
from shoal.scheduler_plugins.protocol import (
    EncodePayload,
    ItemResult,
    Lane,
    OnlineAck,
    OnlineResult,
    PullReply,
    SimPayload,
)
from shoal.scheduler_plugins.pull_queue import PullQueue
from shoal.scheduler_plugins.work_items import ItemState, WorkItem
from shoal.scheduler_plugins.worker_views import WorkerView
from shoal.workers.batching.token_batching import plan_batches
from shoal.workers.operations import embed_operation, sim_operation
from shoal.workers.runtimes.sim_runtime import CHARS_PER_TOKEN, SimulatedRuntime

VARIANTS = ("pull", "push", "push1", "dask")
MAIN_VARIANTS = "pull,push,push1,dask"
SWEEP_VARIANTS = "pull,push,dask"
LABELS = {
    "pull": "(a) Shoal pull queue",
    "push": "(b) push, model-affinity hashing, 2 workers per model",
    "push1": "(b') push, model-affinity hashing, 1 worker per model",
    "dask": "(c) Dask scheduling (submit + resources, stealing)",
}


# -- the workload ---------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    workers: int = 16
    models: int = 24
    models_per_worker: int = 3
    memory_bytes: int = 1_000_000_000  # per model (claimed in the pool only)
    zipf: float = 1.1
    load_mean: float = 3.5  # seconds; loads drawn uniformly in [4/7, 10/7] x mean (2-5 s at 3.5)
    batch_items: int = 600
    batch_jobs: int = 6
    job_gap: float = 3.0  # seconds between batch job arrivals
    item_texts: int = 256
    item_tokens: tuple[int, int] = (32, 96)
    online_rate: float = 4.0  # requests per second (real time)
    online_seconds: float = 40.0  # the stream lasts this long (real time)
    online_texts: int = 8
    online_tokens: tuple[int, int] = (16, 96)
    batch_fixed_seconds: float = 0.02
    per_token_seconds: float = 4e-5
    token_budget: int = 8192
    scale: float = 1.0  # every sleep and arrival time multiplied by this
    push_replicas: int = 2
    seed: int = 7

    def load_range(self) -> tuple[float, float]:
        return self.load_mean * 4 / 7, self.load_mean * 10 / 7


@dataclass
class Workload:
    specs: dict[str, dict[str, Any]]
    popularity: dict[str, float]
    batch: list[tuple[float, str, list[dict[str, Any]]]]  # (at, job, items)
    online: list[tuple[float, str, dict[str, Any]]]  # (at, model, encode payload)


def make_workload(cfg: Config) -> Workload:
    rng = np.random.default_rng(cfg.seed)
    names = [f"sim{i:02d}" for i in range(cfg.models)]
    low, high = cfg.load_range()
    loads = rng.uniform(low, high, cfg.models)
    specs = {
        name: ModelSpec(
            name=name,
            kind="sim",
            dim=8,
            max_seq_length=256,
            memory_bytes=cfg.memory_bytes,
            token_budget={"cpu": cfg.token_budget, "cuda": cfg.token_budget},
            max_batch_size=256,
            load_seconds=float(loads[i]) * cfg.scale,
            batch_fixed_seconds=cfg.batch_fixed_seconds * cfg.scale,
            per_token_seconds=cfg.per_token_seconds * cfg.scale,
        ).model_dump()
        for i, name in enumerate(names)
    }
    ranking = [names[i] for i in rng.permutation(cfg.models)]  # the hottest model is not always sim00
    weights = np.array([1.0 / (k + 1) ** cfg.zipf for k in range(cfg.models)])
    weights /= weights.sum()
    popularity = {m: float(w) for m, w in zip(ranking, weights)}

    draws = rng.choice(cfg.models, size=cfg.batch_items, p=weights)
    per_job = np.array_split(np.arange(cfg.batch_items), cfg.batch_jobs)
    batch = []
    for j, indices in enumerate(per_job):
        items = [
            {
                "key": f"{i:05d}",
                "model": ranking[draws[i]],
                "op": "sim",
                "rows": cfg.item_texts,
                "payload": {
                    "texts": cfg.item_texts,
                    "min_tokens": cfg.item_tokens[0],
                    "max_tokens": cfg.item_tokens[1],
                    "seed": int(i),
                },
            }
            for i in indices
        ]
        batch.append((j * cfg.job_gap * cfg.scale, f"batch-{j}", items))

    online = []
    t = rng.exponential(1.0 / cfg.online_rate)
    while t < cfg.online_seconds:
        model = ranking[rng.choice(cfg.models, p=weights)]
        tokens = rng.integers(cfg.online_tokens[0], cfg.online_tokens[1] + 1, cfg.online_texts)
        texts = ["y" * (CHARS_PER_TOKEN * (int(n) - 2)) for n in tokens]
        online.append((t * cfg.scale, model, {"texts": texts, "truncate": True, "dtype": "float32"}))
        t += rng.exponential(1.0 / cfg.online_rate)
    return Workload(specs, popularity, batch, online)


def ideal_seconds(cfg: Config, wl: Workload) -> dict[str, float]:
    """Device seconds of batch work, and the makespan with no loads and perfect balance."""
    total = 0.0
    for _, _, items in wl.batch:
        for item in items:
            spec = wl.specs[item["model"]]
            lengths = np.minimum(sim_operation.token_counts(item["payload"]), spec["max_seq_length"])
            for batch in plan_batches(lengths, cfg.token_budget, spec["max_batch_size"]):
                padded = len(batch) * int(lengths[batch].max())
                total += spec["batch_fixed_seconds"] + spec["per_token_seconds"] * padded
    return {"batch_device_seconds": total, "ideal_makespan": total / cfg.workers}


# -- (b) push routing -------------------------------------------------------------


def rendezvous(model: str, workers: list[str], replicas: int) -> list[str]:
    """The `replicas` workers (by name) a model hashes to, highest score first."""
    score = lambda w: hashlib.blake2b(f"{model}|{w}".encode(), digest_size=8).digest()  # noqa: E731
    return sorted(workers, key=score, reverse=True)[:replicas]


class PushOnlineQueue(OnlineQueue):
    """Every online request wakes every waiting pull: push keeps no index of who may take it."""

    def submit(self, *args, **kwargs):
        submitted = super().submit(*args, **kwargs)
        self.core._wake_all()
        return submitted


class PushScheduler(PullQueue):
    """Push routing by model affinity, in place of the pull placement.

    Every queued item (batch or online) is routed, as soon as a worker pulls,
    to the less loaded of its model's `replicas` hashed workers and appended to
    that worker's own queue. A worker is only ever leased items from its own
    queue: online first, then a model it holds (oldest head), else its oldest
    head (it loads that model). Nothing is stolen or taken back. Requeued items
    (lost worker, expired lease) go through the central queue and are routed
    again.
    """

    def __init__(self, replicas: int = 2, **kwargs) -> None:
        super().__init__(**kwargs)
        self.replicas = replicas
        # worker address -> lane -> model -> FIFO
        self.routed: dict[str, dict[Lane, dict[str, deque[WorkItem]]]] = defaultdict(
            lambda: {Lane.ONLINE: defaultdict(deque), Lane.BATCH: defaultdict(deque)}
        )
        self.routes: dict[str, list[str]] = {}
        self._queued = asyncio.Event()  # set by every queued item: push wakes every waiting pull
        self.online = PushOnlineQueue(self)

    async def start(self, scheduler) -> None:
        await super().start(scheduler)
        scheduler.handlers["shoal_pull_online"] = self.pull_online

    def work_queued(self, model: str, lane: Lane, count: int) -> None:
        for pull in list(self.batch_pulls.all.values()):
            self.batch_pulls.discard(pull)
            pull.wake()
        self._wake_all()

    def _wake_all(self) -> None:
        self._queued.set()
        self._queued = asyncio.Event()

    def targets(self, model: str) -> list[str]:
        by_name = {str(ws.name): address for address, ws in self.scheduler.workers.items()}
        names = rendezvous(model, sorted(by_name), self.replicas)
        self.routes[model] = names
        return [by_name[n] for n in names]

    def _backlog(self, address: str) -> int:
        queued = sum(
            w.rows
            for fifos in self.routed[address].values()
            for q in fifos.values()
            for w in q
            if w.state is ItemState.QUEUED
        )
        leased = sum(w.rows for w in self.leases.of_worker(address).values())
        return queued + leased

    def _route(self) -> None:
        for model in self.queues.models():
            targets = self.targets(model)
            for lane in Lane:
                for work in self.queues.take(model, lane, 1 << 30):
                    target = min(targets, key=lambda a: (self._backlog(a), targets.index(a)))
                    self.routed[target][lane][model].append(work)

    def _serve(self, view: WorkerView, lane: Lane, limit: int) -> list[WorkItem]:
        fifos = self.routed[view.address][lane]
        heads: dict[str, WorkItem] = {}
        for model in list(fifos):
            fifo = fifos[model]
            while fifo and fifo[0].state is not ItemState.QUEUED:
                fifo.popleft()
            if fifo:
                heads[model] = fifo[0]
            else:
                del fifos[model]
        if not heads:
            return []
        held = [(h.enqueued_at, m) for m, h in heads.items() if m in view.held]
        model = min(held or [(h.enqueued_at, m) for m, h in heads.items()])[1]
        items: list[WorkItem] = []
        fifo = fifos[model]
        while fifo and len(items) < limit:
            work = fifo.popleft()
            if work.state is ItemState.QUEUED:
                items.append(work)
        for work in items:
            self.lease(work, view.address)
        return items

    def _lease_next(self, worker: WorkerView, room: int) -> list[WorkItem]:
        self._route()
        return self._serve(worker, Lane.ONLINE, MAX_ONLINE_BATCH) or self._serve(worker, Lane.BATCH, room)

    def _take_back(self, worker: WorkerView) -> list[WorkItem]:
        return []

    async def pull_online(
        self,
        worker: str,
        held: list[str] | None = None,
        loaded: list[str] | None = None,
        timeout: float = 2.0,
        acks: Sequence[OnlineAck] = (),
        **_ignored: Any,
    ) -> PullReply:
        """A worker's standing online pull: its last groups' acks answered as the plugin's pull does, then only
        online items routed to it (other hints ignored)."""
        for item_id, result, compute_seconds in acks:
            self.online.ack(worker, item_id, result, compute_seconds)
        view = self.reported(worker, held, loaded)
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if worker not in self.scheduler.workers:
                return {"items": [], "reason": "unknown worker"}
            self._route()
            items = self._serve(view, Lane.ONLINE, MAX_ONLINE_BATCH)
            if items:
                return self.items_reply(items)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {"items": []}
            try:
                await asyncio.wait_for(self._queued.wait(), remaining)
            except TimeoutError:
                pass


# -- (c) Dask tasks -----------------------------------------------------------------


def _dask_runtime(spec: dict[str, Any], slots: int) -> SimulatedRuntime:
    """This worker's LRU cache of simulated models (one task at a time per worker).

    Kept on the Worker object: Dask ships this script's functions by value, so
    module globals would not be shared between tasks.
    """
    worker = get_worker()
    cache: OrderedDict[str, SimulatedRuntime] = worker.__dict__.setdefault("_sim_models", OrderedDict())
    stats: Counter[str] = worker.__dict__.setdefault("_sim_stats", Counter())
    name = spec["name"]
    runtime = cache.get(name)
    if runtime is not None:
        cache.move_to_end(name)
        return runtime
    while len(cache) >= slots:
        cache.popitem(last=False)
        stats["evictions"] += 1
    runtime = SimulatedRuntime(ModelSpec(**spec))  # sleeps load_seconds
    cache[name] = runtime
    stats["loads"] += 1
    return runtime


def dask_batch_item(spec: dict[str, Any], payload: SimPayload, slots: int) -> ItemResult:
    runtime = _dask_runtime(spec, slots)
    texts = sim_operation.read(payload)
    computed = sim_operation.compute(runtime, texts)
    return sim_operation.write(payload, texts, computed, ModelSpec(**spec))


def dask_online_item(spec: dict[str, Any], payload: EncodePayload, slots: int) -> OnlineResult:
    runtime = _dask_runtime(spec, slots)
    return embed_operation.online(runtime, [payload])[0]


# -- running one variant ------------------------------------------------------------


def write_profile(cfg: Config, folder: Path) -> Path:
    path = folder / "pull-vs-push.yaml"
    path.write_text(
        "name: pull-vs-push\ndevice: cpu\n"
        f"workers: {cfg.workers}\nthreads_per_worker: 1\nprefetch: 2\n"
        "pull_timeout_seconds: 0.5\nlease_seconds: 60\nmax_attempts: 3\nmemory_fraction: 1.0\n"
    )
    return path


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def replicas(cfg: Config, variant: str) -> int:
    return 1 if variant == "push1" else cfg.push_replicas


async def _cluster(cfg: Config, variant: str) -> LocalCluster:
    kwargs: dict[str, Any] = {}
    if variant != "dask":
        plugins = [PushScheduler(replicas=replicas(cfg, variant))] if variant.startswith("push") else []
        kwargs = {
            "scheduler_kwargs": {"preload": ["shoal.scheduler_plugins"], "plugins": plugins},
            "preload": ["shoal.workers"],
        }
    return await LocalCluster(
        n_workers=cfg.workers,
        threads_per_worker=1,
        processes=False,
        asynchronous=True,
        resources={"MEMORY": cfg.models_per_worker * cfg.memory_bytes},
        dashboard_address=None,
        silence_logs=logging.ERROR,
        **kwargs,
    )


async def _close(cluster: LocalCluster) -> None:
    """Close quietly: workers whose heartbeat races the scheduler's shutdown log an ERROR otherwise."""
    quiet = logging.getLogger("distributed.worker")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        closing = cluster.close()
        if closing is not None:  # a cluster on a running loop closes asynchronously
            await closing
    finally:
        quiet.setLevel(level)


def events(wl: Workload) -> list[tuple[float, int, str, Any]]:
    """Batch jobs (kind 0) and online requests (kind 1) in arrival order: (at, kind, job or model, items or payload)."""
    merged = [(at, 0, job, items) for at, job, items in wl.batch] + [
        (at, 1, model, payload) for at, model, payload in wl.online
    ]
    return sorted(merged, key=lambda e: (e[0], e[1]))


async def online_answer(future: Any, sent: float, latencies: list[float], failures: list[str]) -> None:
    """Await one online request's answer: its latency, or why it failed."""
    try:
        result = await future
        if "error" in result:
            failures.append(result["error"])
        else:
            latencies.append(time.monotonic() - sent)
    except Exception as exc:  # noqa: BLE001
        failures.append(f"{type(exc).__name__}: {exc}")


async def _pace(t0: float, at: float) -> None:
    delay = t0 + at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_shoal(cfg: Config, wl: Workload, variant: str) -> dict[str, Any]:
    cluster = await _cluster(cfg, variant)
    try:
        async with Client(cluster, asynchronous=True) as client:
            await client.wait_for_workers(cfg.workers)
            plugin = cluster.scheduler.extensions["shoal-pull-queue"]
            assert type(plugin) is (PushScheduler if variant.startswith("push") else PullQueue), type(plugin)
            while len(plugin.worker_views) < cfg.workers:  # every pull loop has asked once
                await asyncio.sleep(0.05)
            # The model specs, known to the scheduler before the first request (as the gateway's are).
            await pull_queue(client).submit(job="specs", items=[], settings={"models": wl.specs})
            await pull_queue(client).job_release(job="specs")
            online_settings = GatewaySettings(request_timeout_seconds=600, max_attempts=3)
            latencies: list[float] = []
            failures: list[str] = []

            waiting: list[asyncio.Task] = []
            jobs: dict[str, int] = {}
            with Meter() as meter:
                t0, wall0 = time.monotonic(), time.time()
                for at, kind, name, body in events(wl):
                    await _pace(t0, at)
                    if kind == 0:
                        await pull_queue(client).submit(
                            job=name, items=body, settings={"lease_seconds": 60, "max_attempts": 3}
                        )
                        jobs[name] = len(body)
                    else:
                        _, future = plugin.online.submit(name, "embed", body, len(body["texts"]), online_settings)
                        waiting.append(
                            asyncio.create_task(online_answer(future, time.monotonic(), latencies, failures))
                        )
                while not all(plugin.jobs[j].complete for j in jobs):
                    await asyncio.sleep(0.02)
                await asyncio.gather(*waiting)
                end = time.monotonic()
            finished = {j: (plugin.jobs[j].finished or time.time()) - wall0 for j in jobs}
            done = {j: len(plugin.jobs[j].results) for j in jobs}
            dead = {j: len(plugin.jobs[j].dead_letters) for j in jobs}
            rows = sum(plugin.jobs[j].rows_done for j in jobs)
            for j in jobs:
                await pull_queue(client).job_release(job=j)
            pools = [w.plugins["shoal-worker"].pool for w in cluster.workers.values()]
            events_seen = dict(plugin.events)
            routes = dict(getattr(plugin, "routes", {}))
        makespan = max(finished.values())
        return {
            "makespan": makespan,
            "run_seconds": end - t0,
            "batch_done": sum(done.values()),
            "batch_dead": sum(dead.values()),
            "rows_done": rows,
            "online_done": len(latencies),
            "online_failed": failures,
            "latencies": latencies,
            "loads": sum(p.loads for p in pools),
            "evictions": sum(len(p.evictions) for p in pools),
            "events": events_seen,
            "routes": routes,
            "cpu": meter.record(),
        }
    finally:
        await _close(cluster)


async def run_dask(cfg: Config, wl: Workload) -> dict[str, Any]:
    cluster = await _cluster(cfg, "dask")
    try:
        async with Client(cluster, asynchronous=True) as client:
            await client.wait_for_workers(cfg.workers)
            slots = cfg.models_per_worker
            batch_done: list[float] = []
            rows = [0]
            latencies: list[float] = []
            failures: list[str] = []

            async def batch_result(future) -> None:
                try:
                    result = await future
                    rows[0] += result["rows"]
                    batch_done.append(time.monotonic())
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"{type(exc).__name__}: {exc}")

            tracking: list[asyncio.Task] = []
            with Meter() as meter:
                t0 = time.monotonic()
                n = 0
                for at, kind, name, body in events(wl):
                    await _pace(t0, at)
                    if kind == 0:
                        for item in body:
                            spec = wl.specs[item["model"]]
                            future = client.submit(
                                dask_batch_item,
                                spec,
                                item["payload"],
                                slots,
                                key=f"{name}-{item['key']}",
                                resources={"MEMORY": spec["memory_bytes"]},
                                priority=0,
                                pure=False,
                            )
                            tracking.append(asyncio.create_task(batch_result(future)))
                    else:
                        spec = wl.specs[name]
                        n += 1
                        future = client.submit(
                            dask_online_item,
                            spec,
                            body,
                            slots,
                            key=f"online-{n}",
                            resources={"MEMORY": spec["memory_bytes"]},
                            priority=10,
                            pure=False,
                        )
                        tracking.append(
                            asyncio.create_task(online_answer(future, time.monotonic(), latencies, failures))
                        )
                await asyncio.gather(*tracking)
                end = time.monotonic()
            stats: Counter[str] = Counter()
            for worker in cluster.workers.values():
                stats.update(worker.__dict__.get("_sim_stats", {}))
        return {
            "makespan": max(batch_done) - t0 if batch_done else None,
            "run_seconds": end - t0,
            "batch_done": len(batch_done),
            "batch_dead": cfg.batch_items - len(batch_done),
            "rows_done": rows[0],
            "online_done": len(latencies),
            "online_failed": failures,
            "latencies": latencies,
            "loads": stats.get("loads", 0),
            "evictions": stats.get("evictions", 0),
            "events": {},
            "routes": {},
            "cpu": meter.record(),
        }
    finally:
        await _close(cluster)


def summarize(cfg: Config, wl: Workload, variant: str, raw: dict[str, Any]) -> dict[str, Any]:
    lat = raw.pop("latencies")
    makespan = raw["makespan"]
    online_total = len(wl.online)
    summary = {
        "variant": variant,
        "throughput_items_per_s": cfg.batch_items / makespan if makespan else None,
        "makespan_s": makespan,
        "online_requests": online_total,
        "online_p50_s": percentile(lat, 50),
        "online_p99_s": percentile(lat, 99),
        "online_max_s": max(lat) if lat else None,
        "all_complete": raw["batch_done"] == cfg.batch_items
        and raw["batch_dead"] == 0
        and raw["rows_done"] == cfg.batch_items * cfg.item_texts
        and raw["online_done"] == online_total,
        **raw,
    }
    summary["online_failed"] = summary["online_failed"][:5]
    return summary


def run_config(cfg: Config, variants: tuple[str, ...], label: str) -> dict[str, Any]:
    wl = make_workload(cfg)
    ideal = ideal_seconds(cfg, wl)
    results = {}
    for variant in variants:
        began = time.monotonic()
        raw = asyncio.run(run_dask(cfg, wl) if variant == "dask" else run_shoal(cfg, wl, variant))
        results[variant] = summarize(cfg, wl, variant, raw)
        r = results[variant]
        print(
            f"  [{label}] {variant:5s} {r['throughput_items_per_s']:.2f} items/s, makespan {r['makespan_s']:.1f} s, "
            f"online p50 {r['online_p50_s']:.2f} s p99 {r['online_p99_s']:.2f} s, loads {r['loads']}, "
            f"complete {r['all_complete']} ({time.monotonic() - began:.0f} s with start-up)",
            flush=True,
        )
    hot = sorted(wl.popularity.items(), key=lambda kv: -kv[1])[:3]
    return {
        "config": asdict(cfg),
        "load_range_s": [x * cfg.scale for x in cfg.load_range()],
        "batch_items_by_model": dict(Counter(i["model"] for _, _, items in wl.batch for i in items).most_common()),
        "hottest_models": [[m, round(p, 3)] for m, p in hot],
        "online_requests": len(wl.online),
        **{k: round(v, 2) for k, v in ideal.items()},
        "results": results,
        "ratios": ratios(results),
    }


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Throughput of pull over each baseline; each baseline's online p99 over pull's."""
    out: dict[str, float | None] = {}
    pull = results.get("pull")
    for other in ("push", "push1", "dask"):
        if pull and other in results and results[other]["throughput_items_per_s"]:
            out[f"throughput_pull_over_{other}"] = (
                pull["throughput_items_per_s"] / results[other]["throughput_items_per_s"]
            )
            out[f"p99_{other}_over_pull"] = results[other]["online_p99_s"] / pull["online_p99_s"]
    return out


# -- reporting ----------------------------------------------------------------------


def fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def main_table(run: dict[str, Any]) -> str:
    lines = [
        "| variant | throughput (batch items/s) | makespan (s) | online p50 (s) | online p99 (s) | model loads | all items done |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for variant, r in run["results"].items():
        lines.append(
            f"| {LABELS[variant]} | {fmt(r['throughput_items_per_s'])} | {fmt(r['makespan_s'], 1)} | "
            f"{fmt(r['online_p50_s'])} | {fmt(r['online_p99_s'])} | {r['loads']} | "
            f"{'yes' if r['all_complete'] else 'NO'} |"
        )
    ratio = run["ratios"]
    scale = run["config"]["scale"]
    lines.append("")
    lines.append(
        f"{run['config']['batch_items']} batch items ({run['batch_device_seconds']:.0f} device-seconds), "
        f"{run['online_requests']} online requests; ideal makespan (no loads, perfect balance) {run['ideal_makespan']:.1f} s"
        + (f"; times scaled x{scale}" if scale != 1 else "")
        + "."
    )
    lines.append(
        f"pull / push throughput: **{fmt(ratio.get('throughput_pull_over_push'))}x** (target >= 2x); "
        f"pull / dask: **{fmt(ratio.get('throughput_pull_over_dask'))}x** (target >= 1.3x); "
        f"pull / push with 1 worker per model: {fmt(ratio.get('throughput_pull_over_push1'))}x. "
        f"Online p99 push / pull: {fmt(ratio.get('p99_push_over_pull'))}x, dask / pull: {fmt(ratio.get('p99_dask_over_pull'))}x."
    )
    return "\n".join(lines)


def sweep_table(sweeps: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "| sweep | zipf | mean load (s) | pull items/s | push items/s | dask items/s | pull/push | pull/dask | online p99 pull / push / dask (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, runs in sweeps.items():
        for run in runs:
            cfg, res, ratio = run["config"], run["results"], run["ratios"]
            s = cfg["scale"]
            shown = ("pull", "push", "dask")
            tp = {v: res[v]["throughput_items_per_s"] * s if v in res else None for v in shown}  # real-time items/s
            p99 = " / ".join(fmt(res[v]["online_p99_s"] / s if v in res else None, 1) for v in shown)
            lines.append(
                f"| {name} | {cfg['zipf']} | {cfg['load_mean']} | {fmt(tp['pull'])} | {fmt(tp['push'])} | {fmt(tp['dask'])} | "
                f"{fmt(ratio.get('throughput_pull_over_push'))} | {fmt(ratio.get('throughput_pull_over_dask'))} | {p99} |"
            )
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sweeps = report["sweeps"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (name, key, xlabel) in enumerate(
        [("skew", "zipf", "Zipf exponent (load 2-5 s)"), ("load", "load_mean", "mean load time, s (Zipf 1.1)")]
    ):
        runs = sweeps.get(name, [])
        if not runs:
            continue
        xs = [run["config"][key] for run in runs]
        for variant, marker in zip(VARIANTS, "osv^"):
            if not all(variant in run["results"] for run in runs):
                continue
            tp = [run["results"][variant]["throughput_items_per_s"] * run["config"]["scale"] for run in runs]
            p99 = [run["results"][variant]["online_p99_s"] / run["config"]["scale"] for run in runs]
            axes[0][col].plot(xs, tp, marker=marker, label=LABELS[variant])
            axes[1][col].plot(xs, p99, marker=marker, label=LABELS[variant])
        axes[0][col].set_xlabel(xlabel)
        axes[1][col].set_xlabel(xlabel)
        axes[0][col].set_ylabel("batch items/s (real-time equivalent)")
        axes[1][col].set_ylabel("online p99 latency, s (real-time equivalent)")
        axes[1][col].set_yscale("log")
        axes[1][col].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        axes[1][col].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        for ax in (axes[0][col], axes[1][col]):
            if name == "load":
                ax.set_xscale("log")
                ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
        low, high = axes[1][col].get_ylim()
        axes[1][col].set_yticks(
            [t for t in (0.5, 1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500) if low <= t <= high]
        )
        for row in (0, 1):
            axes[row][col].grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    scale = {run["config"]["scale"] for runs in sweeps.values() for run in runs}
    main = report["main"]
    r = main["ratios"]
    fig.suptitle(
        f"Pull vs push, simulated devices: 16 workers, 24 models, 3 per worker\n"
        f"main run (Zipf {main['config']['zipf']}, loads 2-5 s): pull/push {r.get('throughput_pull_over_push', 0):.2f}x, "
        f"pull/dask {r.get('throughput_pull_over_dask', 0):.2f}x throughput; sweeps time-scaled x{'/'.join(map(str, sorted(scale)))}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figures(report: dict) -> list[harness.Figure]:
    """The main run: pull's throughput and online p99 against push routing and Dask's own scheduling."""
    ratios = report["main"]["ratios"]
    return [
        harness.Figure("throughput pull / push (2 replicas)", round(ratios["throughput_pull_over_push"], 2), "x"),
        harness.Figure("throughput pull / Dask", round(ratios["throughput_pull_over_dask"], 2), "x"),
        harness.Figure("online p99 push / pull", round(ratios["p99_push_over_pull"], 2), "x"),
        harness.Figure("online p99 Dask / pull", round(ratios["p99_dask_over_pull"], 2), "x"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="time-scaled main run and sweeps (a first look)")
    parser.add_argument("--scale", type=float, default=None, help="time scale of the main run (default 1, quick 0.25)")
    parser.add_argument(
        "--sweep-scale", type=float, default=None, help="time scale of the sweeps (default 0.25, quick 0.1)"
    )
    parser.add_argument("--batch-items", type=int, default=None)
    parser.add_argument("--push-replicas", type=int, default=2, help="workers each model hashes to in the push variant")
    parser.add_argument("--skews", default="0.6,1.1,1.6", help="Zipf exponents of the skew sweep ('' for none)")
    parser.add_argument("--loads", default="0.5,3.5,10", help="mean load seconds of the load sweep ('' for none)")
    parser.add_argument("--variants", default=MAIN_VARIANTS, help="variants of the main run")
    parser.add_argument("--sweep-variants", default=SWEEP_VARIANTS, help="variants of the sweeps")
    parser.add_argument("--no-main", action="store_true", help="sweeps only")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", default=str(RESULTS / "pull_vs_push.json"))
    parser.add_argument("--png", default=str(RESULTS / "pull_vs_push.png"))
    args = parser.parse_args(argv)

    logging.getLogger("shoal").setLevel(logging.ERROR)  # an item failure still shows up in the counts
    scale = args.scale if args.scale is not None else (0.25 if args.quick else 1.0)
    sweep_scale = args.sweep_scale if args.sweep_scale is not None else (0.1 if args.quick else 0.25)
    base = Config(scale=scale, push_replicas=args.push_replicas, seed=args.seed)
    if args.batch_items:
        base = replace(base, batch_items=args.batch_items)
    variants = tuple(v for v in args.variants.split(",") if v)
    sweep_variants = tuple(v for v in args.sweep_variants.split(",") if v)
    unknown = set(variants + sweep_variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")

    folder = Path(tempfile.mkdtemp(prefix="shoal-pvp-"))
    os.environ["SHOAL_PROFILE"] = str(write_profile(base, folder))
    os.environ.pop("SHOAL_CATALOG", None)

    started = time.monotonic()
    report: dict[str, Any] = {
        # `code`: which files of the code under test differ from the commit measured
        "conditions": harness.conditions(argv, code=harness.git_state("scheduler_plugins", "workers", "configs")),
        "simulation": "catalog kind sim: loads and batches are sleeps; see the script's docstring",
    }
    if not args.no_main:
        print(f"main run (scale {scale}):", flush=True)
        report["main"] = run_config(base, variants, "main")
    sweeps: dict[str, list[dict[str, Any]]] = {"skew": [], "load": []}
    sweep_base = replace(base, scale=sweep_scale)
    for z in [float(x) for x in args.skews.split(",") if x]:
        print(f"skew sweep, zipf {z} (scale {sweep_scale}):", flush=True)
        sweeps["skew"].append(run_config(replace(sweep_base, zipf=z), sweep_variants, f"zipf {z}"))
    for load in [float(x) for x in args.loads.split(",") if x]:
        if load == sweep_base.load_mean and any(r["config"]["zipf"] == sweep_base.zipf for r in sweeps["skew"]):
            sweeps["load"].append(next(r for r in sweeps["skew"] if r["config"]["zipf"] == sweep_base.zipf))
            continue
        print(f"load sweep, mean load {load} s (scale {sweep_scale}):", flush=True)
        sweeps["load"].append(run_config(replace(sweep_base, load_mean=load), sweep_variants, f"load {load}"))
    report["sweeps"] = sweeps
    report["total_seconds"] = round(time.monotonic() - started, 1)

    harness.write_result("pull_vs_push", report, args.json, figures(report))
    print()
    if "main" in report:
        print(f"## Main run (scale {scale}; Zipf {base.zipf}, loads 2-5 s)\n")
        print(main_table(report["main"]))
        print()
    if any(sweeps.values()):
        print(f"## Sweeps (run at time scale {sweep_scale}; items/s, load and p99 given in real-time equivalents)\n")
        print(sweep_table(sweeps))
    variants_run = set(variants) & set(sweep_variants)
    plottable = "main" in report and {"pull", "push", "dask"} <= variants_run and any(sweeps.values())
    if plottable and importlib.util.find_spec("matplotlib") is None:
        print(f"\nwrote {args.json}; no {args.png}: matplotlib is not installed (pip install '.[bench]')")
    elif plottable:
        plot(report, Path(args.png))
        print(f"\nwrote {args.json} and {args.png}")
    else:
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
