"""Runtime verdicts: how fast each runtime x dtype computed a model on a kind of device, and whether the
quality gate passed it there; and `choose`, the fastest that passed.

A record is one measurement (pipeline/tuning/auto_runtime.py measures) of every candidate for one model on
one device. A worker finds the record for a model it is about to load, first found wins:

1. **Measured here**: the Shoal cache's ``verdicts/FINGERPRINT-SIGNATURE-tTHREADS.json``, keyed by the
   model's fingerprint (its weights and settings), the device's signature (configs/machine.py: CPU model,
   cores, features, GPUs, runtime versions) and the threads per worker.
2. **Shipped**: ``configs/verdicts/*.json``, package data: records measured by Shoal's maintainers for the
   shipped models, each keyed by the model's fingerprint and the device's class (the CPU features that
   change which number format is fast, or the GPU and its compute capability) and valid only with the
   same runtime versions. A record whose own file was not kept is transcribed from the measurement the
   project published (its `described` says from where); it lists only the candidates measured there. A model's first use on a machine of a shipped class runs the shipped choice at
   once (its gate passed on that class), and a measurement here confirms or replaces it afterwards.

Nothing here imports torch: workers choose from these records before they load anything, and `shoal
models` lists the choice.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal, NotRequired, TypedDict, cast, final

from . import CONFIG_DIR, GateEvidence, RuntimeChoice, cache_dir
from .machine import Machine

# The record's format: a record of another (an older way of measuring) is measured again. 3: int8 per channel;
# 4: a full precision starting without torch gated from within MIN_GAIN of fp32.
MEASUREMENT = 4
SHIPPED = CONFIG_DIR / "verdicts"
MIN_GAIN = 0.05  # a candidate must beat fp32 by this much to replace it (timing noise is a few percent)
# Runtimes whose workers import neither torch nor transformers: such a worker loads MiniLM in 0.5-0.7 s
# against 5.7-7.5 s on torch (docs/BENCHMARKS.md, fourth pass), on every command's start. The timing, on a
# loaded model, cannot see that: a full-precision candidate of these needs only to come within MIN_GAIN
# of fp32 torch (as fast, within the timing's noise) to be chosen over it.
STARTS_WITHOUT_TORCH = frozenset({"onnx"})
# A reduced-precision candidate (bf16, fp16, int8) changes the vectors, within the gate: it must also beat the
# fastest full-precision one by this much (a tiny model's int8 at 1.08x is not worth its rounding).
LOSSY_GAIN = 0.25
REFERENCE = RuntimeChoice(runtime="torch", dtype="float32")  # what every other candidate is held to


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
    """A verdicts file: every candidate for one model on one kind of device, and what measuring cost."""

    measurement: int  # MEASUREMENT when written
    model: str
    machine: str  # Machine.signature(device)
    described: str
    device: str
    threads: int
    texts: int
    candidates: list[Candidate]
    seconds: float
    steps: dict[str, float]  # seconds per step of the measurement
    checked: str
    # What a shipped copy of the record is matched by (written since issue 43).
    fingerprint: NotRequired[str]
    device_class: NotRequired[str]  # Machine.device_class(device)
    versions: NotRequired[dict[str, str]]  # the runtime packages' versions (configs/machine.py RUNTIME_PACKAGES)


@final
class MeasurementFailed(TypedDict):
    """A verdicts file for a measurement that failed, cached with its reason so it is not retried."""

    measurement: int
    model: str
    failed: str
    details: str
    checked: str


VerdictsRecord = Measurement | MeasurementFailed


def verdict_path(fingerprint: str, machine: Machine, threads: int, device: str | None = None) -> Path:
    """Keyed by the threads per worker too: they change which runtime is fastest."""
    return cache_dir() / "verdicts" / f"{fingerprint[:16]}-{machine.signature(device)}-t{threads}.json"


def read_verdicts(fingerprint: str, machine: Machine, threads: int, device: str | None = None) -> VerdictsRecord | None:
    """The cached measurement (or failure) for this model on this kind of device at `threads`, or None."""
    return read_record(verdict_path(fingerprint, machine, threads, device))


def read_record(path: Path) -> VerdictsRecord | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("measurement") != MEASUREMENT:
        return None
    return cast(VerdictsRecord, record)  # written by write_record in this format


def write_record(path: Path, record: VerdictsRecord) -> None:
    """Written whole or not at all: concurrent readers see a complete record or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(record, indent=1))
    os.replace(staged, path)


def failure(model: str, reason: str, details: str = "") -> MeasurementFailed:
    """The record of a measurement that failed: cached like a result, so it is not retried on every load."""
    return {
        "measurement": MEASUREMENT,
        "model": model,
        "failed": reason,
        "details": details,
        "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def shipped_verdict(fingerprint: str, machine: Machine, device: str | None = None) -> Measurement | None:
    """The shipped record for this model on this class of device with these runtime versions, or None."""
    record = _shipped().get((fingerprint, machine.device_class(device)))
    if record is None or record.get("versions") != dict(machine.versions):
        return None
    return record


@lru_cache(maxsize=1)
def _shipped() -> dict[tuple[str, str], Measurement]:
    records: dict[tuple[str, str], Measurement] = {}
    for path in sorted(SHIPPED.glob("*.json")):
        record = read_record(path)
        if record is not None and "failed" not in record and "fingerprint" in record and "device_class" in record:
            records[record["fingerprint"], record["device_class"]] = record
    return records


def label(row: Candidate) -> str:
    return f"{row['runtime']} {row['dtype']}"


def entry_bar(runtime: str, dtype: str) -> float:
    """The speed (x fp32 torch) a candidate needs to replace fp32 torch at all."""
    return 1 - MIN_GAIN if dtype == "float32" and runtime in STARTS_WITHOUT_TORCH else 1 + MIN_GAIN


def choose(record: VerdictsRecord) -> tuple[RuntimeChoice, str]:
    """The fastest passing candidate past its `entry_bar` (else fp32 torch), and why, from a measurement."""
    if "failed" in record:
        return REFERENCE, f"measuring failed ({record['failed']}; {record['checked']}): fp32 torch"
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
        return REFERENCE, why
    figures = ", ".join(f"{k} {v:.4f}" for k, v in best["figures"].items() if k != "ndcg@10_fp32")
    figures = f" ({figures})" if figures else ""
    even = (
        f" (within {MIN_GAIN:.0%} of fp32 torch, and its workers start without importing torch)"
        if best["speed_vs_fp32"] < 1 + MIN_GAIN
        else ""
    )
    why = (
        f"{label(best)}: gate pass{figures}, {best['speed_vs_fp32']:.2f}x fp32{even} {at}"
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
