"""The quality gate: may a faster runtime or number format compute a model?

A candidate (runtime, dtype) is compared with the model's fp32 torch runtime,
the reference every other figure in Shoal is measured against, on a sample of
the user's own texts (or the demo corpus):

- embedders: cosine between the candidate's and fp32's vectors, mean >= 0.999
  and minimum >= 0.99; and retrieval on a judged set (pydoc-sections, shipped
  in the package as ``gate_sample/``; nDCG@10 with the same metric code as
  ``shoal eval``) within 0.005 of fp32;
- rerankers: Kendall's tau between the two score lists >= 0.99;
- sparse models: the same cosine figures over the whole vocabulary (a row's
  term weights, zeros elsewhere), so a term lost or gained counts;
- multi-vector models: the same cosine figures over every token's vector
  (both sides tokenize alike, so the tokens pair up one to one);
- image models (CLIP, SigLIP): the same cosine figures over the vectors of
  64 drawn images (decoded and resized as a job's are) and of the texts;
- sequence classifiers: the top label agrees with fp32's on >= 99% of texts,
  and no label's score (a probability) moves by more than 0.02;
- token classifiers: of the spans (label, start, end) either side finds,
  >= 98% are found by both, and no shared span's score moves by more than 0.02.

Each kind's gate (configs/kinds, `Gate`) names its measure (`MEASURES`) and
the call whose outputs are compared. A kind on torch alone has its dtypes for
candidates; `auto` measures none of them (they run in the workers' dtype
unless a profile pins one that passed here).

Both sides run through the worker's own runtimes (workers/runtimes/__init__.py), so the
figures describe exactly what a job would compute. The verdict and figures are
written into the profile beside the choice (``runtimes.MODEL.gate``), so a
reader of the profile sees why a model runs as it does.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...configs import GateEvidence, ModelSpec, RuntimeChoice, RuntimeDType
from ...configs.kinds import DEFAULT, KINDS, kind_of
from ...configs.verdicts import REFERENCE
from ..retrieval.beir import RetrievalSet, load_beir
from ..retrieval.evaluation import evaluate
from ..retrieval.top_k import top_k

# Package data: sample.parquet (64 demo paragraphs) and a BEIR judged set (a copy of datasets/pydoc-sections),
# so the gate runs the same in an installed Shoal, which has no datasets/.
GATE_SAMPLE = Path(__file__).with_name("gate_sample")
JUDGED_SET = str(GATE_SAMPLE)
COSINE_MEAN_AT_LEAST = 0.999
COSINE_MIN_AT_LEAST = 0.99
NDCG_DROP_AT_MOST = 0.005
KENDALL_TAU_AT_LEAST = 0.99
LABEL_AGREEMENT_AT_LEAST = 0.99
SPAN_AGREEMENT_AT_LEAST = 0.98
SCORE_DELTA_AT_MOST = 0.02


@dataclass
class Verdict:
    """The gate's answer for one candidate: its figures, and each figure that failed."""

    model: str
    choice: RuntimeChoice
    figures: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    texts: int = 0
    load_seconds: float = 0.0
    texts_per_second: float = 0.0
    reference_texts_per_second: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        figures = ", ".join(f"{name} {value:.4f}" for name, value in self.figures.items())
        verdict = "pass" if self.passed else "refused: " + "; ".join(self.failures)
        return f"{self.model} on {self.choice.runtime} {self.choice.dtype}: {figures} -> {verdict}"

    def evidence(self) -> GateEvidence:
        """What goes into the profile beside the choice."""
        return {
            "verdict": "pass" if self.passed else "refused",
            **{name: round(value, 5) for name, value in self.figures.items()},
            **({"failed": list(self.failures)} if self.failures else {}),
            "texts": self.texts,
            "checked": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        }


