"""Prometheus metrics of the online gateway, served on its own /metrics.

Each gateway has its own registry, so a restarted gateway (or several in one
test process) never collides with another. Queue depths are read from the
pull queue when scraped, not kept up to date on every request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class _QueueDepths:
    """A collector asking the queue at scrape time: {(model, lane): depth}."""

    def __init__(self, depths: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._depths = depths

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "shoal_queue_depth", "Items waiting in the pull queue, by model and lane", labels=["model", "lane"]
        )
        for (model, lane), depth in sorted(self._depths().items()):
            family.add_metric([model, lane], depth)
        yield family


class GatewayMetrics:
    def __init__(self, queue_depths: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "shoal_online_requests",
            "Online requests answered, by model and HTTP status (499: the client left before its body arrived)",
            ["model", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "shoal_online_latency_seconds",
            "Online request latency by stage: queue (enqueued to leased), compute (the model call "
            "of its group), total (request read to response ready)",
            ["model", "stage"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge("shoal_online_in_flight", "Online requests being answered", registry=self.registry)
        self.connections_refused = Counter(
            "shoal_gateway_connections_refused",
            "Connections over the gateway's max_connections, answered 503 and closed",
            registry=self.registry,
        )
        self.registry.register(_QueueDepths(queue_depths))

    def answered(self, model: str, status: int, total: float, timing: dict[str, float] | None = None) -> None:
        self.requests.labels(model, str(status)).inc()
        self.latency.labels(model, "total").observe(total)
        if timing:
            self.latency.labels(model, "queue").observe(timing["queue"])
            self.latency.labels(model, "compute").observe(timing["compute"])

    def render(self) -> bytes:
        return generate_latest(self.registry)
