"""Which runtime computes each model on this worker: the quality gate's verdict for this device, chosen here.

A worker knows its own device, so it chooses, not the client: a cluster started the Dask way (`dask
worker --preload shoal.workers`, no profile) runs what the gate passed on each worker's device, and a CPU
pool beside GPU workers gets each device's own choice. The model pool's loader asks `RuntimeChooser.choose`
for the spec to load. A model pinned to a runtime for this device kind (a profile's or the catalog's
`runtimes`) runs its pin, unless this machine lacks what the pin needs (configs.hold). Otherwise, for the
kinds `auto` measures (embedders and rerankers), the fastest candidate the gate passed, from the first
record found (configs/verdicts.py): measured here, else shipped for this class of device (then measured
here once the worker is idle, to confirm it), else none yet, and then by `SHOAL_AUTO_MEASURE`:

- ``background`` (the default on a CPU): fp32 torch now, the reference and always safe, while a child
  process measures at a lower priority; once its verdict is in, the worker loads the model on it and swaps
  it in for the fp32 one when that is idle (as it does when a shipped verdict's measurement here disagrees);
- ``wait`` (the default on a GPU, where measuring takes seconds): the first load waits for the measurement;
- ``off``: auto's choice is off: fp32 torch, no verdict read, nothing measured (the test suite's default:
  its comparisons with the reference library's own call are of fp32 torch).

The measurement runs in a child (``python -m shoal.pipeline.tuning.auto_runtime``): this process never
loads the candidates, and a measurement outlives a worker that closes meanwhile. In a cluster, workers of
one kind of device share what they measured through the scheduler (workers/shared_verdicts.py): a verdict
another one measured is taken, not measured again, and one another one is measuring is waited for on fp32.
What each model ran on and why is kept for the job summary (`report`).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from ..configs import ModelSpec, Profile, RuntimeChoice
from ..configs.fingerprints import model_fingerprint
from ..configs.kinds import kind_of
from ..configs.machine import Machine, implied_needs
from ..configs.verdicts import (
    REFERENCE,
    VerdictsRecord,
    choose,
    failure,
    read_record,
    shipped_verdict,
    verdict_path,
    write_record,
)
from .devices import DevicePlan
from .shared_verdicts import SharedVerdicts

logger = logging.getLogger("shoal.worker.runtimes")

MEASURE_ENV = "SHOAL_AUTO_MEASURE"
MODES = ("background", "wait", "off")
BACKGROUND_NICENESS = 10  # the background measurement yields the CPU to the work it shares it with
MEASURING = "shoal.pipeline.tuning.auto_runtime"  # the child's module: `python -m` it, never imported here


def measure_mode(device_kind: str) -> str:
    """`SHOAL_AUTO_MEASURE`, else `wait` on a GPU (measuring takes seconds there) and `background` on a CPU."""
    mode = os.environ.get(MEASURE_ENV) or ("wait" if device_kind == "cuda" else "background")
    if mode not in MODES:
        raise ValueError(f"{MEASURE_ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@dataclass(frozen=True)
class Ran:
    """What this worker runs a model on, and why: a line of the job summary."""

    runtime: str
    dtype: str
    why: str

    def __str__(self) -> str:
        named = f"{self.runtime} {self.dtype}"
        return self.why if self.why.startswith(named) else f"{named}: {self.why}"


class RuntimeChooser:
    """The runtime of each model this worker loads (policy only: the pool's loader acts on it)."""

    def __init__(
        self, profile: Profile, plan: DevicePlan, machine: Machine, shared: SharedVerdicts | None = None
    ) -> None:
        self.profile, self.plan, self.machine, self.shared = profile, plan, machine, shared
        self.ran: dict[str, Ran] = {}
        # Shipped verdicts used here but not measured here yet: measured once the worker is idle.
        self.unconfirmed: dict[Path, ModelSpec] = {}
        # Models loaded before their verdict here (fp32 torch meanwhile, or a shipped one): where it will be.
        self.provisional: dict[str, tuple[Path, ModelSpec]] = {}
        # Of those, the ones another worker of this kind is measuring (shared): measured here if its mark lapses.
        self.awaited: set[str] = set()
        self._lock = threading.Lock()  # `choose` runs in the loader thread, the rest in another one

    def choose(self, spec: ModelSpec) -> ModelSpec:
        """`spec` with this device kind's runtime set; in the loader thread, since it may wait for a measurement."""
        choice, why = self._choice(spec)
        runtime, dtype = (choice or RuntimeChoice()).runtime, (choice or RuntimeChoice()).dtype
        self.ran[spec.name] = Ran(runtime, self.plan.dtype if dtype == "auto" else dtype, why)
        logger.info("%s runs on %s", spec.name, self.ran[spec.name])
        if choice is None:
            return spec
        return spec.model_copy(update={"runtimes": {**spec.runtimes, self.plan.kind: choice}})

    def report(self) -> dict[str, str]:
        """Each model loaded here: what it ran on and why."""
        return {name: str(ran) for name, ran in self.ran.items()}

    def confirm(self, ask_cluster: bool = True) -> list[str]:
        """Start measuring the shipped verdicts used here (the worker is idle, or closing: `ask_cluster` False, the
        scheduler may be gone), unless the cluster has one already; what was started. Blocks: not on the loop."""
        with self._lock:
            waiting, self.unconfirmed = self.unconfirmed, {}
        started = []
        for path, spec in waiting.items():
            if self._recorded(path, ask_cluster) is None:
                measuring = self.shared.claim(path.stem) if self.shared and ask_cluster else None
                if measuring:  # measured here after all if that worker's mark lapses (superseded)
                    with self._lock:
                        self.awaited.add(spec.name)
                how = f"by {measuring}" if measuring else measure_in_background(self.profile, spec, path)
                started.append(f"{spec.name}: {how}")
        return started

    def superseded(self) -> list[ModelSpec]:
        """The models loaded before their verdict here whose verdict has come (measured here, or published by
        another worker of this kind) and names another runtime than the one loaded: the worker loads them
        again (`choose` now gives the verdict's) and swaps them in. A verdict measured here is published.
        Blocks on the scheduler: not on the event loop."""
        found = []
        with self._lock:
            waiting = list(self.provisional.items())
        for name, (path, spec) in waiting:
            measured_here = read_record(path)
            record = measured_here or self._recorded(path)
            if record is None:
                self._take_over(name, path, spec)
                continue
            if measured_here is not None and self.shared is not None and "failed" not in measured_here:
                self.shared.publish(path.stem, measured_here)
            with self._lock:
                self.provisional.pop(name, None)
                self.awaited.discard(name)
                choice, _ = choose(record)
                ran = self.ran.get(name)
            if ran is not None and (choice.runtime, choice.dtype) != (ran.runtime, ran.dtype):
                found.append(spec)
        return found

    def _take_over(self, name: str, path: Path, spec: ModelSpec) -> None:
        """Measure here a model another worker was measuring, once its mark has lapsed (killed, or failed)."""
        with self._lock:
            if name not in self.awaited:
                return
        if self.shared is None or self.shared.claim(path.stem) is not None:
            return
        with self._lock:
            self.awaited.discard(name)
        started = measure_in_background(self.profile, spec, path)
        logger.info("%s: the worker measuring it published nothing in time; measuring here (%s)", name, started)

    def _recorded(self, path: Path, ask_cluster: bool = True) -> VerdictsRecord | None:
        """The record at `path`, else the one another worker of this kind published (cached at `path` then)."""
        record = read_record(path)
        if record is None and self.shared is not None and ask_cluster:
            record = self.shared.fetch(path.stem)
            if record is not None:
                try:
                    write_record(path, record)
                except OSError:
                    pass  # a read-only cache: asked again next time
        return record

    def _choice(self, spec: ModelSpec) -> tuple[RuntimeChoice | None, str]:
        kind = self.plan.kind
        pinned = spec.runtimes.get(kind)
        held = f"{self.profile._held[spec.name]}; " if spec.name in self.profile._held else ""  # configs.hold's why
        if pinned is not None:
            lacking = self.machine.lacks([*pinned.needs, *implied_needs(pinned.dtype, kind)])
            if not lacking:
                return pinned, self._pinned_by(spec, pinned)
            held = f"the pinned {pinned.runtime} {pinned.dtype} needs {', '.join(lacking)}, which this device lacks; "
        if not kind_of(spec).measured:  # a kind with one runtime: nothing to measure
            return None, held + f"torch in the worker's dtype ({spec.kind} models are not measured)"
        if spec.adapter is not None:  # LoRA layers live in the torch model (configs/adapters.base_of)
            return None, held + "torch in the worker's dtype (a LoRA adapter runs on its base's torch model)"
        choice, why = self._measured(spec)
        return choice, held + why

    def _pinned_by(self, spec: ModelSpec, pinned: RuntimeChoice) -> str:
        if self.profile.runtimes.get(spec.name) == pinned:
            return f"pinned by profile {self.profile.name}"
        return "pinned by the model's spec (a catalog entry, or the submitting client's profile)"

    def _measured(self, spec: ModelSpec) -> tuple[RuntimeChoice, str]:
        kind, threads = self.plan.kind, self.plan.threads
        mode = measure_mode(kind)
        if mode == "off":
            return REFERENCE, f"auto's runtime choice is off ({MEASURE_ENV}=off)"
        fingerprint = model_fingerprint(spec)
        path = verdict_path(fingerprint, self.machine, threads, kind)
        record = self._recorded(path)
        if record is None:
            shipped = shipped_verdict(fingerprint, self.machine, kind)
            if shipped is not None and mode == "background":
                with self._lock:
                    self.unconfirmed[path] = spec
                    self.provisional[spec.name] = (path, spec)
                choice, why = choose(shipped)
                return choice, (
                    f"{why}; shipped verdict, measured on {shipped['described']}; measured here once this worker is idle"
                )
            measuring = self.shared.claim(path.stem) if self.shared is not None else None
            if mode == "background":
                started = f"by {measuring}" if measuring else measure_in_background(self.profile, spec, path)
                with self._lock:
                    self.provisional[spec.name] = (path, spec)
                    if measuring:
                        self.awaited.add(spec.name)
                return REFERENCE, (
                    f"fp32 torch, the safe choice, on first use on this device: its runtimes are being measured "
                    f"in the background ({started}); the model moves to the verdict's runtime once it is in"
                )
            record = measure_in_child(self.profile, spec, path)
            if self.shared is not None and "failed" not in record:
                self.shared.publish(path.stem, record)
        choice, why = choose(record)
        if "failed" in record:
            why += f"; delete {path} to measure again"
        return choice, why


def measure_in_child(profile: Profile, spec: ModelSpec, path: Path) -> VerdictsRecord:
    """Measure now, waiting for the child; its record (a failure's too, cached so it is not retried)."""
    logger.info("measuring %s's runtimes on this device (once; cached in %s)", spec.name, path.parent)
    done = subprocess.run(
        _child_command(profile, path), input=spec.model_dump_json(), text=True, env=_child_env(), capture_output=True
    )
    record = read_record(path)
    if record is None:  # the child died before writing: cached all the same
        why = (
            f"the measuring process exited with {done.returncode}" if done.returncode else f"nothing written to {path}"
        )
        record = failure(spec.name, why, done.stderr[-2000:])
        try:
            write_record(path, record)
        except OSError:
            pass  # a read-only cache: measured again next time
    return record


def measure_in_background(profile: Profile, spec: ModelSpec, path: Path) -> str:
    """Measure in a detached child that outlives this worker, unless one is at it already; what was done.

    A lock file beside the record names the child's pid: the workers of one machine start one measurement,
    and a child that died without writing leaves a stale lock the next load replaces. The child runs at a
    lower CPU priority than the work it shares the machine with; its timing is of pairs run back to back,
    so that work's load falls on both sides of each ratio.
    """
    lock = path.with_name(f"{path.name}.measuring")
    try:
        pid = int(lock.read_text())
        os.kill(pid, 0)
        return f"already started, pid {pid}"
    except (OSError, ValueError):
        pass  # no lock, or a stale one
    path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.Popen(
        _child_command(profile, path),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_child_env(),
        start_new_session=True,  # not stopped with the worker
        preexec_fn=lambda: os.nice(BACKGROUND_NICENESS),
    )
    assert child.stdin is not None
    child.stdin.write(spec.model_dump_json())
    child.stdin.close()
    lock.write_text(str(child.pid))
    return f"pid {child.pid}"


def _child_command(profile: Profile, path: Path) -> list[str]:
    return [sys.executable, "-m", MEASURING, profile.path or profile.name, str(path)]


def _child_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
