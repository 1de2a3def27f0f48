"""`auto`'s runtime x dtype per model: the fastest candidate whose gate verdict here is `pass`.

The verdicts are measured once per model and kind of machine, then cached
under the Shoal cache (``verdicts/FINGERPRINT-SIGNATURE.json``): a model's
fingerprint (its weights and settings) and the machine signature
(configs/machine.py: CPU model, cores, features, GPUs, runtime versions).
Measuring is the quality gate on its sample, each candidate against fp32
torch (pipeline/tuning/quality_gate.py; Kendall's tau for rerankers), then
the candidates that pass timed in back-to-back pairs with fp32 at the
layout's threads per worker, where the job will run them. It runs in a child
process, so the command's own process (the embedded scheduler's) never
imports torch.

    python -m pipeline.tuning.auto_runtime PROFILE.yaml < SPEC.json   # what a command runs, once
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from configs import ModelSpec, Profile, RuntimeChoice, load_profile
from configs.auto import NAME, cache_dir, save
from configs.machine import Machine, probe

SAMPLE_TEXTS = 128  # the gate's sample: enough for its minimum cosine, seconds to embed on a small model
TIMED_TEXTS = 64  # each timed run: long enough to dwarf a call's fixed cost
MIN_GAIN = 0.05  # a candidate must beat fp32 by this much to replace it (timing noise is a few percent)
# A reduced-precision candidate (bf16, fp16, int8) changes the vectors, within the gate: it must also beat the
# fastest full-precision one by this much (a tiny model's int8 at 1.08x is not worth its rounding).
LOSSY_GAIN = 0.25


def verdict_path(fingerprint: str, machine: Machine, threads: int) -> Path:
    """Keyed by the threads per worker too: they change which runtime is fastest."""
    return cache_dir() / "verdicts" / f"{fingerprint[:16]}-{machine.signature()}-t{threads}.json"


def read_verdicts(fingerprint: str, machine: Machine, threads: int) -> dict[str, Any] | None:
    """The cached measurement for this model on this kind of machine at `threads` per worker, or None."""
    path = verdict_path(fingerprint, machine, threads)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def choose(record: dict[str, Any]) -> tuple[RuntimeChoice, str]:
    """The fastest passing candidate beating fp32 by MIN_GAIN (else fp32 torch), and why, from a measurement."""
    rows = record["candidates"]
    passing = [r for r in rows if r["verdict"] == "pass" and r.get("speed_vs_fp32") is not None]
    faster = [r for r in passing if (r["runtime"], r["dtype"]) != ("torch", "float32")]
    exact = max((r["speed_vs_fp32"] for r in passing if r["dtype"] == "float32"), default=1.0)
    worth = [r for r in faster if r["dtype"] == "float32" or r["speed_vs_fp32"] >= exact * (1 + LOSSY_GAIN)]
    best = max(worth, key=lambda r: r["speed_vs_fp32"], default=None)
    refused = [f"{r['runtime']} {r['dtype']}" for r in rows if r["verdict"] != "pass"]
    threads = record["threads"]
    at = f"at {threads} thread{'s' * (threads > 1)} per worker, measured {record['checked']}"
    if best is None or best["speed_vs_fp32"] < 1 + MIN_GAIN:
        if not faster and refused:
            why = f"no candidate passed the gate ({', '.join(refused)} refused): fp32 torch"
        else:
            why = (
                f"no candidate that passed the gate beat fp32 by {MIN_GAIN:.0%} "
                f"(reduced precision by {LOSSY_GAIN:.0%} more; {at}): fp32 torch"
            )
        return RuntimeChoice(runtime="torch", dtype="float32"), why
    figures = ", ".join(f"{k} {v:.4f}" for k, v in best["figures"].items() if k != "ndcg@10_fp32")
    why = (
        f"{best['runtime']} {best['dtype']}: gate pass ({figures}), {best['speed_vs_fp32']:.2f}x fp32 {at}"
        + (f"; fastest of {len(faster)} that passed" if len(faster) > 1 else "")
        + (f"; refused: {', '.join(refused)}" if refused else "")
    )
    gate = {"verdict": "pass", **best["figures"], "speed_vs_fp32": best["speed_vs_fp32"], "checked": record["checked"]}
    return RuntimeChoice(runtime=best["runtime"], dtype=best["dtype"], gate=gate), why


def cached_choice(spec: ModelSpec, machine: Machine, threads: int) -> str:
    """`shoal models`' column: auto's runtime for `spec` here, short, or that it is measured on first use."""
    if spec.kind not in ("embedder", "reranker"):
        return "-"
    from pipeline.jobs.fingerprints import model_fingerprint

    record = read_verdicts(model_fingerprint(spec), machine, threads)
    if record is None:
        return "on first use"
    choice, _ = choose(record)
    speed = (choice.gate or {}).get("speed_vs_fp32")
    return f"{choice.runtime} {choice.dtype}" + (f" ({speed:.2f}x fp32)" if speed else " (none faster passed)")


def resolve(profile: Profile, spec: ModelSpec, console: Console | None = None) -> None:
    """Set `auto`'s runtime for `spec`'s model, measuring once if this machine has no verdicts for it."""
    if profile.name != NAME or spec.kind not in ("embedder", "reranker") or spec.name in profile.runtimes:
        return
    from pipeline.jobs.fingerprints import model_fingerprint

    machine = profile._machine or probe()
    fingerprint = model_fingerprint(spec)
    threads = profile.torch_threads(machine.cores)
    record = read_verdicts(fingerprint, machine, threads)
    if record is None:
        path = verdict_path(fingerprint, machine, threads)
        (console or Console(stderr=True)).print(
            f"auto: measuring {spec.name}'s runtimes on this kind of machine (once; cached in {path.parent})",
            highlight=False,
        )
        failed = measure_in_child(profile, spec)
        record = read_verdicts(fingerprint, machine, threads)
        if record is None:  # the job still runs, on the reference runtime, and says why
            profile.runtimes[spec.name] = RuntimeChoice(runtime="torch", dtype="float32")
            profile.reasons[spec.name] = f"measuring failed ({failed or f'nothing written to {path}'}): fp32 torch"
            save(profile)
            return
    choice, why = choose(record)
    profile.runtimes[spec.name] = choice
    profile.reasons[spec.name] = why
    save(profile)


def measure_in_child(profile: Profile, spec: ModelSpec) -> str:
    """`measure` in a fresh interpreter (torch and the model stay out of this process); why it failed, or ""."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "pipeline.tuning.auto_runtime", profile.path or NAME]
    done = subprocess.run(command, input=spec.model_dump_json(), text=True, env=env, stdout=subprocess.DEVNULL)
    return f"exit {done.returncode}; see the lines above" if done.returncode else ""


