"""The pull queue's state: items, their queues and leases, the workers' views, placement.

Both routes over it, batch pulls (pull_queue) and online pulls
(online_queue), change it only through the transitions here: lease,
unlease, hold, start, ack, fail, renew, retry or bury, expire, lose a
worker. Each keeps the indexes true at once (queues, leases, placement's
candidates, the holders of each model), so that no event needs a scan, and
wakes the waiting pulls that may take new work (`work_queued`), no others.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from shoal.configs import ModelSpec

from .leases import Leases
from .model_queues import ModelQueues
from .model_specs import ModelSpecs
from .placement import ModelStats, Placement
from .protocol import REVOKE, ItemResult, Lane, PullReply, SpecFields
from .waiting_pulls import Timeouts, WaitingBatchPulls
from .work_items import ItemState, WorkItem
from .worker_views import WorkerView, WorkerViews, may_take

logger = logging.getLogger("shoal.scheduler")


class QueueState:
    """The state and its transitions; the routes subclass it (PullQueue) or hold it (OnlineQueue)."""

    scheduler: Any  # the Dask scheduler: its workers, and its streams to them (set when the plugin starts)

    def __init__(self, models: Mapping[str, ModelSpec] | None = None) -> None:
        self.model_specs = ModelSpecs()  # its version tells gateways in other processes to refresh theirs
        self.model_specs.add(models or {}, "the plugin's models")
        self.items: dict[str, WorkItem] = {}
        self.views = WorkerViews(on_holders=self._holders_changed)
        self.queues = ModelQueues(on_change=self._batch_work_changed)
        self.placement = Placement(self.queues, self.views, self.model_specs)
        self.leases = Leases()
        self.batch_pulls = WaitingBatchPulls()
        self.timeouts = Timeouts()  # of every waiting pull, batch and online
        self.events: Counter[str] = Counter()  # leased, acked, failed, lost, expired, dead, taken_back, rescued
        self._unplaceable_since: dict[str, float] = {}

    @property
    def model_stats(self) -> ModelStats:
        """Rows and compute seconds per model from batch acks: placement's estimates, the metrics' rates."""
        return self.placement.stats

    @property
    def worker_views(self) -> dict[str, WorkerView]:
        return self.views.views

    @property
    def leased_by_worker(self) -> dict[str, dict[str, WorkItem]]:
        return self.leases.by_worker

    # -- what the online route hears (OnlineQueue, through PullQueue) -------------

    def online_work_queued(self, model: str) -> None:
        """Requests of `model` wait: wake the one online pull that should take them."""

    def view_changed(self, view: WorkerView) -> None:
        """A worker reported or was given a model: its waiting online pull is filed anew."""

    def workers_coming(self) -> bool:
        """An autoscaler may add workers: a request that finds none waits for one (elastic.py)."""
        return False

    # -- transitions ----------------------------------------------------------------

    def add_specs(self, models: Mapping[str, ModelSpec | SpecFields], source: str) -> None:
        """Model specs join the plugin-wide table that pulls send with items, validated here (a
        ConfigError naming `source` and the model); those already known as sent cost a comparison."""
        if self.model_specs.add(models, source):
            self.placement.specs_changed()

    def revoke(self, worker: str | None, item_ids: list[str]) -> None:
        """Tell `worker` it no longer holds `item_ids`: it drops those not started (one way)."""
        stream = self.scheduler.stream_comms.get(worker) if worker and item_ids else None
        if stream is not None:
            try:
                stream.send({"op": REVOKE, "items": item_ids})
            except Exception as exc:  # noqa: BLE001 - a worker whose stream closed is being removed
                logger.info("could not revoke %d items on %s: %s", len(item_ids), worker, exc)

    def start_item(self, worker: str, item_id: str) -> bool:
        """True when `worker` still holds the lease: the item is now running there."""
        item = self.items.get(item_id)
        if item is None or item.state is not ItemState.LEASED or item.worker != worker:
            return False
        item.started = True
        self.placement.started(item)
        return True

    def ack(self, worker: str, item_id: str, result: ItemResult) -> bool:
        """A batch pull's item is done (an online request's: OnlineQueue.ack); its rate joins placement's."""
        item = self.finish(worker, item_id)
        if item is None:
            return False
        if item.lane is Lane.BATCH:
            self.placement.stats.record(
                item.model, int(result.get("rows", 0)), float(result.get("compute_seconds", 0.0))
            )
            self.placement.model_changed(item.model)
        item.settings.record_done(item, worker, result)
        return True

    def finish(self, worker: str, item_id: str) -> WorkItem | None:
        """The first ack of an item finishes it, from whichever worker computed it: the item, for its
        owner to record, or None when it is unknown or done already.

        Outputs are idempotent, so an item computed twice (its lease expired or
        it was taken back while it started) is counted once; a worker still
        holding it is told to drop it.
        """
        item = self.items.get(item_id)
        if item is None or item.state is ItemState.DONE:
            return None
        if item.state is ItemState.QUEUED:
            self.queues.forget(item)
        holder = item.worker
        self.unlease(item)
        if holder != worker:
            self.revoke(holder, [item.id])
        self.events["acked"] += 1
        return item

    def fail(self, worker: str, item_id: str, error: str, permanent: bool = False) -> bool:
        item = self.items.get(item_id)
        if item is None or item.state in (ItemState.DONE, ItemState.DEAD):
            return False
        if item.worker != worker:
            return False
        item.errors.append(f"attempt {item.attempts} on {worker}: {error}")
        self.events["failed"] += 1
        self.unlease(item)
        self.retry_or_bury(item, permanent)
        return True

    def extend(self, worker: str, item_ids: Sequence[str]) -> list[str]:
        """Renew `worker`'s leases of `item_ids`; the ids it no longer holds."""
        lost = []
        now = time.monotonic()
        for item_id in item_ids:
            item = self.items.get(item_id)
            if item is None or item.state is not ItemState.LEASED or item.worker != worker:
                lost.append(item_id)
                continue
            item.deadline = max(item.deadline, now + item.settings.lease_seconds)  # a lease's grace stays
            self.leases.extended(item)
        return lost

    def bury_unplaceable(self) -> None:
        """Items of a model that no worker can host go to dead letters, after a grace.

        The grace (the job's `unplaceable_seconds`) lets a worker that can host
        it join first, as under an autoscaler. Until some worker has pulled,
        nothing is judged. Each model is checked against the distinct worker
        capabilities, not against every worker.
        """
        if not len(self.views):
            return
        now = time.monotonic()
        for model in self.queues.models():
            spec = self.model_specs[model]
            if self.views.holders.get(model) or self.views.anyone_can_host(spec):
                self._unplaceable_since.pop(model, None)
                continue
            since = self._unplaceable_since.setdefault(model, now)
            reason = _unplaceable_reason(model, spec, self.views.largest_budget())
            for lane in Lane:
                for item in self.queues.take(model, lane, len(self.items)):
                    job = item.settings
                    if now - since >= job.unplaceable_seconds:
                        item.errors.append(reason)
                        job.record_dead(item)
                        self.events["dead"] += 1
                    else:
                        self.queues.push(item)

    def expire_leases(self) -> None:
        """Put back the items whose lease ran out (their worker froze, or died unseen); O(1) when none did."""
        for item in self.leases.expired(time.monotonic()):
            worker = item.worker
            view = self.views.views.get(worker or "")
            if view is not None:
                self.views.silence(view)
            self.unlease(item)
            self.revoke(worker, [item.id])
            item.errors.append(f"attempt {item.attempts}: lease on {worker} expired")
            self.events["expired"] += 1
            self.retry_or_bury(item, permanent=False, front=True)

    def reported(
        self, worker: str, held: list[str] | None, loaded: list[str] | None, **capability: Any
    ) -> WorkerView | None:
        """The view of `worker`, updated with what its pull reports; None for a removed worker.

        A late pull of a removed worker must not recreate its view: the view
        would stay a holder of its models forever, keeping their requests from
        other workers.
        """
        if worker not in self.scheduler.workers:
            return None
        view, changed = self.views.report(worker, held, loaded, **capability)
        if changed:
            self.placement.holder_changed(worker)
            self.view_changed(view)
        self.spoke(worker)
        return view

    def spoke(self, worker: str) -> None:
        """A message from `worker` (a pull, its events): if a lease of its had lapsed, it is back."""
        view = self.views.views.get(worker)
        if view is not None and view.silent:
            self.views.speak(view)
            self.view_changed(view)  # its waiting online pull may take the requests queued meanwhile

    def hold(self, view: WorkerView, model: str) -> None:
        """The worker was given `model`'s work: it loads it now, so count it as a holder before
        its next pull says so, or every idle worker would steal the same hot model at once."""
        if model not in view.held:
            self.views.hold(view, model)
            self.view_changed(view)

    def lease(self, item: WorkItem, worker: str, counts_as_attempt: bool = True, grace: float = 0.0) -> None:
        """`grace`: seconds added to this lease only, for what the worker must do first (load the model)."""
        item.lease(worker, item.settings.lease_seconds + grace, counts_as_attempt)
        self.leases.add(item)
        self.placement.leased(item)
        self.events["leased"] += 1

    def items_reply(self, items: list[WorkItem]) -> PullReply:
        """The items with their leases, and their models' specs: an online pull's whole reply, a batch pull's core."""
        messages = [item.to_message(item.settings.lease_seconds) for item in items]
        specs = self.model_specs.fields
        return {"items": messages, "models": {m: specs[m] for m in {item.model for item in items}}}

    def unlease(self, item: WorkItem) -> None:
        """`item` leaves its worker's leases (and placement's candidates); its state is the caller's."""
        if item.worker is not None:
            self.placement.unleased(item)
            self.leases.remove(item)

    def retry_or_bury(self, item: WorkItem, permanent: bool, front: bool = False) -> None:
        job = item.settings
        if permanent or item.attempts >= job.max_attempts:
            job.record_dead(item)
            self.events["dead"] += 1
            return
        item.requeue()
        self.queues.push(item, front=front)
        self.work_queued(item.model, item.lane, 1)

    def work_queued(self, model: str, lane: Lane, count: int) -> None:
        """Wake the pulls that may take `count` new items of `model`, and no others."""
        if lane is Lane.ONLINE:
            self.online_work_queued(model)
            return
        spec = self.model_specs[model]
        self.batch_pulls.wake(model, count, lambda view: may_take(view, model, spec))

    def _batch_work_changed(self, model: str) -> None:
        self.placement.model_changed(model)

    def _holders_changed(self, model: str) -> None:
        self.placement.model_changed(model)
        if not self.views.holders.get(model) and self.queues.waiting_items(model, Lane.ONLINE):
            self.online_work_queued(model)  # its requests may now go to any worker

    def hand_back(self, worker: str, items: list[WorkItem]) -> None:
        """A retiring worker's `items` go back to the front of their queues, uncounted: a retirement is no
        attempt. It is told to drop them (one it started runs on, and the first ack counts)."""
        for item in reversed(items):  # each goes to the front: the first leased is taken first again
            self.unlease(item)
            item.attempts = max(0, item.attempts - 1)
            item.requeue()
            self.queues.push(item, front=True)
        for (model, lane), count in Counter((item.model, item.lane) for item in items).items():
            self.work_queued(model, lane, count)
        self.revoke(worker, [item.id for item in items])
        self.events["handed_back"] += len(items)

    def worker_lost(self, worker: str) -> None:
        """A removed worker's leased items go back to the front of their queues, and wake their takers: a
        retiring one's uncounted (it had been told to go), a lost one's as a spent attempt."""
        view = self.views.get(worker)
        held = []
        for item in list(self.leases.of_worker(worker).values()):
            if item.state is ItemState.LEASED:
                held.append(item)
            else:
                self.leases.remove(item)
        if view is not None and view.retiring:
            self.hand_back(worker, held)
            if held:
                logger.info("worker %s retired; %d items it still held handed back", worker, len(held))
        self.views.remove(worker)
        self.placement.worker_removed(worker)
        if view is not None and view.retiring:
            return
        for item in held:
            self.unlease(item)
            item.errors.append(f"attempt {item.attempts}: worker {worker} was lost")
            self.events["lost"] += 1
            self.retry_or_bury(item, permanent=False, front=True)
        if held:
            logger.warning("worker %s lost; %d leased items put back", worker, len(held))


def _unplaceable_reason(model: str, spec: ModelSpec, largest_budget: int | None) -> str:
    needs = [f"{spec.memory_bytes / 1e9:.2f} GB of model memory"]
    needs += [f"{resource}={amount:g}" for resource, amount in spec.requires.items()]
    largest = f"; the largest worker budget is {largest_budget / 1e9:.2f} GB" if largest_budget is not None else ""
    return f"no worker can host model {model!r}: it needs {', '.join(needs)}{largest}"
