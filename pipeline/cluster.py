"""Reaching a cluster: a given scheduler, or an embedded LocalCluster.

The embedded cluster is the Dask way with Shoal's plugins preloaded, so one
command works on a laptop and the same code joins a real cluster started
with ``dask scheduler --preload shoal.scheduler_plugins``. With ``--adapt
MIN:MAX`` it is Dask's adaptive LocalCluster, its size asked of the Shoal
queue (scheduler_plugins/elastic.py).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import dask
from distributed import Client, LocalCluster
from rich.console import Console

from ..configs import Profile
from ..configs.auto import NAME as AUTO
from ..configs.hub import OFFLINE_ENV, offline
from ..scheduler_plugins.protocol import NAME as PULL_QUEUE
from ..scheduler_plugins.protocol import PullQueueClient
from .jobs.stages import STAGES

LOOPBACK = "127.0.0.1"  # where everything the embedded cluster starts listens, unless the caller says otherwise
NANNY_KEEPS_ITS_WORKER = "3650 days"  # see keep_restarting_workers
IN_PROCESS_SWITCH_SECONDS = 0.0005  # the interpreter's thread switch interval with in-process workers


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class AdaptRange:
    """``--adapt MIN:MAX``: the embedded cluster's worker processes come and go between these counts."""

    minimum: int
    maximum: int

    @classmethod
    def parse(cls, text: str) -> AdaptRange:
        low, sep, high = text.partition(":")
        try:
            minimum, maximum = int(low), int(high if sep else low)
        except ValueError:
            raise ValueError(f"expected MIN:MAX worker counts, e.g. 0:4; got {text!r}") from None
        if minimum < 0 or maximum < max(1, minimum):
            raise ValueError(f"expected 0 <= MIN <= MAX and MAX >= 1; got {text!r}")
        return cls(minimum, maximum)

    def __str__(self) -> str:
        return f"{self.minimum}:{self.maximum}"


def worker_environment(profile: Profile, catalog: str | None = None) -> dict[str, str]:
    """What every worker process needs to see: profile, catalog, and the command's offline mode (`--offline`)."""
    env = {"SHOAL_PROFILE": profile.path or profile.name, "TOKENIZERS_PARALLELISM": "false"}
    if offline():
        env[OFFLINE_ENV] = "1"
    catalog = catalog or os.environ.get("SHOAL_CATALOG")
    if catalog:
        env["SHOAL_CATALOG"] = os.path.abspath(catalog)
    return env


def start_local_cluster(
    profile: Profile, catalog: str | None = None, n_workers: int | None = None, online: bool = False, **kwargs
) -> LocalCluster:
    """The embedded cluster; `online` when it serves the HTTP gateway (the event loop differs, see `event_loop`)."""
    with dask.config.set(_spawn_settings(online)), _spawned_without_main():
        return _local_cluster(profile, catalog, n_workers, **kwargs)


@contextmanager
def local_cluster(
    profile: Profile, catalog: str | None = None, online: bool = False, adapt: AdaptRange | None = None, **kwargs
) -> Iterator[LocalCluster]:
    """The embedded cluster for as long as the block runs; with `adapt`, Dask's adaptive one.

    Adaptive, its worker processes (never the profile's in-process worker) are started and retired
    between `adapt`'s counts as the queue asks, so what `start_local_cluster` sets for the workers it
    spawns holds until the cluster closes: the adaptive loop spawns more at any time.
    """
    if adapt is None:
        with start_local_cluster(profile, catalog, online=online, **kwargs) as cluster:
            yield cluster
        return
    processes = profile.model_copy(update={"in_process_workers": False})
    with (
        dask.config.set(_spawn_settings(online)),
        _spawned_without_main(),
        _local_cluster(processes, catalog, adapt.minimum, **kwargs) as cluster,
    ):
        cluster.adapt(minimum=adapt.minimum, maximum=adapt.maximum)
        yield cluster


def _spawn_settings(online: bool) -> dict[str, object]:
    """What the workers a LocalCluster spawns read from Dask's config while their nannies start."""
    return {
        # Dask's nanny sets MALLOC_TRIM_THRESHOLD_=65536 in workers; with it glibc maps and
        # frees every activation tensor anew on each forward pass, which slows every batch
        # (docs/BENCHMARKS.md). None removes the variable for the workers spawned here.
        "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
        "distributed.admin.event-loop": event_loop(online),
    }


@contextmanager
def _spawned_without_main() -> Iterator[None]:
    """Worker processes spawned meanwhile skip importing the command's script, which they never use.

    A spawned process first imports its parent's ``__main__`` file (multiprocessing's spawn): for the
    ``shoal`` script that is the whole CLI (click, rich, the job code), 0.7-1.1 s per worker process on
    the loaded 2-core VM (docs/BENCHMARKS.md). A main module without ``__file__`` is not imported.
    """
    main = sys.modules["__main__"]
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:  # `python -m`: imported by name, left as is
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = path


