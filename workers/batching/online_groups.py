"""Continuous batching of a worker's online requests.

Online requests leased to this worker wait here. A model that is not
loaded loads in the background, and its requests wait for it without
holding up the others. Each round holds the loaded models of waiting
requests in the pool, then runs on the device thread, ahead of batch items
but after the forward batch running now (see device_thread), and only then
takes every request of those models that is waiting: what accumulated while
the last round ran and while this one waited for the device forms one group
per model and operation, one model call each; the requests of a base's LoRA
adapters join the base's group (each naming its adapter), so one call
computes them in shared forward batches. A round's acks ride on the
worker's next online pull, sent as soon as the round ends (pull_loop): one
round trip per round. While a round runs no online pull waits, so requests
that come meanwhile wait at the scheduler, where an idle worker may take
them, and the next pull brings a round's worth (`round_sizes`). Rounds may
still overlap (a round after a model's load): a round that ends
while another runs, or while a pull waits, sends its acks at once on the
worker's event stream instead.

Every request held here keeps its short lease renewed (scheduler_stream);
one the scheduler revokes (its lease lapsed) is dropped if not computed yet.

A failed group call is run again one request at a time, so a request that
cannot be computed fails alone and the rest of its group is answered. A
failed request is failed as a batch item would be: retried elsewhere, or
answered with the error once out of attempts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ItemMessage, OnlineAck, OnlineResult
from ..model_pool import ModelPool
from ..operations import PERMANENT_ERRORS, online_operation
from ..runtimes import Runtime
from ..runtimes.lora import AdapterRuntime
from ..scheduler_stream import SchedulerStream
from .device_thread import DeviceThread
from .round_sizes import RoundSizes

logger = logging.getLogger("shoal.worker.online")

Message = ItemMessage


@dataclass
class Outcome:
    group: list[Message]
    results: list[OnlineResult] | None
    seconds: float = 0.0
    error: Exception | None = None


class OnlineGroups:
    def __init__(
        self,
        address: str,
        pool: ModelPool,
        device_thread: DeviceThread,
        specs: dict[str, ModelSpec],
        stream: SchedulerStream,
        sizes: RoundSizes,
    ) -> None:
        self.address = address  # this worker's, as the queue knows it
        self.pool = pool
        self.device_thread = device_thread
        self.specs = specs  # the pull loop's, filled by every pull reply
        self.stream = stream
        self.sizes = sizes  # each group call's inputs and time, so that pulls ask for a round's worth
        self.quiet = asyncio.Event()  # no round of requests taken here is running: time for an online pull
        self.quiet.set()
        self.pulling = False  # an online pull is on its way: acks cannot wait for the next one
        self._acks: list[OnlineAck] = []  # for the next online pull
        self._waiting: list[Message] = []
        self._guard = threading.Lock()  # the loop adds, the device thread takes
        self._pending: set[str] = set()  # models of rounds started here, not yet on the device
        self._rounds: set[asyncio.Task] = set()
        self._loads: dict[str, asyncio.Task] = {}
        self._closed = False

    def add(self, messages: list[Message]) -> None:
        for message in messages:
            self.stream.hold(message["id"], message["lease_seconds"])
        with self._guard:
            self._waiting.extend(messages)
        self._kick()

    def revoke(self, item_id: str) -> None:
        """The scheduler gave this request to another worker: drop it unless a round took it already."""
        if not self.stream.holds(item_id):
            return
        with self._guard:
            self._waiting = [m for m in self._waiting if m["id"] != item_id]
        self.stream.release(item_id)

    def take_acks(self) -> list[OnlineAck]:
        acks, self._acks = self._acks, []
        return acks

    def _kick(self) -> None:
        """A round for the waiting requests that neither a round still to start nor a load will take."""
        with self._guard:
            uncovered = {m["model"] for m in self._waiting} - self._pending - self._loads.keys()
            self._pending |= uncovered
        if uncovered:
            task = asyncio.create_task(self._run(uncovered))
            self._rounds.add(task)
            self.quiet.clear()
            task.add_done_callback(self._round_ended)

    def _round_ended(self, task: asyncio.Task) -> None:
        self._rounds.discard(task)
        if not self._rounds:
            self.quiet.set()

    def models(self) -> set[str]:
        """Models of the requests waiting here."""
        with self._guard:
            return {m["model"] for m in self._waiting}

    def close(self) -> None:
        self._closed = True
        for task in [*self._rounds, *self._loads.values()]:
            task.cancel()

    async def _run(self, models: set[str]) -> None:
        """A round of `models` (pending since _kick); one not loaded loads first, with its own round."""
        loaded = set(self.pool.loaded())
        for name in models - loaded:
            if name not in self._loads:
                self._loads[name] = asyncio.create_task(self._load(name))
        self._started(models - loaded)  # their loads' rounds take them
        try:
            await self._round(models & loaded)
        except BaseException:
            self._started(models)  # it may never reach the device
            raise

    async def _load(self, name: str) -> None:
        """Load `name` for the requests waiting on it and run their round.

        The round runs while the load still holds the model, so no other load
        evicts it in between.
        """
        try:
            async with self.pool.use(self.specs[name]):
                await self._round({name})  # also takes requests that came in during the load
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(Outcome(self._take({name}), None, error=exc))
        finally:
            del self._loads[name]
            if not self._closed:
                self._kick()  # whatever happened, its requests must not be left waiting

    async def _round(self, models: set[str]) -> None:
        async with AsyncExitStack() as held:
            runtimes = {}
            for name in models:
                try:
                    runtimes[name] = await held.enter_async_context(self.pool.use(self.specs[name]))
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self._started({name})
                    self._fail(Outcome(self._take({name}), None, error=exc))
            if not runtimes:
                return
            outcomes = await asyncio.wrap_future(self.device_thread.run_online(partial(self._compute, runtimes)))
            self._measured(outcomes)
            acks: list[OnlineAck] = [
                (message["id"], result, outcome.seconds)
                for outcome in outcomes
                if outcome.error is None
                for message, result in zip(outcome.group, outcome.results or [])
            ]
            self._ack(acks)
        for outcome in outcomes:
            if outcome.error is not None:
                self._fail(outcome)

    def _compute(self, runtimes: dict[str, Runtime]) -> list[Outcome]:
        """On the device thread, holding it: take the requests waiting now, then one call per group."""
        self._started(set(runtimes))  # requests from now on start the next round
        outcomes = []
        # One group per loaded model and operation: a base's group also holds its adapters' requests, each
        # payload naming its adapter, so one call computes them all in the same forward batches.
        groups: dict[tuple[int, str], list[Message]] = {}
        models: dict[int, Any] = {}
        for message in self._take(set(runtimes)):
            model = computing(runtimes[message["model"]])
            models[id(model)] = model
            groups.setdefault((id(model), message["op"]), []).append(message)
        for (key, op), group in groups.items():
            payloads = [through(runtimes[m["model"]], m["payload"]) for m in group]
            began = time.perf_counter()
            try:
                results = online_operation(op)(models[key], payloads)
            except Exception as exc:  # noqa: BLE001 - reported per request by _fail
                if len(group) == 1:
                    outcomes.append(Outcome(group, None, error=exc))
                else:
                    outcomes.extend(self._one_by_one(models[key], op, group, payloads))
                continue
            outcomes.append(Outcome(group, results, time.perf_counter() - began))
        return outcomes

    def _measured(self, outcomes: list[Outcome]) -> None:
        """Each group call's inputs and time, for its models' round sizes (adapters share their base's)."""
        for outcome in outcomes:
            if outcome.error is None and outcome.seconds > 0:
                inputs = sum(message.get("rows") or 1 for message in outcome.group)
                for model in {message["model"] for message in outcome.group}:
                    self.sizes.measured(model, inputs, outcome.seconds)

    @staticmethod
    def _one_by_one(runtime: Any, op: str, group: list[Message], payloads: list[Any]) -> list[Outcome]:
        """The group's call failed: each request alone, so only those that fail are failed."""
        answered: list[Message] = []
        results: list[OnlineResult] = []
        outcomes = []
        began = time.perf_counter()
        for message, payload in zip(group, payloads, strict=True):
            try:
                results.extend(online_operation(op)(runtime, [payload]))
                answered.append(message)
            except Exception as exc:  # noqa: BLE001 - reported per request by _fail
                outcomes.append(Outcome([message], None, error=exc))
        if answered:
            outcomes.append(Outcome(answered, results, time.perf_counter() - began))
        return outcomes

    def _started(self, models: set[str]) -> None:
        with self._guard:
            self._pending -= models

    def _take(self, models: set[str]) -> list[Message]:
        with self._guard:
            taken = [m for m in self._waiting if m["model"] in models]
            self._waiting = [m for m in self._waiting if m["model"] not in models]
        return taken

    def _fail(self, outcome: Outcome) -> None:
        exc = outcome.error
        logger.warning("online group of %d failed: %s", len(outcome.group), exc)
        for message in outcome.group:
            self.stream.fail(message["id"], f"{type(exc).__name__}: {exc}", isinstance(exc, PERMANENT_ERRORS))

    def _ack(self, acks: list[OnlineAck]) -> None:
        """With the next online pull, due as this round ends; on the event stream if none is due."""
        if not acks:
            return
        if self.pulling or self._rounds != {asyncio.current_task()}:
            self.stream.ack_online(acks)
            return
        for item_id, _, _ in acks:
            self.stream.release(item_id)
        self._acks.extend(acks)


def computing(runtime: Any) -> Any:
    """The model that computes a runtime's requests: a LoRA adapter's base (its requests join the base's group)."""
    return runtime.base if isinstance(runtime, AdapterRuntime) else runtime


def through(runtime: Any, payload: Any) -> Any:
    """A request's payload as its group's call takes it: naming its adapter when its model is one."""
    return {**payload, "adapter": runtime.adapter} if isinstance(runtime, AdapterRuntime) else payload
