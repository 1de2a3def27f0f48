"""A worker's pull loop: ask for work when there is room, run it, ack it.

A pull leases as many items as this worker expects to start within a short
window, from its measured drain rate (at least `prefetch`), and asks again
when half of them are left: one pull per many items. Up to `prefetch` items
are in hand at once, so the next item's input is read from storage while the
model computes the current one; the rest wait here, and an idle worker may
take them back (the scheduler then revokes them here). One batch item
computes at a time; batch items and online groups share the worker's device
thread one forward batch at a time, online first (see device_thread).
Storage reads and writes run in I/O threads beside them. Starts, acks,
failures and lease renewals go one way, coalesced (scheduler_stream).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor

from distributed import Worker

from ..configs import Profile
from ..scheduler_plugins.model_specs import ModelSpecs
from ..scheduler_plugins.protocol import (
    REVOKE,
    ItemMessage,
    JobContext,
    PullQueueClient,
    PullReply,
    WorkerReport,
)
from .batching.device_thread import DeviceThread
from .batching.online_groups import OnlineGroups
from .batching.round_sizes import RoundSizes
from .model_pool import ModelPool
from .operations import PERMANENT_ERRORS, batch_operation
from .scheduler_stream import SchedulerStream

logger = logging.getLogger("shoal.worker")

RECONNECT_SECONDS = 1.0
PULL_WINDOW_SECONDS = 4.0  # a pull leases what this worker expects to start within this long: one pull per ~2 s
MAX_LEASED = 256  # items leased here at once, whatever the drain rate
RETIRE_MARGIN_SECONDS = 5.0  # a retirement's answer may come this long after its grace


class DrainRate:
    """Batch items this worker finishes per second, over its last few dozen."""

    def __init__(self, window: int = 32) -> None:
        self._finished: deque[float] = deque(maxlen=window)

    def finished(self) -> None:
        self._finished.append(time.monotonic())

    def per_second(self) -> float:
        if len(self._finished) < 2:
            return 0.0
        return (len(self._finished) - 1) / max(self._finished[-1] - self._finished[0], 1e-6)


class PullLoop:
    def __init__(self, dask_worker: Worker, profile: Profile, pool: ModelPool, device_thread: DeviceThread) -> None:
        self.dask_worker = dask_worker
        self.queue = PullQueueClient(dask_worker.scheduler)
        self.stream = SchedulerStream(dask_worker)
        self.profile = profile
        self.pool = pool
        self.device_thread = device_thread
        self.io_executor = ThreadPoolExecutor(2, thread_name_prefix="shoal-io")
        self.item_lock = asyncio.Lock()  # one batch item computing at a time
        self.leased: dict[str, ItemMessage] = {}  # batch items leased here, not finished
        self.waiting: deque[str] = deque()  # of those, the ones not in hand yet
        self.in_hand: dict[str, asyncio.Task] = {}  # reading, computing or writing
        self.computing: set[str] = set()  # started: a revocation no longer stops them
        self.specs = ModelSpecs()  # the scheduler's, as its replies send them
        self.contexts: dict[str, JobContext] = {}  # of the jobs of items leased here
        self._job_items: Counter[str] = Counter()  # items leased here per job: its context stays while any is
        self.drain = DrainRate()
        self._room = asyncio.Event()
        self.retiring = False  # pulls no more: its work goes back or finishes (retire)
        self.round_sizes = RoundSizes(profile.online_round_seconds)
        self.online = OnlineGroups(dask_worker.address, pool, device_thread, self.specs, self.stream, self.round_sizes)
        dask_worker.stream_handlers[REVOKE] = self._revoked

    async def run(self) -> None:
        self.stream.start()
        online_puller = asyncio.create_task(self._pull_online())
        try:
            while True:
                self._room.clear()
                room = 0 if self.retiring else self._room_now()
                if room <= 0:
                    await self._room.wait()
                    continue
                events = self.stream.take()  # they ride on the pull: one message fewer
                try:
                    reply = await self.queue.pull(
                        self.dask_worker.address,
                        room,
                        len(self.leased),
                        self.profile.pull_timeout_seconds,
                        self._report(),
                        events,
                    )
                except asyncio.CancelledError:
                    self.stream.send(events)
                    raise
                except Exception as exc:  # scheduler gone or restarting: keep asking
                    logger.warning("pull failed (%s: %s); retrying", type(exc).__name__, exc)
                    self.stream.send(events)
                    await asyncio.sleep(RECONNECT_SECONDS)
                    continue
                if reply is None:  # a scheduler without the Shoal plugin (yet)
                    await asyncio.sleep(RECONNECT_SECONDS)
                    continue
                self._learn_specs(reply)
                self.contexts.update(reply.get("contexts", {}))
                self.pool.demand = reply.get("demand", self.pool.demand)
                if self.retiring:  # batch items: handed back by retire
                    continue
                for message in reply["items"]:
                    self._leased(message)
                self._fill()
                if not reply["items"] and reply.get("reason"):
                    await asyncio.sleep(RECONNECT_SECONDS)
        finally:
            online_puller.cancel()
            self.online.close()
            for task in list(self.in_hand.values()):
                task.cancel()
            self.stream.close()
            self.io_executor.shutdown(wait=False, cancel_futures=True)

    async def retire(self, grace: float) -> None:
        """This worker is leaving (SIGTERM, a scale-down, a close): it pulls no more; the scheduler takes back
        what it has not started at once, lets what started finish and be acked within `grace` seconds, then
        takes back the rest; none of it spends an attempt (elastic.Elastic.drain)."""
        self.retiring = True
        self._room.set()
        self.online.pulling = True  # no online pull comes again: online acks go on the stream
        self.stream.ack_online(self.online.take_acks())
        events = self.stream.take()  # they ride on the retirement, so that what started here counts as started
        try:
            late = await asyncio.wait_for(
                self.queue.retire(self.dask_worker.address, grace, events), grace + RETIRE_MARGIN_SECONDS
            )
        except Exception as exc:  # noqa: BLE001 - closing goes on: the scheduler puts back what is left
            logger.warning("could not retire before closing (%s: %s)", type(exc).__name__, exc)
            self.stream.send(events)
            return
        finally:
            self.stream.flush()
        if late:
            logger.info("retired: %d items still running after the grace of %g s were handed back", late, grace)

    def _room_now(self) -> int:
        """How many items to ask for now: none until half of what this worker expects to start is left."""
        window = min(PULL_WINDOW_SECONDS, self.profile.lease_seconds / 3)
        target = max(self.profile.prefetch, min(MAX_LEASED, math.ceil(self.drain.per_second() * window)))
        leased = len(self.leased)
        return target - leased if leased <= target // 2 else 0

    def _leased(self, message: ItemMessage) -> None:
        item_id = message["id"]
        self.leased[item_id] = message
        self.waiting.append(item_id)
        self._job_items[message["job"]] += 1
        self.stream.hold(item_id, message["lease_seconds"])

    def _fill(self) -> None:
        """Up to `prefetch` items in hand: reading their input while another computes."""
        while self.waiting and len(self.in_hand) < self.profile.prefetch:
            item_id = self.waiting.popleft()
            if item_id in self.leased:  # else revoked while it waited
                self.in_hand[item_id] = asyncio.create_task(self._process(self.leased[item_id]))

    def _revoked(self, items: list[str]) -> None:
        """The scheduler took these back (for an idle worker, or their lease lapsed): drop those not started.

        One started here meanwhile runs on; the first ack of it counts.
        """
        for item_id in items:
            self.online.revoke(item_id)
            if item_id in self.computing or item_id not in self.leased:
                continue
            task = self.in_hand.get(item_id)
            if task is not None:
                task.cancel()  # its `finally` forgets it
            else:
                self._forget(self.leased[item_id])

    def _forget(self, message: ItemMessage) -> None:
        item_id, job = message["id"], message["job"]
        if self.leased.pop(item_id, None) is None:
            return
        self.in_hand.pop(item_id, None)
        self.computing.discard(item_id)
        self.stream.release(item_id)
        self._job_items[job] -= 1
        if self._job_items[job] <= 0:
            del self._job_items[job]
            self.contexts.pop(job, None)  # the next pull brings it again
        self._fill()
        if not self.leased:
            self.stream.flush_soon()  # out of work: its last acks finish a job, or tell the queue it is idle
        self._room.set()

    async def _process(self, message: ItemMessage) -> None:
        item_id = message["id"]
        loop = asyncio.get_running_loop()
        try:
            operation = batch_operation(message["op"])
            spec = self.specs[message["model"]]
            payload = {**self.contexts.get(message["job"], {}), **message["payload"]}
            data = await loop.run_in_executor(self.io_executor, operation.read, payload)
            # The model loads (if it must) before the item's turn, while others compute.
            async with self.pool.use(spec) as runtime, self.item_lock:
                self.computing.add(item_id)
                self.stream.started(item_id)
                began = time.perf_counter()
                computed = await asyncio.wrap_future(self.device_thread.run(operation.compute, runtime, data))
                compute_seconds = time.perf_counter() - began
            result = await loop.run_in_executor(self.io_executor, operation.write, payload, data, computed, spec)
            result["compute_seconds"] = compute_seconds
            self.stream.ack(item_id, result)
            self.drain.finished()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            permanent = isinstance(exc, PERMANENT_ERRORS)
            logger.warning("item %s failed (%s): %s", item_id, "permanent" if permanent else "will retry", exc)
            self.stream.fail(item_id, f"{type(exc).__name__}: {exc}", permanent)
        finally:
            self._forget(message)

    def _held_models(self) -> list[str]:
        """What this worker holds: loaded, loading, or named by work leased here.

        The scheduler counts this worker as a holder of each, from the moment
        it takes the work, so no second worker loads the same model for it.
        """
        leased = (message["model"] for message in self.leased.values())
        return list(dict.fromkeys([*self.pool.held(), *leased, *self.online.models()]))

    def _report(self) -> WorkerReport:
        return {
            "held": self._held_models(),
            "loaded": self.pool.loaded(),
            "budget": self.pool.budget,
            "free_bytes": self.pool.free_bytes(),
            "load_seconds": self.pool.load_seconds,
            "pinned": self.pool.pinned(),
        }

    def _learn_specs(self, reply: PullReply) -> None:
        """The specs a pull reply sends with its items: the scheduler's catalog is the one source.

        Every online reply names its model, so a spec is validated again only
        when it changed, not once per request.
        """
        self.specs.add(reply.get("models", {}), "the scheduler's pull reply")

    async def _pull_online(self) -> None:
        """Keep an online pull waiting while no online group computes here; it carries the last groups' acks.

        While a group computes, requests wait at the scheduler (an idle worker
        may take them); the pull that follows the group takes a round's worth (`online_rows`).
        """
        while not self.retiring:
            await self.online.quiet.wait()
            acks = self.online.take_acks()
            self.online.pulling = True
            try:
                reply = await self.queue.pull_online(
                    address=self.dask_worker.address,
                    held=self._held_models(),
                    loaded=self.pool.loaded(),
                    timeout=self.profile.pull_timeout_seconds,
                    busy=self.item_lock.locked(),
                    acks=acks,
                    online_rows=self.round_sizes.rows(),
                )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.warning("online pull failed (%s: %s); retrying", type(exc).__name__, exc)
                self.stream.ack_online(acks)  # if the scheduler is still there, they reach it
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            finally:
                self.online.pulling = self.retiring
            if reply is None or (not reply["items"] and reply.get("reason")):
                await asyncio.sleep(RECONNECT_SECONDS)
                continue
            self._learn_specs(reply)
            if reply["items"]:
                self.online.add(reply["items"])  # they join the next online group here
