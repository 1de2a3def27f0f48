"""The Dask WorkerPlugin that owns a worker's model pool and pull loop."""

from __future__ import annotations

import asyncio
import atexit
import gc
import logging
import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from distributed.diagnostics.plugin import WorkerPlugin
from distributed.protocol.pickle import dumps

from ..configs import Catalog, ModelSpec, Profile, load_catalog, load_profile
from ..configs.machine import probe
from .batching.device_thread import DeviceThread
from .devices import detect_device
from .model_pool import ModelPool
from .pull_loop import PullLoop
from .runtime_choice import RuntimeChooser
from .runtimes import Runtime, load_runtime, require_installed
from .runtimes.lora import AdapterLoader
from .shared_verdicts import SharedVerdicts
from .termination import TerminationForwarder, take_over_sigterm, termination_grace

logger = logging.getLogger("shoal.worker")

IDLE_CHECK_SECONDS = 5.0  # how often an idle worker looks for shipped verdicts to confirm by measuring
# A worker closed by Dask (not SIGTERM'd: its nanny's close, a scale-down) lets its running items finish within
# this long: a nanny kills its worker process 8 s after asking it to close (its close timeout of 10 s, times 0.8).
CLOSING_DRAIN_SECONDS = 5.0


def exit_without_teardown() -> None:
    """End a worker process once the other exit handlers ran, skipping the interpreter's module teardown.

    Tearing down torch's and transformers' thousands of modules takes seconds (2.6 s measured with
    MiniLM loaded, docs/BENCHMARKS.md), and every embedded cluster's stop waits for its worker
    processes to end. By the time exit handlers run, the worker has closed and told its nanny.
    """
    atexit.unregister(exit_without_teardown)
    atexit._run_exitfuncs()  # the handlers registered before this one: logging, multiprocessing's finalizers
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