def event_loop(online: bool) -> str:
    """For a cluster that serves online requests, uvloop where it is installed; else Dask's default.

    An operator's ``distributed.admin.event-loop`` always wins. Online, the
    scheduler with the gateway and each worker run one event loop that every
    request crosses; uvloop's costs less per message, so the gateway answers
    more requests per second (docs/BENCHMARKS.md). A batch job's messages are
    a few per thousand rows, so nothing is gained there, and uvloop has
    crashed the process that closes its loop (a segmentation fault in the
    client's loop thread at a cluster's close, seen once in the test suite;
    uvloop issue #706 is of that kind): batch commands keep Dask's loop. The
    scheduler's loop is the one created here, the workers' are created by
    their nannies from this config.
    """
    chosen = dask.config.get("distributed.admin.event-loop")
    if chosen != "tornado" or not online:  # tornado is Dask's default: anything else is an operator's choice
        return chosen
    return "uvloop" if importlib.util.find_spec("uvloop") else chosen


def _local_cluster(profile: Profile, catalog: str | None, n_workers: int | None, **kwargs) -> LocalCluster:
    common = dict(
        threads_per_worker=1,
        scheduler_kwargs={"preload": ["shoal.scheduler_plugins"]},
        preload=["shoal.workers"],
        # The dashboard serves /metrics, logs and worker pages without the gateway's token: loopback
        # only, as Dask's scheduler, nanny and worker listeners already are in a LocalCluster.
        dashboard_address=kwargs.pop("dashboard_address", f"{LOOPBACK}:0"),
        silence_logs=kwargs.pop("silence_logs", logging.ERROR),
    )
    if profile.in_process_workers:
        if (n_workers or 1) != 1:
            raise ClusterError(
                f"profile {profile.name!r} runs its one worker in process; {n_workers} workers asked for"
            )
        return _in_process_cluster(profile, catalog, **common, **kwargs)
    keep_restarting_workers()
    return LocalCluster(
        n_workers=profile.workers if n_workers is None else n_workers,
        processes=True,
        env=worker_environment(profile, catalog),
        **common,
        **kwargs,
    )


def keep_restarting_workers() -> None:
    """A worker that dies again soon after its nanny restarted it is restarted again, for good.

    Dask's SpecCluster closes a worker's nanny when no worker of that name has joined within
    ``distributed.deploy.lost-worker-timeout`` (15 s) of a worker's removal. A worker killed within
    15 s of its own restart (a crash loop, an OOM during a model load, the chaos benchmark) leaves its
    replacement starting when that check runs: the nanny is closed and the cluster is one worker
    short until the command stops. The nanny restarts its worker itself, so there is nothing for the
    check to retire. Dask reads the setting when a worker is removed, so it is set for the process.
    """
    dask.config.set({"distributed.deploy.lost-worker-timeout": NANNY_KEEPS_ITS_WORKER})


def _in_process_cluster(
    profile: Profile, catalog: str | None, preload_argv: Sequence[str] = (), **kwargs
) -> LocalCluster:
    """One worker in this process, its comms with the scheduler Dask's in-memory ``inproc://``.

    Each online request crosses the scheduler-worker link twice (the request
    out, the answer back); in memory, neither crossing serializes nor wakes
    another process, which shortens every online request (docs/BENCHMARKS.md).
    The price is isolation: a worker that crashes takes
    the scheduler and the gateway with it, where a worker process would be
    restarted by its nanny. Other processes (``--scheduler`` job commands,
    dashboards) reach the scheduler on a TCP listener added beside the inproc
    one, as Dask itself does for Jupyter (see `contact_address`).

    The event loop now shares this process's interpreter lock with the
    worker's device thread; a switch interval shorter than Python's default
    bounds how long the device thread waits for it behind a busy gateway, which
    lowers the online p99 under batch load (docs/BENCHMARKS.md).
    """
    sys.setswitchinterval(min(sys.getswitchinterval(), IN_PROCESS_SWITCH_SECONDS))
    argv = [*preload_argv, "--shoal-profile", profile.path or profile.name]
    if catalog:
        argv += ["--shoal-catalog", os.path.abspath(catalog)]
    cluster = LocalCluster(n_workers=1, processes=False, protocol="inproc://", preload_argv=argv, **kwargs)
    try:
        cluster.sync(cluster.scheduler.listen, f"tcp://{LOOPBACK}:0")
    except BaseException:
        cluster.close()
        raise
    return cluster


