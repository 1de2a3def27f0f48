"""SIGTERM is a retirement, not a loss.

SIGTERM is what Kubernetes sends on scale-down, eviction and node drain, what
spot and preemptible machines get before they go, and what a job scheduler
sends `dask worker` at the end of its time. How `dask worker` handles it
(distributed 2026.8, ``distributed/cli/dask_worker.py`` and ``_signals.py``):

- with a nanny (the default), the signal reaches the nanny's process (PID 1
  in a container); its handler closes the nanny with a 10 s timeout, which
  asks the worker process to close and kills it 8 s later;
- with ``--no-nanny``, the same handler ends the command's event loop at
  once: the worker's connection to the scheduler breaks before its plugins
  are torn down, so the scheduler sees a lost worker;
- a nanny's worker process keeps Python's default, so a SIGTERM sent to it
  (SLURM signals every process of a step) ends it at once.

So Shoal takes SIGTERM over where Dask would close the worker on it, or
nothing would catch it: in the worker's process, `ShoalWorker` retires the
worker within the grace (`termination_grace`), then closes it, telling its
nanny not to start another; in a nanny's process, `TerminationForwarder`
passes the signal on to its worker process. A second SIGTERM changes
nothing: the grace bounds the retirement, and the platform's own kill
(Kubernetes' `terminationGracePeriodSeconds`, SLURM's `KillWait`) comes after.
SIGINT stays Dask's: Ctrl-C closes at once.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable

import dask.config
from dask.utils import parse_timedelta
from distributed.diagnostics.plugin import NannyPlugin

logger = logging.getLogger("shoal.worker")

GRACE_CONFIG = "shoal.worker.termination-grace"  # Dask config; env DASK_SHOAL__WORKER__TERMINATION_GRACE=25s
DEFAULT_GRACE = "25s"  # Kubernetes' default terminationGracePeriodSeconds is 30 s


def termination_grace() -> float:
    """Seconds a SIGTERM'd worker may spend finishing the items it started (Dask config `GRACE_CONFIG`)."""
    return float(parse_timedelta(dask.config.get(GRACE_CONFIG, default=DEFAULT_GRACE)))


def take_over_sigterm(on_term: Callable[[], None]) -> Callable[[], None] | None:
    """Call `on_term` on the running loop at each SIGTERM, in a process where `dask worker`'s own handler, or
    none (a nanny's worker process), would catch it; the undo, or None where SIGTERM is left alone.

    Left alone: another thread than the main one (signals reach only it), and a process that handles
    SIGTERM itself, such as a `shoal` command running its cluster's nannies or worker in process.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    dask_handler = getattr(previous, "__module__", None) == "distributed._signals"
    worker_process = previous == signal.SIG_DFL and multiprocessing.parent_process() is not None
    if not (dask_handler or worker_process):
        return None
    loop = asyncio.get_running_loop()

    def handle(signum: int, frame: object) -> None:
        loop.call_soon_threadsafe(on_term)  # nothing else in a signal handler: it may interrupt any line

    signal.signal(signal.SIGTERM, handle)

    def undo() -> None:
        if signal.getsignal(signal.SIGTERM) is handle:
            signal.signal(signal.SIGTERM, previous)

    return undo


class TerminationForwarder(NannyPlugin):
    """In a nanny's process: SIGTERM goes on to its worker process, which retires, then closes and tells the
    nanny to close after it; the nanny does not close it first (Dask would kill it 8 s into its grace)."""

    name = "shoal-termination"
    idempotent = True

    def __init__(self) -> None:
        self._undo: Callable[[], None] | None = None

    def setup(self, nanny) -> None:
        def forward() -> None:
            nanny.close_gracefully(reason="signal-15")  # its worker process's exit now ends it, never restarts it
            pid = nanny.process.pid if nanny.process is not None else None
            if pid is None:
                asyncio.ensure_future(nanny.close(reason="signal-15"))
                return
            logger.info("SIGTERM: passed on to worker process %d, which retires", pid)
            os.kill(pid, signal.SIGTERM)

        self._undo = take_over_sigterm(forward)

    def teardown(self, nanny) -> None:
        if self._undo is not None:
            self._undo()
