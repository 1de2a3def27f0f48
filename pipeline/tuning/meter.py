"""How busy the machine was with other work while a trial ran.

Tuning on a shared machine measures the neighbours too. Every trial records
the share of all cores that processes other than the tuner and its workers
used meanwhile, so a profile tuned under load says so (and is marked
preliminary) instead of passing noisy figures off as the hardware's.
"""

from __future__ import annotations

import os
import time

import psutil


def _machine_busy_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine so far, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0.0
    busy = user + nice + system + irq + softirq + steal
    return busy / tick, (busy + idle + iowait) / tick


def process_tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds of a process (this one by default) and its descendants (cluster workers), live or reaped."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in root.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue
        total += child_times.user + child_times.system
    return total


class MachineMeter:
    """Context manager: wall seconds, and the other processes' share of all cores."""

    seconds: float = 0.0
    other_share: float | None = None

    def __enter__(self) -> MachineMeter:
        self._machine = _machine_busy_seconds()
        self._own = process_tree_cpu_seconds()
        self._began = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._began
        machine = _machine_busy_seconds()
        if machine is None or self._machine is None:
            return
        busy = machine[0] - self._machine[0]
        capacity = max(machine[1] - self._machine[1], 1e-9)
        own = process_tree_cpu_seconds() - self._own
        self.other_share = min(1.0, max(0.0, busy - own) / capacity)
