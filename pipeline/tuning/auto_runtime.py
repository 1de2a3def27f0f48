"""`auto`'s runtime x dtype per model: the fastest candidate whose gate verdict here is `pass`.

The verdicts are measured once per model and kind of machine, then cached
under the Shoal cache (``verdicts/FINGERPRINT-SIGNATURE-tTHREADS.json``): a
model's fingerprint (its weights and settings) and the machine signature
(configs/machine.py: CPU model, cores, features, GPUs, runtime versions).

Measuring takes seconds, not minutes, because it does only what can change
the choice. Candidates the hardware cannot make fast are not offered (bf16
without bf16 hardware). fp32 torch is the reference, never checked against
itself. Every candidate is loaded once and first timed with fp32 torch, all
in the same rounds (fp32 runs once a round), at the layout's threads per
worker, on the gate's small sample; only one fast enough to be chosen
(beating fp32 by MIN_GAIN, or for a full precision whose workers start
without torch, within MIN_GAIN of it; a reduced precision also beating the
fastest full-precision candidate that passed by LOSSY_GAIN) goes through the quality
gate (pipeline/tuning/quality_gate.py: cosine on the sample, then nDCG@10 on
the judged set only if cosine passed; Kendall's tau for rerankers), the one
most likely to be chosen first, and gating stops once nothing left could
beat a candidate that passed. An int8 graph is the cached fp32 export
quantized, and the export is the one the job's workers load afterwards. The
sample and the judged set are package data (``gate_sample/``), so an installed
Shoal measures without a checkout's datasets/.

It runs in a child process, so the command's own process (the embedded
scheduler's) never imports torch. A measurement that fails is cached too,
with its reason: the command runs fp32 torch and says why, and later
commands do not retry it (delete the file, or a new MEASUREMENT format, to
measure again).

    python -m shoal.pipeline.tuning.auto_runtime PROFILE.yaml VERDICTS.json < SPEC.json   # what a command runs, once
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypedDict, cast, final

from rich.console import Console

from shoal.configs import Catalog, ConfigError, GateEvidence, ModelSpec, Profile, RuntimeChoice, load_profile
from shoal.configs.auto import NAME, cache_dir, save
from shoal.configs.machine import Machine, probe

# The record's format: a record of another (an older way of measuring) is measured again. 3: int8 per channel;
# 4: a full precision starting without torch gated from within MIN_GAIN of fp32.
MEASUREMENT = 4
TIMED_PAIRS = 3  # back-to-back pairs per candidate, their median ratio its speed
TIMED_TEXTS = 32  # of the sample, per timed run: timing took most of a first use at 64 (docs/BENCHMARKS.md)
MIN_GAIN = 0.05  # a candidate must beat fp32 by this much to replace it (timing noise is a few percent)
# Runtimes whose workers import neither torch nor transformers: such a worker loads MiniLM in 0.5-0.7 s
# against 5.7-7.5 s on torch (docs/BENCHMARKS.md, fourth pass), on every command's start. The timing, on a
# loaded model, cannot see that: a full-precision candidate of these needs only to come within MIN_GAIN
# of fp32 torch (as fast, within the timing's noise) to be chosen over it.
STARTS_WITHOUT_TORCH = frozenset({"onnx"})
# A reduced-precision candidate (bf16, fp16, int8) changes the vectors, within the gate: it must also beat the
# fastest full-precision one by this much (a tiny model's int8 at 1.08x is not worth its rounding).
LOSSY_GAIN = 0.25
# "wait": a model's first use here waits for its measurement; otherwise (the default) it runs fp32 torch while
# a background child measures (resolve).
MEASURE_ENV = "SHOAL_AUTO_MEASURE"
BACKGROUND_NICENESS = 10  # the background measurement yields the CPU to the job it shares it with


class Candidate(TypedDict):
    """One runtime x dtype of a measurement: its speed against fp32 torch, and the gate's verdict if gated."""

    runtime: str
    dtype: str
    verdict: Literal["pass", "refused", "too slow"]
    figures: dict[str, float]  # the gate's (quality_gate.Verdict.figures); none when not gated
    failures: list[str]
    speed_vs_fp32: float


