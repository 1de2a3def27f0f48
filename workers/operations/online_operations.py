"""Online operations: every waiting request of one model answered by one model call.

The online groups (online_groups) hand a whole group (the requests of one
model and operation that waited for the round) to one of these functions, on
the device thread. The texts of all
requests go through the runtime together, so its token-budget batching sorts
and packs them; each request then gets its own slice. A request that cannot be
answered (too long with truncation off, an unknown prompt name) gets an error result with an HTTP
status; the others in its group are still answered.

Results travel back through the scheduler, so vectors are raw little-endian
bytes with their shape, never lists of floats.
"""

from __future__ import annotations

import numpy as np

from shoal.configs.prompts import PromptError
from shoal.scheduler_plugins.protocol import EncodePayload, OnlineResult, ScorePayload
from shoal.workers.data.vector_precision import VectorFormat, compact
from shoal.workers.runtimes import Embedder, Runtime, Scorer

WIRE_DTYPES = {"float32": "<f4", "float16": "<f2"}


def too_long(limit: int) -> OnlineResult:
    return {"error": f"an input is longer than the model's {limit} tokens and truncate is off", "status": 422}


def encode(runtime: Embedder, payloads: list[EncodePayload]) -> list[OnlineResult]:
    """{"texts", "truncate", "dtype"[, "precision", "dim", "ranges", "prompt_name" or "prompt"]} per request
    -> {"embeddings", "shape", "dtype", "tokens"}.

    With a precision other than float32, "dtype" names it and the bytes are
    the quantized values (binary: packed bits), as a batch job stores them.
    Requests are run together per prompt text (configs/prompts.py; none
    given: the model's default); an unknown prompt name is that request's 400.
    """
    results: list[OnlineResult] = [{} for _ in payloads]
    by_prompt: dict[str, list[int]] = {}
    for i, payload in enumerate(payloads):
        try:
            prompt = runtime.prompts.text(payload.get("prompt_name"), payload.get("prompt"))
        except PromptError as exc:
            results[i] = {"error": str(exc), "status": 400}
            continue
        if not payload.get("truncate", True) and runtime.token_lengths(payload["texts"], prompt)[1]:
            results[i] = too_long(runtime.spec.max_seq_length)
            continue
        by_prompt.setdefault(prompt, []).append(i)
    for prompt, answered in by_prompt.items():
        texts = [text for i in answered for text in payloads[i]["texts"]]
        measured = runtime.token_lengths(texts, prompt)
        lengths = measured[0]
        vectors, _ = runtime.embed(texts, measured, prompt)
        start = 0
        for i in answered:
            payload = payloads[i]
            end = start + len(payload["texts"])
            results[i] = encoded(vectors[start:end], payload)
            results[i]["tokens"] = int(lengths[start:end].sum())
            start = end
    return results


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


def score(runtime: Runtime, payloads: list[ScorePayload]) -> list[OnlineResult]:
    """{"query", "documents", "truncate"} per request -> {"scores" (document order), "tokens"}."""
    if not isinstance(runtime, Scorer):
        return [{"error": f"model {runtime.spec.name!r} cannot score pairs", "status": 501} for _ in payloads]
    results: list[OnlineResult] = [{} for _ in payloads]
    answered, queries, documents = [], [], []
    for i, payload in enumerate(payloads):
        pair_queries = [payload["query"]] * len(payload["documents"])
        if not payload.get("truncate", True) and runtime.token_lengths(pair_queries, payload["documents"])[1]:
            results[i] = too_long(runtime.spec.max_seq_length)
            continue
        answered.append(i)
        queries.extend(pair_queries)
        documents.extend(payload["documents"])
    if not queries:
        return results
    measured = runtime.token_lengths(queries, documents)
    lengths = measured[0]
    scores, _ = runtime.score(queries, documents, measured)
    start = 0
    for i in answered:
        end = start + len(payloads[i]["documents"])
        results[i] = {"scores": scores[start:end].astype(float).tolist(), "tokens": int(lengths[start:end].sum())}
        start = end
    return results
