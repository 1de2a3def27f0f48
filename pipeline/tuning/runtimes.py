"""The tuner's phase 0: which runtime and dtype compute each model, under the quality gate.

Every candidate for the device kind (`quality_gate.candidates`) is first
judged by the gate against fp32 torch on the tuning sample; only those that
pass are timed, each in back-to-back pairs with fp32 torch on the same texts
(which goes first alternates), and scored by the median of the pairs' ratios:
a shared machine drifts and spikes, and a pair shares its spell. The
fastest that beats fp32 by the search's minimum gain is chosen; the gate's
figures and the measured ratio go into the profile beside the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...configs import ModelSpec, RuntimeChoice
from ...configs.kinds import kind_of
from ...configs.kinds.embedder import vectors
from .meter import MachineMeter
from .quality_gate import REFERENCE, PrecisionGate, Verdict, candidates

PAIRS = 3
# A speed this near the bar it is judged against is timed again, over twice as many rounds more: three
# rounds of 32 texts put ONNX fp32 anywhere from 0.78x to 2.02x fp32 torch within minutes on the busy
# 2-core VM (docs/BENCHMARKS.md), and `auto` caches the choice made from them.
CLOSE_CALL = 0.25


@dataclass
class RuntimeSearch:
    """Phase 0's result for one model: the choice, and every candidate's verdict and speed."""

    choice: RuntimeChoice
    verdicts: list[Verdict] = field(default_factory=list)
    speedups: dict[str, float] = field(default_factory=dict)  # "runtime dtype" -> x fp32 torch, timed beside it
    threads: int = 0  # threads per process the speedups were timed at
    earlier: str = ""  # the speedups at phase 0's own threads, when re-timed at the chosen layout's

    def lines(self, model: str) -> list[str]:
        rows = []
        for v in self.verdicts:
            label = f"{v.choice.runtime} {v.choice.dtype}"
            speed = f"{self.speedups[label]:.2f}x fp32" if label in self.speedups else "not timed"
            figures = ", ".join(f"{k} {x:.4f}" for k, x in v.figures.items())
            verdict = "pass" if v.passed else "refused (" + "; ".join(v.failures) + ")"
            chosen = (
                " <- chosen" if (v.choice.runtime, v.choice.dtype) == (self.choice.runtime, self.choice.dtype) else ""
            )
            rows.append(f"  {model} {label}: {speed}, {figures}: {verdict}{chosen}")
        if self.earlier:
            rows.append(
                f"  {model}: speeds above re-timed at the chosen layout's {self.threads} thread(s) per worker; "
                f"at phase 0's threads: {self.earlier}"
            )
        return rows


def timed_work(spec: ModelSpec) -> Callable[[Any, list[str]], Any]:
    """What a runtime of `spec`'s kind is timed on: the call its gate compares (a reranker scores pairs)."""
    gate = kind_of(spec).gate
    if gate is None:
        raise ValueError(f"model {spec.name!r}: kind {spec.kind!r} has no quality gate to time runtimes by")
    return gate.outputs


def paired_speedup(
    candidate,
    reference,
    texts: list[str],
    pairs: int = PAIRS,
    work: Callable[[Any, list[str]], Any] = vectors,
    bar: float | None = None,
) -> float:
    """How many times faster `candidate` does `work` on `texts` than `reference`: the median of back-to-back pairs."""
    return speedups([candidate], reference, texts, pairs, work, None if bar is None else [bar])[0]


def speedups(
    candidates: list,
    reference,
    texts: list[str],
    pairs: int = PAIRS,
    work: Callable[[Any, list[str]], Any] = vectors,
    bars: Sequence[float] | None = None,
) -> list[float]:
    """Each candidate's speed against `reference`, all timed in the same rounds: the reference runs once a round.

    A candidate's figure is the median over rounds of the reference's seconds over its own in that round;
    the order within a round rotates, so none always runs first. When a figure lies within CLOSE_CALL of
    its bar in `bars` (the speed a choice of it turns on), twice as many rounds more are timed and the
    median is over all.
    """
    runtimes = [reference, *candidates]
    for runtime in runtimes:
        work(runtime, texts[:32])  # warm: kernels picked, caches filled
    ratios: list[list[float]] = [[] for _ in candidates]

    def time_rounds(first: int, count: int) -> None:
        for r in range(first, first + count):
            seconds = [0.0] * len(runtimes)
            for i in [(r + k) % len(runtimes) for k in range(len(runtimes))]:
                with MachineMeter() as meter:
                    work(runtimes[i], texts)
                seconds[i] = meter.seconds
            for k in range(len(candidates)):
                ratios[k].append(seconds[0] / seconds[k + 1])

    time_rounds(0, pairs)
    if bars is not None and any(abs(float(np.median(x)) - bar) < CLOSE_CALL for x, bar in zip(ratios, bars)):
        time_rounds(pairs, 2 * pairs)
    return [float(np.median(x)) for x in ratios]


def choose_runtime(spec: ModelSpec, plan, texts: list[str], min_gain: float, judged_set: str | None) -> RuntimeSearch:
    """The fastest candidate the gate accepts for `spec` on this device (fp32 torch when none beats it)."""
    from ...workers.runtimes import RuntimeNotInstalled, require_installed

    offered = []
    for choice in candidates(plan.kind):
        try:
            require_installed(choice.runtime)
            offered.append(choice)
        except RuntimeNotInstalled:
            continue  # an uninstalled runtime is not a candidate on this machine
    gate = PrecisionGate(spec, plan, texts, judged_set)
    verdicts = [gate.check(choice) for choice in offered]
    return time_passing(RuntimeSearch(REFERENCE, verdicts, threads=plan.threads), spec, plan, texts, min_gain)


def retime(search: RuntimeSearch, spec: ModelSpec, plan, texts: list[str], min_gain: float) -> RuntimeSearch:
    """`search` timed again at `plan`'s threads (phase 2's layout): the gate's verdicts stand, the speeds may not.

    Torch's OpenMP threads and ONNX Runtime's scale differently, above all on a busy machine, so the
    fastest candidate at phase 0's threads per process need not be the fastest at the chosen layout's.
    """
    earlier = ", ".join(f"{label} {x:.2f}x" for label, x in search.speedups.items())
    again = RuntimeSearch(REFERENCE, search.verdicts, threads=plan.threads, earlier=earlier)
    return time_passing(again, spec, plan, texts, min_gain)


def time_passing(search: RuntimeSearch, spec: ModelSpec, plan, texts: list[str], min_gain: float) -> RuntimeSearch:
    """Each candidate that passed the gate timed against fp32 torch; the fastest beating it by `min_gain` chosen."""
    from ...workers.runtimes import load_runtime

    passing = [v.choice for v in search.verdicts if v.passed and v.choice != REFERENCE]
    if not passing:
        return search

    def load(choice: RuntimeChoice):
        return load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan)

    work = timed_work(spec)
    reference = load(REFERENCE)
    try:
        for choice in passing:
            candidate = load(choice)
            try:
                search.speedups[f"{choice.runtime} {choice.dtype}"] = paired_speedup(
                    candidate, reference, texts, work=work, bar=1 + min_gain
                )
            finally:
                candidate.close()
    finally:
        reference.close()
    best_label, best = max(search.speedups.items(), key=lambda item: item[1])
    if best >= 1 + min_gain:
        verdict = next(v for v in search.verdicts if f"{v.choice.runtime} {v.choice.dtype}" == best_label)
        evidence = {**verdict.evidence(), "speed_vs_fp32": round(best, 2), "timed_at_threads": search.threads}
        search.choice = verdict.choice.model_copy(update={"gate": evidence})
    return search
