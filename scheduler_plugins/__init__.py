"""Shoal's scheduler side: load with ``dask scheduler --preload shoal.scheduler_plugins``.

Runs inside the Dask scheduler process and never imports torch. With
``--shoal-gateway-port PORT`` (or the Dask config ``shoal.gateway.enabled:
true``) it also serves the online gateway, with the catalog's models.
Importing this package loads nothing else: the plugin is imported when Dask
calls `dask_setup`, so clients and workers can import `protocol` alone.
"""

from __future__ import annotations

import gc

import click
import dask.config

from ..configs import GatewaySettings, load_catalog, load_profile, log_like_dask
from .protocol import NAME

__all__ = ["dask_setup"]


def gateway_settings(port: int | None, host: str | None, profile: str | None) -> GatewaySettings | None:
    """The profile's `gateway:` section, then Dask config `shoal.gateway`, then the options; None when off."""
    config = {str(k).replace("-", "_"): v for k, v in (dask.config.get("shoal.gateway", default=None) or {}).items()}
    enabled = bool(config.pop("enabled", False)) or port is not None
    if not enabled:
        return None
    options = {k: v for k, v in (("port", port), ("host", host)) if v is not None}
    return GatewaySettings(**{**load_profile(profile).gateway.model_dump(), **config, **options})


@click.command()
@click.option(
    "--shoal-gateway-port", type=int, default=None, help="Serve the online gateway on this port (0: any free one)."
)
@click.option(
    "--shoal-gateway-host", default=None, help="Address the gateway binds; default 127.0.0.1 (loopback only)."
)
@click.option("--shoal-profile", default=None, help="Profile name or YAML path whose `gateway:` limits apply.")
async def dask_setup(
    scheduler, shoal_gateway_port: int | None, shoal_gateway_host: str | None, shoal_profile: str | None
) -> None:
    from .pull_queue import PullQueue

    if NAME in scheduler.plugins:
        return
    log_like_dask()
    settings = gateway_settings(shoal_gateway_port, shoal_gateway_host, shoal_profile)
    models = load_catalog().models if settings else None
    await scheduler.register_scheduler_plugin(PullQueue(gateway=settings, models=models), name=NAME, idempotent=True)
    # The process entry point: what is alive now lives as long as the process. Out of the collector's
    # sight, a full collection no longer scans it (it stalled every request in flight in `shoal serve`).
    gc.collect()
    gc.freeze()
