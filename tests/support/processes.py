"""Processes a test starts: a free port to give one, a line to wait for in its output, and stopping them."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import IO


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
    """SIGTERM the processes still running, last started first; SIGKILL one that has not exited in 30 s."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
