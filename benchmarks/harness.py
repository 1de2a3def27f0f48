"""What every benchmark needs besides its own experiment: meters, the machine, the code, the result file.

Importing this module puts the repository root on ``sys.path`` (the scripts run
as ``.venv/bin/python benchmarks/NAME.py``) and sets the environment defaults
the workers run with (offline Hugging Face hub, no tokenizer thread pools), so
a benchmark imports it before anything of Shoal's.

- ``Meter``: wall time, this process's CPU (its children's included), and what
  the rest of the machine did meanwhile. Built on the tuner's
  ``shoal.pipeline.tuning.meter.MachineMeter``, which owns the reading of
  ``/proc/stat``; the meter adds the per-process view (system time, page
  faults), steal time and the load average.
- ``ProcessClock``: the CPU of another process (a server, a scheduler) over a
  stretch of wall time.
- ``wait_for_idle``, ``load_average``: before a timed run, wait a while for the machine
  to calm down; the load average to record beside a measurement.
- ``machine_info``, ``git_state``, ``conditions``: what a result was measured on.
- ``Figure``, ``write_result``: one JSON file per benchmark, ``benchmarks/results/<name>.json``
  (``--json PATH`` elsewhere), written over the last run's, with the run's headline ``figures``: the numbers
  a claim rests on, each with its goal. ``benchmarks/figures.py`` lays them out as the table that opens
  docs/BENCHMARKS.md; older runs live in that page's sections below it.
- ``markdown_table``: a table for the report a benchmark prints.
- ``venv_command``, ``subprocess_env``, ``job_figures``: running the
  ``shoal`` command as a user does and reading its job summary.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as in the workers
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import psutil  # noqa: E402

from shoal.pipeline.tuning.meter import MachineMeter, process_tree_cpu_seconds  # noqa: E402

# -- meters ---------------------------------------------------------------------


def _rusage() -> tuple[float, float, int]:
    """(CPU seconds, system seconds, minor page faults) of this process and its reaped children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    return cpu, own.ru_stime + children.ru_stime, own.ru_minflt + children.ru_minflt


def _steal_and_total() -> tuple[float, float] | None:
    """(steal, total) CPU seconds of the whole machine so far; guest time is already counted in user."""
    times = psutil.cpu_times()._asdict()
    if "steal" not in times:
        return None
    return times["steal"], sum(v for k, v in times.items() if k not in ("guest", "guest_nice"))


def load_average() -> float:
    """The 1-minute load average, rounded for a result file."""
    return round(os.getloadavg()[0], 2)


class Meter(MachineMeter):
    """Context manager: a timed run on a possibly shared machine.

    After the block: ``seconds`` (wall), ``own_cpu`` (this process and every
    child it ran, e.g. a ``shoal embed`` subprocess and its workers),
    ``own_sys`` and ``minor_faults`` (what an allocator that keeps returning
    memory costs), ``other_share`` (share of all cores other processes used,
    from MachineMeter), ``steal_share`` (share the hypervisor took) and the
    1-minute load average before and after. ``record()`` gives them as a dict
    for a result file.
    """

    own_cpu: float = 0.0
    own_sys: float = 0.0
    minor_faults: int = 0
    steal_share: float | None = None

    def __enter__(self) -> Meter:
        self.load_before = load_average()
        self._rusage = _rusage()
        self._steal = _steal_and_total()
        super().__enter__()
        return self

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        cpu, system, faults = _rusage()
        self.own_cpu = cpu - self._rusage[0]
        self.own_sys = system - self._rusage[1]
        self.minor_faults = faults - self._rusage[2]
        steal = _steal_and_total()
        if steal and self._steal:
            self.steal_share = (steal[0] - self._steal[0]) / max(steal[1] - self._steal[1], 1e-9)
        self.load_after = load_average()

    def record(self, rows: int | None = None) -> dict[str, Any]:
        extra = {}
        if rows is not None and self.own_cpu > 0:
            # less sensitive to other processes than rows/s (though not immune: spin-waits, caches)
            extra["rows_per_cpu_s"] = round(rows / self.own_cpu, 2)
        return {
            **extra,
            "wall_s": round(self.seconds, 3),
            "own_cpu_s": round(self.own_cpu, 2),
            "own_cores_used": round(self.own_cpu / self.seconds, 2) if self.seconds else None,
            "own_sys_s": round(self.own_sys, 2),
            "own_minor_faults": self.minor_faults,
            "other_cpu_share": None if self.other_share is None else round(self.other_share, 3),
            "steal_share": None if self.steal_share is None else round(self.steal_share, 3),
            "loadavg_1m_before": self.load_before,
            "loadavg_1m_after": self.load_after,
        }


class ProcessClock:
    """Context manager: CPU seconds of another process (and its children) over a stretch of wall time.

    After the block: ``cpu_seconds``, ``seconds`` (wall) and ``share`` (of one core).
    """

    cpu_seconds: float = 0.0
    seconds: float = 0.0

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> ProcessClock:
        self._cpu = process_tree_cpu_seconds(self.pid)
        self._began = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._began
        self.cpu_seconds = process_tree_cpu_seconds(self.pid) - self._cpu

    @property
    def share(self) -> float:
        return self.cpu_seconds / self.seconds if self.seconds else 0.0


