"""The online path of the pull queue: requests in, online pulls, group acks, answers out.

An online request is an item in its model's online lane (see
online_requests), so it shares leases, retries and worker-loss handling with
batch items. Each worker keeps one online pull waiting beside its batch
pulls; a new request wakes the one waiting pull placement ranks best for it
(waiting_pulls), which then takes every request of that model queued by the
time it runs: continuous batching, at one wake-up per model per loop pass.

Requests come from a gateway in this process (`local_backend`) or from
gateways in their own processes, which send requests and receive answers in
batches: ``shoal_online_submit`` (one message per gateway per loop pass) and
``shoal_online_answers`` (a long poll returning every answer ready).

A worker's online pull also carries the acks of its last groups: one round
trip per group. It sends its next pull when its last group has left the
device, so requests that come meanwhile wait here, where an idle worker may
take them, and its next pull takes them all at once.

Online leases are short (``GatewaySettings.online_lease_seconds``) and
renewed by the worker while it holds the requests: a worker that stops
answering (frozen, a stop-the-world pause) loses them within about a
second, and they go to another worker. A holder can also stop between two
pulls, holding no lease to lapse: requests of a held model that no holder's
pull came for within a lease are then rescued, by the one best waiting pull
of a worker that does not hold the model (one timer per model, armed only
while its requests wait for busy or absent holders).

Routes declared here: ``shoal_pull_online``, ``shoal_online_submit``,
``shoal_online_answers``, ``shoal_online_models``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shoal.configs import GatewaySettings, ModelSpec

from .online_requests import OnlineFailure, OnlineJob
from .placement import online_rank
from .protocol import (
    Lane,
    OnlineAck,
    OnlinePayload,
    OnlineResult,
    PullReply,
    RemoteAnswer,
    RemoteAnswers,
    RemoteModels,
    RemoteQueued,
    RemoteRequest,
    RemoteSettings,
    SpecFields,
)
from .queue_state import QueueState
from .scaling import OnlineLoad
from .waiting_pulls import WaitingOnlinePulls, WaitingPull
from .work_items import ItemState, WorkItem, unsendable
from .worker_views import WorkerView, may_take

logger = logging.getLogger("shoal.online")

FIRST_LOAD_GRACE_SECONDS = 30.0  # a model's first load on a worker, whose time nobody measured yet
GATEWAY_GONE_SECONDS = 30.0  # a remote gateway that stops asking for answers this long is forgotten


class OnlineQueue:
    def __init__(self, core: QueueState) -> None:
        self.core = core
        self.jobs: dict[str, OnlineJob] = {}  # one standing job per model
        self.pulls = WaitingOnlinePulls(online_rank)
        self._claims: dict[str, WaitingPull] = {}  # model -> the pull woken for its requests, not yet run
        self._rescues: dict[str, asyncio.TimerHandle] = {}  # model -> when its holders are passed over
        self.gateways: dict[str, RemoteGateway] = {}
        self.load = OnlineLoad()  # what the online lane asks of the cluster's size (scaling.py)

    def handlers(self) -> dict[str, Callable[..., Any]]:
        return {
            "shoal_pull_online": self.pull,
            "shoal_online_submit": self.remote_submit,
            "shoal_online_answers": self.remote_answers,
            "shoal_online_models": self.remote_models,
        }

    def close(self) -> None:
        for gateway in self.gateways.values():
            gateway.close()
        self.gateways.clear()
        for timer in self._rescues.values():
            timer.cancel()
        self._rescues.clear()

    # -- requests ------------------------------------------------------------------

    def submit(
        self, model: str, op: str, payload: OnlinePayload, rows: int, settings: GatewaySettings
    ) -> tuple[WorkItem, asyncio.Future[OnlineResult]]:
        """Queue one online request; its future gets the worker's result (or OnlineFailure)."""
        job = self.jobs.get(model)
        if job is None:
            job = self.jobs[model] = OnlineJob(model, settings, self._forget)
        elif job.settings is not settings:
            job.configure(settings)
        item, future = job.new_item(op, payload, rows)
        self.load.arrived()
        self.core.items[item.id] = item
        self.core.queues.push(item)
        self.wake(model)
        return item, future

    def _forget(self, item: WorkItem) -> None:
        """An answered or cancelled request's item leaves the queue's table at once."""
        self.core.items.pop(item.id, None)

    def pending(self, model: str) -> int:
        """Requests of `model` not answered yet: queued, or leased and waiting on a worker."""
        job = self.jobs.get(model)
        return len(job.futures) if job is not None else 0

    def pending_by_model(self) -> dict[str, int]:
        return {model: len(job.futures) for model, job in self.jobs.items()}

    def cancel(self, item: WorkItem) -> None:
        """The request is gone (deadline, shutdown, client): drop its item wherever it is."""
        if item.state is ItemState.QUEUED:
            self.core.queues.forget(item)
        elif item.state is not ItemState.LEASED:
            return
        self.core.unlease(item)
        self.jobs[item.model].cancel(item)

    def local_backend(self) -> LocalBackend:
        return LocalBackend(self)

    # -- online pulls --------------------------------------------------------------

    async def pull(
        self,
        worker: str,
        held: list[str] | None = None,
        timeout: float = 2.0,
        busy: bool = False,
        loaded: list[str] | None = None,
        acks: Sequence[OnlineAck] = (),
    ) -> PullReply:
        """Answer `acks` (the worker's last groups), then lease every waiting online request of one
        model to `worker`, waiting up to `timeout`.

        Workers keep one of these waiting besides their batch pulls while no
        group of theirs computes, so a request is taken the moment it is
        queued, even while batch items fill the worker. Which model, and which
        waiting pull a new request wakes, is placement's
        (Placement.online_model_for, online_rank).
        """
        self.ack_all(worker, acks)
        view = self.core.reported(worker, held, loaded)
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        claim: str | None = None  # the model whose requests woke this pull

        def take() -> PullReply | None:
            nonlocal claim
            if worker not in self.core.scheduler.workers:
                if claim is not None:
                    self.wake(claim)
                return {"items": [], "reason": "unknown worker"}
            if view.silent:  # a lease of its lapsed since this pull came: its requests go to another
                if claim is not None:
                    woken_for, claim = claim, None
                    self.wake(woken_for)
                return None
            model = claim if claim and self.core.queues.waiting_items(claim, Lane.ONLINE) else None
            model = model or self.core.placement.online_model_for(view, busy, self.pulls, self._claims)
            batch = self.core.model_specs[model].online_batch if model else 0
            # A group of about one forward batch: requests up to `batch` in all, and no more texts than that,
            # so the parts of a large request (request_parts) go to as many workers as pull for them.
            items = self.core.queues.take(model, Lane.ONLINE, batch, rows=batch) if model else []
            if not (model and items):
                return None
            grace = 0.0 if model in view.loaded else load_grace(view, model)
            for item in items:
                self.core.lease(item, worker, grace=grace)
            self.core.hold(view, model)  # a holder now, loaded or not
            self.wake(model)  # more than one group's worth waits: the next pull takes the rest
            return self.core.items_reply(items)

        def park() -> WaitingPull:
            waiting = WaitingPull(view, busy)
            self.pulls.add(waiting)
            return waiting

        def unpark(waiting: WaitingPull) -> None:
            nonlocal claim
            self.pulls.discard(waiting)
            claim = waiting.claim
            if claim is not None and self._claims.get(claim) is waiting:
                del self._claims[claim]

        reply = await self.core.timeouts.long_poll(take, park, unpark, timeout)
        return reply or {"items": []}

    def wake(self, model: str) -> None:
        """Wake the one waiting pull that should take `model`'s queued requests, if none is on its way.

        While the model has holders only their pulls are asked; when none of
        theirs waits, the rescue is armed.
        """
        if model in self._claims or not self.core.queues.waiting_items(model, Lane.ONLINE):
            return
        held = bool(self.core.views.holders.get(model))
        if not self._wake_one(model, held) and held and model not in self._rescues:
            self._arm_rescue(model)

    def _wake_one(self, model: str, held: bool) -> bool:
        """Wake the best waiting pull for `model`: among its holders' if `held`, else among all; False if none."""
        spec = self.core.model_specs[model]
        while (pull := self.pulls.take(model, held, lambda view: may_take(view, model, spec))) is not None:
            if pull.wake(model):  # else its timeout woke it: it leaves the index and the next one is asked
                self._claims[model] = pull
                return True
        return False

    def _arm_rescue(self, model: str) -> None:
        """Pass `model`'s holders over once its oldest queued request has waited a lease for them."""
        head = self.core.queues.head(model, Lane.ONLINE)
        job = self.jobs.get(model)
        if head is None or job is None:
            return
        delay = max(0.0, head.enqueued_at + job.lease_seconds - time.monotonic())
        self._rescues[model] = asyncio.get_running_loop().call_later(delay, self._rescue, model)

    def _rescue(self, model: str) -> None:
        """No holder came for `model`'s requests within a lease (all busy, or one stopped between two pulls,
        holding no lease to lapse): a worker that does not hold it takes them, loading it if it must."""
        del self._rescues[model]
        head = self.core.queues.head(model, Lane.ONLINE)
        if head is None or model in self._claims:
            return
        job = self.jobs[model]
        waited = time.monotonic() - head.enqueued_at
        if waited < job.lease_seconds:  # the old head was taken; this one is newer
            self._arm_rescue(model)
        elif self._wake_one(model, True) or self._wake_one(model, False):  # a holder's pull, if one waits by now
            self.core.events["rescued"] += 1
            logger.info(
                "online requests of %s waited %.2f s for its holders: %s takes them",
                model,
                waited,
                self._claims[model].view.address,
            )
        else:  # no pull waits at all: asked again after another lease
            self._rescues[model] = asyncio.get_running_loop().call_later(job.lease_seconds, self._rescue, model)

    def view_changed(self, view: WorkerView) -> None:
        """A worker's pull reported or it was given a model: its waiting online pull is filed anew,
        and wakes for requests of a model it now holds that nobody was woken for."""
        if self.pulls.refile(view.address) is None:
            return
        for model in view.held:
            if self.core.queues.waiting_items(model, Lane.ONLINE) and model not in self._claims:
                self.wake(model)

    def ack_all(self, worker: str, acks: Sequence[OnlineAck]) -> None:
        """Acks of a worker's last groups; each group's one model call counts once towards the online load."""
        for item_id, result, compute_seconds in acks:
            self.ack(worker, item_id, result, compute_seconds)
        for compute_seconds in {compute_seconds for _, _, compute_seconds in acks}:
            self.load.computed(compute_seconds)

    def ack(self, worker: str, item_id: str, result: OnlineResult, compute_seconds: float) -> bool:
        """Finish one online item with its worker's result.

        The result gets the stage timings the gateway reports: queue (enqueued
        to leased, here) and compute (its group's one model call, on the worker).
        """
        item = self.core.items.get(item_id)
        if item is not None and item.state is ItemState.LEASED:
            result["timing"] = {"queue": item.leased_at - item.enqueued_at, "compute": compute_seconds}
        item = self.core.finish(worker, item_id)
        if item is None:
            return False
        item.settings.record_done(item, worker, result)
        return True

    # -- gateways in their own processes -------------------------------------------

    def remote_submit(
        self,
        gateway: str,
        requests: list[RemoteRequest],
        settings: RemoteSettings | None = None,
        cancel: list[int] | None = None,
    ) -> RemoteQueued:
        """Queue a gateway's batch of requests: [[request id, model, op, payload, rows, timeout], ...].

        Answers come back through ``shoal_online_answers``; a request refused
        at once (no workers, queue full, unknown model) is answered there too.
        `cancel`: ids of requests the gateway gave up (client gone).
        """
        remote = self.gateways.get(gateway)
        if remote is None:
            remote = self.gateways[gateway] = RemoteGateway(gateway)
        remote.seen()
        if settings is not None:
            remote.settings = GatewaySettings(**settings)
        for request_id in cancel or ():
            item = remote.forget(request_id)
            if item is not None:
                self.cancel(item)
        for request_id, model, op, payload, rows, timeout in requests:
            refusal = self.refusal(model, remote.settings, payload)
            if refusal is not None:
                remote.answer(request_id, refusal)
                continue
            item, future = self.submit(model, op, payload, rows, remote.settings)
            remote.track(request_id, item, future, min(float(timeout), remote.settings.longest_deadline), self.cancel)
        return {"queued": len(requests)}

    async def remote_answers(self, gateway: str, timeout: float = 2.0) -> RemoteAnswers:
        """Every answer ready for `gateway`, waiting up to `timeout` for one: a long poll."""
        remote = self.gateways.get(gateway)
        if remote is None:
            remote = self.gateways[gateway] = RemoteGateway(gateway)
        remote.seen()
        answers = await remote.collect(timeout)
        return {"answers": answers, "workers": len(self.core.scheduler.workers), "specs": self.core.model_specs.version}

    def remote_models(self, models: dict[str, SpecFields] | None = None) -> RemoteModels:
        """What a gateway validates requests against and lists: specs, workers, loaded copies.

        `models`: specs the gateway brings from its own catalog (as `shoal serve`
        does for the embedded gateway), added to those known.
        """
        self.core.add_specs(models or {}, "a gateway's models")
        return {
            "models": self.core.model_specs.fields,
            "specs": self.core.model_specs.version,
            "workers": len(self.core.scheduler.workers),
            "workers_coming": self.core.workers_coming(),
            "loaded": dict(self.core.views.loaded),
        }

    def forget_gone_gateways(self) -> None:
        """Requests of a gateway that stopped asking for answers are cancelled: nobody waits for them."""
        now = time.monotonic()
        for name in [n for n, g in self.gateways.items() if now - g.last_seen > GATEWAY_GONE_SECONDS]:
            logger.warning("gateway %s stopped asking for answers; cancelling its requests", name)
            for item in self.gateways.pop(name).close():
                self.cancel(item)

    def refusal(
        self, model: str, settings: GatewaySettings, payload: OnlinePayload | None = None
    ) -> OnlineResult | None:
        """Why a request is answered at once instead of queued: its status and message; None to queue it."""
        reason = unsendable(payload)
        if reason is not None:
            return {"status": 400, "error": f"the request cannot be sent to a worker: {reason}"}
        if model not in self.core.model_specs:
            return {"status": 404, "error": f"unknown model {model!r}"}
        if not self.core.scheduler.workers and not self.core.workers_coming():
            return {"status": 503, "error": "no workers are connected"}
        if self.pending(model) >= settings.max_queue_depth:
            return {"status": 429, "error": f"too many requests waiting for {model!r}"}
        return None


