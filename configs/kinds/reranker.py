"""Rerankers (cross-encoders): one score per (query, passage) pair.

Recognised from a sentence-transformers ``CrossEncoder`` folder, or a bare
``*ForSequenceClassification`` one with a single label (a bare cross-encoder;
named labels make it a classifier). Its operation is ``rerank``: the batch op
(`shoal rerank`), and online ``/v1/rerank`` and Cohere's ``/v1|v2/rerank``
(the gateway's API formats). Runs on torch or ONNX Runtime; the gate holds a
candidate's scores to fp32's by Kendall's tau.
"""

from __future__ import annotations

from typing import Any

from .kind import Gate, Kind

RUNTIMES = "shoal.workers.runtimes"


def recognises(files: Any) -> bool:
    if files.stated().get("model_type") == "CrossEncoder":
        return True
    return not files.module_types() and files.sequence_classifier() and files.labels() == 1


def scores(runtime: Any, texts: list[str]) -> Any:
    """Each text scored against the one before it, as (query, passage) pairs: what the gate compares and times."""
    return runtime.score(texts[1:] + texts[:1], texts)[0]


KIND = Kind(
    name="reranker",
    command="rerank",
    operations={"rerank": "shoal.workers.operations.rerank_operation"},
    api="rerank",
    runtimes={
        "torch": f"{RUNTIMES}.cross_encoder:CrossEncoderScorer",
        "onnx": f"{RUNTIMES}.onnx_runtime:OnnxCrossEncoder",
    },
    tunable=True,
    recognises=recognises,
    adapters=True,
    width=lambda files: files.labels(),
    gate=Gate("kendall", scores),
)