def wait_for_idle(max_wait: float, threshold: float = 0.10, window: float = 1.0) -> float:
    """Wait until other processes use less than `threshold` of all cores over `window` seconds.

    Returns the seconds waited; gives up after `max_wait`. Only softens the
    noise of a shared machine: a burst can still start mid-run, which is why
    every run also records the other processes' CPU share.
    """
    waited = 0.0
    while waited < max_wait:
        with MachineMeter() as meter:
            time.sleep(window)
        waited += window
        if meter.other_share is None or meter.other_share < threshold:
            break
    return round(waited, 1)


# -- conditions -------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """The cores this process may run on (= os.cpu_count() unless pinned), as the workers count them."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def machine_info() -> dict[str, Any]:
    return {
        "host": platform.node(),
        "cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "cpu_model": cpu_model(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def git_state(*paths: str) -> dict[str, Any]:
    """The commit measured, and which tracked files (under `paths`, default all) differ from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    return {"commit": git("rev-parse", "--short", "HEAD") or None, "uncommitted": dirty.splitlines()}


def describe_code(git: dict[str, Any]) -> str:
    """`abc1234` or `abc1234 (modified tracked files)`, for a report line."""
    return f"{git.get('commit') or '?'}{' (modified tracked files)' if git.get('uncommitted') else ''}"


def conditions(argv: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """When, how, on what machine and which code a run measured; `extra` adds the benchmark's own."""
    return {
        "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine_info(),
        "git": git_state(),
        **extra,
    }


def result_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


@dataclass
class Figure:
    """One headline number of a run: what a claim in the docs rests on.

    `name` says what was measured in words ("scheduler CPU per item, 64 workers"), `value` and `unit` the
    figure (a ratio's unit is "x"), `goal` what it is held to ("<= 50 us", "0", ">= 1.2x"; empty when none)
    and `met` whether this run met it (None without a goal). docs/BENCHMARKS.md's opening table lists them.
    """

    name: str
    value: float | int | str
    unit: str = ""
    goal: str = ""
    met: bool | None = None


def write_result(
    name: str, result: dict[str, Any], path: str | Path | None = None, figures: list[Figure] | None = None
) -> Path:
    """Write `result` as JSON to `path` (default benchmarks/results/<name>.json), over the last run's.

    A result without ``conditions`` gets them (``conditions()``); the benchmark's name is recorded with
    it, and its headline `figures` (`Figure`), which ``benchmarks/figures.py`` puts in docs/BENCHMARKS.md's
    opening table once the file is in benchmarks/results/.
    """
    target = Path(path) if path else result_path(name)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = {"benchmark": name, **result}
    data.setdefault("conditions", conditions())
    if figures is not None:
        data["figures"] = [asdict(figure) for figure in figures]
    target.write_text(json.dumps(data, indent=1, default=float) + "\n")
    return target


# -- reports ----------------------------------------------------------------------


def markdown_table(columns: list[str], rows: list[Any], right: tuple[str, ...] = ()) -> list[str]:
    """The lines of a Markdown table. A row is a sequence of cells or a dict by column name;
    columns named in `right` are right-aligned (numbers); None shows as an empty cell."""
    lines = [
        "| " + " | ".join(columns) + " |",
        "| " + " | ".join("---:" if c in right else "---" for c in columns) + " |",
    ]
    for row in rows:
        cells = [row.get(c) for c in columns] if isinstance(row, dict) else row
        lines.append("| " + " | ".join("" if v is None else str(v) for v in cells) + " |")
    return lines


# -- running shoal ----------------------------------------------------------------


def venv_command(name: str) -> str:
    """A console script of this venv (`shoal`, `dask`), else the one on PATH."""
    exe = Path(sys.executable).parent / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if found:
        return found
    raise SystemExit(f"no `{name}` command next to this Python or on PATH; run `make install`")


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a `shoal` subprocess: the same tree as this script on PYTHONPATH
    (so a clean export of a commit can be benchmarked with the shared venv), wide tables."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "COLUMNS": "200", "PYTHONPATH": pythonpath, **extra}


SUMMARY_ROW = re.compile(r"^[│|┃]\s*(?P<key>[^│|┃]+?)\s*[│|┃]\s*(?P<value>[^│|┃]*?)\s*[│|┃]\s*$")


def job_figures(stderr: str) -> dict[str, float]:
    """The numeric rows of a `shoal embed`/`shoal rerank` job summary (`seconds`, `rows`, `rows/s`, ...)."""
    rows: dict[str, float] = {}
    for line in stderr.splitlines():
        m = SUMMARY_ROW.match(line.strip())
        if m:
            try:
                rows[m.group("key")] = float(m.group("value").replace(",", ""))
            except ValueError:
                pass
    return rows
