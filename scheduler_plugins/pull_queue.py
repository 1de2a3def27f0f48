"""The pull queue: a scheduler plugin holding work items for Shoal's workers.

Workers ask for work when they have room (a bounded long poll) and get items
of one model; each pulled item is leased with a deadline that the worker
extends while it runs. A lost worker or an expired lease puts the item back;
after `max_attempts` leases it goes to the job's dead letters with its errors.

Routes (all declared in ``ShoalScheduler.start``):

- ``shoal_submit``: register a job and enqueue its items
- ``shoal_pull``: lease up to `room` items of one model to a worker
- ``shoal_ack`` / ``shoal_fail``: finish a leased item
- ``shoal_extend``: extend a worker's leases; answers which it no longer holds
- ``shoal_job_status`` / ``shoal_job_release``: follow and forget a job
- ``shoal_overview``: queue depths and workers, for status and metrics
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado.ioloop import PeriodicCallback

from .jobs import Job
from .model_queues import ModelQueues
from .placement import choose_model
from .work_items import BATCH, ONLINE, ItemState, WorkItem

logger = logging.getLogger("shoal.scheduler")

NAME = "shoal-pull-queue"
MAX_ONLINE_BATCH = 512
LEASE_CHECK_MS = 500


class ShoalScheduler(SchedulerPlugin):
    name = NAME

    def __init__(self) -> None:
        self.queues = ModelQueues()
        self.jobs: dict[str, Job] = {}
        self.items: dict[str, WorkItem] = {}
        self.leased_by_worker: dict[str, set[str]] = defaultdict(set)
        self.worker_models: dict[str, dict[str, Any]] = {}
        self.model_specs: dict[str, dict[str, Any]] = {}
        self.events: Counter[str] = Counter()  # leased, acked, failed, lost, expired, dead
        self._work_added = asyncio.Event()
        self._lease_checker: PeriodicCallback | None = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler
        scheduler.handlers.update(
            {
                "shoal_submit": self.submit,
                "shoal_pull": self.pull,
                "shoal_ack": self.ack,
                "shoal_fail": self.fail,
                "shoal_extend": self.extend,
                "shoal_job_status": self.job_status,
                "shoal_job_release": self.job_release,
                "shoal_overview": self.overview,
            }
        )
        scheduler.extensions["shoal"] = self
        self._lease_checker = PeriodicCallback(self.expire_leases, LEASE_CHECK_MS)
        self._lease_checker.start()

    async def close(self) -> None:
        if self._lease_checker is not None:
            self._lease_checker.stop()

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
        can_host: list[str] | None = None,
        free_bytes: int | None = None,
    ) -> dict[str, Any]:
        self.worker_models[worker] = {"resident": list(resident or []), "free_bytes": free_bytes}
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            if worker not in self.scheduler.workers:
                return {"items": [], "reason": "unknown worker"}
            items = self._lease_next(worker, resident or [], max(1, room), can_host)
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

    def ack(self, worker: str, item: str, result: dict[str, Any]) -> dict[str, Any]:
        work = self.items.get(item)
        if work is None or work.state is ItemState.DONE:
            return {"accepted": False}
        self._unlease(work)
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
            "workers": dict(self.worker_models),
            "jobs": {job_id: job.status() for job_id, job in self.jobs.items()},
            "events": dict(self.events),
        }

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
        self.worker_models.pop(worker, None)
        item_ids = self.leased_by_worker.pop(worker, set())
        for item_id in item_ids:
            work = self.items.get(item_id)
            if work is not None and work.state is ItemState.LEASED:
                work.errors.append(f"attempt {work.attempts}: worker {worker} was lost")
                self.events["lost"] += 1
                self._retry_or_bury(work, permanent=False, front=True)
        if item_ids:
            logger.warning("worker %s lost; %d leased items put back", worker, len(item_ids))

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

    def _lease_next(
        self, worker: str, resident: list[str], room: int, can_host: list[str] | None
    ) -> list[WorkItem]:
        choice = choose_model(self.queues, resident, can_host)
        if choice is None:
            return []
        model, priority = choice
        limit = MAX_ONLINE_BATCH if priority == ONLINE else room
        items = self.queues.take(model, priority, limit)
        self.events["leased"] += len(items)
        for work in items:
            work.lease(worker, self.jobs[work.job].lease_seconds)
            self.leased_by_worker[worker].add(work.id)
        return items

    def _pull_reply(self, items: list[WorkItem]) -> dict[str, Any]:
        messages = []
        for work in items:
            message = work.to_message()
            message["lease_seconds"] = self.jobs[work.job].lease_seconds
            messages.append(message)
        models = {work.model for work in items}
        jobs = {work.job for work in items}
        return {
            "items": messages,
            "models": {m: self.model_specs[m] for m in models},
            "contexts": {j: self.jobs[j].context for j in jobs},
        }

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