def load_grace(view: WorkerView, model: str) -> float:
    """Seconds added to a request's short lease on a worker that must load its model first.

    A load can hold the worker's loop for seconds (a first load imports torch,
    whose native initialisation keeps the GIL), so no renewal leaves meanwhile:
    twice the load this worker measured, else FIRST_LOAD_GRACE_SECONDS.
    """
    measured = view.load_seconds.get(model)
    return 2 * measured + 1.0 if measured is not None else FIRST_LOAD_GRACE_SECONDS  # 0.0: a load under 1 ms


class RemoteGateway:
    """What the scheduler keeps for one gateway process: its requests in flight and answers to send."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.settings = GatewaySettings()
        self.last_seen = time.monotonic()
        self._requests: dict[int, tuple[WorkItem, asyncio.TimerHandle]] = {}
        self._answers: list[RemoteAnswer] = []
        self._waiter: asyncio.Future[None] | None = None

    def seen(self) -> None:
        self.last_seen = time.monotonic()

    def track(
        self,
        request_id: int,
        item: WorkItem,
        future: asyncio.Future[OnlineResult],
        timeout: float,
        cancel: Callable[[WorkItem], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout, self._expire, request_id, timeout, cancel)
        self._requests[request_id] = (item, timer)
        future.add_done_callback(lambda done: self._resolved(request_id, done))

    def forget(self, request_id: int) -> WorkItem | None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return None
        entry[1].cancel()
        return entry[0]

    def answer(self, request_id: int, outcome: OnlineResult) -> None:
        self._answers.append((request_id, outcome))
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def collect(self, timeout: float) -> list[RemoteAnswer]:
        if not self._answers and timeout > 0:
            loop = asyncio.get_running_loop()
            self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _wake, self._waiter)
            try:
                await self._waiter
                await asyncio.sleep(0)  # answers resolved in this same loop pass travel together
            finally:
                timer.cancel()
                self._waiter = None
        answers, self._answers = self._answers, []
        return answers

    def close(self) -> list[WorkItem]:
        """Forget every request; the items are returned for cancelling."""
        items = [self.forget(request_id) for request_id in list(self._requests)]
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return [item for item in items if item is not None]

    def _resolved(self, request_id: int, future: asyncio.Future[OnlineResult]) -> None:
        item = self.forget(request_id)
        if item is None or future.cancelled():
            return
        error = future.exception()
        if error is None:
            self.answer(request_id, future.result())
        elif isinstance(error, OnlineFailure):
            self.answer(request_id, {"status": 502, "error": f"model {item.model!r} failed: {error}"})
        else:
            self.answer(request_id, {"status": 500, "error": f"{type(error).__name__}: {error}"})

    def _expire(self, request_id: int, timeout: float, cancel: Callable[[WorkItem], None]) -> None:
        item = self.forget(request_id)
        if item is not None:
            cancel(item)
            self.answer(request_id, {"status": 504, "error": f"no answer within {timeout:g} s"})


class LocalBackend:
    """The gateway's view of a queue in its own process: no message, no serialization."""

    def __init__(self, online: OnlineQueue) -> None:
        self.online = online
        self.core = online.core

    def specs(self) -> Mapping[str, ModelSpec]:
        return self.core.model_specs

    def workers(self) -> int:
        """Shoal workers connected and pulling."""
        return sum(1 for w in self.core.views.views if w in self.core.scheduler.workers)

    def workers_coming(self) -> bool:
        return self.core.workers_coming()

    def loaded_counts(self) -> dict[str, int]:
        return dict(self.core.views.loaded)

    def queue_depths(self) -> dict[tuple[str, str], int]:
        queues = self.core.queues
        return {(model, lane.value): queues.depth(model, lane) for model in self.core.model_specs for lane in Lane}

    async def answer(
        self, model: str, op: str, payload: OnlinePayload, rows: int, timeout: float, settings: GatewaySettings
    ) -> OnlineResult:
        """The worker's result for one request, or {"status", "error"} when it cannot be had."""
        refusal = self.online.refusal(model, settings, payload)
        if refusal is not None:
            return refusal
        item, future = self.online.submit(model, op, payload, rows, settings)
        # The future itself carries the deadline: `wait_for` would add a future and a loop pass per answer.
        deadline = asyncio.get_running_loop().call_later(timeout, _expire, future)
        try:
            return await future
        except TimeoutError:
            self.online.cancel(item)
            if not self.core.scheduler.workers:  # scaled to zero, and no worker started in time: try again soon
                return {"status": 503, "error": f"no worker started within {timeout:g} s; the cluster is scaling up"}
            return {"status": 504, "error": f"no answer within {timeout:g} s"}
        except OnlineFailure as exc:
            return {"status": 502, "error": f"model {model!r} failed: {exc}"}
        except asyncio.CancelledError:
            self.online.cancel(item)
            raise
        finally:
            deadline.cancel()

    async def close(self) -> None:
        """Nothing to let go of: the queue outlives its gateway."""


def _wake(waiter: asyncio.Future[None]) -> None:
    """A long poll's timeout: it returns with whatever is there (maybe nothing)."""
    if not waiter.done():
        waiter.set_result(None)


def _expire(future: asyncio.Future[OnlineResult]) -> None:
    """A request's deadline: its waiter gets TimeoutError (the gateway then cancels the queued item)."""
    if not future.done():
        future.set_exception(TimeoutError())