def measure(spec: ModelSpec, profile: Profile, machine: Machine) -> dict[str, Any]:
    """Every offered candidate through the gate, those passing timed against fp32; the record to cache."""
    from dataclasses import replace

    from pipeline.jobs.fingerprints import model_fingerprint
    from pipeline.tuning.quality_gate import REFERENCE, PrecisionGate, candidates
    from pipeline.tuning.runtimes import embed_texts, paired_speedup, score_texts
    from pipeline.tuning.sample import draw_sample
    from pipeline.tuning.tune import DEMO_INPUT
    from workers.devices import apply_torch_threads, detect_device
    from workers.runtimes import RuntimeNotInstalled, load_runtime, require_installed

    plan = detect_device(profile, {})
    offered = []
    for choice in candidates(plan.kind):
        if choice.dtype == "bfloat16" and not machine.bf16:
            continue
        try:
            require_installed(choice.runtime)
        except RuntimeNotInstalled:
            continue
        offered.append(choice)
    with tempfile.TemporaryDirectory(prefix="shoal-auto-") as folder:
        texts = draw_sample(DEMO_INPUT, SAMPLE_TEXTS, Path(folder)).texts
    # The gate's figures do not depend on threads: it runs on every core, the timing at the layout's.
    gate_plan = replace(plan, threads=max(plan.threads, machine.cores))
    apply_torch_threads(gate_plan)
    gate = PrecisionGate(spec, gate_plan, texts)
    verdicts = [gate.check(choice) for choice in offered]
    apply_torch_threads(plan)
    work = embed_texts if spec.kind == "embedder" else score_texts

    def load(choice: RuntimeChoice):
        return load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan)

    speeds: dict[tuple[str, str], float] = {(REFERENCE.runtime, REFERENCE.dtype): 1.0}
    passing = [v.choice for v in verdicts if v.passed and v.choice != REFERENCE]
    if passing:
        reference = load(REFERENCE)
        try:
            for choice in passing:
                candidate = load(choice)
                try:
                    speeds[(choice.runtime, choice.dtype)] = paired_speedup(
                        candidate, reference, texts[:TIMED_TEXTS], work=work
                    )
                finally:
                    candidate.close()
        finally:
            reference.close()
    rows = [
        {
            "runtime": v.choice.runtime,
            "dtype": v.choice.dtype,
            "verdict": "pass" if v.passed else "refused",
            "figures": {k: round(x, 5) for k, x in v.figures.items()},
            "failures": v.failures,
            "speed_vs_fp32": round(speeds[key], 3) if (key := (v.choice.runtime, v.choice.dtype)) in speeds else None,
        }
        for v in verdicts
    ]
    return {
        "model": spec.name,
        "fingerprint": model_fingerprint(spec),
        "machine": machine.signature(),
        "described": machine.describe(),
        "device": plan.kind,
        "threads": plan.threads,
        "texts": len(texts),
        "candidates": rows,
        "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> None:
    profile = load_profile(sys.argv[1])
    spec = ModelSpec.model_validate_json(sys.stdin.read())
    machine = probe()
    record = measure(spec, profile, machine)
    path = verdict_path(record["fingerprint"], machine, record["threads"])
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    staged.write_text(json.dumps(record, indent=1))
    os.replace(staged, path)
    console = Console(stderr=True)
    for row in record["candidates"]:
        speed = f"{row['speed_vs_fp32']:.2f}x fp32" if row["speed_vs_fp32"] is not None else "not timed"
        console.print(f"auto: {spec.name} {row['runtime']} {row['dtype']}: {row['verdict']}, {speed}", highlight=False)


if __name__ == "__main__":
    main()