class ShoalWorker(WorkerPlugin):
    name = "shoal-worker"

    def __init__(
        self,
        profile: str | None = None,
        pinned: tuple[str, ...] | list[str] = (),
        warm: tuple[str, ...] | list[str] = (),
        catalog: str | None = None,
    ) -> None:
        self.profile_name = profile
        self.pinned = list(pinned)
        self.warm = list(warm)
        self.catalog_path = catalog
        self._task: asyncio.Task | None = None
        self._warming: set[asyncio.Task] = set()
        self._confirming: asyncio.Task | None = None
        self.device_thread: DeviceThread | None = None
        self.loader: ThreadPoolExecutor | None = None
        self._undo_sigterm: Callable[[], None] | None = None
        self._terminating: asyncio.Task | None = None
        self._forwarding: asyncio.Task | None = None
        self.adapter_reader: ThreadPoolExecutor | None = None
        self.chooser: RuntimeChooser | None = None

    async def setup(self, worker) -> None:
        profile = load_profile(self.profile_name)
        for choice in profile.runtimes.values():
            require_installed(choice.runtime)  # fail at start, naming the extra, not at the first item
        pinned = list(dict.fromkeys([*profile.pinned, *self.pinned]))
        plan = detect_device(profile, dict(worker.state.total_resources))
        self.device_thread = DeviceThread()  # every model call: batch items, and online groups first
        # Loads get their own thread: a model loads while another one computes.
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="shoal-load")
        # This device's runtime for each model it loads: the gate's verdict here (runtime_choice).
        shared = SharedVerdicts(worker.scheduler, asyncio.get_running_loop(), worker.address)
        self.chooser = RuntimeChooser(profile, plan, probe(), shared)
        load = partial(self._load, self.chooser, plan, self.device_thread)
        # LoRA adapters are read in a thread of their own (not behind a base's load: they take milliseconds)
        # and placed on the device thread between forward batches.
        self.adapter_reader = ThreadPoolExecutor(1, thread_name_prefix="shoal-adapters")
        self.pool = ModelPool(
            plan.memory_budget,
            load,
            self.loader,
            AdapterLoader(self.device_thread, self.adapter_reader),
        )
        self.loop = PullLoop(worker, profile, self.pool, self.device_thread)
        self.plan = plan
        # Pool figures ride on Dask's heartbeat to the scheduler, for its dashboard and /metrics.
        worker.metrics["shoal"] = lambda _: {
            "loads": self.pool.loads,
            "evictions": len(self.pool.evictions),
            "load_seconds": dict(self.pool.load_seconds),
        }
        logger.info("shoal worker on %s (%s), model budget %.1f GB", plan.device, plan.dtype, plan.memory_budget / 1e9)
        if pinned or self.warm:
            catalog = load_catalog(self.catalog_path)
            for name in pinned:  # tuned as the job's items will ask for it
                await self.pool.pin(profile.tuned(catalog.get(name)))
            # Warm loads run after the worker joins: the client plans the job meanwhile, and the job's
            # first item waits on the load already under way (the pool counts it as held).
            for name in self.warm:
                task = asyncio.create_task(self._warm(profile, catalog, name), name=f"warm {name}")
                self._warming.add(task)
                task.add_done_callback(self._warming.discard)
        # What is alive now (imports, pinned models) stays: out of the collector's
        # sight, so a full collection does not stall online rounds scanning it (see pull_queue).
        gc.collect()
        gc.freeze()
        self._task = asyncio.create_task(self.loop.run())
        self._confirming = asyncio.create_task(self._confirm_when_idle(self.chooser, load))
        self._undo_sigterm = take_over_sigterm(partial(self._on_sigterm, worker))
        if worker.nanny:  # its process gets a container's SIGTERM: it passes it on to this one
            self._forwarding = asyncio.create_task(self._forward_sigterm(worker.rpc, worker.nanny))

    @staticmethod
    async def _forward_sigterm(rpc, nanny_address: str) -> None:
        """Add the TerminationForwarder to this worker's nanny, in the background: a nanny answers no call
        before its worker has started."""
        try:
            async with rpc(nanny_address) as nanny:
                await nanny.plugin_add(plugin=dumps(TerminationForwarder()), name=TerminationForwarder.name)
        except Exception as exc:  # noqa: BLE001 - SIGTERM then closes the worker as Dask does
            logger.warning("SIGTERM will not be a retirement: could not reach the nanny (%s)", exc)

    def _on_sigterm(self, worker) -> None:
        if self._terminating is None:
            self._terminating = asyncio.create_task(self._retire_and_close(worker))
        else:
            logger.info("SIGTERM again: already retiring")

    async def _retire_and_close(self, worker) -> None:
        """SIGTERM: a retirement within the grace (see termination.py), then Dask closes this worker, and
        its nanny after it."""
        grace = termination_grace()
        logger.info("SIGTERM: retiring (a grace of %g s for the items started here), then closing", grace)
        await self.loop.retire(grace)
        await worker.close(reason="shoal-retired-on-sigterm")

    @staticmethod
    def _load(chooser: RuntimeChooser, plan, device_thread: DeviceThread, spec: ModelSpec) -> Runtime:
        """The pool's loader: the runtime this device's choice names for `spec` (in the loader thread)."""
        return load_runtime(chooser.choose(spec), plan, device_thread)

    async def _confirm_when_idle(self, chooser: RuntimeChooser, load: Callable[[ModelSpec], Runtime]) -> None:
        """Shipped verdicts used here are measured here too, once no work is in hand (not beside a job); a model
        loaded before its verdict here is loaded again on the verdict's runtime and swapped in when idle."""
        swaps: list[tuple[ModelSpec, Runtime, int]] = []  # loaded on the verdict's runtime, waiting to go in
        while True:
            await asyncio.sleep(IDLE_CHECK_SECONDS)
            loop = asyncio.get_running_loop()
            if chooser.unconfirmed and not self.loop.leased and not self.loop.online.models():
                for started in await loop.run_in_executor(None, chooser.confirm):  # asks the scheduler
                    logger.info("confirming a shipped verdict: %s", started)
            for spec in await loop.run_in_executor(None, chooser.superseded):
                try:
                    runtime = await asyncio.get_running_loop().run_in_executor(self.loader, load, spec)
                except Exception as exc:  # noqa: BLE001 - the loaded runtime keeps serving
                    logger.warning("could not load %s on its verdict's runtime: %s", spec.name, exc)
                    continue
                swaps.append((spec, runtime, int(runtime.memory_bytes())))
            waiting = []
            for spec, runtime, size in swaps:
                if spec.name not in self.pool.loaded():
                    runtime.close()  # evicted meanwhile: its next load chooses the verdict's runtime itself
                elif not self.pool.replace_idle(spec.name, runtime, size):
                    waiting.append((spec, runtime, size))  # in use now: the next look
            swaps = waiting

    async def warmed(self) -> None:
        """Until the warm loads started at setup have ended, loaded or not."""
        await asyncio.gather(*self._warming, return_exceptions=True)

    async def _warm(self, profile: Profile, catalog: Catalog, name: str) -> None:
        """Best effort: a model that cannot load now fails on its items instead, with the reason."""
        try:
            if not await self.pool.warm(profile.tuned(catalog.get(name))):
                logger.info("not warming %s: it does not fit in what is free", name)
        except Exception as exc:  # noqa: BLE001 - the job reports it per item
            logger.warning("could not warm %s: %s", name, exc)

    async def teardown(self, worker) -> None:
        # Registered last, so it runs first at exit and every other handler runs once (see exit_without_teardown).
        if multiprocessing.parent_process() is not None:  # a nanny's worker process, never a command's own
            atexit.register(exit_without_teardown)
        if self._undo_sigterm is not None:
            self._undo_sigterm()
        for task in list(self._warming):
            task.cancel()
        if self._confirming is not None:
            self._confirming.cancel()
        if self._task is not None and not self._task.done():
            if not self.loop.retiring:  # closed by Dask, not SIGTERM'd: a retirement all the same
                await self.loop.retire(CLOSING_DRAIN_SECONDS)
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.device_thread is not None:
            self.device_thread.shutdown()
        for executor in (self.loader, self.adapter_reader):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        if self.chooser is not None:
            self.chooser.confirm(ask_cluster=False)  # a closing worker leaves its measurements running
