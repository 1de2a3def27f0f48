"""Continuous batching of a worker's online requests.

Online requests leased to this worker wait here. A model that is not
loaded loads in the background, and its requests wait for it without
holding up the others. Each round holds the loaded models of waiting
requests in the pool, then runs on the device thread, ahead of batch items
but after the forward batch running now (see device_thread), and only then
takes every request of those models that is waiting: what accumulated while
the last round ran and while this one waited for the device forms one group
per model and operation, one model call each. Acks go out as soon as the
round ends, before anything else. Rounds overlap: a request that comes in
while a round computes starts the next round at once, so it runs as soon as
that one ends, not after the next forward batch of batch work (which a
request arriving while the last round's answers went out used to wait for).

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
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any

from configs import ModelSpec
from scheduler_plugins.protocol import ItemMessage, PullQueueClient

from .device_thread import DeviceThread
from .model_pool import ModelPool
from .operations import ONLINE_OPERATIONS, PERMANENT_ERRORS

logger = logging.getLogger("shoal.worker.online")

Message = ItemMessage
ReportFailure = Callable[[str, str, bool], Awaitable[None]]


@dataclass
class Outcome:
    group: list[Message]
    results: list[dict[str, Any]] | None
    seconds: float = 0.0
    error: Exception | None = None


class OnlineGroups:
    def __init__(
        self,
        address: str,
        queue: PullQueueClient,
        pool: ModelPool,
        device_thread: DeviceThread,
        specs: dict[str, ModelSpec],
        report_failure: ReportFailure,
    ) -> None:
        self.address = address  # this worker's, as the queue knows it
        self.queue = queue
        self.pool = pool
        self.device_thread = device_thread
        self.specs = specs  # the pull loop's, filled by every pull reply
        self.report_failure = report_failure
        self._waiting: list[Message] = []
        self._guard = threading.Lock()  # the loop adds, the device thread takes
        self._pending: set[str] = set()  # models of rounds started here, not yet on the device
        self._rounds: set[asyncio.Task] = set()
        self._loads: dict[str, asyncio.Task] = {}
        self._closed = False
        self._acks: set[asyncio.Task] = set()

    def add(self, messages: list[Message]) -> None:
        with self._guard:
            self._waiting.extend(messages)
        self._kick()

    def _kick(self) -> None:
        """A round for the waiting requests that neither a round still to start nor a load will take."""
        with self._guard:
            uncovered = {m["model"] for m in self._waiting} - self._pending - self._loads.keys()
            self._pending |= uncovered
        if uncovered:
            task = asyncio.create_task(self._run(uncovered))
            self._rounds.add(task)
            task.add_done_callback(self._rounds.discard)

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
            await self._fail(Outcome(self._take({name}), None, error=exc))
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
                    await self._fail(Outcome(self._take({name}), None, error=exc))
            if not runtimes:
                return
            outcomes = await asyncio.wrap_future(self.device_thread.run_online(partial(self._compute, runtimes)))
            for outcome in outcomes:
                if outcome.error is None:
                    ack = asyncio.create_task(self._ack(outcome))
                    self._acks.add(ack)
                    ack.add_done_callback(self._acks.discard)
            await asyncio.sleep(0)  # the answers go out before the models are released and the next round
        for outcome in outcomes:
            if outcome.error is not None:
                await self._fail(outcome)

    def _compute(self, runtimes: dict[str, Any]) -> list[Outcome]:
        """On the device thread, holding it: take the requests waiting now, then one call per group."""
        self._started(set(runtimes))  # requests from now on start the next round
        outcomes = []
        groups: dict[tuple[str, str], list[Message]] = {}
        for message in self._take(set(runtimes)):
            groups.setdefault((message["model"], message["op"]), []).append(message)
        for (model, op), group in groups.items():
            began = time.perf_counter()
            try:
                results = ONLINE_OPERATIONS[op](runtimes[model], [m["payload"] for m in group])
            except Exception as exc:  # noqa: BLE001 - reported per request by _fail
                if len(group) == 1:
                    outcomes.append(Outcome(group, None, error=exc))
                else:
                    outcomes.extend(self._one_by_one(runtimes[model], op, group))
                continue
            outcomes.append(Outcome(group, results, time.perf_counter() - began))
        return outcomes

    @staticmethod
    def _one_by_one(runtime: Any, op: str, group: list[Message]) -> list[Outcome]:
        """The group's call failed: each request alone, so only those that fail are failed."""
        answered: list[Message] = []
        results: list[dict[str, Any]] = []
        outcomes = []
        began = time.perf_counter()
        for message in group:
            try:
                results.extend(ONLINE_OPERATIONS[op](runtime, [message["payload"]]))
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

    async def _fail(self, outcome: Outcome) -> None:
        exc = outcome.error
        logger.warning("online group of %d failed: %s", len(outcome.group), exc)
        for message in outcome.group:
            await self.report_failure(message["id"], f"{type(exc).__name__}: {exc}", isinstance(exc, PERMANENT_ERRORS))

    async def _ack(self, outcome: Outcome) -> None:
        """One message, no reply awaited: nothing here depends on the answer, so nothing waits for it."""
        results = [[m["id"], r] for m, r in zip(outcome.group, outcome.results or [])]
        try:
            await self.queue.ack_many(self.address, results, outcome.seconds)
        except Exception as exc:  # the leases run out and the requests are retried
            logger.warning("could not ack %d online requests (%s)", len(outcome.group), exc)