@final
class Measurement(TypedDict):
    """A verdicts file: every candidate for one model on this kind of machine, and what measuring cost."""

    measurement: int  # MEASUREMENT when written
    model: str
    machine: str  # Machine.signature()
    described: str
    device: str
    threads: int
    texts: int
    candidates: list[Candidate]
    seconds: float
    steps: dict[str, float]  # seconds per step of the measurement
    checked: str


@final
class MeasurementFailed(TypedDict):
    """A verdicts file for a measurement that failed, cached with its reason so it is not retried."""

    measurement: int
    model: str
    failed: str
    details: str
    checked: str


VerdictsRecord = Measurement | MeasurementFailed


def verdict_path(fingerprint: str, machine: Machine, threads: int) -> Path:
    """Keyed by the threads per worker too: they change which runtime is fastest."""
    return cache_dir() / "verdicts" / f"{fingerprint[:16]}-{machine.signature()}-t{threads}.json"


def read_verdicts(fingerprint: str, machine: Machine, threads: int) -> VerdictsRecord | None:
    """The cached measurement (or failure) for this model on this kind of machine at `threads`, or None."""
    path = verdict_path(fingerprint, machine, threads)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("measurement") != MEASUREMENT:
        return None
    return cast(VerdictsRecord, record)  # written by write_record in this format


def write_record(path: Path, record: VerdictsRecord) -> None:
    """Written whole or not at all: concurrent commands read a complete record or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(record, indent=1))
    os.replace(staged, path)


def failure(model: str, reason: str, details: str = "") -> MeasurementFailed:
    """The record of a measurement that failed: cached like a result, so it is not retried on every command."""
    return {
        "measurement": MEASUREMENT,
        "model": model,
        "failed": reason,
        "details": details,
        "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def gate_texts() -> list[str]:
    """The gate's sample: 64 paragraphs of the demo corpus, shipped with the package."""
    import pyarrow.parquet as pq

    from shoal.pipeline.tuning.quality_gate import GATE_SAMPLE

    return [str(t) for t in pq.read_table(GATE_SAMPLE / "sample.parquet", columns=["text"]).column("text").to_pylist()]


def label(row: Candidate) -> str:
    return f"{row['runtime']} {row['dtype']}"


def entry_bar(runtime: str, dtype: str) -> float:
    """The speed (x fp32 torch) a candidate needs to replace fp32 torch at all."""
    return 1 - MIN_GAIN if dtype == "float32" and runtime in STARTS_WITHOUT_TORCH else 1 + MIN_GAIN


