"""The pull queue's state: items, their queues and leases, the workers' views, placement.

A plain object. The batch route (batch_route), the online route
(online_route) and the elastic part (elastic) each hold it, change it only
through the transitions here (lease what placement decided, start, finish,
fail, renew, expire, retry or bury, hand back, lose a worker), and hear of
its changes through its topics. Each transition keeps the indexes true at
once (queues, leases, placement's candidates, the holders of each model),
so that no event needs a scan.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, ParamSpec

from ..configs import ModelSpec
from .clock import Clock
from .leases import Leases, load_grace
from .model_queues import ModelQueues
from .model_specs import ModelSpecs
from .placement import LeaseDecision, Placement
from .protocol import REVOKE, ItemResult, Lane, PullReply, SpecFields
from .work_items import ItemState, WorkItem
from .worker_views import WorkerView, WorkerViews

logger = logging.getLogger("shoal.scheduler")

P = ParamSpec("P")


class Topic(Generic[P]):
    """One kind of change, and who hears of it: each subscriber in turn, in the order they subscribed."""

    def __init__(self) -> None:
        self._subscribers: list[Callable[P, None]] = []

    def subscribe(self, subscriber: Callable[P, None]) -> None:
        self._subscribers.append(subscriber)

    def publish(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for subscriber in self._subscribers:
            subscriber(*args, **kwargs)


class QueueState:
    """The state and its transitions. Its topics: `queued(model, lane, count)`, work that pulls may take
    (submitted, retried, handed back, or a model whose holders all left); `view_changed(view)`, a worker holds
    other models, fell silent, spoke again or retires; `worker_free(worker)`, a worker holds no lease now."""

    scheduler: Any  # the Dask scheduler: its workers, and its streams to them (set when the plugin starts)

    def __init__(self, models: Mapping[str, ModelSpec] | None = None, clock: Clock | None = None) -> None:
        self.clock = clock or Clock()
        self.model_specs = ModelSpecs()  # its version tells gateways in other processes to refresh theirs
        self.model_specs.add(models or {}, "the plugin's models")
        self.items: dict[str, WorkItem] = {}
        self.views = WorkerViews(on_holders=self._holders_changed)
        self.queues = ModelQueues(on_change=lambda model: self.placement.model_changed(model), family=self.family)
        self.placement = Placement(self.queues, self.views, self.model_specs)
        self.leases = Leases(self.clock, self._expired)
        self.counts: Counter[str] = Counter()  # leased, acked, failed, lost, expired, dead, taken_back, rescued, ...
        self.queued: Topic[[str, Lane, int]] = Topic()
        self.view_changed: Topic[[WorkerView]] = Topic()
        self.worker_free: Topic[[str]] = Topic()
        self._unplaceable_since: dict[str, float] = {}

    def family(self, model: str) -> str:
        """The models whose online requests one pull may take together: a LoRA adapter's base and its other
        adapters (a worker computes them in shared forward batches, workers/batching/online_groups)."""
        spec = self.model_specs.get(model)
        return spec.adapter.base if spec is not None and spec.adapter is not None and not spec.adapter.merged else model

    def add_specs(self, models: Mapping[str, ModelSpec | SpecFields], source: str) -> None:
        """Model specs join the plugin-wide table that pulls send with items, validated here (a
        ConfigError naming `source` and the model); those already known as sent cost a comparison."""
        if self.model_specs.add(models, source):
            self.placement.specs_changed()

    def enqueue(self, items: Sequence[WorkItem]) -> None:
        """New items wait in their queues; the pulls that may take them are woken."""
        now = self.clock.now()
        for item in items:
            item.enqueued_at = now
            self.items[item.id] = item
            self.queues.push(item)
        if len(items) == 1:  # an online request: no Counter
            self.queued.publish(items[0].model, items[0].lane, 1)
            return
        for (model, lane), count in Counter((item.model, item.lane) for item in items).items():
            self.queued.publish(model, lane, count)

    def revoke(self, worker: str | None, item_ids: list[str]) -> None:
        """Tell `worker` it no longer holds `item_ids`: it drops those not started (one way)."""
        stream = self.scheduler.stream_comms.get(worker) if worker and item_ids else None
        if stream is not None:
            try:
                stream.send({"op": REVOKE, "items": item_ids})
            except Exception as exc:  # noqa: BLE001 - a worker whose stream closed is being removed
                logger.info("could not revoke %d items on %s: %s", len(item_ids), worker, exc)

    # -- a worker's view --------------------------------------------------------------

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
            self.view_changed.publish(view)
        self.spoke(worker)
        return view

    def spoke(self, worker: str) -> None:
        """A message from `worker` (a pull, its events): if a lease of its had lapsed, it is back."""
        view = self.views.get(worker)
        if view is not None and view.silent and not view.retiring:
            self.views.speak(view)
            self.view_changed.publish(view)  # its waiting online pull may take the requests queued meanwhile

    def retire(self, view: WorkerView, retiring: bool = True) -> None:
        """It is leaving (or, not `retiring`, stays after all): it takes no new work and holds no model."""
        (self.views.retire if retiring else self.views.unretire)(view)
        self.view_changed.publish(view)

    # -- leases -------------------------------------------------------------------------

    def carry_out(self, decision: LeaseDecision, view: WorkerView) -> list[WorkItem]:
        """Lease to `view`'s worker what placement decided (a batch or an online pull alike): the items."""
        if decision.take_back is not None:  # from a holder that would start it later: no attempt spent
            item, holder = decision.take_back, decision.take_back.worker
            self.unlease(item)
            self.revoke(holder, [item.id])
            self.counts["taken_back"] += 1
            items, attempt = [item], False
        elif decision.lane is Lane.ONLINE:  # a forward batch's worth, its model's family's requests included
            items, attempt = self.queues.take_family(decision.model, decision.lane, decision.count, decision.rows), True
        else:
            items, attempt = self.queues.take(decision.model, decision.lane, decision.count, decision.rows), True
        for item in items:
            grace = decision.grace if item.model == decision.model else load_grace(view, item.model)
            self.leases.grant(item, view.address, grace, counts_as_attempt=attempt)
            self.placement.leased(item)
        self.counts["leased"] += len(items)
        unheld = [model for model in dict.fromkeys(item.model for item in items) if model not in view.held]
        for model in unheld:
            # It loads the model now: a holder before its next pull says so, or every idle worker would
            # steal the same hot model at once.
            self.views.hold(view, model)
        if unheld:
            self.view_changed.publish(view)
        return items

    def items_reply(self, items: list[WorkItem]) -> PullReply:
        """The items as leased, and their models' specs: an online pull's whole reply, a batch pull's core."""
        specs = self.model_specs.fields
        return {
            "items": [item.to_message() for item in items],
            "models": {m: specs[m] for m in {i.model for i in items}},
        }

    def start(self, worker: str, item_id: str) -> bool:
        """True when `worker` still holds the lease: the item is now running there."""
        item = self.items.get(item_id)
        if item is None or item.state is not ItemState.LEASED or item.worker != worker:
            return False
        item.started = True
        self.placement.started(item)
        return True

    def unlease(self, item: WorkItem) -> None:
        """`item` leaves its worker's leases (and placement's candidates); its state is the caller's."""
        if item.worker is not None:
            self.placement.unleased(item)
            if self.leases.remove(item) and item.worker not in self.leases.by_worker:
                self.worker_free.publish(item.worker)

    # -- outcomes -----------------------------------------------------------------------

    def ack(self, worker: str, item_id: str, result: Any) -> bool:
        """The first ack of an item finishes it, from whichever worker computed it; its owner records it.

        Outputs are idempotent, so an item computed twice (its lease expired or
        it was taken back while it started) is counted once; a worker still
        holding it is told to drop it. A batch item's rate joins placement's.
        """
        item = self.items.get(item_id)
        if item is None or item.state is ItemState.DONE:
            return False
        if item.state is ItemState.QUEUED:
            self.queues.forget(item)
        holder = item.worker
        self.unlease(item)
        if holder != worker:
            self.revoke(holder, [item.id])
        self.counts["acked"] += 1
        if item.lane is Lane.BATCH:
            batch: ItemResult = result
            self.placement.stats.record(item.model, int(batch.get("rows", 0)), float(batch.get("compute_seconds", 0)))
            self.placement.model_changed(item.model)
        item.owner.record_done(item, worker, result)
        return True

    def fail(self, worker: str, item_id: str, error: str, permanent: bool = False) -> bool:
        item = self.items.get(item_id)
        if item is None or item.state is not ItemState.LEASED or item.worker != worker:
            return False
        item.errors.append(f"attempt {item.attempts} on {worker}: {error}")
        self.counts["failed"] += 1
        self.unlease(item)
        self.retry_or_bury(item, permanent)
        return True

    def retry_or_bury(self, item: WorkItem, permanent: bool, front: bool = False) -> None:
        """Queued again while it has attempts left (and is not `permanent`ly bad), else a dead letter."""
        if permanent or item.attempts >= item.owner.max_attempts:
            self.bury(item)
        else:
            self.requeue([item], front)

    def bury(self, item: WorkItem) -> None:
        item.owner.record_dead(item)
        self.counts["dead"] += 1

    def requeue(self, items: Sequence[WorkItem], front: bool = False) -> None:
        """`items` wait again (at the `front`: the first of them taken first), and wake their takers."""
        now = self.clock.now()
        for item in reversed(items) if front else items:
            item.move(ItemState.QUEUED)
            item.worker, item.started, item.enqueued_at = None, False, now
            self.queues.push(item, front=front)
        for (model, lane), count in Counter((item.model, item.lane) for item in items).items():
            self.queued.publish(model, lane, count)

    def hand_back(self, worker: str, items: list[WorkItem]) -> None:
        """A retiring worker's `items` go back to the front of their queues, uncounted: a retirement is no
        attempt. It is told to drop them (one it started runs on, and the first ack counts)."""
        for item in items:
            self.unlease(item)
            item.attempts = max(0, item.attempts - 1)
        self.requeue(items, front=True)
        self.revoke(worker, [item.id for item in items])
        self.counts["handed_back"] += len(items)

    def _expired(self, item: WorkItem) -> None:
        """A lease ran out (its worker froze, or died unseen): the item goes back as a spent attempt, and
        the worker is silent (no holder, no new work) until it speaks again."""
        worker = item.worker
        view = self.views.get(worker or "")
        if view is not None:
            self.views.silence(view)
        self.unlease(item)
        self.revoke(worker, [item.id])
        item.errors.append(f"attempt {item.attempts}: lease on {worker} expired")
        self.counts["expired"] += 1
        self.retry_or_bury(item, permanent=False, front=True)

    def worker_lost(self, worker: str) -> None:
        """A removed worker's leased items go back to the front of their queues: a retiring one's
        uncounted (it had been told to go), a lost one's as a spent attempt."""
        view = self.views.remove(worker)
        self.placement.worker_removed(worker)
        held = list(self.leases.of_worker(worker).values())
        if view is not None and view.retiring:
            self.hand_back(worker, held)
            if held:
                logger.info("worker %s retired; %d items it still held handed back", worker, len(held))
            return
        for item in held:
            self.unlease(item)
            item.errors.append(f"attempt {item.attempts}: worker {worker} was lost")
            self.counts["lost"] += 1
            self.retry_or_bury(item, permanent=False, front=True)
        if held:
            logger.warning("worker %s lost; %d leased items put back", worker, len(held))

    def bury_unplaceable(self) -> None:
        """Items of a model that no worker can host go to dead letters, after a grace.

        The grace (the owner's `unplaceable_seconds`) lets a worker that can host
        it join first, as under an autoscaler. Until some worker has pulled,
        nothing is judged. Each model is checked against the distinct worker
        capabilities, not against every worker.
        """
        if not len(self.views):
            return
        now = self.clock.now()
        for model in self.queues.models():
            spec = self.model_specs[model]
            if self.views.holders.get(model) or self.views.anyone_can_host(spec):
                self._unplaceable_since.pop(model, None)
                continue
            waited = now - self._unplaceable_since.setdefault(model, now)
            reason = _unplaceable_reason(model, spec, self.views.largest_budget())
            for lane in Lane:
                for item in self.queues.queued(model, lane):
                    if waited >= item.owner.unplaceable_seconds:
                        self.queues.forget(item)
                        item.errors.append(reason)
                        self.bury(item)

    def _holders_changed(self, model: str) -> None:
        self.placement.model_changed(model)
        if not self.views.holders.get(model) and self.queues.waiting_items(model, Lane.ONLINE):
            self.queued.publish(model, Lane.ONLINE, 0)  # its requests may now go to any worker


def _unplaceable_reason(model: str, spec: ModelSpec, largest_budget: int | None) -> str:
    needs = [f"{spec.memory_bytes / 1e9:.2f} GB of model memory"]
    needs += [f"{resource}={amount:g}" for resource, amount in spec.requires.items()]
    largest = f"; the largest worker budget is {largest_budget / 1e9:.2f} GB" if largest_budget is not None else ""
    return f"no worker can host model {model!r}: it needs {', '.join(needs)}{largest}"
