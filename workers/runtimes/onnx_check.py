"""The check every ONNX export passes before it is cached: the graph must reproduce the torch fp32 model.

A traced graph can be wrong without an error: a tokenizer setting lost on
the way, a pooling that skips tokens, dropout left on. So the graph runs on a
few fixed texts, tokenized as a worker will tokenize them (onnx_tokenizer),
and its vectors or scores are compared with the torch model's own; and no
module of the model may be left in training mode (``torch.onnx.export``
restores the mode a wrapper had, so a wrapper not put in eval mode turns
dropout on in the shared model). An export that fails is never cached.

int8 graphs are not checked here: how far quantization moves the vectors is
the quality gate's question (pipeline/tuning/quality_gate.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...configs import ModelSpec
from .onnx_tokenizer import GraphTokenizer

# Short, long (truncated at max_seq_length), non-ASCII and empty-ish inputs: what tokenization gets wrong first.
CHECK_TEXTS = [
    "How do I read a Parquet file in chunks?",
    "a",
    "Numbers 3.14159, dates 2026-12-03, and symbols #@!% mixed in.",
    "Café naïve résumé — unicode déjà vu 東京 🚀",
    " ".join(["Long passages are truncated to the model's limit before they reach the graph."] * 60),
]
CHECK_MIN_COSINE = 0.9999  # fp32 graph against fp32 torch: only float reordering may differ
CHECK_MAX_SCORE_ERROR = 1e-3


class ExportCheckFailed(RuntimeError):
    """An exported graph that does not reproduce the torch model: never cached."""


@dataclass(frozen=True)
class CheckInputs:
    """What the export is traced on and checked with: texts, or (query, passage) pairs for a reranker."""

    first: list[str]
    second: list[str] | None = None  # the pairs' passages

    def feeds(self, tokenizer: GraphTokenizer, names: list[str], max_length: int) -> dict[str, np.ndarray]:
        """The graph's inputs, tokenized as a worker tokenizes them."""
        return tokenizer.graph_inputs(names, max_length, self.first, self.second)


TEXTS = CheckInputs(CHECK_TEXTS)
PAIRS = CheckInputs([CHECK_TEXTS[0]] * len(CHECK_TEXTS) + [CHECK_TEXTS[4]], CHECK_TEXTS + [CHECK_TEXTS[2]])


def check_export(
    spec: ModelSpec, model: Any, tokenizer: GraphTokenizer, names: list[str], graph: Path, inputs: CheckInputs
) -> None:
    """Raise `ExportCheckFailed` unless `graph` gives what the torch fp32 `model` gives on `inputs`.

    `model`: the SentenceTransformer or CrossEncoder the graph was traced
    from. Texts are checked without a prompt: a prompt is text the runtime
    prepends, never part of the graph.
    """
    import onnxruntime as ort

    check_eval(spec, model)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    got = session.run(None, inputs.feeds(tokenizer, names, spec.max_seq_length))[0]
    if inputs.second is not None:
        pairs = list(zip(inputs.first, inputs.second))
        expected = np.asarray(model.predict(pairs, batch_size=len(pairs), show_progress_bar=False), dtype=np.float32)
        error = float(np.abs(got.reshape(-1) - expected.reshape(-1)).max())
        if not error <= CHECK_MAX_SCORE_ERROR:
            raise ExportCheckFailed(
                f"model {spec.name!r}: the ONNX graph's scores differ from torch fp32 by up to {error:.2e} "
                f"(allowed {CHECK_MAX_SCORE_ERROR:.0e})"
            )
        return
    expected = model.encode(
        inputs.first,
        prompt="",
        batch_size=len(inputs.first),
        convert_to_numpy=True,
        normalize_embeddings=spec.normalize,
    )
    check_vectors(spec, got, expected)


def check_eval(spec: ModelSpec, model: Any) -> None:
    """No module of `model` may be left in training mode (dropout on) by the export."""
    left_training = [name or "(root)" for name, module in model.named_modules() if module.training]
    if left_training:
        raise ExportCheckFailed(f"model {spec.name!r}: export left modules in training mode: {left_training[:3]}")


def check_vectors(spec: ModelSpec, got: np.ndarray, expected: np.ndarray, what: str = "vectors") -> None:
    """The graph's vectors must be torch fp32's, row by row, up to float reordering (CHECK_MIN_COSINE)."""
    cosine = np.sum(got * expected, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    if got.shape != expected.shape or not float(cosine.min()) >= CHECK_MIN_COSINE:
        raise ExportCheckFailed(
            f"model {spec.name!r}: the ONNX graph does not reproduce torch fp32 {what} "
            f"(shape {got.shape} vs {expected.shape}, cosine min {float(cosine.min()):.6f}, "
            f"needed {CHECK_MIN_COSINE})"
        )
