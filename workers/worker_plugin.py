"""The Dask WorkerPlugin that owns a worker's model pool and pull loop."""

from __future__ import annotations

import asyncio
import gc
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from distributed.diagnostics.plugin import WorkerPlugin

from configs import Catalog, Profile, load_catalog, load_profile

from .device_thread import DeviceThread
from .devices import detect_device
from .model_pool import ModelPool
from .pull_loop import PullLoop
from .runtimes import load_runtime, require_installed

logger = logging.getLogger("shoal.worker")


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
        self.device_thread: DeviceThread | None = None
        self.loader: ThreadPoolExecutor | None = None

    async def setup(self, worker) -> None:
        profile = load_profile(self.profile_name)
        for choice in profile.runtimes.values():
            require_installed(choice.runtime)  # fail at start, naming the extra, not at the first item
        pinned = list(dict.fromkeys([*profile.pinned, *self.pinned]))
        plan = detect_device(profile, dict(worker.state.total_resources))
        self.device_thread = DeviceThread()  # every model call: batch items, and online groups first
        # Loads get their own thread: a model loads while another one computes.
        self.loader = ThreadPoolExecutor(1, thread_name_prefix="shoal-load")
        self.pool = ModelPool(
            plan.memory_budget, partial(load_runtime, plan=plan, device_thread=self.device_thread), self.loader
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
            for name in self.warm:
                await self._warm(profile, catalog, name)
        # What is alive now (imports, pinned and warmed models) stays: out of the collector's
        # sight, so a full collection does not stall online rounds scanning it (see pull_queue).
        gc.collect()
        gc.freeze()
        self._task = asyncio.create_task(self.loop.run())

    async def _warm(self, profile: Profile, catalog: Catalog, name: str) -> None:
        """Best effort: a model that cannot load now fails on its items instead, with the reason."""
        try:
            if not await self.pool.warm(profile.tuned(catalog.get(name))):
                logger.info("not warming %s: it does not fit in what is free", name)
        except Exception as exc:  # noqa: BLE001 - the job reports it per item
            logger.warning("could not warm %s: %s", name, exc)

    async def teardown(self, worker) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self.device_thread is not None:
            self.device_thread.shutdown()
        if self.loader is not None:
            self.loader.shutdown(wait=False, cancel_futures=True)