def choose(record: VerdictsRecord) -> tuple[RuntimeChoice, str]:
    """The fastest passing candidate past its `entry_bar` (else fp32 torch), and why, from a measurement."""
    if "failed" in record:
        return RuntimeChoice(runtime="torch", dtype="float32"), (
            f"measuring failed ({record['failed']}; {record['checked']}): fp32 torch"
        )
    rows = record["candidates"]
    passing = [r for r in rows if r["verdict"] == "pass" and r.get("speed_vs_fp32") is not None]
    faster = [r for r in passing if (r["runtime"], r["dtype"]) != ("torch", "float32")]
    entering = [r for r in faster if r["speed_vs_fp32"] >= entry_bar(r["runtime"], r["dtype"])]
    # What runs without a reduced precision: the fastest full precision that may replace fp32, else fp32.
    exact = max((r["speed_vs_fp32"] for r in entering if r["dtype"] == "float32"), default=1.0)
    worth = [r for r in entering if r["dtype"] == "float32" or r["speed_vs_fp32"] >= exact * (1 + LOSSY_GAIN)]
    best = max(worth, key=lambda r: r["speed_vs_fp32"], default=None)
    refused = [label(r) for r in rows if r["verdict"] == "refused"]
    slow = [f"{label(r)} {r['speed_vs_fp32']:.2f}x" for r in rows if r["verdict"] == "too slow"]
    threads = record["threads"]
    at = f"at {threads} thread{'s' * (threads > 1)} per worker, measured {record['checked']}"
    if best is None:
        if not faster and refused and not slow:
            why = f"no candidate passed the gate ({', '.join(refused)} refused): fp32 torch"
        else:
            why = (
                f"no candidate that passed the gate beat fp32 by {MIN_GAIN:.0%} "
                f"(one starting without torch: came within {MIN_GAIN:.0%}; "
                f"reduced precision by {LOSSY_GAIN:.0%} more; {at}"
                + (f"; too slow to gate: {', '.join(slow)}" if slow else "")
                + (f"; refused: {', '.join(refused)}" if refused else "")
                + "): fp32 torch"
            )
        return RuntimeChoice(runtime="torch", dtype="float32"), why
    figures = ", ".join(f"{k} {v:.4f}" for k, v in best["figures"].items() if k != "ndcg@10_fp32")
    even = (
        f" (within {MIN_GAIN:.0%} of fp32 torch, and its workers start without importing torch)"
        if best["speed_vs_fp32"] < 1 + MIN_GAIN
        else ""
    )
    why = (
        f"{label(best)}: gate pass ({figures}), {best['speed_vs_fp32']:.2f}x fp32{even} {at}"
        + (f"; fastest of {len(faster)} that passed" if len(faster) > 1 else "")
        + (f"; refused: {', '.join(refused)}" if refused else "")
        + (f"; too slow to gate: {', '.join(slow)}" if slow else "")
    )
    gate: GateEvidence = {
        "verdict": "pass",
        **best["figures"],
        "speed_vs_fp32": best["speed_vs_fp32"],
        "checked": record["checked"],
    }
    return RuntimeChoice.model_validate({"runtime": best["runtime"], "dtype": best["dtype"], "gate": gate}), why


def cached_choice(spec: ModelSpec, machine: Machine, threads: int) -> str:
    """`shoal models`' column: auto's runtime for `spec` here, short, or that it is measured on first use."""
    if spec.kind not in ("embedder", "reranker"):  # not measured: torch in the workers' dtype, or a profile's pin
        return "-" if spec.kind == "sim" else "torch (workers' dtype)"
    from shoal.pipeline.jobs.fingerprints import model_fingerprint

    record = read_verdicts(model_fingerprint(spec), machine, threads)
    if record is None:
        return "on first use"
    if "failed" in record:
        return f"torch float32 (measuring failed: {record['failed']})"
    choice, _ = choose(record)
    speed = (choice.gate or {}).get("speed_vs_fp32")
    return f"{choice.runtime} {choice.dtype}" + (f" ({speed:.2f}x fp32)" if speed else " (none faster passed)")


def listed_choice(profile: Profile, spec: ModelSpec, machine: Machine) -> str:
    """`shoal models`' column under `profile`: its pin, else auto's choice here, and why a pin is not used."""
    pinned = profile.runtimes.get(spec.name)
    if pinned is not None:
        return f"{pinned.runtime} {pinned.dtype} (pinned by profile {profile.name})"
    from shoal.configs.auto import auto_profile

    threads = (auto_profile(machine) if profile.name == NAME else profile).torch_threads(machine.cores)
    choice = cached_choice(spec, machine, threads)
    held = profile._held.get(spec.name)
    pin = held.split(", which needs ")[0].removeprefix(f"profile {profile.name} pins ") if held else ""
    return f"{choice}; {profile.name}'s {pin} pin needs what this machine lacks" if held else choice


