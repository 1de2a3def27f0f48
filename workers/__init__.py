"""Shoal's worker side: load with ``dask worker tcp://… --preload shoal.workers``.

Adds the ShoalWorker plugin, whose pull loop takes work items from the
scheduler plugin's queues and runs them on models loaded here. Importing
this package loads nothing else and changes nothing: the worker's
environment (the tokenizers' thread pool off) is set and the plugin and its operations are
imported when Dask calls `dask_setup`, so the client can use
`shoal.workers.data.storage`, `shoal.workers.data.chunking` and the like without torch, the pull
loop or a changed environment.
"""

from __future__ import annotations

import os

import click

__all__ = ["dask_setup"]

# Set by the worker's entry point, before the plugin imports tokenizers (it reads them at import): the
# tokenizers' own thread pool stays off. A worker fetches the Hub commit a job pins into its own cache
# unless its environment sets HF_HUB_OFFLINE (configs/hub.py).
WORKER_ENVIRONMENT = {
    "TOKENIZERS_PARALLELISM": "false",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}


@click.command()
@click.option("--shoal-profile", default=None, help="Cluster profile name or YAML path.")
@click.option("--shoal-pin", multiple=True, help="Model to load at start and never evict.")
@click.option("--shoal-warm", multiple=True, help="Model to load at start if it fits; evicted like any other.")
@click.option("--shoal-catalog", default=None, help="Extra catalog YAML, laid over the shipped one and $SHOAL_CATALOG.")
async def dask_setup(
    worker,
    shoal_profile: str | None,
    shoal_pin: tuple[str, ...],
    shoal_warm: tuple[str, ...],
    shoal_catalog: str | None,
) -> None:
    for name, value in WORKER_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    from ..configs import log_like_dask

    log_like_dask()
    from .worker_plugin import ShoalWorker

    plugin = ShoalWorker(profile=shoal_profile, pinned=shoal_pin, warm=shoal_warm, catalog=shoal_catalog)
    await worker.plugin_add(plugin, name=ShoalWorker.name)
