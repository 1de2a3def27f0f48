"""The pull queue: a scheduler plugin holding work items for Shoal's workers.

Workers ask for work when they have room (a bounded long poll) and get items
of one model, as many as they expect to start soon, each leased (leases.py).
A lost worker or an expired lease puts the item back; after `max_attempts`
leases it goes to its owner's dead letters with its errors.

The plugin composes four parts: the queue's state (queue_state.py), the
batch route (batch_route.py), the online route (online_route.py) and the
elastic part (elastic.py, Dask's autoscaling methods replaced). Every
handler is declared here, in `start`, and the workers' one-way events
(protocol.WorkerEvents: starts, acks, failures and renewals of many items in
one message) are handled here; what a worker no longer holds is revoked by
a ``REVOKE`` message on the scheduler's stream to it.

Per event (pull, ack, request) the plugin does O(1) or O(log n) work in
workers, models and leased items: worker views, waiting pulls, leases and
placement's candidates are indexes kept up to date as events happen, and new
work wakes only the pulls that may take it (see waiting_pulls).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from ..configs import GatewaySettings, ModelSpec
from .batch_route import BatchRoute
from .clock import Clock
from .dashboard import start_dashboard
from .elastic import Elastic
from .jobs import Job
from .metrics import start_metrics, stop_metrics
from .online_route import OnlineRoute
from .protocol import (
    EVENTS,
    NAME,
    GatewayFields,
    GatewayStarted,
    GatewayStopped,
    ItemAck,
    ItemFailure,
    JobStatus,
    Lane,
    OnlineAck,
    Overview,
    SpecFields,
)
from .queue_state import QueueState
from .waiting_pulls import LongPolls

if TYPE_CHECKING:  # aiohttp, imported when a gateway starts: a batch job's scheduler never starts one
    from .gateway.app import Gateway

logger = logging.getLogger("shoal.scheduler")

CHECK_MS = 500  # items no worker can host, and gateways gone silent, are looked for this often


class PullQueue(SchedulerPlugin):
    """The scheduler plugin: the queue's state, its two routes and the elastic part, and every handler."""

    name = NAME

    def __init__(
        self,
        gateway: GatewaySettings | None = None,
        models: Mapping[str, ModelSpec] | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`gateway`: start the online gateway with these settings; `models`: specs it serves; `clock`: the
        time leases, long polls and timers keep (tests drive their own)."""
        self.state = QueueState(models, clock)
        long_polls = LongPolls(self.state.clock)  # of every waiting pull, batch and online
        self.batch = BatchRoute(self.state, long_polls, self.worker_events)
        self.online = OnlineRoute(self.state, long_polls, lambda: self.elastic.workers_coming())
        self.elastic = Elastic(self.state, self.online.load, self.worker_events)
        self.gateway: Gateway | None = None
        self._long_polls = long_polls
        self._gateway_settings = gateway
        self._checker: PeriodicCallback | None = None

    async def start(self, scheduler) -> None:
        """Once: Dask starts a plugin that a preload registered again when the scheduler itself starts,
        and a second start would leave the first one's periodic check running past `close`."""
        if self._checker is not None:
            return
        self.scheduler = self.state.scheduler = scheduler
        batch, online, elastic = self.batch, self.online, self.elastic
        scheduler.handlers.update(
            {
                "shoal_submit": batch.submit,
                "shoal_pull": batch.pull,
                "shoal_job_status": batch.job_status,
                "shoal_job_release": batch.job_release,
                "shoal_pull_online": online.pull,
                "shoal_online_submit": online.remote_submit,
                "shoal_online_answers": online.remote_answers,
                "shoal_online_models": online.remote_models,
                "shoal_overview": self.overview,
                "shoal_gateway_start": self.gateway_start,
                "shoal_gateway_stop": self.gateway_stop,
                "adaptive_target": elastic.adaptive_target,
                "workers_to_close": elastic.workers_to_close,
                "retire_workers": elastic.retire_workers,
                "shoal_retire": elastic.drain,
                "shoal_scaling": elastic.status,
            }
        )
        scheduler.stream_handlers[EVENTS] = self.worker_events
        elastic.install(scheduler)
        scheduler.extensions[NAME] = self
        self.metrics = start_metrics(self)
        start_dashboard(scheduler, self.metrics)
        self._checker = PeriodicCallback(self.check, CHECK_MS)
        self._checker.start()
        if self._gateway_settings is not None:
            await self.gateway_start(self._gateway_settings.model_dump())

    async def close(self) -> None:
        stop_metrics(self)
        if self._checker is not None:
            self._checker.stop()
        await self.gateway_stop()
        self.online.close()
        self.state.leases.close()
        self._long_polls.close()

    # -- handlers -----------------------------------------------------------

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
        state = self.state
        lost: list[str] = []
        try:
            state.spoke(worker)
            lost += [item_id for item_id in started if not state.start(worker, item_id)]
            for item_id, result in acks:
                state.ack(worker, item_id, result)
            self.online.ack_all(worker, online_acks)
            for item_id, error, permanent in failed:
                state.fail(worker, item_id, error, permanent)
            lost += state.leases.renew(worker, extend)
        except Exception:  # noqa: BLE001 - see the docstring
            logger.exception("bad events from %s", worker)
        state.revoke(worker, lost)

    def overview(self) -> Overview:
        state = self.state
        return {
            "queues": {
                model: {
                    "online": state.queues.depth(model, Lane.ONLINE),
                    "batch": state.queues.depth(model, Lane.BATCH),
                }
                for model in state.queues.models()
            },
            "leased": {w: len(ids) for w, ids in state.leases.by_worker.items() if ids},
            "workers": {
                address: {
                    "held": sorted(view.held),
                    "loaded": sorted(view.loaded),
                    "budget": view.budget,
                    "free_bytes": view.free_bytes,
                }
                for address, view in state.views.views.items()
            },
            "jobs": {job_id: _job_overview(job) for job_id, job in self.batch.jobs.items()},
            "counts": dict(state.counts),
            "scaling": self.elastic.status(),
        }

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
        self.state.add_specs(models or {}, "the gateway's models")
        await self.gateway_stop()
        from .gateway.app import Gateway
        from .online_route import LocalBackend

        gateway = Gateway(LocalBackend(self.online), GatewaySettings(**(settings or {})))
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
        self.batch.client_left(client)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str = "", **kwargs) -> None:
        self.state.worker_lost(worker)

    def check(self) -> None:
        self.state.bury_unplaceable()
        self.online.forget_gone_gateways()


def _job_overview(job: Job) -> JobStatus:
    """A job's status with its item states (queued, leased, done, dead) per model, for `shoal status`."""
    status = job.status()
    status["models"] = job.counts_by_model()
    return status
