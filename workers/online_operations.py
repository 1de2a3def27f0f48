"""Online operations: every request of one pull answered by one model call.

The pull loop hands a whole online group (what queued while the last group
ran) to one of these functions, on the device thread. The texts of all
requests go through the runtime together, so its token-budget batching sorts
and packs them; each request then gets its own slice. A request that cannot be
answered (too long with truncation off) gets an error result with an HTTP
status; the others in its group are still answered.

Results travel back through the scheduler, so vectors are raw little-endian
bytes with their shape, never lists of floats.
"""

from __future__ import annotations

from typing import Any

import numpy as np

WIRE_DTYPES = {"float32": "<f4", "float16": "<f2"}


def _too_long(limit: int) -> dict[str, Any]:
    return {"error": f"an input is longer than the model's {limit} tokens and truncate is off", "status": 422}


def encode(runtime, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """{"texts", "truncate", "dtype"} per request -> {"embeddings", "shape", "dtype", "tokens"}."""
    results: list[dict[str, Any]] = [{} for _ in payloads]
    answered, texts = [], []
    for i, payload in enumerate(payloads):
        if not payload.get("truncate", True) and runtime.token_lengths(payload["texts"])[1]:
            results[i] = _too_long(runtime.spec.max_seq_length)
            continue
        answered.append(i)
        texts.extend(payload["texts"])
    if not texts:
        return results
    measured = runtime.token_lengths(texts)
    lengths = measured[0]
    vectors, _ = runtime.embed(texts, measured)
    start = 0
    for i in answered:
        payload = payloads[i]
        end = start + len(payload["texts"])
        dtype = payload.get("dtype", "float32")
        results[i] = {
            "embeddings": np.ascontiguousarray(vectors[start:end], dtype=WIRE_DTYPES[dtype]).tobytes(),
            "shape": [end - start, vectors.shape[1]],
            "dtype": dtype,
            "tokens": int(lengths[start:end].sum()),
        }
        start = end
    return results


def score(runtime, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """{"query", "documents", "truncate"} per request -> {"scores" (document order), "tokens"}."""
    if not hasattr(runtime, "score"):
        return [{"error": f"model {runtime.spec.name!r} cannot score pairs", "status": 501} for _ in payloads]
    results: list[dict[str, Any]] = [{} for _ in payloads]
    answered, queries, documents = [], [], []
    for i, payload in enumerate(payloads):
        pair_queries = [payload["query"]] * len(payload["documents"])
        if not payload.get("truncate", True) and runtime.token_lengths(pair_queries, payload["documents"])[1]:
            results[i] = _too_long(runtime.spec.max_seq_length)
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
