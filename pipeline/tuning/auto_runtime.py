"""Measuring `auto`'s runtime verdicts: each candidate's speed against fp32 torch, and the gate's verdict.

A worker measures a model once per kind of device (workers/runtime_choice.py starts this module in a child),
and the record is cached under the Shoal cache (``verdicts/FINGERPRINT-SIGNATURE-tTHREADS.json``, see
configs/verdicts.py, which also holds `choose`): a model's fingerprint (its weights and settings) and the
device's signature (configs/machine.py: CPU model, cores, features, GPUs, runtime versions).

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

It runs in a child process, so the worker never loads the candidates itself. A measurement that fails is
cached too, with its reason: the worker runs fp32 torch and says why, and later loads do not retry it (delete
the file, or a new MEASUREMENT format, to measure again). A record carries what a shipped copy is matched by
(the model's fingerprint, the device's class, the runtime versions): copied into configs/verdicts/, it is
the first use's choice on every machine of that class.

    python -m shoal.pipeline.tuning.auto_runtime PROFILE.yaml VERDICTS.json < SPEC.json   # what a worker runs, once
"""

from __future__ import annotations

import datetime as dt
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from ...configs import ModelSpec, Profile, RuntimeChoice, load_profile
from ...configs.auto import NAME
from ...configs.fingerprints import model_fingerprint
from ...configs.kinds import kind_of
from ...configs.machine import Machine, probe
from ...configs.verdicts import (
    LOSSY_GAIN,
    MEASUREMENT,
    Candidate,
    Measurement,
    choose,
    entry_bar,
    failure,
    label,
    read_verdicts,
    shipped_verdict,
    write_record,
)

TIMED_PAIRS = 3  # back-to-back pairs per candidate, their median ratio its speed
TIMED_TEXTS = 32  # of the sample, per timed run: timing took most of a first use at 64 (docs/BENCHMARKS.md)


def gate_texts() -> list[str]:
    """The gate's sample: 64 paragraphs of the demo corpus, shipped with the package."""
    import pyarrow.parquet as pq

    from .quality_gate import GATE_SAMPLE

    return [str(t) for t in pq.read_table(GATE_SAMPLE / "sample.parquet", columns=["text"]).column("text").to_pylist()]


def cached_choice(spec: ModelSpec, machine: Machine, threads: int) -> str:
    """`shoal models`' column: auto's runtime for `spec` on this machine's CPU, short, or that it is measured on
    first use."""
    kind = kind_of(spec)
    if not kind.measured:  # not measured: torch in the workers' dtype, or a profile's pin
        return "-" if kind.simulated else "torch (workers' dtype)"
    fingerprint = model_fingerprint(spec)
    record = read_verdicts(fingerprint, machine, threads, "cpu")
    shipped = shipped_verdict(fingerprint, machine, "cpu") if record is None else None
    record = record or shipped
    if record is None:
        return "on first use"
    if "failed" in record:
        return f"torch float32 (measuring failed: {record['failed']})"
    choice, _ = choose(record)
    speed = (choice.gate or {}).get("speed_vs_fp32")
    listed = f"{choice.runtime} {choice.dtype}" + (f" ({speed:.2f}x fp32" if speed else " (none faster passed")
    return listed + ("; shipped verdict, measured here on first use)" if shipped else ")")


def listed_choice(profile: Profile, spec: ModelSpec, machine: Machine) -> str:
    """`shoal models`' column under `profile`: its pin, else auto's choice here, and why a pin is not used."""
    pinned = profile.runtimes.get(spec.name)
    if pinned is not None:
        return f"{pinned.runtime} {pinned.dtype} (pinned by profile {profile.name})"
    from ...configs.auto import auto_profile

    threads = (auto_profile(machine) if profile.name == NAME else profile).torch_threads(machine.cores)
    choice = cached_choice(spec, machine, threads)
    held = profile._held.get(spec.name)
    pin = held.split(", which needs ")[0].removeprefix(f"profile {profile.name} pins ") if held else ""
    return f"{choice}; {profile.name}'s {pin} pin needs what this machine lacks" if held else choice


def offered(plan_kind: str, machine: Machine) -> list[RuntimeChoice]:
    """The candidates this machine could make fast, fp32 torch (the reference) left out."""
    from ...workers.runtimes import RuntimeNotInstalled, require_installed
    from .quality_gate import REFERENCE, candidates

    chosen = []
    for choice in candidates(plan_kind):
        if choice == REFERENCE or (choice.dtype == "bfloat16" and not machine.bf16):
            continue  # bf16 without bf16 hardware is emulated: many times slower than fp32
        if choice.dtype == "float16" and not machine.has("fp16"):
            continue  # a GPU before Volta has no fp16 tensor cores
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

    from ...workers.devices import apply_torch_threads, detect_device
    from ...workers.runtimes import load_runtime
    from .quality_gate import JUDGED_SET, REFERENCE, PrecisionGate
    from .runtimes import speedups, timed_work

    began = mark = time.perf_counter()
    steps: dict[str, float] = {}  # seconds per step, for the record: what a first use costs, and where

    def step(name: str) -> None:
        nonlocal mark
        steps[name], mark = round(time.perf_counter() - mark, 2), time.perf_counter()

    plan = detect_device(profile, {})
    # The gate's figures do not depend on threads: it runs on every core, the timing at the layout's.
    gate_plan = replace(plan, threads=max(plan.threads, machine.cores))
    texts = gate_texts()
    work = timed_work(spec)

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
        "machine": machine.signature(plan.kind),
        "described": machine.describe(),
        "device": plan.kind,
        "threads": plan.threads,
        "texts": len(texts),
        "candidates": rows,
        "seconds": round(time.perf_counter() - began, 1),
        "steps": steps,
        "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "fingerprint": model_fingerprint(spec),
        "device_class": machine.device_class(plan.kind),
        "versions": dict(machine.versions),
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
