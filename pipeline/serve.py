"""`shoal serve`: the online gateway on a cluster, until SIGINT or SIGTERM.

Without --scheduler the embedded cluster starts with the listed models pinned
(loaded before the workers join, never evicted); with --adapt its workers
come and go with the queue, down to MIN (0: none while idle), and the models
are warmed instead (loaded as each worker starts, evictable), since a pinned
model keeps a worker from ever retiring; with --scheduler the gateway
starts in that cluster's scheduler. Either way the catalog's specs reach the
scheduler with the start call, so the gateway knows every model it may serve.
On a signal the gateway stops accepting, answers what is in flight, and the
command exits 0.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from distributed import Client
from rich.console import Console

from ..configs import Catalog, ConfigError, Profile
from ..configs.auto import serving_layout
from .cluster import (
    AdaptRange,
    check_plugin,
    connect,
    contact_address,
    local_cluster,
    pull_queue,
    worker_runtimes,
)
from .jobs.engine import choice_lines


@contextmanager
def _cluster(
    scheduler: str | None, profile: Profile, catalog_path: str | None, pinned: list[str], adapt: AdaptRange | None
) -> Iterator[tuple[Client, str]]:
    """A client of the cluster, and the scheduler address to print for job commands."""
    if scheduler:
        with connect(scheduler, profile, catalog_path, adapt=adapt) as client:
            yield client, client.scheduler.address
        return
    flag = "--shoal-warm" if adapt is not None else "--shoal-pin"
    argv = [arg for name in pinned for arg in (flag, name)]
    with (
        local_cluster(profile, catalog_path, online=True, adapt=adapt, preload_argv=argv) as cluster,
        Client(cluster) as client,
    ):
        check_plugin(client)
        yield client, contact_address(cluster)


def _stop_signal() -> threading.Event:
    """Set by the first SIGINT or SIGTERM; a second one interrupts as usual."""
    stop = threading.Event()

    def handler(signum, frame) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def serve(
    profile: Profile,
    catalog: Catalog,
    catalog_path: str | None,
    models: list[str],
    host: str | None,
    port: int | None,
    scheduler: str | None,
    console: Console,
    adapt: AdaptRange | None = None,
) -> int:
    if not scheduler and adapt is None:  # auto's online layout: the worker in the server's process
        profile = serving_layout(profile)
    pinned = {spec.name: spec for spec in map(catalog.get, models)}  # catalog names, folders, HF ids
    if scheduler and models:
        console.print("[yellow]note:[/yellow] --models pins only on an embedded cluster; there they load on first use")
    settings = profile.gateway.model_copy(update={k: v for k, v in (("host", host), ("port", port)) if v is not None})
    specs = {name: profile.tuned(spec).model_dump() for name, spec in {**catalog.models, **pinned}.items()}
    stop = _stop_signal()
    with _cluster(scheduler, profile, catalog_path, list(pinned), adapt) as (client, address):
        try:
            reply = client.sync(pull_queue(client).gateway_start, settings.model_dump(), specs)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {exc}") from None
        if "error" in reply:
            raise ConfigError(reply["error"])
        console.print(
            f"serving {', '.join(sorted(specs))} on {reply['url']} "
            f"(scheduler {address}, for batch jobs too; Ctrl-C to stop)",
            highlight=False,
        )
        if adapt is not None:
            console.print(f"workers: adaptive, {adapt.minimum} to {adapt.maximum} as the queue needs", highlight=False)
        served = [profile.tuned(spec) for spec in pinned.values()]
        for label, why in choice_lines(profile, served, worker_runtimes(client)):
            console.print(f"{label}: {why}", highlight=False)
        while not stop.wait(0.5):
            pass
        console.print("stopping: no new requests; finishing those in flight")
        client.sync(pull_queue(client).gateway_stop)
    console.print("stopped")
    return 0
