"""The pull queue: a scheduler plugin holding work items for Shoal's workers.

Workers ask for work when they have room (a bounded long poll) and get items
of one model, as many as they expect to start soon; each pulled item is
leased with a deadline that the worker extends while it holds it. A lost
worker or an expired lease puts the item back; after `max_attempts` leases
it goes to the job's dead letters with its errors.

Routes (all declared in ``PullQueue.start``):

- ``shoal_submit``: register a job and enqueue its items
- ``shoal_pull``: lease up to `room` items of one model to a worker
- the worker stream's ``EVENTS`` (protocol.WorkerEvents), one way and
  coalesced: starts, acks, failures and lease renewals of many items in one
  message; what a worker has gathered when it pulls rides on the pull. An item a worker no longer holds (taken back for an idle worker,
  expired, finished elsewhere) is revoked by a ``REVOKE`` message on the
  scheduler's stream to it: no round trip per item, before its start or after.
- ``shoal_job_status`` / ``shoal_job_release``: follow and forget a job
- ``shoal_overview``: queue depths and workers, for status and metrics
- the online path's routes (``shoal_pull_online``, ``shoal_ack_many``, and
  those of gateways in their own processes) are declared by ``OnlineQueue``
  (online_queue.py), started beside this plugin
- ``shoal_gateway_start`` / ``shoal_gateway_stop``: the online HTTP gateway
  (scheduler_plugins/gateway/app.py), on this scheduler's event loop
- Dask's own ``adaptive_target``, ``workers_to_close`` and ``retire_workers``,
  replaced so that Dask's autoscalers see Shoal's queue, with ``shoal_retire``
  and ``shoal_scaling``: declared by ``Elastic`` (elastic.py)

The state both routes share, and its transitions, are `QueueState`'s
(queue_state.py); this module is the plugin and the batch route over it.

Per event (pull, ack, request) the plugin does O(1) or O(log n) work in
workers, models and leased items: worker views, waiting pulls, leases and
placement's candidates are indexes kept up to date as events happen, and new
work wakes only the pulls that may take it (see waiting_pulls).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from shoal.configs import GatewaySettings, ModelSpec

from .dashboard import start_dashboard
from .elastic import Elastic
from .jobs import Job
from .metrics import start_metrics, stop_metrics
from .online_queue import OnlineQueue
from .protocol import (
    EVENTS,
    NAME,
    GatewayFields,
    GatewayStarted,
    GatewayStopped,
    ItemAck,
    ItemFailure,
    JobSettings,
    JobStatus,
    Lane,
    OnlineAck,
    Overview,
    PullReply,
    ReleaseReply,
    SpecFields,
    SubmitReply,
    SubmittedItem,
    WorkerEvents,
)
from .queue_state import QueueState
from .waiting_pulls import WaitingPull
from .work_items import ItemState, WorkItem
from .worker_views import WorkerView

if TYPE_CHECKING:  # aiohttp, imported when a gateway starts: a batch job's scheduler never starts one
    from .gateway.app import Gateway

logger = logging.getLogger("shoal.scheduler")

LEASE_CHECK_MS = 100  # how late an expired lease is noticed: online leases last half a second
PLACEMENT_CHECK_MS = 500


class PullQueue(QueueState, SchedulerPlugin):
    """The scheduler plugin: handlers, batch jobs and the batch route; the online route is `online`."""

    name = NAME

    def __init__(self, gateway: GatewaySettings | None = None, models: Mapping[str, ModelSpec] | None = None) -> None:
        """`gateway`: start the online gateway with these settings; `models`: specs it serves."""
        super().__init__(models)
        self.jobs: dict[str, Job] = {}
        self.online = OnlineQueue(self)
        self.elastic = Elastic(self, self.online.load)
        self.gateway: Gateway | None = None
        self._gateway_settings = gateway
        self._checkers: list[PeriodicCallback] = []

    def online_work_queued(self, model: str) -> None:
        self.online.wake(model)

    def view_changed(self, view: WorkerView) -> None:
        self.online.view_changed(view)

    def workers_coming(self) -> bool:
        return self.elastic.workers_coming()

    async def start(self, scheduler) -> None:
        """Once: Dask starts a plugin that a preload registered again when the scheduler itself starts,
        and a second start would leave the first one's periodic checks running past `close`."""
        if self._checkers:
            return
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "shoal_submit": self.submit,
                "shoal_pull": self.pull,
                "shoal_job_status": self.job_status,
                "shoal_job_release": self.job_release,
                "shoal_overview": self.overview,
                "shoal_gateway_start": self.gateway_start,
                "shoal_gateway_stop": self.gateway_stop,
                **self.online.handlers(),
            }
        )
        self.elastic.install(scheduler)
        scheduler.stream_handlers[EVENTS] = self.worker_events
        scheduler.extensions[NAME] = self
        self.metrics = start_metrics(self)
        start_dashboard(scheduler, self.metrics)
        self._checkers = [
            PeriodicCallback(self.expire_leases, LEASE_CHECK_MS),
            PeriodicCallback(self.check_placement, PLACEMENT_CHECK_MS),
        ]
        for checker in self._checkers:
            checker.start()
        if self._gateway_settings is not None:
            await self.gateway_start(self._gateway_settings.model_dump())

    async def close(self) -> None:
        stop_metrics(self)
        for checker in self._checkers:
            checker.stop()
        await self.gateway_stop()
        self.online.close()
        self.timeouts.close()

    # -- handlers -----------------------------------------------------------

    def submit(self, job: str, items: list[SubmittedItem], settings: JobSettings | None = None) -> SubmitReply:
        if job in self.jobs:
            raise ValueError(f"job {job!r} already exists")
        settings = settings or {}
        unknown = {submitted["model"] for submitted in items} - set(self.model_specs) - set(settings.get("models", {}))
        if unknown:
            raise ValueError(f"job {job!r}: no model spec for {sorted(unknown)}")
        lane = Lane(settings.get("lane", Lane.BATCH))
        self.add_specs(settings.get("models", {}), f"job {job!r}")
        queued = [
            WorkItem(
                id=f"{job}/{submitted['key']}",
                job=job,
                model=submitted["model"],
                op=submitted["op"],
                payload=submitted["payload"],
                lane=lane,
                rows=int(submitted.get("rows", 0)),
            )
            for submitted in items
        ]
        self.jobs[job] = Job(job, queued, settings)
        for item in queued:
            self.items[item.id] = item
            self.queues.push(item)
        for model, count in Counter(item.model for item in queued).items():
            self.work_queued(model, lane, count)
        return {"job": job, "items": len(queued)}

    async def pull(
        self,
        worker: str,
        held: list[str] | None = None,
        room: int = 1,
        timeout: float = 2.0,
        in_hand: int = 0,
        budget: int | None = None,
        free_bytes: int | None = None,
        load_seconds: dict[str, float] | None = None,
        loaded: list[str] | None = None,
        pinned: list[str] | None = None,
        events: WorkerEvents | None = None,
    ) -> PullReply:
        """Lease work to `worker`, waiting up to `timeout` seconds for some.

        The worker reports the models it holds (`held`: loaded, loading or
        named by work in hand), those loaded now (`loaded`) and pinned, its
        model budget and measured load times with every pull, so placement
        and scaling always see its present state. `events`: what it had
        gathered for its next events message, riding on the pull instead (one
        message fewer), handled first. A retiring worker gets nothing.
        """
        if events:
            self.worker_events(worker, **events)
        state = self.scheduler.workers.get(worker)
        view = self.reported(
            worker,
            held,
            loaded,
            budget=budget,
            free_bytes=free_bytes,
            load_seconds=load_seconds or {},
            resources=dict(getattr(state, "resources", None) or {}),
            pinned=pinned or [],
        )
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        if view.retiring:
            return {"items": [], "reason": "retiring"}

        def take() -> PullReply | None:
            if worker not in self.scheduler.workers:
                return {"items": [], "reason": "unknown worker"}
            if view.silent:
                return None
            items = self._lease_next(view, max(1, room))
            if not items and in_hand == 0:
                items = self._take_back(view)
            return self._pull_reply(items, view) if items else None

        def park() -> WaitingPull:
            waiting = WaitingPull(view)
            self.batch_pulls.add(waiting)
            return waiting

        reply = await self.timeouts.long_poll(take, park, self.batch_pulls.discard, timeout)
        return reply or {"items": []}

    def worker_events(
        self,
        worker: str,
        started: Sequence[str] = (),
        acks: Sequence[ItemAck] = (),
        failed: Sequence[ItemFailure] = (),
        extend: Sequence[str] = (),
        online_acks: Sequence[OnlineAck] = (),
    ) -> None:
        """A worker's coalesced one-way events (protocol.WorkerEvents); revokes what it no longer holds.

        A stream handler that raised would close the worker's stream, and
        Dask would remove the worker: a bad event is logged, never raised.
        """
        lost: list[str] = []
        try:
            self.spoke(worker)
            lost += [item_id for item_id in started if not self.start_item(worker, item_id)]
            for item_id, result in acks:
                self.ack(worker, item_id, result)
            self.online.ack_all(worker, online_acks)
            for item_id, error, permanent in failed:
                self.fail(worker, item_id, error, permanent)
            lost += self.extend(worker, extend)
        except Exception:  # noqa: BLE001 - see the docstring
            logger.exception("bad events from %s", worker)
        self.revoke(worker, lost)

    def job_status(self, job: str, results: bool = False) -> JobStatus:
        if job not in self.jobs:
            raise KeyError(f"unknown job {job!r}")
        return self.jobs[job].status(with_results=results)

    def job_release(self, job: str) -> ReleaseReply:
        record = self.jobs.pop(job, None)
        if record is None:
            return {"released": False}
        for item_id, item in record.items.items():
            if item.state is ItemState.QUEUED:
                self.queues.forget(item)
            self.unlease(item)
            item.move(ItemState.DEAD)
            self.items.pop(item_id, None)
        return {"released": True}

    def overview(self) -> Overview:
        return {
            "queues": {
                model: {
                    "online": self.queues.depth(model, Lane.ONLINE),
                    "batch": self.queues.depth(model, Lane.BATCH),
                }
                for model in self.queues.models()
            },
            "leased": {w: len(ids) for w, ids in self.leases.by_worker.items() if ids},
            "workers": {
                address: {
                    "held": sorted(view.held),
                    "loaded": sorted(view.loaded),
                    "budget": view.budget,
                    "free_bytes": view.free_bytes,
                }
                for address, view in self.views.views.items()
            },
            "jobs": {job_id: self._job_overview(job) for job_id, job in self.jobs.items()},
            "events": dict(self.events),
            "scaling": self.elastic.status(),
        }

    @staticmethod
    def _job_overview(job: Job) -> JobStatus:
        """A job's status with its item states (queued, leased, done, dead) per model, for `shoal status`."""
        status = job.status()
        status["models"] = job.counts_by_model()
        return status

    # -- the embedded gateway -------------------------------------------------

    async def gateway_start(
        self,
        settings: GatewayFields | None = None,
        models: dict[str, SpecFields] | None = None,
        replace: bool = False,
    ) -> GatewayStarted:
        """Start the gateway serving `models` besides those known: {"url"}.

        A running gateway is stopped first with `replace`, else left alone:
        {"error"}, so a second `shoal serve` cannot take over the first one's.
        """
        if self.gateway is not None and not replace:
            return {"error": f"this scheduler already serves the online gateway on {self.gateway.url}"}
        self.add_specs(models or {}, "the gateway's models")
        await self.gateway_stop()
        from .gateway.app import Gateway

        gateway = Gateway(self.online.local_backend(), GatewaySettings(**(settings or {})))
        url = await gateway.start()
        self.gateway = gateway
        return {"url": url}

    async def gateway_stop(self) -> GatewayStopped:
        """Stop accepting requests, finish those in flight, close the gateway."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.stop()
        return {"stopped": gateway is not None}

    # -- scheduler events ---------------------------------------------------

    def remove_client(self, scheduler, client: str) -> None:
        """A client that went away without releasing its jobs: drop their queued work.

        Parts already written stay; a re-run of the same command picks up from them.
        """
        for job_id in [j for j, job in self.jobs.items() if job.client == client and not job.complete]:
            logger.warning("client %s left; dropping its job %s", client, job_id)
            self.job_release(job_id)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str = "", **kwargs) -> None:
        self.worker_lost(worker)

    def check_placement(self) -> None:
        self.bury_unplaceable()
        self.online.forget_gone_gateways()

    def _lease_next(self, view: WorkerView, room: int) -> list[WorkItem]:
        choice = self.placement.choose(view)
        if choice is None:
            return []
        model, lane = choice
        # A steal takes one item: the model must load before any of them runs,
        # and meanwhile the rest are better off with the workers that hold it.
        rows = None
        if lane is Lane.ONLINE:  # a group of about one forward batch, as an online pull takes (online_queue)
            limit = rows = self.model_specs[model].online_batch
        elif model in view.held:
            limit = min(room, self._fair_share(model))
        else:
            limit = 1
        items = self.queues.take(model, lane, limit, rows)
        for item in items:
            self.lease(item, view.address)
        self.hold(view, model)
        return items

    def _fair_share(self, model: str) -> int:
        """Of `model`'s waiting batch items, this pull's share among its holders (at least one).

        Pulls ask for as many items as their worker will start soon; the share
        keeps the first pull of a job from leasing what other holders would
        start sooner, so the tail needs few take-backs.
        """
        return max(
            1, math.ceil(self.queues.waiting_items(model, Lane.BATCH) / max(1, self.views.holders.get(model, 0)))
        )

    def _take_back(self, view: WorkerView) -> list[WorkItem]:
        """An idle worker takes one item another worker leased but has not started.

        Only where it starts sooner here (see Placement.take_back); never
        online items (they are pulled together and start at once). The first
        holder is told by a REVOKE message; if it started the item meanwhile,
        both compute it and the first ack counts (outputs are idempotent).
        """
        item = self.placement.take_back(view)
        if item is None:
            return []
        holder = item.worker
        self.unlease(item)
        self.revoke(holder, [item.id])
        self.lease(item, view.address, counts_as_attempt=False)
        self.hold(view, item.model)
        self.events["taken_back"] += 1
        return [item]

    def _pull_reply(self, items: list[WorkItem], view: WorkerView) -> PullReply:
        """A batch pull's reply: the items, their jobs' contexts, and demand for the worker's evictions.

        Demand (waiting items and holders) is sent for the models the worker
        holds, the only ones it may evict: per pull, not per model in the cluster.
        """
        return {
            **self.items_reply(items),
            "contexts": {item.job: item.owner.context for item in items if isinstance(item.owner, Job)},
            "demand": {m: [self.queues.waiting_items(m), self.views.holders.get(m, 0)] for m in view.held},
        }
