"""`shoal gateway`: the online gateway in a process of its own, in front of a running cluster.

The same routes, limits, auth and metrics as `shoal serve`'s gateway, but
HTTP parsing, auth and encoding run here, not on the scheduler's one event
loop; requests reach the scheduler in batches (see
scheduler_plugins/gateway/link.py). Start as many as the load needs, on as many
machines, behind any load balancer. A gateway started before its scheduler
answers 503 until it connects; one that loses the scheduler answers 503 and
reconnects. SIGINT or SIGTERM stops accepting, answers what is in flight,
and exits 0.
"""

from __future__ import annotations

import asyncio
import signal

from distributed.security import Security
from rich.console import Console

from ..configs import Catalog, ConfigError, GatewaySettings, ModelSpec, Profile
from ..scheduler_plugins.gateway.app import Gateway
from ..scheduler_plugins.gateway.link import SchedulerLink


async def run_gateway(
    scheduler: str,
    settings: GatewaySettings,
    specs: dict[str, ModelSpec],
    console: Console,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until `stop` is set (or SIGINT/SIGTERM when None)."""
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
    link = SchedulerLink(
        scheduler,
        Security().get_connection_args("client"),
        models={name: spec.model_dump() for name, spec in specs.items()},
    )
    await link.start()
    gateway = Gateway(link, settings)
    try:
        url = await gateway.start()
    except OSError as exc:
        await link.close()
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from None
    console.print(f"gateway on {url} for scheduler {scheduler} (Ctrl-C to stop)", highlight=False)
    await stop.wait()
    console.print("stopping: no new requests; finishing those in flight")
    await gateway.stop()
    await link.close()
    console.print("stopped")


def gateway(
    profile: Profile, catalog: Catalog, scheduler: str, host: str | None, port: int | None, console: Console
) -> int:
    settings = profile.gateway.model_copy(update={k: v for k, v in (("host", host), ("port", port)) if v is not None})
    specs = {name: profile.tuned(spec) for name, spec in catalog.models.items()}
    try:
        import uvloop
    except ImportError:
        asyncio.run(run_gateway(scheduler, settings, specs, console))
    else:
        uvloop.run(run_gateway(scheduler, settings, specs, console))
    return 0
