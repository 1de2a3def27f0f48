"""Shoal's live figures, and the same figures as Prometheus metrics on Dask's /metrics.

The pull queue already knows queue depths, leases, workers' loaded models
and its event counters; workers report their model pool's loads and
evictions as a Dask custom worker metric (``worker.metrics["shoal"]``,
sent with every heartbeat), so no Shoal message changes for them. Figures
are read when asked for, never kept up to date on the queue's hot path. The
one thing sampled is rows done per model, once a second, so throughput is
a rate over the last seconds rather than an average since start.

Dask's scheduler serves prometheus_client's global registry at /metrics
(distributed/http/scheduler/prometheus). One collector per process is
registered there and reads the latest started scheduler's figures, as
Dask's own collectors do when tests start schedulers one after another.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, TypedDict

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from tornado.ioloop import PeriodicCallback

from .protocol import QueueDepths, ScalingStatus, WorkerSummary

if TYPE_CHECKING:
    from .pull_queue import PullQueue

SAMPLE_MS = 1000
RATE_WINDOW_SECONDS = 10.0
WORKER_METRIC = "shoal"  # the key workers' pool figures arrive under, in their Dask heartbeat metrics


class ModelFigures(QueueDepths):
    online_pending: int  # requests not answered yet
    rows_per_second: float  # batch rows, over the last RATE_WINDOW_SECONDS
    rows_done: float
    compute_seconds: float


class WorkerFigures(WorkerSummary):
    leased: int
    loads: int  # from the worker's heartbeat, as are the two below
    evictions: int
    load_seconds: dict[str, float]
    connected: bool


class JobFigures(TypedDict):
    rows_done: int
    rows_total: int
    done: int
    failed: int
    items: int
    elapsed: float
    complete: bool


class Figures(TypedDict):
    """What the dashboard and the metrics show, and /shoal/figures.json serves."""

    models: dict[str, ModelFigures]
    workers: dict[str, WorkerFigures]
    jobs: dict[str, JobFigures]
    counts: dict[str, int]
    scaling: ScalingStatus  # the worker count autoscalers are told, and why


class ShoalMetrics:
    def __init__(self, queue: PullQueue) -> None:
        self.queue = queue
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def sample(self) -> None:
        """Rows done per model now; samples older than the rate window (but one) are dropped."""
        now = self.queue.state.clock.now()
        self._samples.append((now, dict(self.queue.state.placement.stats.rows)))
        while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_SECONDS:
            self._samples.popleft()

    def rates(self) -> dict[str, float]:
        """Batch rows per second per model, over the last RATE_WINDOW_SECONDS."""
        if len(self._samples) < 2:
            return {}
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        seconds = max(t1 - t0, 1e-9)
        return {model: (rows - first.get(model, 0.0)) / seconds for model, rows in last.items()}

    def figures(self) -> Figures:
        """Everything the dashboard shows: the queue's overview, workers' pools, throughput."""
        overview = self.queue.overview()
        stats = self.queue.state.placement.stats
        rates = self.rates()
        pending = {model: len(requests) for model, requests in self.queue.online.requests.items()}  # unanswered
        models = sorted(set(overview["queues"]) | set(stats.rows) | set(pending))
        workers: dict[str, WorkerFigures] = {}
        for address, view in overview["workers"].items():
            state = self.queue.scheduler.workers.get(address)
            pool = dict((getattr(state, "metrics", None) or {}).get(WORKER_METRIC) or {})
            workers[address] = {
                **view,
                "leased": overview["leased"].get(address, 0),
                "loads": pool.get("loads", 0),
                "evictions": pool.get("evictions", 0),
                "load_seconds": pool.get("load_seconds", {}),
                "connected": state is not None,
            }
        return {
            "models": {
                model: {
                    **overview["queues"].get(model, QueueDepths(online=0, batch=0)),
                    "online_pending": pending.get(model, 0),
                    "rows_per_second": rates.get(model, 0.0),
                    "rows_done": stats.rows.get(model, 0.0),
                    "compute_seconds": stats.seconds.get(model, 0.0),
                }
                for model in models
            },
            "workers": workers,
            "jobs": {
                job_id: {
                    "rows_done": job["rows_done"],
                    "rows_total": job["rows_total"],
                    "done": job["done"],
                    "failed": job["failed"],
                    "items": job["items"],
                    "elapsed": job["elapsed"],
                    "complete": job["complete"],
                }
                for job_id, job in overview["jobs"].items()
            },
            "counts": overview["counts"],
            "scaling": overview["scaling"],
        }

    def collect(self) -> Iterable[Metric]:
        figures = self.figures()
        models, workers = figures["models"], figures["workers"]
        depth = GaugeMetricFamily("shoal_queue_depth", "Items waiting in the pull queue", labels=["model", "lane"])
        pending = GaugeMetricFamily(
            "shoal_online_pending", "Online requests not answered yet (queued or leased)", labels=["model"]
        )
        rows = CounterMetricFamily("shoal_rows", "Batch rows done (acked), by model", labels=["model"])
        compute = CounterMetricFamily(
            "shoal_compute_seconds", "Worker compute seconds of acked batch items", labels=["model"]
        )
        rate = GaugeMetricFamily(
            "shoal_rows_per_second", f"Batch rows/s over the last {RATE_WINDOW_SECONDS:g} s", labels=["model"]
        )
        for model, f in models.items():
            depth.add_metric([model, "online"], f["online"])
            depth.add_metric([model, "batch"], f["batch"])
            pending.add_metric([model], f["online_pending"])
            rows.add_metric([model], f["rows_done"])
            compute.add_metric([model], f["compute_seconds"])
            rate.add_metric([model], f["rows_per_second"])
        leased = GaugeMetricFamily("shoal_leased_items", "Items leased to a worker, not yet acked", labels=["worker"])
        loaded = GaugeMetricFamily(
            "shoal_loaded_model", "1 for each model loaded on a worker", labels=["worker", "model"]
        )
        budget = GaugeMetricFamily(
            "shoal_model_budget_bytes", "Memory a worker's loaded models may use", labels=["worker"]
        )
        free = GaugeMetricFamily(
            "shoal_model_free_bytes", "Of that budget, not used by loaded models", labels=["worker"]
        )
        loads = CounterMetricFamily("shoal_model_loads", "Model loads on a worker", labels=["worker"])
        evictions = CounterMetricFamily("shoal_model_evictions", "Models evicted from a worker", labels=["worker"])
        for address, w in workers.items():
            leased.add_metric([address], w["leased"])
            for model in w["loaded"]:
                loaded.add_metric([address, model], 1)
            if w["budget"] is not None:
                budget.add_metric([address], w["budget"])
            if w["free_bytes"] is not None:
                free.add_metric([address], w["free_bytes"])
            loads.add_metric([address], w["loads"])
            evictions.add_metric([address], w["evictions"])
        events = CounterMetricFamily(
            "shoal_queue_events",
            "Pull-queue events: leased, acked, failed, lost, expired, dead, taken_back, rescued",
            labels=["event"],
        )
        for event, count in sorted(figures["counts"].items()):
            events.add_metric([event], count)
        jobs = GaugeMetricFamily("shoal_jobs", "Jobs the queue holds", labels=["state"])
        complete = sum(1 for job in figures["jobs"].values() if job["complete"])
        jobs.add_metric(["running"], len(figures["jobs"]) - complete)
        jobs.add_metric(["complete"], complete)
        scaling = figures["scaling"]
        target = GaugeMetricFamily(
            "shoal_scaling_target_workers",
            "Workers the queue asks Dask's autoscalers for (adaptive_target), labelled with the reason",
            labels=["reason"],
        )
        target.add_metric([scaling["reason"]], scaling["target"])
        current = GaugeMetricFamily("shoal_scaling_current_workers", "Workers connected to the scheduler now")
        current.add_metric([], scaling["current"])
        yield from (depth, pending, rows, compute, rate, leased, loaded, budget, free, loads, evictions, events, jobs)
        yield from (target, current)


class _LatestScheduler:
    """The collector on the global registry: the figures of the latest started Shoal scheduler still running.

    One that closes hands /metrics back to the one started before it, as when a test's short-lived
    queue closes beside a long-lived cluster's.
    """

    def __init__(self) -> None:
        self.running: list[weakref.ref[ShoalMetrics]] = []

    def collect(self) -> Iterable[Metric]:
        for ref in reversed(self.running):
            metrics = ref()
            if metrics is not None:
                yield from metrics.collect()
                return


_COLLECTOR = _LatestScheduler()
REGISTRY.register(_COLLECTOR)


def start_metrics(queue: PullQueue) -> ShoalMetrics:
    """Figures of `queue`, sampled every second while its scheduler runs, served on /metrics."""
    metrics = ShoalMetrics(queue)
    sampler = PeriodicCallback(metrics.sample, SAMPLE_MS)
    queue.scheduler.periodic_callbacks["shoal-metrics"] = sampler  # the scheduler stops it on close
    sampler.start()
    metrics.sample()
    _COLLECTOR.running.append(weakref.ref(metrics))
    return metrics


def stop_metrics(queue: PullQueue) -> None:
    """`queue` closed: /metrics serves the latest other one still running."""
    _COLLECTOR.running = [ref for ref in _COLLECTOR.running if (m := ref()) is not None and m.queue is not queue]
