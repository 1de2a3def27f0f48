"""The `classify` operation: labels and scores per row (or per window) from a sequence classifier.

Stored as ``labels: list<struct<label: string, score: float32>>``, best
first: the order and the values transformers' ``text-classification``
pipeline gives with ``top_k=None`` (its ties in label order), cut to
`top_k` labels and to those scoring at least `threshold`. One column, so a
row's labels and scores cannot drift apart and a null text is one null;
the top label is ``labels[1]`` in SQL, ``labels[0]`` in Arrow. With zero-shot
`labels` (an NLI model) the labels are the job's, scored as the
``zero-shot-classification`` pipeline scores them. Online, `online` (op `label`) answers
a group of requests in one model call per set of zero-shot options: each
text's labels as [{"label", "score"}], best first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ClassifyPayload, ClassifyTexts, ItemResult, OnlineResult
from ..batching.token_batching import Adapters, Measured
from ..data.chunking import Windows
from ..runtimes.classifier import DEFAULT_TEMPLATE, SequenceClassifier
from .embed_operation import read as read_texts
from .online_texts import answer_texts
from .row_parts import KindInput, row_texts, write_rows

LABEL = pa.struct([("label", pa.string()), ("score", pa.float32())])
Ranked = list[tuple[str, float]]  # one text's labels, best first
ClassifyComputed = tuple[list[int], list[Ranked], int, Windows | None]
ZeroShot = tuple[tuple[str, ...], str, bool]  # the labels, the hypothesis template, each label on its own


def read(payload: ClassifyPayload) -> KindInput:
    return KindInput(read_texts(payload), payload)


def compute(runtime: SequenceClassifier, data: KindInput) -> ClassifyComputed:
    present, texts, windows = row_texts(data.rows, runtime.tokenizer, data.rows.chunk)
    payload: ClassifyPayload = data.payload
    scores, names, truncated = score(runtime, texts, zero_shot_of(payload))
    return present, rank(scores, names, payload.get("top_k"), payload.get("threshold")), truncated, windows


def zero_shot_of(payload: ClassifyPayload | ClassifyTexts) -> ZeroShot | None:
    """The zero-shot options a job or request gives, or None: the model's own labels."""
    labels = payload.get("labels")
    if not labels:
        return None
    return tuple(labels), payload.get("template", DEFAULT_TEMPLATE), bool(payload.get("multi_label", False))


def score(
    runtime: SequenceClassifier,
    texts: list[str],
    zero_shot: ZeroShot | None,
    measured: Measured | None = None,
    adapters: Adapters = None,
) -> tuple[np.ndarray, list[str], int]:
    """(texts, labels) scores, the labels' names in column order, and how many texts were truncated;
    `adapters`: each text's LoRA adapter."""
    if zero_shot is None:
        scores, truncated = runtime.classify(texts, measured, adapters=adapters)
        return scores, runtime.labels, truncated
    labels, template, multi_label = zero_shot
    scores, truncated = runtime.zero_shot(texts, list(labels), template, multi_label, adapters=adapters)
    return scores, list(labels), truncated


def rank(scores: np.ndarray, names: list[str], top_k: int | None, threshold: float | None) -> list[Ranked]:
    """Each row's labels best first (ties in label order, as the pipeline sorts), cut to `top_k` and `threshold`."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :top_k]
    ranked = []
    for row, columns in zip(scores, order):
        kept = [(names[c], float(row[c])) for c in columns]
        ranked.append([pair for pair in kept if pair[1] >= threshold] if threshold is not None else kept)
    return ranked


def labels_column(rows: list[Ranked]) -> pa.Array:
    """One list of (label, score) per row."""
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows], dtype=np.int64)]).astype(np.int32)
    names = pa.array([name for row in rows for name, _ in row], pa.string())
    values = pa.array(np.fromiter((s for row in rows for _, s in row), dtype=np.float32), pa.float32())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays([names, values], fields=list(LABEL)))


def write(payload: ClassifyPayload, data: KindInput, computed: ClassifyComputed, spec: ModelSpec) -> ItemResult:
    present, ranked, truncated, windows = computed
    return write_rows(payload, data.rows, present, windows, truncated, "labels", labels_column(ranked))


def online(runtime: SequenceClassifier, payloads: list[ClassifyTexts]) -> list[OnlineResult]:
    """{"texts", "truncate"[, "top_k", "threshold", "labels", "template", "multi_label"]} per request
    -> {"outputs": [[{"label", "score"}, ...] per text, best first], "tokens"}.

    Zero-shot labels asked of a model without an entailment label are that request's 400; with truncation
    off, a zero-shot text is measured beside its longest hypothesis.
    """
    results: list[OnlineResult] = [
        {"error": f"model {runtime.spec.name!r} has no entailment label: it scores only its own labels", "status": 400}
        for _ in payloads
    ]
    asked = [i for i, payload in enumerate(payloads) if runtime.entailment is not None or not zero_shot_of(payload)]
    answered = answer_texts(
        runtime,
        [payloads[i] for i in asked],
        zero_shot_of,
        lambda texts, measured, zero_shot, adapters: _scored(runtime, texts, zero_shot, measured, adapters),
        _answer,
        lambda texts, zero_shot: _lengths(runtime, texts, zero_shot),
    )
    for i, result in zip(asked, answered):
        results[i] = result
    return results


def _lengths(runtime: SequenceClassifier, texts: list[str], zero_shot: ZeroShot | None) -> Measured:
    """Tokens per text, each beside its longest hypothesis when zero-shot: what truncation off is held to."""
    if zero_shot is None:
        return runtime.token_lengths(texts)
    labels, template, _ = zero_shot
    return runtime.zero_shot_lengths(texts, list(labels), template)


def _scored(
    runtime: SequenceClassifier,
    texts: list[str],
    zero_shot: ZeroShot | None,
    measured: Measured,
    adapters: list[str | None],
) -> list[tuple[np.ndarray, list[str]]]:
    """Each text's scores, with the names of their columns."""
    scores, names, _ = score(runtime, texts, zero_shot, measured, adapters)
    return [(row, names) for row in scores]


def _answer(payload: ClassifyTexts, rows: Sequence[tuple[np.ndarray, list[str]]]) -> OnlineResult:
    names = rows[0][1] if rows else []
    scores = np.stack([row for row, _ in rows]) if rows else np.zeros((0, 0), np.float32)
    ranked = rank(scores, names, payload.get("top_k"), payload.get("threshold"))
    return {"outputs": [[{"label": name, "score": value} for name, value in labels] for labels in ranked]}