def judge_vectors(candidate: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], list[str]]:
    """Cosine figures of two row-aligned vector sets, and the thresholds they miss."""
    cosine = np.sum(candidate * reference, axis=1) / (
        np.linalg.norm(candidate, axis=1) * np.linalg.norm(reference, axis=1)
    )
    figures = {"cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min())}
    failures = []
    if not figures["cosine_mean"] >= COSINE_MEAN_AT_LEAST:
        failures.append(f"cosine mean {figures['cosine_mean']:.4f} < {COSINE_MEAN_AT_LEAST}")
    if not figures["cosine_min"] >= COSINE_MIN_AT_LEAST:
        failures.append(f"cosine min {figures['cosine_min']:.4f} < {COSINE_MIN_AT_LEAST}")
    return figures, failures


def judge_retrieval(candidate_ndcg: float, reference_ndcg: float) -> tuple[dict[str, float], list[str]]:
    figures = {"ndcg@10": candidate_ndcg, "ndcg@10_fp32": reference_ndcg}
    drop = reference_ndcg - candidate_ndcg
    failures = (
        []
        if drop <= NDCG_DROP_AT_MOST
        else [
            f"nDCG@10 {candidate_ndcg:.4f} is {drop:.4f} below fp32's {reference_ndcg:.4f} (allowed {NDCG_DROP_AT_MOST})"
        ]
    )
    return figures, failures


def judge_scores(candidate: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], list[str]]:
    """Kendall's tau (tau-b, ties counted) of two score lists over the same pairs."""
    from scipy.stats import kendalltau

    tau = float(kendalltau(candidate, reference).statistic)
    figures = {"kendall_tau": tau}
    failures = [] if tau >= KENDALL_TAU_AT_LEAST else [f"Kendall tau {tau:.4f} < {KENDALL_TAU_AT_LEAST}"]
    return figures, failures


def judge_labels(candidate: np.ndarray, reference: np.ndarray) -> tuple[dict[str, float], list[str]]:
    """Top-1 agreement and the largest score change of two (texts, labels) score matrices."""
    figures = {
        "top1_agreement": float((candidate.argmax(axis=1) == reference.argmax(axis=1)).mean()),
        "score_delta_max": float(np.abs(candidate - reference).max(initial=0.0)),
    }
    failures = []
    if not figures["top1_agreement"] >= LABEL_AGREEMENT_AT_LEAST:
        failures.append(f"top-1 label agreement {figures['top1_agreement']:.4f} < {LABEL_AGREEMENT_AT_LEAST}")
    return figures, failures + _score_delta(figures["score_delta_max"])


def judge_entities(candidate: list[list[Any]], reference: list[list[Any]]) -> tuple[dict[str, float], list[str]]:
    """Of the spans either side finds per text (label, start, end), the share both find; their largest score change."""
    both = either = 0
    delta = 0.0
    for found, expected in zip(candidate, reference):
        ours = {(e.label, e.start, e.end): e.score for e in found}
        theirs = {(e.label, e.start, e.end): e.score for e in expected}
        shared = ours.keys() & theirs.keys()
        both, either = both + len(shared), either + len(ours.keys() | theirs.keys())
        delta = max([delta, *(abs(ours[span] - theirs[span]) for span in shared)])
    figures = {"span_agreement": both / either if either else 1.0, "score_delta_max": delta}
    failures = []
    if not figures["span_agreement"] >= SPAN_AGREEMENT_AT_LEAST:
        failures.append(f"span agreement {figures['span_agreement']:.4f} < {SPAN_AGREEMENT_AT_LEAST}")
    return figures, failures + _score_delta(delta)


def _score_delta(delta: float) -> list[str]:
    return [] if delta <= SCORE_DELTA_AT_MOST else [f"a score moved by {delta:.4f} > {SCORE_DELTA_AT_MOST}"]


# How a kind's outputs are held to fp32's: the measure its gate names (configs/kinds, `Gate.measure`).
MEASURES: dict[str, Callable[[Any, Any], tuple[dict[str, float], list[str]]]] = {
    "cosine": judge_vectors,
    "kendall": judge_scores,
    "labels": judge_labels,
    "spans": judge_entities,
}


