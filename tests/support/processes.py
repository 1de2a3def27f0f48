"""Processes a test starts: starting one so that it is stopped however the test ends, a free port to give one, a
line to wait for in its output, and stopping them.

A process a test starts runs in a session of its own (`started`, `dask_cli_cluster`), so stopping it stops what it
started too: `shoal embed`'s embedded cluster, `dask worker`'s nanny and worker processes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

STOP_SECONDS = 30  # a process's time to exit on SIGTERM before SIGKILL


@contextmanager
def started(command: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """`command` in a process (and session) of its own, stopped with whatever it started when the block exits,
    whether the test passed or not; `popen` as for subprocess.Popen."""
    proc = subprocess.Popen(list(command), start_new_session=True, **popen)
    try:
        yield proc
    finally:
        stop_processes([proc])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a process that must be told its port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_line(stream: IO[str] | None, marker: str, timeout: float = 120) -> str:
    """The first line of `stream` (a process's output) that contains `marker`; fails after `timeout` seconds."""
    assert stream is not None, "the process's output is not piped"
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(stream.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in list(lines):
            if marker in line:
                return line
        time.sleep(0.1)
    raise TimeoutError(f"no {marker!r} in: {lines}")


def stop_processes(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM the processes still running, last started first; SIGKILL one that has not exited in STOP_SECONDS.
    A process that leads a session (`started`) is stopped with its group: what is left of it once it exited
    is killed too, so no worker of an embedded cluster outlives its command."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.kill()
            proc.wait()
        _signal_group(proc, signal.SIGKILL)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    """`signum` to the process group `proc` leads, if it leads one (it was started in a session of its own: a
    group's id is its leader's pid, so a process that leads none has no group of that id)."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # no such group (left or never led one): nothing to stop
