"""How many workers Shoal's queue needs now, and why: the count Dask's adaptive scaling asks for.

Dask's adaptive scaling (``LocalCluster.adapt``, SpecCluster's ``Adaptive``,
dask-jobqueue, the Kubernetes operator's autoscaler through
``/api/v1/adaptive_target``) asks the scheduler's ``adaptive_target`` for a
worker count. Shoal's items are not Dask tasks, so Dask's own count sees an
idle cluster during a Shoal job. The queue's count is the largest of:

- **batch backlog**: each model's remaining rows (waiting and leased) over
  its measured rows per compute second on one worker, summed into
  worker-seconds, done within the target duration; but no more workers than
  the work can use: one per `items_per_worker` items of each model, not one
  per row;
- **leases**: the workers holding leased items (retiring one would hand back
  work it is about to start, or redo what it started);
- **online**: the workers the online lane kept busy over the last window
  (its groups' compute seconds per second) at `online_utilization`, and one
  while any request came within `online_idle_seconds` (the scale-to-zero
  cool-down) or waits for a worker;
- **pinned**: enough workers to keep one holder of every pinned model.

Dask's own tasks are counted by Dask (elastic.py takes the larger). One
count costs O(models with work + distinct pinned sets), once per ask (each
adaptive interval), never per pull, ack or request.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import dask.config

ITEMS_PER_WORKER = 2  # a worker keeps about this many batch items in hand (prefetch): more workers idle
ONLINE_WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class ScalingSettings:
    """Dask config ``shoal.adaptive.*``; Dask's ``distributed.adaptive.target-duration`` is the drain time."""

    items_per_worker: int = ITEMS_PER_WORKER
    online_utilization: float = 0.5  # of a worker's time spent on online groups, before another is asked for
    online_idle_seconds: float = 120.0  # after the last online request, the online lane needs no worker
    drain_timeout_seconds: float = 60.0  # a retiring worker's running items may finish within this long

    @classmethod
    def from_config(cls) -> ScalingSettings:
        config = dask.config.get("shoal.adaptive", default=None) or {}
        fields = {str(k).replace("-", "_"): v for k, v in config.items()}
        unknown = set(fields) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown shoal.adaptive settings: {sorted(unknown)}")
        return cls(**{k: type(getattr(cls, k))(v) for k, v in fields.items()})


@dataclass(frozen=True)
class ScalingNeed:
    """A worker count and the reason for it, as /metrics and the /shoal page show them."""

    workers: int
    reason: str


class OnlineLoad:
    """Online groups' compute seconds and request arrivals over a sliding window, in one-second buckets."""

    def __init__(self, window: float = ONLINE_WINDOW_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.clock = clock
        self.last_request_at: float | None = None
        self._buckets: deque[list[float]] = deque()  # [second, compute seconds]

    def arrived(self) -> None:
        self.last_request_at = self.clock()

    def computed(self, seconds: float) -> None:
        """A group's one model call took `seconds` on its worker (acked once per group, not per request)."""
        now = math.floor(self.clock())
        if self._buckets and self._buckets[-1][0] == now:
            self._buckets[-1][1] += seconds
        else:
            self._buckets.append([now, seconds])
        self._trim(now)

    def busy_workers(self) -> float:
        """Workers kept busy by online groups, on average over the window."""
        self._trim(self.clock())
        return sum(seconds for _, seconds in self._buckets) / self.window

    def idle_for(self) -> float:
        return math.inf if self.last_request_at is None else self.clock() - self.last_request_at

    def _trim(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] <= now - self.window:
            self._buckets.popleft()


class QueueView(Protocol):
    """What the count reads of the queue (elastic.Elastic reads it off QueueState)."""

    def batch_models(self) -> list[str]: ...
    def remaining(self, model: str) -> tuple[int, int]: ...  # (items, rows) waiting or leased, batch lane
    def rows_per_second(self, model: str) -> float | None: ...  # measured on one worker; None: never
    def workers_with_leases(self) -> int: ...
    def online_waiting(self) -> int: ...
    def pinned_sets(self) -> Mapping[frozenset[str], int]: ...


def need(queue: QueueView, online: OnlineLoad, target_duration: float, settings: ScalingSettings) -> ScalingNeed:
    """The workers the queue needs now, and the largest reason."""
    reasons: list[tuple[int, str]] = [(0, "idle: no backlog, no leases, no online traffic")]
    reasons.append(_batch(queue, target_duration, settings))
    leased = queue.workers_with_leases()
    if leased:
        reasons.append((leased, f"{leased} workers hold leased items"))
    reasons.append(_online(queue, online, settings))
    pinned = pinned_cover(queue.pinned_sets())
    if pinned:
        reasons.append((pinned, f"{pinned} workers keep every pinned model held"))
    workers, reason = max(reasons, key=lambda entry: entry[0])
    return ScalingNeed(workers, reason)


def _batch(queue: QueueView, target_duration: float, settings: ScalingSettings) -> tuple[int, str]:
    seconds = 0.0
    usable = 0
    biggest: tuple[float, str, int, float | None] | None = None
    for model in queue.batch_models():
        items, rows = queue.remaining(model)
        if not items:
            continue
        rate = queue.rows_per_second(model)
        # Unmeasured: as many workers as the items can use, until the first acks say how fast it goes.
        model_seconds = rows / rate if rate else math.inf
        seconds += model_seconds
        usable += math.ceil(items / settings.items_per_worker)
        if biggest is None or model_seconds > biggest[0]:
            biggest = (model_seconds, model, items, rate)
    if biggest is None:
        return 0, "no batch backlog"
    workers = min(usable, math.ceil(seconds / target_duration) if math.isfinite(seconds) else usable)
    _, model, items, rate = biggest
    speed = f"at {rate:,.0f} rows/s per worker" if rate else "not measured yet"
    return max(1, workers), f"backlog of {items:,} items of {model} {speed}"


def _online(queue: QueueView, online: OnlineLoad, settings: ScalingSettings) -> tuple[int, str]:
    busy = online.busy_workers()
    workers = math.ceil(busy / settings.online_utilization) if busy > 0 else 0
    if workers:
        return workers, f"online groups keep {busy:.2f} workers busy"
    waiting = queue.online_waiting()
    if waiting:
        return 1, f"{waiting} online requests wait for a worker"
    if online.idle_for() < settings.online_idle_seconds:
        return 1, f"online requests within the last {settings.online_idle_seconds:g} s"
    return 0, "no online traffic"


def pinned_cover(pinned_sets: Mapping[frozenset[str], int]) -> int:
    """Workers enough for one holder of each pinned model: a greedy cover over the distinct pinned sets.

    Workers of one profile pin the same models, so one of them covers all.
    """
    uncovered = set().union(*pinned_sets) if pinned_sets else set()
    counts: Counter[frozenset[str]] = Counter(pinned_sets)
    workers = 0
    while uncovered:
        best = max(counts, key=lambda s: len(s & uncovered))
        if not best & uncovered:
            break
        uncovered -= best
        workers += 1
        counts[best] -= 1
        if not counts[best]:
            del counts[best]
    return workers