class PrecisionGate:
    """Checks candidates for one model against its fp32 torch runtime, loaded once.

    Only what can change a verdict is computed: a candidate refused on cosine (or tau) is not run over
    the judged set, and fp32's own nDCG@10 is computed when the first candidate needs it, so the gate
    holds the reference while it lives.
    """

    def __init__(
        self, spec: ModelSpec, plan, texts: list[str], judged_set: str | None = JUDGED_SET, reference=None
    ) -> None:
        """`reference`: fp32 torch already loaded by the caller (auto's timing), used instead of loading another."""
        from ...workers.runtimes import load_runtime

        gate = kind_of(spec).gate
        if gate is None:
            gated = ", ".join(kind.name for kind in KINDS if kind.gate)
            raise ValueError(f"model {spec.name!r}: the precision gate checks {gated}, not {spec.kind!r}")
        self.spec, self.plan, self.texts, self.gate = spec, plan, texts, gate
        self._load = load_runtime
        self.judged: RetrievalSet | None = load_beir(judged_set) if judged_set and gate.retrieval else None
        self.reference = reference if reference is not None else self._runtime(REFERENCE)[0]
        self.reference_outputs, self.reference_rate = self._outputs(self.reference)
        self._reference_ndcg: float | None = None

    def check(self, choice: RuntimeChoice, runtime=None) -> Verdict:
        """`choice`'s verdict; `runtime`, when given, is `choice` already loaded (closed here all the same)."""
        load_seconds = 0.0
        if runtime is None:
            runtime, load_seconds = self._runtime(choice)
        try:
            outputs, rate = self._outputs(runtime)
            verdict = Verdict(
                self.spec.name,
                choice,
                texts=len(self.texts),
                load_seconds=load_seconds,
                texts_per_second=rate,
                reference_texts_per_second=self.reference_rate,
            )
            judged = MEASURES[self.gate.measure](outputs, self.reference_outputs)
            parts = [judged]
            if self.judged is not None and not judged[1]:  # refused on the sample: retrieval cannot save it
                parts.append(judge_retrieval(self._ndcg(runtime, self.judged), self.reference_ndcg()))
        finally:
            runtime.close()
        for figures, failures in parts:
            verdict.figures.update(figures)
            verdict.failures.extend(failures)
        return verdict

    def reference_ndcg(self) -> float:
        """fp32 torch's nDCG@10 on the judged set, computed once, when a candidate first needs it."""
        assert self.judged is not None
        if self._reference_ndcg is None:
            self._reference_ndcg = self._ndcg(self.reference, self.judged)
        return self._reference_ndcg

    def _runtime(self, choice: RuntimeChoice):
        import time

        if self.spec.adapter is not None and choice.runtime != "torch":  # base_of would run torch regardless
            raise ValueError(
                f"model {self.spec.name!r} is a LoRA adapter: it runs on its base's torch model, not {choice.runtime}"
            )

        spec = self.spec.model_copy(update={"runtimes": {self.plan.kind: choice}})
        began = time.perf_counter()
        runtime = self._load(spec, self.plan)
        return runtime, time.perf_counter() - began

    def _outputs(self, runtime) -> tuple[Any, float]:
        """The runtime's vectors (scores, entities) on the sample, and its rate in texts per second."""
        import time

        began = time.perf_counter()
        outputs = self.gate.outputs(runtime, self.texts)
        return outputs, len(self.texts) / max(time.perf_counter() - began, 1e-9)

    @staticmethod
    def _ndcg(runtime, judged: RetrievalSet) -> float:
        corpus_ids = [str(i) for i in judged.corpus.column("id").to_pylist()]
        corpus = runtime.embed([str(t or "") for t in judged.corpus.column("text").to_pylist()])[0]
        query_ids = [str(i) for i in judged.queries.column("id").to_pylist()]
        queries = runtime.embed([str(t or "") for t in judged.queries.column("text").to_pylist()])[0]
        nearest, _ = top_k(queries, corpus, 10)
        rankings = {q: [corpus_ids[j] for j in row] for q, row in zip(query_ids, nearest)}
        return evaluate(rankings, judged.qrels)["ndcg@10"]


def candidates(device_kind: str, kind: str = DEFAULT.name) -> list[RuntimeChoice]:
    """What the gate and `shoal tune` try for a model of `kind` on this kind of device, fastest-looking last:
    torch's dtypes, then on a CPU the kind's ONNX runtime, if it has one, in fp32 and int8."""
    dtypes: tuple[RuntimeDType, ...] = (
        ("float32", "float16", "bfloat16") if device_kind == "cuda" else ("float32", "bfloat16")
    )
    choices = [RuntimeChoice(runtime="torch", dtype=d) for d in dtypes]
    if device_kind != "cuda" and "onnx" in kind_of(kind).runtimes:
        choices += [RuntimeChoice(runtime="onnx", dtype="float32"), RuntimeChoice(runtime="onnx", dtype="int8")]
    return choices
