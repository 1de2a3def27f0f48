"""A worker's pull loop: ask for work when there is room, run it, ack it.

Up to `prefetch` items are in hand at once, so the next item's input is read
from storage while the model computes the current one. One batch item
computes at a time; batch items and online groups share the worker's device
thread one forward batch at a time, online first (see device_thread). Storage
reads and writes run in I/O threads beside them. Leases of the items in
hand are extended while they run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from configs import ModelSpec, Profile
from scheduler_plugins.protocol import ItemMessage, PullQueueClient, PullReply, WorkerReport

from .device_thread import DeviceThread
from .model_pool import ModelPool
from .online_groups import OnlineGroups
from .operations import ONLINE_OPERATIONS, OPERATIONS, PERMANENT_ERRORS

logger = logging.getLogger("shoal.worker")

RECONNECT_SECONDS = 1.0


class PullLoop:
    def __init__(self, worker, profile: Profile, pool: ModelPool, device_thread: DeviceThread) -> None:
        self.worker = worker
        self.queue = PullQueueClient(worker.scheduler)
        self.profile = profile
        self.pool = pool
        self.device_thread = device_thread
        self.io_executor = ThreadPoolExecutor(2, thread_name_prefix="shoal-io")
        self.item_lock = asyncio.Lock()  # one batch item computing at a time
        self.in_hand: dict[str, asyncio.Task] = {}
        self.lease_seconds: dict[str, float] = {}
        self.item_models: dict[str, str] = {}  # of the items in hand
        self.specs: dict[str, ModelSpec] = {}
        self._spec_sources: dict[str, dict[str, Any]] = {}  # the reply dict each of `specs` came from
        self.contexts: dict[str, dict[str, Any]] = {}
        self._room = asyncio.Event()
        self.online = OnlineGroups(worker.address, self.queue, pool, device_thread, self.specs, self._report_failure)

    async def run(self) -> None:
        extender = asyncio.create_task(self._extend_leases())
        online_puller = asyncio.create_task(self._pull_online())
        try:
            while True:
                self._room.clear()
                room = self.profile.prefetch - len(self.in_hand)
                if room <= 0:
                    await self._room.wait()
                    continue
                try:
                    reply = await self.queue.pull(
                        self.worker.address, room, len(self.in_hand), self.profile.pull_timeout_seconds, self._report()
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # scheduler gone or restarting: keep asking
                    logger.warning("pull failed (%s: %s); retrying", type(exc).__name__, exc)
                    await asyncio.sleep(RECONNECT_SECONDS)
                    continue
                if reply is None:  # a scheduler without the Shoal plugin (yet)
                    await asyncio.sleep(RECONNECT_SECONDS)
                    continue
                self._learn_specs(reply)
                self.contexts.update(reply.get("contexts", {}))
                self.pool.demand = reply.get("demand", self.pool.demand)
                if self._start_online(reply["items"]):
                    continue
                for message in reply["items"]:
                    self.lease_seconds[message["id"]] = message["lease_seconds"]
                    self.item_models[message["id"]] = message["model"]
                    self.in_hand[message["id"]] = asyncio.create_task(self._process(message))
                if not reply["items"] and reply.get("reason"):
                    await asyncio.sleep(RECONNECT_SECONDS)
        finally:
            extender.cancel()
            online_puller.cancel()
            self.online.close()
            for task in list(self.in_hand.values()):
                task.cancel()
            self.io_executor.shutdown(wait=False, cancel_futures=True)

    async def _process(self, message: ItemMessage) -> None:
        item_id = message["id"]
        loop = asyncio.get_running_loop()
        try:
            operation = OPERATIONS[message["op"]]
            spec = self.specs[message["model"]]
            payload = {**self.contexts.get(message["job"], {}), **message["payload"]}
            data = await loop.run_in_executor(self.io_executor, operation.read, payload)
            # The model loads (if it must) before the item's turn, while others compute.
            async with self.pool.use(spec) as runtime, self.item_lock:
                started = await self.queue.start(self.worker.address, item_id)
                if not started["ok"]:  # taken back for an idle worker, or lease lost
                    return
                began = time.perf_counter()
                computed = await asyncio.wrap_future(self.device_thread.run(operation.compute, runtime, data))
                compute_seconds = time.perf_counter() - began
            result = await loop.run_in_executor(self.io_executor, operation.write, payload, data, computed, spec)
            result["compute_seconds"] = compute_seconds
            await self.queue.ack(self.worker.address, item_id, result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            permanent = isinstance(exc, PERMANENT_ERRORS)
            logger.warning("item %s failed (%s): %s", item_id, "permanent" if permanent else "will retry", exc)
            await self._report_failure(item_id, f"{type(exc).__name__}: {exc}", permanent)
        finally:
            self.in_hand.pop(item_id, None)
            self.lease_seconds.pop(item_id, None)
            self.item_models.pop(item_id, None)
            if not any(i.startswith(f"{message['job']}/") for i in self.in_hand):
                self.contexts.pop(message["job"], None)  # the next pull brings it again
            self._room.set()

    def _held_models(self) -> list[str]:
        """What this worker holds: loaded, loading, or named by work in hand.

        The scheduler counts this worker as a holder of each, from the moment
        it takes the work, so no second worker loads the same model for it.
        """
        held = [*self.pool.held(), *self.item_models.values(), *self.online.models()]
        return list(dict.fromkeys(held))

    def _report(self) -> WorkerReport:
        return {
            "held": self._held_models(),
            "loaded": self.pool.loaded(),
            "budget": self.pool.budget,
            "free_bytes": self.pool.free_bytes(),
            "load_seconds": self.pool.load_seconds,
        }

    def _learn_specs(self, reply: PullReply) -> None:
        """The specs a pull reply sends with its items: the scheduler's catalog is the one source.

        Every online reply names its model, so a spec is validated again only
        when it changed, not once per request.
        """
        for name, spec in reply.get("models", {}).items():
            if self._spec_sources.get(name) != spec:
                self.specs[name] = ModelSpec(**spec)
                self._spec_sources[name] = spec

    def _start_online(self, messages: list[ItemMessage]) -> bool:
        """A pull answered with online requests: they join the next online group here."""
        if not messages or messages[0]["op"] not in ONLINE_OPERATIONS:
            return False
        self.online.add(messages)
        return True

    async def _pull_online(self) -> None:
        """Keep an online pull waiting at all times, so requests never wait for a batch slot."""
        while True:
            try:
                reply = await self.queue.pull_online(
                    worker=self.worker.address,
                    held=self._held_models(),
                    loaded=self.pool.loaded(),
                    timeout=self.profile.pull_timeout_seconds,
                    busy=self.item_lock.locked(),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("online pull failed (%s: %s); retrying", type(exc).__name__, exc)
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            if reply is None or (not reply["items"] and reply.get("reason")):
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            self._learn_specs(reply)
            if self._start_online(reply["items"]):
                await asyncio.sleep(0)  # the group reaches the device before the next pull is sent

    async def _report_failure(self, item_id: str, error: str, permanent: bool) -> None:
        try:
            await self.queue.fail(self.worker.address, item_id, error, permanent)
        except Exception as exc:
            logger.warning("could not report failure of %s (%s); its lease will expire", item_id, exc)

    async def _extend_leases(self) -> None:
        while True:
            interval = min(self.lease_seconds.values(), default=self.profile.lease_seconds) / 3
            await asyncio.sleep(interval)
            if not self.in_hand:
                continue
            try:
                reply = await self.queue.extend(self.worker.address, list(self.in_hand))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("lease extension failed (%s: %s)", type(exc).__name__, exc)
                continue
            if reply is None:
                continue
            for item_id in reply["lost"]:
                task = self.in_hand.get(item_id)
                if task is not None:
                    logger.warning("item %s is no longer leased here; dropping it", item_id)
                    task.cancel()
