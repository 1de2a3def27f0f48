"""Processes a test starts: starting them so that they are stopped however the test ends, a free port to give one,
a line to wait for in its output, and stopping them.

Every process a test starts goes through `Processes` (or `started`, for one): it runs in a session of its own,
so stopping it stops what it started too (`shoal embed`'s embedded cluster, `dask worker`'s nanny and worker
processes), and the block's exit stops every one still running, passed or failed. tests/test_processes.py
fails on a subprocess.Popen anywhere else in tests/.
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
from pathlib import Path
from typing import IO, Any

from tests.support.paths import ROOT

STOP_SECONDS = 30  # a process's time to exit on SIGTERM before SIGKILL


class Processes:
    """The processes one block of a test starts, each in a session of its own, in the order started; leaving the
    block stops every one still running (last started first) with whatever it started, however the block ends."""

    def __init__(self) -> None:
        self._started: list[subprocess.Popen] = []

    def start(self, command: Sequence[str], *, log: Path | None = None, **popen: Any) -> subprocess.Popen:
        """`command` in a process and session of its own, in the repository unless `cwd=` says otherwise; `log`: a
        file that takes its stdout and stderr; `popen` as for subprocess.Popen."""
        popen.setdefault("cwd", ROOT)
        if log is not None:
            with log.open("w") as out:
                proc = subprocess.Popen(
                    list(command), start_new_session=True, stdout=out, stderr=subprocess.STDOUT, **popen
                )
        else:
            proc = subprocess.Popen(list(command), start_new_session=True, **popen)
        self._started.append(proc)
        return proc

    def stop(self) -> None:
        stop_processes(self._started)

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[subprocess.Popen]:
        return iter(list(self._started))

    def __getitem__(self, index: int) -> subprocess.Popen:
        return self._started[index]

    def __len__(self) -> int:
        return len(self._started)


@contextmanager
def started(command: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """One process, as `Processes.start` starts it, stopped with whatever it started when the block exits."""
    with Processes() as procs:
        yield procs.start(command, **popen)


def run(
    command: Sequence[str], *, timeout: float, input: str | None = None, **popen: Any
) -> subprocess.CompletedProcess:
    """`command` to its end, as subprocess.run runs it with its output captured as text, but started as `started`
    starts one: on a timeout (subprocess.TimeoutExpired) or any failure here, what it started is stopped with it,
    and what it left running once it exited is stopped too."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with started(command, **({"stdin": subprocess.PIPE} if input is not None else {}), **pipes, **popen) as proc:
        out, err = proc.communicate(input, timeout=timeout)
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


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
