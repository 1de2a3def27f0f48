"""The online route: requests in, online pulls, group acks, answers out.

An online request is an item in its model's online lane (online_requests),
with the leases, retries and worker-loss handling of batch items. Each
worker keeps one online pull waiting beside its batch pulls while no group
of its own computes; a new request wakes the one waiting pull placement
ranks best for it, which takes the requests of that model queued by then,
in fair shares (model_queues): continuous batching. Its next pull carries
the group's acks: one round trip per group.

Requests come from a gateway in this process (`LocalBackend`) or from
gateways in their own processes, in batches: ``shoal_online_submit`` (one
message per gateway per loop pass) and ``shoal_online_answers`` (a long poll
returning every answer ready).

A worker that stops answering loses its short leases within about a
second. A holder can also stop between two pulls, holding no lease to lapse:
requests of a held model that no holder's pull came for within a lease are
then rescued by the best waiting pull of another worker (one timer per
model, armed only while its requests wait for busy or absent holders).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from ..configs import GatewaySettings, ModelSpec
from .clock import Clock, Timer
from .online_requests import OnlineFailure, OnlineRequests
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
from .waiting_pulls import LongPolls, WaitingPull, WaitingPulls
from .work_items import ItemState, WorkItem, unsendable
from .worker_views import WorkerView, may_take

logger = logging.getLogger("shoal.online")

GATEWAY_GONE_SECONDS = 30.0  # a remote gateway that stops asking for answers this long is forgotten


class OnlineRoute:
    """Online requests and online pulls over the queue's state; `workers_coming`: whether an autoscaler may
    add workers (elastic.py), so that a request that finds none waits for one."""

    def __init__(self, state: QueueState, long_polls: LongPolls, workers_coming: Callable[[], bool]) -> None:
        self.state = state
        self.long_polls = long_polls
        self.workers_coming = workers_coming
        self.requests: dict[str, OnlineRequests] = {}  # per model
        self.pulls = WaitingPulls(online_rank)
        self.gateways: dict[str, RemoteGateway] = {}
        self.load = OnlineLoad(clock=state.clock.now)  # what the online lane asks of the cluster's size (scaling.py)
        self._claims: dict[str, WaitingPull] = {}  # model -> the pull woken for its requests, not yet run
        self._rescues: dict[str, Timer] = {}  # model -> when its holders are passed over
        state.queued.subscribe(self._queued)
        state.view_changed.subscribe(self._view_changed)

    def close(self) -> None:
        for gateway in self.gateways.values():
            gateway.close()
        self.gateways.clear()
        for timer in self._rescues.values():
            timer.cancel()
        self._rescues.clear()

    # -- requests ------------------------------------------------------------------

    def submit(
        self, model: str, op: str, payload: OnlinePayload, rows: int, settings: GatewaySettings, flow: str | None = None
    ) -> tuple[WorkItem, asyncio.Future[OnlineResult]]:
        """Queue one online request (`flow`: the request it is a part of); its future gets the worker's result
        (or OnlineFailure)."""
        requests = self.requests.get(model)
        if requests is None:
            # An answered or cancelled request's item leaves the queue's table at once.
            requests = self.requests[model] = OnlineRequests(
                model, settings, lambda i: self.state.items.pop(i.id, None)
            )
        elif requests.settings is not settings:
            requests.configure(settings)
        item, future = requests.new_item(op, payload, rows, flow)
        self.load.arrived()
        self.state.enqueue([item])
        return item, future

    def pending(self, model: str) -> int:
        """Requests of `model` not answered yet: queued, or leased and waiting on a worker."""
        return len(self.requests.get(model, ()))

    def cancel(self, item: WorkItem) -> None:
        """The request is gone (deadline, shutdown, client): drop its item wherever it is."""
        if item.state is ItemState.QUEUED:
            self.state.queues.forget(item)
        elif item.state is not ItemState.LEASED:
            return
        self.state.unlease(item)
        self.requests[item.model].cancel(item)

    def refusal(
        self, model: str, settings: GatewaySettings, payload: OnlinePayload | None = None
    ) -> OnlineResult | None:
        """Why a request is answered at once instead of queued: its status and message; None to queue it."""
        reason = unsendable(payload)
        if reason is not None:
            return {"status": 400, "error": f"the request cannot be sent to a worker: {reason}"}
        if model not in self.state.model_specs:
            return {"status": 404, "error": f"unknown model {model!r}"}
        if not self.state.scheduler.workers and not self.workers_coming():
            return {"status": 503, "error": "no workers are connected"}
        # A large request's later part is not refused for the depth: its request was let in with its first part,
        # and a 429 now would throw away the parts already computed.
        later_part = bool(payload and cast(dict[str, Any], payload).get("first_input"))
        if self.pending(model) >= settings.max_queue_depth and not later_part:
            return {"status": 429, "error": f"too many requests waiting for {model!r}"}
        return None

    # -- online pulls --------------------------------------------------------------

    async def pull(
        self,
        worker: str,
        held: list[str] | None = None,
        timeout: float = 2.0,
        busy: bool = False,
        loaded: list[str] | None = None,
        acks: Sequence[OnlineAck] = (),
        online_rows: dict[str, int] | None = None,
    ) -> PullReply:
        """Answer `acks` (the worker's last groups), then lease the waiting requests of one model to
        `worker`, the inputs it computes in one round (`online_rows`, per model it measured; else a forward
        batch's worth), waiting up to `timeout`.

        Workers keep one of these waiting besides their batch pulls while no
        group of theirs computes, so a request is taken the moment it is
        queued, even while batch items fill the worker. Which model, and which
        waiting pull a new request wakes, is placement's (Placement.decide,
        online_rank).
        """
        self.ack_all(worker, acks)
        state = self.state
        view = state.reported(worker, held, loaded, online_rows=online_rows)
        if view is None:
            return {"items": [], "reason": "unknown worker"}
        claim: str | None = None  # the model whose requests woke this pull

        def take() -> PullReply | None:
            nonlocal claim
            woken_for, claim = claim, None
            if worker not in state.scheduler.workers or view.silent:  # silent: a lease of its lapsed meanwhile
                if woken_for is not None:
                    self.wake(woken_for)  # another pull takes them
                return {"items": [], "reason": "unknown worker"} if worker not in state.scheduler.workers else None
            decision = state.placement.decide(
                view, Lane.ONLINE, busy=busy, claim=woken_for, waiting=self.pulls, claimed=self._claims
            )
            items = state.carry_out(decision, view) if decision is not None else []
            if not items:
                return None
            for model in dict.fromkeys(item.model for item in items):  # more than a group's worth: the next pull
                self.wake(model)
            return state.items_reply(items)

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

        reply = await self.long_polls.long_poll(take, park, unpark, timeout)
        return reply or {"items": []}

    def wake(self, model: str) -> None:
        """Wake the one waiting pull that should take `model`'s queued requests, if none is on its way.

        While the model has holders only their pulls are asked; when none of
        theirs waits, the rescue is armed.
        """
        if model in self._claims or not self.state.queues.waiting_items(model, Lane.ONLINE):
            return
        held = bool(self.state.views.holders.get(model))
        if not self._wake_one(model, held) and held and model not in self._rescues:
            self._arm_rescue(model)

    def _queued(self, model: str, lane: Lane, count: int) -> None:
        if lane is Lane.ONLINE:
            self.wake(model)

    def _wake_one(self, model: str, held: bool) -> bool:
        """Wake the best waiting pull for `model`: among its holders' if `held`, else among all; False if none.

        A LoRA adapter nobody holds goes first to a holder of its base, which adds it in milliseconds.
        """
        spec = self.state.model_specs[model]
        family = self.state.family(model)
        asked = [(model, held)] if held or family == model else [(family, True), (model, False)]

        def may(view: WorkerView) -> bool:
            return may_take(view, model, spec)

        for filed_under, holders_only in asked:
            while pulls := self.pulls.take(filed_under, 1, may, holders_only=holders_only):
                if pulls[0].wake(model):  # else its timeout woke it: it leaves the index and the next one is asked
                    self._claims[model] = pulls[0]
                    return True
        return False

    def _arm_rescue(self, model: str, delay: float | None = None) -> None:
        """Pass `model`'s holders over once its next queued request has waited a lease for them."""
        head = self.state.queues.head(model, Lane.ONLINE)
        requests = self.requests.get(model)
        if head is None or requests is None:
            return
        if delay is None:
            delay = head.enqueued_at + requests.lease_seconds - self.state.clock.now()
        self._rescues[model] = self.state.clock.call_later(delay, self._rescue, model)

    def _rescue(self, model: str) -> None:
        """No holder came for `model`'s requests within a lease (all busy, or one stopped between two pulls,
        holding no lease to lapse): a worker that does not hold it takes them, loading it if it must."""
        del self._rescues[model]
        head = self.state.queues.head(model, Lane.ONLINE)
        if head is None or model in self._claims:
            return
        lease = self.requests[model].lease_seconds
        waited = self.state.clock.now() - head.enqueued_at
        if waited < lease:  # the old head was taken; this one is newer
            self._arm_rescue(model)
        elif self._wake_one(model, True) or self._wake_one(model, False):  # a holder's pull, if one waits by now
            self.state.counts["rescued"] += 1
            taker = self._claims[model].view.address
            logger.info("online requests of %s waited %.2f s for its holders: %s takes them", model, waited, taker)
        else:  # no pull waits at all: asked again after another lease
            self._arm_rescue(model, lease)

    def _view_changed(self, view: WorkerView) -> None:
        """A worker's pull reported or it was given a model: its waiting online pull is filed anew,
        and wakes for requests of a model it now holds that nobody was woken for."""
        if self.pulls.refile(view.address) is None:
            return
        for model in view.held:
            if self.state.queues.waiting_items(model, Lane.ONLINE) and model not in self._claims:
                self.wake(model)

    def ack_all(self, worker: str, acks: Sequence[OnlineAck]) -> None:
        """Acks of a worker's last groups; each group's one model call counts once towards the online load.

        A result gets the stage timings the gateway reports: queue (enqueued to
        leased, here) and compute (its group's one model call, on the worker).
        """
        for item_id, result, compute_seconds in acks:
            item = self.state.items.get(item_id)
            if item is not None and item.state is ItemState.LEASED:
                result["timing"] = {"queue": item.leased_at - item.enqueued_at, "compute": compute_seconds}
            self.state.ack(worker, item_id, result)
        for compute_seconds in {compute_seconds for _, _, compute_seconds in acks}:
            self.load.computed(compute_seconds)

    # -- gateways in their own processes -------------------------------------------

    def remote_submit(
        self,
        gateway: str,
        requests: list[RemoteRequest],
        settings: RemoteSettings | None = None,
        cancel: list[int] | None = None,
    ) -> RemoteQueued:
        """Queue a gateway's batch of requests: [[request id, model, op, payload, rows, timeout(, flow)], ...].

        Answers come back through ``shoal_online_answers``; a request refused
        at once (no workers, queue full, unknown model) is answered there too.
        `cancel`: ids of requests the gateway gave up (client gone). `flow`: the
        request a part belongs to, so that a request's parts share a fair share.
        """
        remote = self._gateway(gateway)
        if settings is not None:
            remote.settings = GatewaySettings(**settings)
        for request_id in cancel or ():
            item = remote.forget(request_id)
            if item is not None:
                self.cancel(item)
        for request_id, model, op, payload, rows, timeout, *flow in requests:
            refusal = self.refusal(model, remote.settings, payload)
            if refusal is not None:
                remote.answer(request_id, refusal)
                continue
            part_of = f"{gateway}/{flow[0] if flow else request_id}"
            item, future = self.submit(model, op, payload, rows, remote.settings, part_of)
            remote.track(request_id, item, future, min(float(timeout), remote.settings.longest_deadline), self.cancel)
        return {"queued": len(requests)}

    async def remote_answers(self, gateway: str, timeout: float = 2.0) -> RemoteAnswers:
        """Every answer ready for `gateway`, waiting up to `timeout` for one: a long poll."""
        answers = await self._gateway(gateway).collect(timeout)
        return {
            "answers": answers,
            "workers": len(self.state.scheduler.workers),
            "specs": self.state.model_specs.version,
        }

    def remote_models(self, models: dict[str, SpecFields] | None = None) -> RemoteModels:
        """What a gateway validates requests against and lists: specs, workers, loaded copies.

        `models`: specs the gateway brings from its own catalog (as `shoal serve`
        does for the embedded gateway), added to those known.
        """
        self.state.add_specs(models or {}, "a gateway's models")
        return {
            "models": self.state.model_specs.fields,
            "specs": self.state.model_specs.version,
            "workers": len(self.state.scheduler.workers),
            "workers_coming": self.workers_coming(),
            "loaded": dict(self.state.views.loaded),
        }

    def forget_gone_gateways(self) -> None:
        """Requests of a gateway that stopped asking for answers are cancelled: nobody waits for them."""
        now = self.state.clock.now()
        for name in [n for n, g in self.gateways.items() if now - g.last_seen > GATEWAY_GONE_SECONDS]:
            logger.warning("gateway %s stopped asking for answers; cancelling its requests", name)
            for item in self.gateways.pop(name).close():
                self.cancel(item)

    def _gateway(self, name: str) -> RemoteGateway:
        remote = self.gateways.get(name)
        if remote is None:
            remote = self.gateways[name] = RemoteGateway(self.state.clock)
        remote.last_seen = self.state.clock.now()
        return remote


class RemoteGateway:
    """What the scheduler keeps for one gateway process: its requests in flight and answers to send."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.settings = GatewaySettings()
        self.last_seen = clock.now()
        self._requests: dict[int, tuple[WorkItem, Timer]] = {}
        self._answers: list[RemoteAnswer] = []
        self._waiter: asyncio.Future[None] | None = None

    def track(
        self,
        request_id: int,
        item: WorkItem,
        future: asyncio.Future[OnlineResult],
        timeout: float,
        cancel: Callable[[WorkItem], None],
    ) -> None:
        timer = self.clock.call_later(timeout, self._expire, request_id, timeout, cancel)
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
            self._waiter = asyncio.get_running_loop().create_future()
            timer = self.clock.call_later(timeout, _wake, self._waiter)
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
            self.answer(request_id, {"status": 504, "error": f"no answer within {timeout:.3g} s"})


class LocalBackend:
    """The gateway's view of a queue in its own process (gateway.link.GatewayBackend): no message, no
    serialization."""

    def __init__(self, online: OnlineRoute) -> None:
        self.online = online
        self.state = online.state

    def specs(self) -> Mapping[str, ModelSpec]:
        return self.state.model_specs

    def workers(self) -> int:
        """Shoal workers connected and pulling."""
        return sum(1 for w in self.state.views.views if w in self.state.scheduler.workers)

    def workers_coming(self) -> bool:
        return self.online.workers_coming()

    def loaded_counts(self) -> dict[str, int]:
        return dict(self.state.views.loaded)

    def queue_depths(self) -> dict[tuple[str, str], int]:
        queues = self.state.queues
        return {(model, lane.value): queues.depth(model, lane) for model in self.state.model_specs for lane in Lane}

    async def answer(
        self,
        model: str,
        op: str,
        payload: OnlinePayload,
        rows: int,
        timeout: float,
        settings: GatewaySettings,
        flow: str | None = None,
    ) -> OnlineResult:
        """The worker's result for one request (or a part of the request `flow`), or {"status", "error"} when
        it cannot be had."""
        refusal = self.online.refusal(model, settings, payload)
        if refusal is not None:
            return refusal
        item, future = self.online.submit(model, op, payload, rows, settings, flow)
        # The future itself carries the deadline: `wait_for` would add a future and a loop pass per answer.
        deadline = self.state.clock.call_later(timeout, _expire, future)
        try:
            return await future
        except TimeoutError:
            self.online.cancel(item)
            if not self.state.scheduler.workers:  # scaled to zero, and no worker started in time: try again soon
                return {"status": 503, "error": f"no worker started within {timeout:.3g} s; the cluster is scaling up"}
            return {"status": 504, "error": f"no answer within {timeout:.3g} s"}
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
