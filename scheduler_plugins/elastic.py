"""Dask's adaptive scaling driven by Shoal's queue: the target, which workers to close, graceful retirement.

Dask's autoscalers (``Adaptive`` over RPC, dask-jobqueue, the Kubernetes
operator through ``/api/v1/adaptive_target`` and ``/api/v1/retire_workers``,
``Client.retire_workers``, a worker's ``close_gracefully``) call three
scheduler methods. Shoal's items are not Dask tasks, so Dask's own answers
would see an idle cluster in the middle of a job: retire busy workers, never
add any for a backlog. The pull queue installs these in their place, as
methods and as handlers of the same names, so every caller gets them:

- ``adaptive_target``: the larger of the queue's need (scaling.py) and, when
  the scheduler has Dask tasks, Dask's own count;
- ``workers_to_close``: workers with nothing leased first, then those whose
  models other workers also hold; never the last holder of a pinned model;
- ``retire_workers``: each worker is drained the Shoal way first (`drain`),
  then Dask retires it as before.

Draining a worker (a retirement): it takes no new work (its view is
retiring: silent for good), the batch items it leased but did not start go
back to the front of their queues at once and it is told to drop them
(``REVOKE``), and what it started (batch items, online groups) finishes and
is acked, within `drain_timeout_seconds` (or the grace its own
``shoal_retire`` asks for); what is still running then goes back too. A
retirement never spends an attempt: only a loss does (a worker that leaves
without retiring, or whose lease lapses). No item is lost, and the first ack
of an item counts (outputs are idempotent), so none is written twice. A
worker sent SIGTERM (``dask worker``, a Kubernetes pod deletion, a spot
machine's notice) drains itself through ``shoal_retire`` with its grace
(workers/termination.py).

Scale to zero: while an autoscaler asks for the target (within
`SCALER_SEEN_SECONDS` of its last ask), an online request that finds no
worker waits in the queue for one (up to its deadline) instead of a 503:
the target it raises is what starts the worker.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass
from operator import attrgetter
from typing import Any

import dask.config
from dask.utils import parse_timedelta
from toolz import groupby

from .protocol import Lane, ScalingStatus, WorkerEvents
from .queue_state import QueueState
from .scaling import OnlineLoad, ScalingNeed, ScalingSettings, need
from .work_items import WorkItem

logger = logging.getLogger("shoal.scheduler")

SCALER_SEEN_SECONDS = 30.0  # an autoscaler asked this recently: the cluster may grow (Adaptive asks every second)


@dataclass
class LastAsk:
    target: int
    reason: str
    at: float  # on the queue's clock


class Elastic:
    """The scaling methods the plugin installs on its scheduler (see the module docstring), over the queue's
    state; `online`: the online lane's load; `events`: handles a retiring worker's last events."""

    def __init__(self, state: QueueState, online: OnlineLoad, events: Callable[..., None]) -> None:
        self.state = state
        self.online = online
        self.settings = ScalingSettings.from_config()
        self.last: LastAsk | None = None
        self._events = events
        self._dask_target: Callable[..., int] | None = None
        self._dask_retire: Callable[..., Any] | None = None
        self._draining: dict[str, asyncio.Future[None]] = {}  # worker -> resolved when it holds no lease
        state.worker_free.subscribe(self._free)

    def install(self, scheduler) -> None:
        """Take the place of the scheduler's methods (the plugin declares the handlers); Dask's own stay
        reachable from here."""
        self._dask_target = scheduler.adaptive_target
        self._dask_retire = scheduler.retire_workers
        scheduler.adaptive_target = self.adaptive_target
        scheduler.workers_to_close = self.workers_to_close
        scheduler.retire_workers = self.retire_workers

    # -- what the count reads (scaling.QueueView) ---------------------------------------

    def batch_models(self) -> list[str]:
        leased = self.state.leases.batch_items
        return list(dict.fromkeys([*self.state.queues.models(Lane.BATCH), *leased]))

    def remaining(self, model: str) -> tuple[int, int]:
        queues, leases = self.state.queues, self.state.leases
        return (
            queues.waiting_items(model, Lane.BATCH) + leases.batch_items.get(model, 0),
            queues.waiting_rows(model, Lane.BATCH) + leases.batch_rows.get(model, 0),
        )

    def rows_per_second(self, model: str) -> float | None:
        stats = self.state.placement.stats
        return stats.rows_per_second(model) if stats.seconds.get(model) else None

    def workers_with_leases(self) -> int:
        return len(self.state.leases.by_worker)

    def online_waiting(self) -> int:
        queues = self.state.queues
        return sum(queues.waiting_items(model, Lane.ONLINE) for model in queues.models(Lane.ONLINE))

    def pinned_sets(self) -> Mapping[frozenset[str], int]:
        return self.state.views.pinned_sets

    # -- the scheduler's methods --------------------------------------------------------

    def adaptive_target(self, target_duration: Any = None) -> int:
        """Workers wanted now: the queue's need, or Dask's own count for its tasks, whichever is larger."""
        duration = parse_timedelta(
            target_duration if target_duration is not None else dask.config.get("distributed.adaptive.target-duration")
        )
        wanted = need(self, self.online, duration, self.settings)
        target, reason = wanted.workers, wanted.reason
        if self.state.scheduler.tasks and self._dask_target is not None:
            tasks = self._dask_target(duration)
            if tasks > target:
                target, reason = tasks, f"Dask's own tasks want {tasks} workers"
        self.last = LastAsk(target, reason, self.state.clock.now())
        return target

    def workers_to_close(
        self,
        memory_ratio: float | None = None,
        n: int | None = None,
        key: Callable[[Any], Hashable] | bytes | None = None,
        minimum: int | None = None,
        target: int | None = None,
        attribute: str = "address",
    ) -> list[str]:
        """Workers (their `attribute`) to close for `target` workers or `n` fewer; without either, the idle ones.

        Dask's signature and grouping (`key`: workers closed together, as
        dask-jobqueue's jobs are); Dask's memory ratio is not Shoal's concern
        and is ignored. Costs a sort of the workers, once per scale-down ask.
        """
        scheduler = self.state.scheduler
        if target is not None and n is None:
            n = len(scheduler.workers) - target
        keep = len(scheduler.workers) - max(0, n) if n is not None else None
        if isinstance(key, bytes):
            key = pickle.loads(key)
        valid = [ws for ws in scheduler.workers.values() if not ws.long_running]
        for plugin in list(scheduler.plugins.values()):
            valid = plugin.valid_workers_downscaling(scheduler, valid)
        groups = list(groupby(key or attrgetter("address"), valid).values())
        pinned_left = Counter(self.state.views.pinned_holders)
        remain = len(scheduler.workers)
        closing = []
        for group in sorted(groups, key=self._closing_cost):
            if keep is not None and remain - len(group) < keep:
                break
            if keep is None and self._closing_cost(group)[0]:
                break  # only idle workers, without a count to reach
            if minimum and remain - len(group) < minimum:
                break
            pinned = Counter(model for ws in group for model in self._pinned(ws.address))
            if any(pinned_left[model] <= count for model, count in pinned.items()):
                continue  # the last holder of a pinned model
            pinned_left.subtract(pinned)
            closing += group
            remain -= len(group)
        return [getattr(ws, attribute) for ws in closing]

    async def retire_workers(
        self, workers: list[str] | None = None, *, names: list | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        """Dask's ``retire_workers``, with each worker drained of Shoal's work first (see the module docstring)."""
        assert self._dask_retire is not None
        scheduler = self.state.scheduler
        chooser = {k: kwargs.pop(k) for k in ("memory_ratio", "n", "key", "minimum", "target") if k in kwargs}
        if names is not None:
            wanted = {str(name) for name in names}
            addresses = [ws.address for ws in scheduler.workers.values() if str(ws.name) in wanted]
        elif workers is not None:
            addresses = [address for address in workers if address in scheduler.workers]
        else:
            addresses = self.workers_to_close(**chooser)
        if not addresses:
            return {}
        await asyncio.gather(*(self.drain(address) for address in addresses))
        retired = await self._dask_retire(workers=addresses, **kwargs)
        for address in addresses:
            if address not in retired and address in scheduler.workers:
                self._keep(address)  # Dask could not retire it (its data had nowhere to go): it serves again
        return retired

    async def drain(self, worker: str, timeout: float | None = None, events: WorkerEvents | None = None) -> int:
        """Retire `worker` from Shoal's work: no new work, unstarted items back now, started ones finish.

        Waits up to `timeout` (default `drain_timeout_seconds`) for its leases
        to end; what it still holds then goes back too, uncounted. The count
        of items handed back then. Also the ``shoal_retire`` handler, whose
        `events` (what the worker had gathered) are handled first, so that
        what it started is not taken for unstarted.
        """
        state = self.state
        if events:
            self._events(worker, **events)
        grace = self.settings.drain_timeout_seconds if timeout is None else timeout
        view = state.views.get(worker)
        if view is not None and not view.retiring:
            state.retire(view)
            handed = self._hand_back(worker)
            held = len(state.leases.of_worker(worker))
            logger.info(
                "retiring %s: %d unstarted items handed back, %d finishing within %g s", worker, handed, held, grace
            )
        if state.leases.of_worker(worker) and worker in state.scheduler.workers:
            drained = self._draining.setdefault(worker, asyncio.get_running_loop().create_future())
            timer = state.clock.call_later(grace, _resolve, drained)
            try:
                await drained
            finally:
                timer.cancel()
                self._draining.pop(worker, None)
        late = self._hand_back(worker, started=True) if worker in state.scheduler.workers else 0
        if late:
            logger.info("retired %s: %d items still running after the grace handed back", worker, late)
        return late

    def workers_coming(self) -> bool:
        """An autoscaler asked for the target lately: a request that finds no worker may wait for one."""
        return self.last is not None and self.state.clock.now() - self.last.at < SCALER_SEEN_SECONDS

    def status(self) -> ScalingStatus:
        """The target and why, the workers now, and how long ago an autoscaler asked (None: never)."""
        if self.last is not None:
            wanted, asked = ScalingNeed(self.last.target, self.last.reason), self.state.clock.now() - self.last.at
        else:
            duration = parse_timedelta(dask.config.get("distributed.adaptive.target-duration"))
            wanted, asked = need(self, self.online, duration, self.settings), None
        return {
            "target": wanted.workers,
            "current": len(self.state.scheduler.workers),
            "reason": wanted.reason,
            "asked_seconds_ago": asked,
            "settings": asdict(self.settings),
        }

    # -- helpers of the above -----------------------------------------------------------

    def _closing_cost(self, group: Iterable[Any]) -> tuple[bool, int, int]:
        """(busy, models only it holds, items leased): the cheapest group to close sorts first."""
        views, leases = self.state.views, self.state.leases
        busy, unique, leased = False, 0, 0
        for ws in group:
            held = len(leases.of_worker(ws.address))
            busy = busy or bool(held) or bool(ws.processing)
            leased += held
            view = views.get(ws.address)
            if view is not None and not view.silent:
                unique += sum(1 for model in view.held if views.holders.get(model, 0) <= 1)
        return busy, unique, leased

    def _pinned(self, worker: str) -> frozenset[str]:
        view = self.state.views.get(worker)
        return view.pinned if view is not None and not view.retiring else frozenset()

    def _held(self, worker: str) -> int:
        return len(self.state.leases.of_worker(worker))

    def _hand_back(self, worker: str, started: bool = False) -> int:
        """Its batch items not started (with `started`, all its items) go back, and it is told to drop them."""
        back: list[WorkItem] = [
            item
            for item in self.state.leases.of_worker(worker).values()
            if started or (item.lane is Lane.BATCH and not item.started)
        ]
        self.state.hand_back(worker, back)
        return len(back)

    def _free(self, worker: str) -> None:
        """It holds no lease now: its drain, if one waits, is over."""
        drained = self._draining.get(worker)
        if drained is not None:
            _resolve(drained)

    def _keep(self, worker: str) -> None:
        view = self.state.views.get(worker)
        if view is not None and view.retiring:
            self.state.retire(view, retiring=False)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
