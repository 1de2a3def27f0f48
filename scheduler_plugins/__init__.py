"""Shoal's scheduler side: load with ``dask scheduler --preload scheduler_plugins``.

Runs inside the Dask scheduler process and never imports torch.
"""

from __future__ import annotations

from .pull_queue import NAME, ShoalScheduler

__all__ = ["ShoalScheduler", "dask_setup"]


async def dask_setup(scheduler) -> None:
    if NAME not in scheduler.plugins:
        await scheduler.register_scheduler_plugin(ShoalScheduler(), name=NAME, idempotent=True)