def resolve(profile: Profile, spec: ModelSpec, console: Console | None = None) -> None:
    """Set `auto`'s runtime for `spec`'s model (on `auto`, or where the profile's pin does not hold here).

    With no verdicts for this kind of machine yet, the command does not wait for them: it runs fp32 torch
    (the reference, the safe choice) while a child process measures, and later commands use the verdict
    (`MEASURE_ENV=wait` waits instead, as tests and benchmarks that time the chosen runtime do).
    """
    if spec.kind not in ("embedder", "reranker") or spec.name in profile.runtimes:
        return
    if spec.adapter is not None:  # a LoRA adapter runs on its base's torch copy (configs/adapters.base_of)
        return
    held = profile._held.get(spec.name) or (
        None if profile.name == NAME else f"profile {profile.name} pins no runtime for {spec.name}"
    )
    from shoal.pipeline.jobs.fingerprints import model_fingerprint

    machine = profile._machine or probe()
    fingerprint, threads = model_fingerprint(spec), profile.torch_threads(machine.cores)
    path = verdict_path(fingerprint, machine, threads)
    record = read_verdicts(fingerprint, machine, threads)
    console = console or Console(stderr=True)
    if record is None and os.environ.get(MEASURE_ENV) != "wait":
        started = measure_in_background(profile, spec, path)
        console.print(
            f"auto: {spec.name} runs on fp32 torch this time: its runtimes are being measured in the background "
            f"({started}; once per kind of machine, cached in {path.parent})",
            highlight=False,
        )
        choice, why = (
            RuntimeChoice(runtime="torch", dtype="float32"),
            (
                f"fp32 torch, the safe choice, on first use here: the measurement runs in the background ({started}), "
                "later commands run its verdict"
            ),
        )
    else:
        if record is None:
            console.print(
                f"auto: measuring {spec.name}'s runtimes on this kind of machine (once; cached in {path.parent})",
                highlight=False,
            )
            crashed = measure_in_child(profile, spec, path)
            record = read_verdicts(fingerprint, machine, threads)
            if record is None:  # the child died before writing: cached all the same
                record = failure(spec.name, crashed or f"nothing written to {path}")
                try:
                    write_record(path, record)
                except OSError:
                    pass  # a read-only cache: measured again next time
            if "failed" in record:
                console.print(
                    f"auto: measuring {spec.name} failed ({record['failed']}): it runs on fp32 torch; "
                    f"delete {path} to measure again",
                    highlight=False,
                )
        choice, why = choose(record)
    profile.runtimes[spec.name] = choice
    profile.reasons[spec.name] = f"{held}; auto's choice: {why}" if held else why
    save(profile)


def resolve_unpinned(profile: Profile, catalog: Catalog, models: list[str]) -> None:
    """`auto`'s runtime for each of `models` that `profile` pins none for, or whose pin does not hold here.

    For an embedded cluster (its workers run here): a profile refines `auto`, it never makes a model slower
    than `auto` would run it (configs.hold). `auto` itself is resolved by the cluster's start.
    """
    if profile.name == NAME:
        return
    for name in dict.fromkeys(models):
        try:
            spec = catalog.get(name)
        except ConfigError:
            continue  # the job refuses it with the reason
        resolve(profile, spec)


def measure_in_child(profile: Profile, spec: ModelSpec, path: Path) -> str:
    """`measure` in a fresh interpreter, writing `path` (torch and the model stay out of this process).

    Why it died without writing, or "".
    """
    done = subprocess.run(
        _child_command(profile, path),
        input=spec.model_dump_json(),
        text=True,
        env=_child_env(),
        stdout=subprocess.DEVNULL,
    )
    return f"the measuring process exited with {done.returncode}" if done.returncode else ""


