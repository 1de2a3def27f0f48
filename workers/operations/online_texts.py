"""What every operation's `online` shares: a group of requests answered in few model calls.

A request whose texts are longer than
the model's window with truncation off gets its own 422, and the others are
still answered; the texts of every request that asks for the same options
(`options(payload)`: a top-k, an input type) go through the runtime in one
call, so its token-budget batching sorts and packs them across requests;
each request then gets its own slice of the answers, with its token count.
Requests for different LoRA adapters of one base share that call: each
text goes through its request's adapter (`adapter`, set by the worker's
online groups), in the same forward batches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from ...configs.kinds.embedder import WIRE_DTYPES
from ...scheduler_plugins.protocol import EncodePayload, OnlineResult, TextsPayload
from ..batching.token_batching import Measured
from ..data.vector_precision import VectorFormat, compact

A = TypeVar("A")  # one text's answer
K = TypeVar("K", bound=Hashable)  # the options requests share a call by
P = TypeVar("P", bound=TextsPayload)  # the operation's request


def answer_texts(
    runtime: Any,
    payloads: list[P],
    options: Callable[[P], K],
    compute: Callable[[list[str], Measured, K, list[str | None]], Sequence[A]],
    answer: Callable[[P, Sequence[A]], OnlineResult],
    measure: Callable[[list[str], K], Measured] | None = None,
) -> list[OnlineResult]:
    """One result per payload: `compute(texts, measured, options, adapters)` per options, `answer` per request.

    `measure(texts, options)` measures (default: ``runtime.token_lengths(texts)``); `measured` is passed on
    so no text is counted twice; `adapters`: each text's request's adapter (`input_adapters`).
    """
    measure = measure or (lambda texts, _: runtime.token_lengths(texts))
    results: list[OnlineResult] = [{} for _ in payloads]
    groups: dict[K, list[int]] = {}
    for i, payload in enumerate(payloads):
        key = options(payload)
        if not payload.get("truncate", True) and measure(payload["texts"], key)[1]:
            results[i] = too_long(runtime.spec.max_seq_length)
            continue
        groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        texts = [text for i in members for text in payloads[i]["texts"]]
        measured = measure(texts, key)
        answers = compute(texts, measured, key, input_adapters(payloads, members, "texts"))
        start = 0
        for i in members:
            end = start + len(payloads[i]["texts"])
            results[i] = answer(payloads[i], answers[start:end])
            results[i]["tokens"] = int(measured[0][start:end].sum())
            start = end
    return results


def input_adapters(payloads: Sequence[Any], members: list[int], inputs: str) -> list[str | None]:
    """The adapter of each input of the `members` requests (their `inputs` lists, in order): a mixed group's."""
    return [payloads[i].get("adapter") for i in members for _ in payloads[i][inputs]]


def too_long(limit: int) -> OnlineResult:
    return {"error": f"an input is longer than the model's {limit} tokens and truncate is off", "status": 422}


def encoded(vectors: np.ndarray, payload: EncodePayload) -> OnlineResult:
    """One request's vectors in its format: shortened and quantized if asked, else float32 or float16."""
    dim = payload.get("dim") or vectors.shape[1]
    if dim > vectors.shape[1]:
        return {"error": f"dim {dim} is more than the model gives ({vectors.shape[1]})", "status": 422}
    ranges = payload.get("ranges")
    if ranges is not None and len(ranges[0]) != dim:
        return {"error": f"ranges cover {len(ranges[0])} dimensions; the vectors have {dim}", "status": 422}
    fmt = VectorFormat(precision=payload.get("precision", "float32"), dim=payload.get("dim"), ranges=ranges)
    stored = compact(vectors, fmt)
    dtype = fmt.precision if fmt.precision != "float32" else payload.get("dtype", "float32")
    wire = WIRE_DTYPES.get(dtype, stored.dtype.str)
    return {
        "embeddings": np.ascontiguousarray(stored, dtype=wire).tobytes(),
        "shape": list(stored.shape),
        "dtype": dtype,
    }
