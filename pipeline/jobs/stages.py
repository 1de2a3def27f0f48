"""Where a whole command's seconds go: marks from the process's start to the cluster's stop.

A batch job's fixed part (imports, the cluster starting, the model loading,
the stop) is paid on every run; these marks measure it so it can be cut and
kept cut. Each stage is the time since the mark before it; `--verbose`
prints them when the command ends, and the benchmarks read that output.
"""

from __future__ import annotations

import time

from rich.console import Console

STAGE_PREFIX = "stage "  # the printed lines: "stage NAME: SECONDS s", in order


def process_age() -> float:
    """Seconds since this process started (its imports and Python's own start included)."""
    import psutil

    return time.time() - psutil.Process().create_time()


class Stages:
    """Named marks on one clock; a stage lasts from the previous mark (the process's start for the first)."""

    def __init__(self) -> None:
        self.verbose = False
        self.marks: list[tuple[str, float]] = []
        self._began = time.perf_counter()
        self._started_ago = 0.0

    def start(self, verbose: bool) -> None:
        """Called as the command starts: what came before it is the imports."""
        self.verbose = verbose
        self._began = time.perf_counter()
        self._started_ago = process_age() if verbose else 0.0
        self.marks = [("imports", self._began)]

    def mark(self, name: str) -> None:
        if self.verbose:
            self.marks.append((name, time.perf_counter()))

    def mark_at(self, name: str, epoch: float) -> None:
        """A mark for something that happened at `epoch` (time.time()), e.g. in another thread."""
        if self.verbose:
            self.marks.append((name, time.perf_counter() - (time.time() - epoch)))

    def seconds(self) -> dict[str, float]:
        """Each stage's seconds, in order; `total` since the process started."""
        if not self.marks:
            return {}
        stages = {"imports": self._started_ago}
        for (_, before), (name, at) in zip(self.marks, self.marks[1:]):
            stages[name] = stages.get(name, 0.0) + at - before
        stages["total"] = self._started_ago + self.marks[-1][1] - self._began
        return stages

    def report(self, console: Console) -> None:
        if not self.verbose:
            return
        for name, seconds in self.seconds().items():
            console.print(f"{STAGE_PREFIX}{name}: {seconds:.2f} s", highlight=False)


STAGES = Stages()
"""The command's marks: one command per process."""
