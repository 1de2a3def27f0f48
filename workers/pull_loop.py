"""A worker's pull loop: ask for work when there is room, run it, ack it.

Up to `prefetch` items are held at once, so the next item's input is read
from storage while the model computes the current one. The device is used by
one batch at a time (the compute lock); storage reads and writes run in I/O
threads beside it. Leases of held items are extended while they run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from configs import ModelSpec, Profile

from .compute_lock import ComputeLock
from .model_pool import ModelPool, ModelTooLarge
from .operations import ONLINE_OPERATIONS, OPERATIONS
from .parquet_slices import InputError

logger = logging.getLogger("shoal.worker")

PERMANENT_ERRORS = (InputError, ModelTooLarge)
RECONNECT_SECONDS = 1.0


class PullLoop:
    def __init__(self, worker, profile: Profile, pool: ModelPool, compute: ThreadPoolExecutor) -> None:
        self.worker = worker
        self.profile = profile
        self.pool = pool
        self.compute_executor = compute
        self.io_executor = ThreadPoolExecutor(2, thread_name_prefix="shoal-io")
        self.compute_lock = ComputeLock()  # online groups go first
        self.held: dict[str, asyncio.Task] = {}
        self.lease_seconds: dict[str, float] = {}
        self.specs: dict[str, ModelSpec] = {}
        self.contexts: dict[str, dict[str, Any]] = {}
        self._room = asyncio.Event()
        self._online_waiting: list[dict[str, Any]] = []  # online requests leased here, not yet computed
        self._online_runner: asyncio.Task | None = None
        self._online_acks: set[asyncio.Task] = set()
        self.items_done = 0

    async def run(self) -> None:
        extender = asyncio.create_task(self._extend_leases())
        online = asyncio.create_task(self._pull_online())
        try:
            while True:
                self._room.clear()
                room = self.profile.prefetch - len(self.held)
                if room <= 0:
                    await self._room.wait()
                    continue
                try:
                    reply = await self.worker.scheduler.shoal_pull(
                        worker=self.worker.address,
                        resident=self.pool.resident(),
                        room=room,
                        held=len(self.held),
                        timeout=self.profile.pull_timeout_seconds,
                        budget=self.pool.budget,
                        free_bytes=self.pool.free_bytes(),
                        load_seconds=self.pool.load_seconds,
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
                for name, spec in reply.get("models", {}).items():
                    self.specs[name] = ModelSpec(**spec)
                self.contexts.update(reply.get("contexts", {}))
                self.pool.demand = reply.get("demand", self.pool.demand)
                if self._start_online(reply["items"]):
                    continue
                for message in reply["items"]:
                    self.lease_seconds[message["id"]] = message["lease_seconds"]
                    self.held[message["id"]] = asyncio.create_task(self._process(message))
                if not reply["items"] and reply.get("reason"):
                    await asyncio.sleep(RECONNECT_SECONDS)
        finally:
            extender.cancel()
            online.cancel()
            if self._online_runner is not None:
                self._online_runner.cancel()
            for task in list(self.held.values()):
                task.cancel()
            self.io_executor.shutdown(wait=False, cancel_futures=True)

    async def _process(self, message: dict[str, Any]) -> None:
        item_id = message["id"]
        loop = asyncio.get_running_loop()
        try:
            operation = OPERATIONS[message["op"]]
            spec = self.specs[message["model"]]
            payload = {**self.contexts.get(message["job"], {}), **message["payload"]}
            data = await loop.run_in_executor(self.io_executor, operation.read, payload)
            # The model loads (if it must) outside the device lock, while others compute.
            async with self.pool.use(spec) as runtime, self.compute_lock:
                started = await self.worker.scheduler.shoal_start(worker=self.worker.address, item=item_id)
                if not started["ok"]:  # taken back for an idle worker, or lease lost
                    return
                began = time.perf_counter()
                computed = await loop.run_in_executor(self.compute_executor, operation.compute, runtime, data)
                compute_seconds = time.perf_counter() - began
            result = await loop.run_in_executor(
                self.io_executor, operation.write, payload, data, computed, spec
            )
            result["compute_seconds"] = compute_seconds
            await self.worker.scheduler.shoal_ack(worker=self.worker.address, item=item_id, result=result)
            self.items_done += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            permanent = isinstance(exc, PERMANENT_ERRORS)
            logger.warning("item %s failed (%s): %s", item_id, "permanent" if permanent else "will retry", exc)
            await self._report_failure(item_id, f"{type(exc).__name__}: {exc}", permanent)
        finally:
            self.held.pop(item_id, None)
            self.lease_seconds.pop(item_id, None)
            if not any(i.startswith(f"{message['job']}/") for i in self.held):
                self.contexts.pop(message["job"], None)  # the next pull brings it again
            self._room.set()

    def _start_online(self, messages: list[dict[str, Any]]) -> bool:
        """A pull answered with online requests: they join the next online group here."""
        if not messages or messages[0]["op"] not in ONLINE_OPERATIONS:
            return False
        self._online_waiting.extend(messages)
        if self._online_runner is None or self._online_runner.done():
            self._online_runner = asyncio.create_task(self._run_online())
        return True

    async def _pull_online(self) -> None:
        """Keep an online pull waiting at all times, so requests never wait for a batch slot."""
        while True:
            try:
                reply = await self.worker.scheduler.shoal_pull_online(
                    worker=self.worker.address,
                    resident=self.pool.resident(),
                    timeout=self.profile.pull_timeout_seconds,
                    busy=self.compute_lock.locked(),
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
            for name, spec in reply.get("models", {}).items():
                self.specs[name] = ModelSpec(**spec)
            self._start_online(reply["items"])

    async def _run_online(self) -> None:
        """Continuous batching: each time the device is free, every request waiting here is one group.

        The group is formed when the device is taken, not when the wait for it
        began, so requests that arrive while a batch item computes join the
        group that runs next. Groups go before waiting batch items.
        """
        while self._online_waiting:
            async with self.compute_lock.first():
                waiting, self._online_waiting = self._online_waiting, []
                groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
                for message in waiting:
                    groups.setdefault((message["model"], message["op"]), []).append(message)
                for (model, op), group in groups.items():
                    await self._compute_online(model, op, group)

    async def _compute_online(self, model: str, op: str, group: list[dict[str, Any]]) -> None:
        """One model call over every request of the group; its ack goes out without holding the device.

        If the call fails, each request is failed as a batch item would be:
        retried elsewhere, or answered with the error once out of attempts.
        """
        try:
            async with self.pool.use(self.specs[model]) as runtime:
                began = time.perf_counter()
                results = await asyncio.get_running_loop().run_in_executor(
                    self.compute_executor, ONLINE_OPERATIONS[op], runtime, [m["payload"] for m in group]
                )
                compute_seconds = time.perf_counter() - began
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            permanent = isinstance(exc, PERMANENT_ERRORS)
            logger.warning("online group of %d failed: %s", len(group), exc)
            for message in group:
                await self._report_failure(message["id"], f"{type(exc).__name__}: {exc}", permanent)
            return
        ack = asyncio.create_task(self._ack_online(group, results, compute_seconds))
        self._online_acks.add(ack)
        ack.add_done_callback(self._online_acks.discard)

    async def _ack_online(self, group: list[dict[str, Any]], results: list[dict[str, Any]], seconds: float) -> None:
        try:
            await self.worker.scheduler.shoal_ack_many(
                worker=self.worker.address, results=[[m["id"], r] for m, r in zip(group, results)], compute_seconds=seconds
            )
            self.items_done += len(group)
        except Exception as exc:  # the leases run out and the requests are retried
            logger.warning("could not ack %d online requests (%s)", len(group), exc)

    async def _report_failure(self, item_id: str, error: str, permanent: bool) -> None:
        try:
            await self.worker.scheduler.shoal_fail(
                worker=self.worker.address, item=item_id, error=error, permanent=permanent
            )
        except Exception as exc:
            logger.warning("could not report failure of %s (%s); its lease will expire", item_id, exc)

    async def _extend_leases(self) -> None:
        while True:
            interval = min(self.lease_seconds.values(), default=self.profile.lease_seconds) / 3
            await asyncio.sleep(interval)
            if not self.held:
                continue
            try:
                reply = await self.worker.scheduler.shoal_extend(
                    worker=self.worker.address, items=list(self.held)
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("lease extension failed (%s: %s)", type(exc).__name__, exc)
                continue
            if reply is None:
                continue
            for item_id in reply["lost"]:
                task = self.held.get(item_id)
                if task is not None:
                    logger.warning("item %s is no longer leased here; dropping it", item_id)
                    task.cancel()
