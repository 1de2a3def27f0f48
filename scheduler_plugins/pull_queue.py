"""The pull queue: a scheduler plugin holding work items for Shoal's workers.

Workers ask for work when they have room (a bounded long poll) and get items
of one model; each pulled item is leased with a deadline that the worker
extends while it runs. A lost worker or an expired lease puts the item back;
after `max_attempts` leases it goes to the job's dead letters with its errors.

Routes (all declared in ``ShoalScheduler.start``):

- ``shoal_submit``: register a job and enqueue its items
- ``shoal_pull``: lease up to `room` items of one model to a worker
- ``shoal_start``: a worker is about to compute a leased item (or learns it
  was taken back for an idle worker)
- ``shoal_ack`` / ``shoal_fail``: finish a leased item
- ``shoal_extend``: extend a worker's leases; answers which it no longer holds
- ``shoal_job_status`` / ``shoal_job_release``: follow and forget a job
- ``shoal_overview``: queue depths and workers, for status and metrics
- ``shoal_pull_online``: lease every waiting online request of one model
  (continuous batching); a worker keeps one waiting beside its batch pulls
- ``shoal_ack_many``: finish a group of online items in one message
- ``shoal_gateway_start`` / ``shoal_gateway_stop``: the online HTTP gateway
  (scheduler_plugins/gateway.py), on this scheduler's event loop
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter, defaultdict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from configs import GatewaySettings

from .dashboard import start_dashboard
from .gateway import Gateway
from .jobs import Job
from .metrics import start_metrics
from .model_queues import ModelQueues
from .online_requests import OnlineJob, leased_at
from .placement import Placement, WorkerView, can_host
from .work_items import BATCH, ONLINE, ItemState, WorkItem

logger = logging.getLogger("shoal.scheduler")

NAME = "shoal-pull-queue"
MAX_ONLINE_BATCH = 512
LEASE_CHECK_MS = 500


class ShoalScheduler(SchedulerPlugin):
    name = NAME

    def __init__(self, gateway: GatewaySettings | None = None, models: dict[str, dict[str, Any]] | None = None) -> None:
        """`gateway`: start the online gateway with these settings; `models`: specs it serves."""
        self.queues = ModelQueues()
        self.jobs: dict[str, Job] = {}
        self.items: dict[str, WorkItem] = {}
        self.leased_by_worker: dict[str, set[str]] = defaultdict(set)
        self.worker_views: dict[str, WorkerView] = {}
        self.placement = Placement()
        self.model_specs: dict[str, dict[str, Any]] = dict(models or {})
        self.online: dict[str, OnlineJob] = {}
        self._online_pullers: dict[str, bool] = {}  # worker -> busy, for each online pull waiting
        self._online_waiters: set[asyncio.Future] = set()  # online pulls waiting: a request wakes no batch pull
        self.gateway: Gateway | None = None
        self._gateway_settings = gateway
        self.events: Counter[str] = Counter()  # leased, acked, failed, lost, expired, dead
        self._work_added = asyncio.Event()
        self._lease_checker: PeriodicCallback | None = None
        self._unplaceable_since: dict[str, float] = {}

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "shoal_submit": self.submit,
                "shoal_pull": self.pull,
                "shoal_start": self.start_item,
                "shoal_ack": self.ack,
                "shoal_fail": self.fail,
                "shoal_extend": self.extend,
                "shoal_job_status": self.job_status,
                "shoal_job_release": self.job_release,
                "shoal_overview": self.overview,
                "shoal_pull_online": self.pull_online,
                "shoal_ack_many": self.ack_many,
                "shoal_gateway_start": self.gateway_start,
                "shoal_gateway_stop": self.gateway_stop,
            }
        )
        scheduler.extensions["shoal"] = self
        self.metrics = start_metrics(self)
        start_dashboard(scheduler, self.metrics)
        self._lease_checker = PeriodicCallback(self.check_leases_and_placement, LEASE_CHECK_MS)
        self._lease_checker.start()
        if self._gateway_settings is not None:
            await self.gateway_start(self._gateway_settings.model_dump())
        # Everything alive now lives as long as the process: out of the collector's sight, a full
        # collection no longer scans it. Before, one took ~60 ms in `shoal serve`, a stall for
        # every request in flight, and came every few seconds at 1,000 req/s.
        gc.collect()
        gc.freeze()

    async def close(self) -> None:
        if self._lease_checker is not None:
            self._lease_checker.stop()
        await self.gateway_stop()

    # -- handlers -----------------------------------------------------------

    def submit(self, job: str, items: list[dict[str, Any]], settings: dict[str, Any] | None = None) -> dict[str, Any]:
        if job in self.jobs:
            raise ValueError(f"job {job!r} already exists")
        unknown = {spec["model"] for spec in items} - set(self.model_specs) - set((settings or {}).get("models", {}))
        if unknown:
            raise ValueError(f"job {job!r}: no model spec for {sorted(unknown)}")
        settings = settings or {}
        priority = int(settings.get("priority", BATCH))
        self.model_specs.update(settings.get("models", {}))
        work = [
            WorkItem(
                id=f"{job}/{spec['key']}",
                job=job,
                model=spec["model"],
                op=spec["op"],
                payload=spec["payload"],
                priority=priority,
                rows=int(spec.get("rows", 0)),
            )
            for spec in items
        ]
        self.jobs[job] = Job(job, work, settings)
        for item in work:
            self.items[item.id] = item
            self.queues.push(item)
        self._notify()
        return {"job": job, "items": len(work)}

    async def pull(
        self,
        worker: str,
        resident: list[str] | None = None,
        room: int = 1,
        timeout: float = 2.0,
        held: int = 0,
        budget: int | None = None,
        free_bytes: int | None = None,
        load_seconds: dict[str, float] | None = None,
        ready: list[str] | None = None,
    ) -> dict[str, Any]:
        """Lease work to `worker`, waiting up to `timeout` seconds for some.

        The worker reports the models it holds (`resident`: loaded, loading or
        named by work in hand) and those loaded now (`ready`), its model
        budget and measured load times with every pull, so placement always
        sees its present state.
        """
        view = self._reported(worker, resident, ready)
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        view.budget = budget
        view.free_bytes = free_bytes
        view.load_seconds.update(load_seconds or {})
        state = self.scheduler.workers.get(worker)
        view.resources = dict(getattr(state, "resources", None) or {})
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if worker not in self.scheduler.workers:
                return {"items": [], "reason": "unknown worker"}
            items = self._lease_next(view, max(1, room))
            if not items and held == 0:
                items = self._take_back(view)
            if items:
                return self._pull_reply(items)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {"items": []}
            event = self._work_added
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                pass

    def start_item(self, worker: str, item: str) -> dict[str, Any]:
        """True when `worker` still holds the lease: the item is now running there."""
        work = self.items.get(item)
        if work is None or work.state is not ItemState.LEASED or work.worker != worker:
            return {"ok": False}
        work.started = True
        return {"ok": True}

    def ack(self, worker: str, item: str, result: dict[str, Any]) -> dict[str, Any]:
        work = self.items.get(item)
        if work is None or work.state is ItemState.DONE:
            return {"accepted": False}
        if work.state is ItemState.QUEUED:
            self.queues.forget(work)
        self._unlease(work)
        self.placement.stats.record(work.model, int(result.get("rows", 0)), float(result.get("compute_seconds", 0.0)))
        job = self.jobs[work.job]
        job.dead_letters.pop(work.id, None)
        job.record_done(work, worker, result)
        self.events["acked"] += 1
        return {"accepted": True}

    def fail(self, worker: str, item: str, error: str, permanent: bool = False) -> dict[str, Any]:
        work = self.items.get(item)
        if work is None or work.state in (ItemState.DONE, ItemState.DEAD):
            return {"accepted": False}
        if work.worker != worker:
            return {"accepted": False}
        work.errors.append(f"attempt {work.attempts} on {worker}: {error}")
        self.events["failed"] += 1
        self._unlease(work)
        self._retry_or_bury(work, permanent)
        return {"accepted": True}

    def extend(self, worker: str, items: list[str]) -> dict[str, Any]:
        lost = []
        now = time.monotonic()
        for item_id in items:
            work = self.items.get(item_id)
            if work is None or work.state is not ItemState.LEASED or work.worker != worker:
                lost.append(item_id)
                continue
            work.deadline = now + self.jobs[work.job].lease_seconds
        return {"lost": lost}

    def job_status(self, job: str, results: bool = False) -> dict[str, Any]:
        if job not in self.jobs:
            raise KeyError(f"unknown job {job!r}")
        return self.jobs[job].status(with_results=results)

    def job_release(self, job: str) -> dict[str, Any]:
        record = self.jobs.pop(job, None)
        if record is None:
            return {"released": False}
        for item_id, work in record.items.items():
            if work.state is ItemState.QUEUED:
                self.queues.forget(work)
            self._unlease(work)
            work.state = ItemState.DEAD
            self.items.pop(item_id, None)
        return {"released": True}

    def overview(self) -> dict[str, Any]:
        return {
            "queues": {
                model: {
                    "online": self.queues.depth(model, ONLINE),
                    "batch": self.queues.depth(model, BATCH),
                }
                for model in self.queues.models()
            },
            "leased": {w: len(ids) for w, ids in self.leased_by_worker.items() if ids},
            "workers": {
                address: {"resident": sorted(view.ready), "budget": view.budget, "free_bytes": view.free_bytes}
                for address, view in self.worker_views.items()
            },
            "jobs": {job_id: {**job.status(), "models": self._item_states(job)} for job_id, job in self.jobs.items()},
            "events": dict(self.events),
        }

    @staticmethod
    def _item_states(job: Job) -> dict[str, dict[str, int]]:
        """Item states (queued, leased, done, dead) per model of a job, for `shoal status`."""
        states: dict[str, Counter[str]] = defaultdict(Counter)
        for item in job.items.values():
            states[item.model][item.state.value] += 1
        return {model: dict(counts) for model, counts in states.items()}

    # -- online requests ------------------------------------------------------

    async def gateway_start(
        self, settings: dict[str, Any] | None = None, models: dict[str, dict[str, Any]] | None = None,
        replace: bool = False,
    ) -> dict[str, Any]:
        """Start the gateway serving `models` besides those known: {"url"}.

        A running gateway is stopped first with `replace`, else left alone:
        {"error"}, so a second `shoal serve` cannot take over the first one's.
        """
        if self.gateway is not None and not replace:
            return {"error": f"this scheduler already serves the online gateway on {self.gateway.url}"}
        self.model_specs.update(models or {})
        await self.gateway_stop()
        gateway = Gateway(self, GatewaySettings(**(settings or {})))
        url = await gateway.start()
        self.gateway = gateway
        return {"url": url}

    async def gateway_stop(self) -> dict[str, Any]:
        """Stop accepting requests, finish those in flight, close the gateway."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.stop()
        return {"stopped": gateway is not None}

    def submit_online(
        self, model: str, op: str, payload: dict[str, Any], rows: int, settings: GatewaySettings
    ) -> tuple[WorkItem, asyncio.Future]:
        """Queue one online request, in-process (the gateway calls this); its future gets the result."""
        job = self.online.get(model)
        if job is None:
            job = self.online[model] = OnlineJob(model, 0.0, 0, lambda item: self.items.pop(item.id, None))
            self.jobs[job.id] = job
        # A request never outlives its deadline, so that is its lease too.
        job.lease_seconds = settings.request_timeout_seconds
        job.max_attempts = settings.max_attempts
        item, future = job.new_item(op, payload, rows, ONLINE)
        self.items[item.id] = item
        self.queues.push(item)
        for waiter in self._online_waiters:
            _settle(waiter)
        self._online_waiters.clear()
        return item, future

    def online_pending(self, model: str) -> int:
        """Requests of `model` not answered yet: queued, or leased and waiting on a worker."""
        job = self.online.get(model)
        return len(job.futures) if job is not None else 0

    def cancel_online(self, item: WorkItem) -> None:
        """The request is gone (deadline, shutdown): drop its item wherever it is."""
        if item.state is ItemState.QUEUED:
            self.queues.forget(item)
        elif item.state is not ItemState.LEASED:
            return
        self._unlease(item)
        self.jobs[item.job].cancel(item)

    def _reported(self, worker: str, resident: list[str] | None, ready: list[str] | None) -> WorkerView | None:
        """The view of `worker`, updated with what its pull reports; None for a removed worker.

        A late pull of a removed worker must not recreate its view: the view
        would stay a holder of its models forever, keeping their requests from
        other workers.
        """
        if worker not in self.scheduler.workers:
            return None
        view = self.worker_views.setdefault(worker, WorkerView(worker))
        view.report(resident, ready)
        return view

    async def pull_online(
        self,
        worker: str,
        resident: list[str] | None = None,
        timeout: float = 2.0,
        busy: bool = False,
        ready: list[str] | None = None,
    ) -> dict[str, Any]:
        """Lease every waiting online request of one model to `worker`, waiting up to `timeout`.

        Workers keep one of these waiting besides their batch pulls, so a
        request is taken the moment it is queued, even while batch items fill
        the worker. Only models resident here, or held by no worker (one has
        to load it), so a request never waits for a load another worker spared.
        A `busy` worker (its device computing) leaves requests to an idle one
        waiting here too, so they do not wait for its running batch.
        """
        view = self._reported(worker, resident, ready)
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        self._online_pullers[worker] = busy
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            while True:
                if worker not in self.scheduler.workers:
                    return {"items": [], "reason": "unknown worker"}
                model = self._online_model_for(view, busy)
                items = self.queues.take(model, ONLINE, MAX_ONLINE_BATCH) if model else []
                for work in items:
                    self._lease(work, worker)
                if items:
                    view.resident.add(model)  # a holder now, loaded or not (see _lease_next)
                    return self._items_reply(items)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {"items": []}
                await self._online_request_queued(remaining)
        finally:
            self._online_pullers.pop(worker, None)

    async def _online_request_queued(self, timeout: float) -> None:
        """Until the gateway queues a request, or `timeout` seconds.

        A bare future and a timer: `wait_for(event.wait())` cost a task per
        wait, and every online request wakes a waiting pull.
        """
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._online_waiters.add(waiter)
        timer = loop.call_later(timeout, _settle, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._online_waiters.discard(waiter)

    def _online_model_for(self, view: WorkerView, busy: bool) -> str | None:
        """The model whose online requests this online pull takes, oldest head first.

        A request goes to a worker holding its model, or to any when none does.
        Among the workers pulling now, one with the model loaded goes before
        one still loading it, and an idle one before a busy one: a request
        waits for a running forward batch rather than a load, and for neither
        when it need not.
        """
        held = {m for v in self.worker_views.values() for m in v.resident}

        def may_serve(address: str, model: str) -> bool:
            other = self.worker_views.get(address)
            return other is not None and (model in other.resident or model not in held)

        def better_elsewhere(model: str) -> bool:
            mine = (model in view.ready, not busy)
            return any(
                (model in self.worker_views[w].ready, not b) > mine
                for w, b in self._online_pullers.items()
                if w != view.address and may_serve(w, model)
            )

        heads = [
            (model not in view.resident, head.enqueued_at, model)
            for model in self.queues.models()
            if may_serve(view.address, model)
            and (head := self.queues.head(model, ONLINE)) is not None
            and not better_elsewhere(model)
        ]
        return min(heads)[2] if heads else None

    def ack_many(self, worker: str, results: list[list[Any]], compute_seconds: float = 0.0) -> dict[str, Any]:
        """Finish a worker's group of online items: `results` is [[item id, result], ...].

        Each result gets the stage timings the gateway reports: queue (enqueued
        to leased, here) and compute (the group's one model call, on the worker).
        """
        accepted = 0
        for item_id, result in results:
            work = self.items.get(item_id)
            if work is not None and work.state is ItemState.LEASED:
                lease_seconds = self.jobs[work.job].lease_seconds
                result["timing"] = {"queue": leased_at(work, lease_seconds) - work.enqueued_at, "compute": compute_seconds}
            accepted += self.ack(worker, item_id, result)["accepted"]
        return {"accepted": accepted}

    # -- scheduler events ---------------------------------------------------

    def remove_client(self, scheduler, client: str) -> None:
        """A client that went away without releasing its jobs: drop their queued work.

        Parts already written stay; a re-run of the same command picks up from them.
        """
        for job_id in [j for j, job in self.jobs.items() if job.client == client and not job.complete]:
            logger.warning("client %s left; dropping its job %s", client, job_id)
            self.job_release(job_id)

    def remove_worker(self, scheduler, worker: str, *, stimulus_id: str = "", **kwargs) -> None:
        """A lost worker's leased items go back to the front of their queues."""
        self.worker_views.pop(worker, None)
        item_ids = self.leased_by_worker.pop(worker, set())
        for item_id in item_ids:
            work = self.items.get(item_id)
            if work is not None and work.state is ItemState.LEASED:
                work.errors.append(f"attempt {work.attempts}: worker {worker} was lost")
                self.events["lost"] += 1
                self._retry_or_bury(work, permanent=False, front=True)
        if item_ids:
            logger.warning("worker %s lost; %d leased items put back", worker, len(item_ids))

    def check_leases_and_placement(self) -> None:
        self.expire_leases()
        self.bury_unplaceable()

    def bury_unplaceable(self) -> None:
        """Items of a model that no worker can host go to dead letters, after a grace.

        The grace (the job's `unplaceable_seconds`) lets a worker that can host
        it join first, as under an autoscaler. Until some worker has pulled,
        nothing is judged.
        """
        if not self.worker_views:
            return
        now = time.monotonic()
        for model in self.queues.models():
            spec = self.model_specs.get(model, {})
            views = list(self.worker_views.values())
            if any(model in v.resident or can_host(spec, v) for v in views):
                self._unplaceable_since.pop(model, None)
                continue
            since = self._unplaceable_since.setdefault(model, now)
            reason = _unplaceable_reason(model, spec, views)
            for priority in (ONLINE, BATCH):
                for work in self.queues.take(model, priority, len(self.items)):
                    job = self.jobs[work.job]
                    if now - since >= job.unplaceable_seconds:
                        work.errors.append(reason)
                        job.record_dead(work)
                        self.events["dead"] += 1
                    else:
                        self.queues.push(work)

    def expire_leases(self) -> None:
        now = time.monotonic()
        for worker, item_ids in list(self.leased_by_worker.items()):
            for item_id in list(item_ids):
                work = self.items.get(item_id)
                if work is None or work.state is not ItemState.LEASED:
                    item_ids.discard(item_id)
                elif work.deadline < now:
                    item_ids.discard(item_id)
                    work.errors.append(f"attempt {work.attempts}: lease on {worker} expired")
                    self.events["expired"] += 1
                    self._retry_or_bury(work, permanent=False, front=True)

    # -- internals ----------------------------------------------------------

    def _holders(self) -> dict[str, int]:
        """How many workers hold (or are loading) each model."""
        holders: dict[str, int] = defaultdict(int)
        for view in self.worker_views.values():
            for model in view.resident:
                holders[model] += 1
        return holders

    def _lease_next(self, worker: WorkerView, room: int) -> list[WorkItem]:
        choice = self.placement.choose(self.queues, worker, self.model_specs, self._holders())
        if choice is None:
            return []
        model, priority = choice
        # A steal takes one item: the model must load before any of them runs,
        # and meanwhile the rest are better off with the workers that hold it.
        limit = MAX_ONLINE_BATCH if priority == ONLINE else room if model in worker.resident else 1
        items = self.queues.take(model, priority, limit)
        for work in items:
            self._lease(work, worker.address)
        # The worker loads it now: count it as a holder before its next pull
        # says so, or every idle worker would steal the same hot model at once.
        worker.resident.add(model)
        return items

    def _take_back(self, worker: WorkerView) -> list[WorkItem]:
        """An idle worker takes one item another worker leased but has not started.

        Only where it starts sooner here (see Placement.take_back_gain), the
        largest gain first; never online items (they are pulled together and
        start at once). The first holder learns it lost the item when it asks
        to start it.
        """
        best: tuple[float, WorkItem] | None = None
        for address, item_ids in self.leased_by_worker.items():
            if address == worker.address:
                continue
            leased = [self.items[i] for i in item_ids]
            ahead = [w for w in leased if w.started]
            for work in leased:
                if work.started or work.priority != BATCH:
                    continue
                if work.model not in worker.resident and not can_host(self.model_specs.get(work.model, {}), worker):
                    continue
                gain = self.placement.take_back_gain(
                    work, worker, self.worker_views.get(address), ahead, self.model_specs
                )
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, work)
        if best is None:
            return []
        work = best[1]
        self._unlease(work)
        self._lease(work, worker.address, counts_as_attempt=False)
        self.events["taken_back"] += 1
        return [work]

    def _lease(self, work: WorkItem, worker: str, counts_as_attempt: bool = True) -> None:
        work.lease(worker, self.jobs[work.job].lease_seconds, counts_as_attempt)
        self.leased_by_worker[worker].add(work.id)
        self.events["leased"] += 1

    def _pull_reply(self, items: list[WorkItem]) -> dict[str, Any]:
        """A batch pull's reply: the items, their jobs' contexts, and demand for the worker's evictions."""
        holders = self._holders()
        return {
            **self._items_reply(items),
            "contexts": {j: self.jobs[j].context for j in {work.job for work in items}},
            # For the worker's eviction choice: waiting items and holders per model.
            "demand": {m: [self.queues.waiting_items(m), holders.get(m, 0)] for m in self.queues.models()},
        }

    def _items_reply(self, items: list[WorkItem]) -> dict[str, Any]:
        """The items with their leases, and their models' specs: an online pull's whole reply, a batch pull's core."""
        messages = []
        for work in items:
            message = work.to_message()
            message["lease_seconds"] = self.jobs[work.job].lease_seconds
            messages.append(message)
        return {"items": messages, "models": {m: self.model_specs[m] for m in {work.model for work in items}}}

    def _unlease(self, work: WorkItem) -> None:
        if work.worker is not None:
            self.leased_by_worker.get(work.worker, set()).discard(work.id)

    def _retry_or_bury(self, work: WorkItem, permanent: bool, front: bool = False) -> None:
        job = self.jobs[work.job]
        if permanent or work.attempts >= job.max_attempts:
            job.record_dead(work)
            self.events["dead"] += 1
            return
        work.requeue()
        self.queues.push(work, front=front)
        self._notify()

    def _notify(self) -> None:
        """Wake every waiting pull; each then tries to lease again."""
        self._work_added.set()
        self._work_added = asyncio.Event()


def _settle(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _unplaceable_reason(model: str, spec: dict[str, Any], views: list[WorkerView]) -> str:
    needs = [f"{spec.get('memory_bytes', 0) / 1e9:.2f} GB of model memory"]
    needs += [f"{resource}={amount:g}" for resource, amount in (spec.get("requires") or {}).items()]
    budgets = [v.budget for v in views if v.budget is not None]
    largest = f"; the largest worker budget is {max(budgets) / 1e9:.2f} GB" if budgets else ""
    return f"no worker can host model {model!r}: it needs {', '.join(needs)}{largest}"