def measure_in_background(profile: Profile, spec: ModelSpec, path: Path) -> str:
    """`measure` in a detached child that outlives the command, unless one is at it already; what was done.

    A lock file beside the record names the child's pid: concurrent first uses start one measurement, and
    a child that died without writing leaves a stale lock the next command replaces. The child runs at a
    lower CPU priority than the job it shares the machine with; its timing is of pairs run back to back,
    so the job's load falls on both sides of each ratio.
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
        start_new_session=True,  # not stopped by the command's Ctrl-C or exit
        preexec_fn=lambda: os.nice(BACKGROUND_NICENESS),
    )
    assert child.stdin is not None
    child.stdin.write(spec.model_dump_json())
    child.stdin.close()
    lock.write_text(str(child.pid))
    return f"pid {child.pid}"


def _child_command(profile: Profile, path: Path) -> list[str]:
    return [sys.executable, "-m", "shoal.pipeline.tuning.auto_runtime", profile.path or NAME, str(path)]


def _child_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def offered(plan_kind: str, machine: Machine) -> list[RuntimeChoice]:
    """The candidates this machine could make fast, fp32 torch (the reference) left out."""
    from shoal.pipeline.tuning.quality_gate import REFERENCE, candidates
    from shoal.workers.runtimes import RuntimeNotInstalled, require_installed

    chosen = []
    for choice in candidates(plan_kind):
        if choice == REFERENCE or (choice.dtype == "bfloat16" and not machine.bf16):
            continue  # bf16 without bf16 hardware is emulated: many times slower than fp32
        try:
            require_installed(choice.runtime)
        except RuntimeNotInstalled:
            continue
        chosen.append(choice)
    return chosen


def judge(
    speeds: dict[tuple[str, str], float], check: Callable[[RuntimeChoice], tuple[dict[str, float], list[str]]]
) -> list[Candidate]:
    """The record's rows: fp32 torch, then each timed candidate, gated by `check` only if it could be chosen.

    A candidate goes through the gate only when, were it to pass, `choose` would take it: it beats the
    fastest that passed before it (and its `entry_bar`), and a reduced precision also the fastest
    full-precision one that passed by LOSSY_GAIN. A reduced precision beating every full-precision one by
    LOSSY_GAIN wins if it passes, so those go first, fastest first: the first to pass ends the gating.
    Then full precision, then reduced, each fastest first.
    """
    rows: list[Candidate] = [
        {"runtime": "torch", "dtype": "float32", "verdict": "pass", "figures": {}, "failures": [], "speed_vs_fp32": 1.0}
    ]
    best = 0.0  # the fastest that passed
    exact: float | None = None  # the fastest full precision that passed (else fp32 torch's 1.0 counts)
    fastest_exact = max([1.0, *(s for c, s in speeds.items() if c[1] == "float32" and s >= entry_bar(*c))])
    outright = [
        c for c, s in speeds.items() if c[1] != "float32" and s >= max(entry_bar(*c), fastest_exact * (1 + LOSSY_GAIN))
    ]
    order = sorted(speeds, key=lambda c: (c not in outright, c[1] != "float32", -speeds[c]))
    for runtime, dtype in order:
        speed = speeds[runtime, dtype]
        timed = round(speed, 3)
        row = Candidate(runtime=runtime, dtype=dtype, verdict="too slow", figures={}, failures=[], speed_vs_fp32=timed)
        needed = max(best, entry_bar(runtime, dtype))
        if dtype != "float32":
            needed = max(needed, (1.0 if exact is None else exact) * (1 + LOSSY_GAIN))
        if speed < needed:
            rows.append({**row, "failures": [f"{speed:.2f}x < {needed:.2f}x"]})
            continue
        figures, failures = check(RuntimeChoice.model_validate({"runtime": runtime, "dtype": dtype}))
        rows.append({**row, "verdict": "refused" if failures else "pass", "figures": figures, "failures": failures})
        if not failures:
            best = max(best, speed)
            if dtype == "float32":
                exact = speed if exact is None else max(exact, speed)
    return rows


def measure(spec: ModelSpec, profile: Profile, machine: Machine) -> Measurement:
    """Each offered candidate timed against fp32; those fast enough to be chosen through the gate; the record.

    Every candidate is loaded once: timed in the same rounds against one fp32 torch (which runs once a
    round), then handed to the gate with that same reference, so nothing is loaded twice.
    """
    from dataclasses import replace

    from shoal.pipeline.tuning.quality_gate import JUDGED_SET, REFERENCE, PrecisionGate
    from shoal.pipeline.tuning.runtimes import embed_texts, score_texts, speedups
    from shoal.workers.devices import apply_torch_threads, detect_device
    from shoal.workers.runtimes import load_runtime

    began = mark = time.perf_counter()
    steps: dict[str, float] = {}  # seconds per step, for the record: what a first use costs, and where

    def step(name: str) -> None:
        nonlocal mark
        steps[name], mark = round(time.perf_counter() - mark, 2), time.perf_counter()

    plan = detect_device(profile, {})
    # The gate's figures do not depend on threads: it runs on every core, the timing at the layout's.
    gate_plan = replace(plan, threads=max(plan.threads, machine.cores))
    texts = gate_texts()
    work = embed_texts if spec.kind == "embedder" else score_texts

    def load(choice: RuntimeChoice):
        return load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan)

    speeds: dict[tuple[str, str], float] = {}
    loaded: dict[tuple[str, str], Any] = {}
    reference: Any = None
    choices = offered(plan.kind, machine)
    try:
        if choices:
            apply_torch_threads(plan)
            reference = load(REFERENCE)
            step("load fp32 torch")
            for choice in choices:
                loaded[choice.runtime, choice.dtype] = load(choice)
                step(f"load {choice.runtime} {choice.dtype}")
            bars = [entry_bar(*choice) for choice in loaded]
            timed = speedups(list(loaded.values()), reference, texts[:TIMED_TEXTS], TIMED_PAIRS, work, bars)
            speeds = dict(zip(loaded, timed))
            step("time the candidates")
            if gate_plan.threads != plan.threads:  # an ONNX session keeps the threads it was made with
                for runtime in loaded.values():
                    runtime.close()
                loaded.clear()
        gate: PrecisionGate | None = None

        def check(choice: RuntimeChoice) -> tuple[dict[str, float], list[str]]:
            nonlocal gate
            if gate is None:  # built only when a candidate needs it: fp32's outputs on the sample
                apply_torch_threads(gate_plan)
                gate = PrecisionGate(spec, gate_plan, texts, JUDGED_SET, reference=reference)
                step("gate: fp32 torch's outputs")
            verdict = gate.check(choice, loaded.pop((choice.runtime, choice.dtype), None))
            step(f"gate: {choice.runtime} {choice.dtype}")
            return {k: round(x, 5) for k, x in verdict.figures.items()}, verdict.failures

        rows = judge(speeds, check)
    finally:
        for runtime in [*loaded.values(), *([reference] if reference is not None else [])]:
            runtime.close()
    return {
        "measurement": MEASUREMENT,
        "model": spec.name,
        "machine": machine.signature(),
        "described": machine.describe(),
        "device": plan.kind,
        "threads": plan.threads,
        "texts": len(texts),
        "candidates": rows,
        "seconds": round(time.perf_counter() - began, 1),
        "steps": steps,
        "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> None:
    """The child: measure, or record why measuring failed; either way write the record where the parent reads it."""
    profile, path = load_profile(sys.argv[1]), Path(sys.argv[2])
    spec = ModelSpec.model_validate_json(sys.stdin.read())
    console = Console(stderr=True)
    try:
        record = measure(spec, profile, probe())
    except Exception as exc:  # any reason at all: cached with it, so no later command retries it
        write_record(path, failure(spec.name, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    finally:
        path.with_name(f"{path.name}.measuring").unlink(missing_ok=True)  # a background measurement's lock
    write_record(path, record)
    for row in record["candidates"]:
        console.print(
            f"auto: {spec.name} {label(row)}: {row['verdict']}, {row['speed_vs_fp32']:.2f}x fp32", highlight=False
        )
    console.print(f"auto: measured {spec.name} in {record['seconds']:.1f} s", highlight=False)


if __name__ == "__main__":
    main()