def check_runtimes(profile: Profile) -> None:
    """A runtime the profile names but this machine lacks fails before any start, naming the extra.

    `auto`'s runtimes are exempt: each was loaded on this machine when measured, and a package
    installed or removed since changes the machine signature, so it is measured again. Checking
    would import torch here, 1.3 s of the command's start.
    """
    if profile.name == AUTO:
        return
    from rich.markup import escape

    from ..workers.runtimes import RuntimeNotInstalled, require_installed

    for model, choice in profile.runtimes.items():
        if choice.runtime == "torch":
            continue  # a dependency of Shoal itself: importing it here only cost every pinned profile 1.3 s
        try:
            require_installed(choice.runtime)
        except RuntimeNotInstalled as exc:  # escaped: the CLI prints errors as rich markup, and "[onnx]" is a tag
            raise ClusterError(escape(f"profile {profile.name!r}, model {model!r}: {exc}")) from None


def contact_address(cluster: LocalCluster) -> str:
    """Where other processes reach the embedded cluster's scheduler (never its inproc:// address)."""
    return next(
        listener.contact_address
        for listener in cluster.scheduler.listeners
        if not listener.contact_address.startswith("inproc://")
    )


def pull_queue(client: Client) -> PullQueueClient:
    """The pull queue's handlers on `client`'s scheduler; run them with ``client.sync(method, ...)``."""
    return PullQueueClient(client.scheduler)


def has_shoal_plugin(dask_scheduler) -> bool:
    return PULL_QUEUE in dask_scheduler.extensions


def check_plugin(client: Client) -> None:
    if not client.run_on_scheduler(has_shoal_plugin):
        raise ClusterError(
            f"the scheduler at {client.scheduler.address} has no Shoal plugin; start it "
            "with `dask scheduler --preload shoal.scheduler_plugins`"
        )


@contextmanager
def connect(
    scheduler: str | None,
    profile: Profile,
    catalog: str | None = None,
    warm: list[str] | tuple[str, ...] = (),
    adapt: AdaptRange | None = None,
) -> Iterator[Client]:
    """A client of `scheduler`, or of an embedded cluster whose workers load `warm` before they join,
    adaptive between `adapt`'s counts when given.

    Warming moves a job's model load out of the job and into the cluster's
    start, where it overlaps nothing anyway; a running cluster loads on demand.
    """
    if scheduler and adapt is not None:
        raise ClusterError(
            "--adapt sizes the embedded cluster; a running cluster scales with its own autoscaler (docs/DEPLOY.md)"
        )
    if scheduler:
        try:
            client = Client(scheduler, timeout=dask.config.get("shoal.connect-timeout", default="20s"))
        except (OSError, TimeoutError) as exc:
            raise ClusterError(f"cannot reach the scheduler at {scheduler}: {exc}") from exc
        with client:
            check_plugin(client)
            yield client
        return
    STAGES.mark("checks")
    loads: dict[str, dict[str, float]] = {}
    check_runtimes(profile)  # the embedded workers share this machine's packages
    argv = [arg for name in dict.fromkeys(warm) for arg in ("--shoal-warm", name)]
    with local_cluster(profile, catalog, preload_argv=argv, adapt=adapt) as cluster, Client(cluster) as client:
        mark_cluster_start(cluster)
        check_plugin(client)
        yield client
        if STAGES.verbose:
            loads = client.run(model_loads)
    STAGES.mark("stop")
    if STAGES.verbose:
        console = Console(stderr=True, soft_wrap=True)
        STAGES.report(console)
        for worker, seconds in sorted(loads.items()):
            for model, load in seconds.items():
                console.print(
                    f"model load {model} on {worker}: {load:.2f} s (beside the stages above)", highlight=False
                )


def mark_cluster_start(cluster: LocalCluster) -> None:
    """The scheduler's start and the last worker's arrival, from the scheduler's own clock and events."""
    STAGES.mark_at("scheduler up", cluster.scheduler.time_started)
    events = cluster.scheduler.get_events("all")
    joined = [at for at, event in events if isinstance(event, dict) and event.get("action") == "add-worker"]
    if joined:
        STAGES.mark_at("workers up", max(joined))
    STAGES.mark("client up")


def model_loads(dask_worker) -> dict[str, float]:
    """Seconds each model took to load on this worker (its pool's own timing)."""
    plugin = dask_worker.plugins.get("shoal-worker")
    return dict(plugin.pool.load_seconds) if plugin is not None else {}


def _runtimes_here(dask_worker) -> dict[str, str]:
    plugin = dask_worker.plugins.get("shoal-worker")
    chooser = getattr(plugin, "chooser", None)
    return chooser.report() if chooser is not None else {}


def worker_runtimes(client: Client) -> dict[str, dict[str, str]]:
    """Per worker, each model it loaded: the runtime it ran on and why (workers/runtime_choice.py chose it there).

    One call to every worker, once per job; a worker that left meanwhile is missing from the answer.
    """
    try:
        replies = client.run(_runtimes_here, on_error="ignore")  # a worker that cannot answer is left out
    except (OSError, TimeoutError) as exc:  # the cluster is going away: the summary goes without it
        logging.getLogger("shoal").info("could not ask the workers what they ran: %s", exc)
        return {}
    return {worker: ran for worker, ran in replies.items() if ran}
