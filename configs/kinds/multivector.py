"""Multi-vector encoders (ColBERT): one vector per token of each text.

Recognised from sentence-transformers' ``MultiVectorEncoder`` or PyLate's
``ColBERT`` (its ``model_type`` or ``skiplist_words``), modules of
``multi_vector_encoder``, or a transformer and a Dense projection with no
pooling. Its operation is ``multivector``: `shoal embed` of such a model
(``--input-type query`` encodes queries; its input type picks its prefix, so
it takes no prompt) and ``POST /v1/multivector/{model}`` ``{"texts",
"truncate", "input_type", "dtype", "precision", "dim", "ranges"}`` ->
``{"model", "dtype", "embeddings", "shapes", "usage"}``: each text's (tokens,
dim) matrix, raw bytes in MessagePack, nested lists in JSON. The gate compares
every token's vector by cosine (both sides tokenize alike).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import request_options
from .embedder import WIRE_DTYPES
from .kind import Body, Fields, Gate, InvalidRequest, Kind, Route


def recognises(files: Any) -> bool:
    """One vector per token: sentence-transformers' MultiVectorEncoder, or PyLate's ColBERT (its model_type,
    its skiplist, or a transformer and a Dense projection with no pooling)."""
    stated, types = files.stated(), files.module_types()
    if stated.get("model_type") in ("MultiVectorEncoder", "ColBERT") or "skiplist_words" in stated:
        return True
    if any(".multi_vector_encoder." in t for t in types):
        return True
    projected = any(t.endswith("Transformer") for t in types) and any(t.endswith("Dense") for t in types)
    return projected and not any(t.endswith("Pooling") for t in types)


def parse(options: Body, fields: Fields, spec: Any) -> None:
    input_type = options.get("input_type", "document")
    if input_type not in ("query", "document"):
        raise InvalidRequest("invalid request: input_type must be 'query' or 'document', not {value}", input_type)
    fields["input_type"] = input_type


def answer(fields: Fields, result: Any, binary: bool) -> dict[str, Any]:
    precision = fields.get("precision", "float32")
    dtype = precision if precision != "float32" else fields.get("dtype", "float32")
    rows = result["outputs"]
    matrices: list[Any] = [row["embeddings"] for row in rows]
    if not binary:
        wire = WIRE_DTYPES[dtype]
        matrices = [
            np.frombuffer(row["embeddings"], wire)
            .reshape(row["shape"])
            .astype(np.float32 if wire[1] == "f" else wire)
            .tolist()
            for row in rows
        ]
    return {
        "dtype": dtype,
        "embeddings": matrices,
        "shapes": [row["shape"] for row in rows],
        "usage": request_options.tokens(result),
    }


def token_vectors(runtime: Any, texts: list[str]) -> np.ndarray:
    """Every token's vector, in order: what the gate compares."""
    return np.concatenate(runtime.multivector(texts)[0])


KIND = Kind(
    name="multivector",
    command="embed",
    operations={"multivector": "shoal.workers.operations.multivector_operation"},
    runtimes={"torch": "shoal.workers.runtimes.multi_vector:MultiVectorEmbedder"},
    recognises=recognises,
    normalizes=lambda files: files.normalize(),
    options=frozenset({"chunk", "vectors", "input_type"}),
    route=Route("give token vectors", frozenset({"input_type"}), parse, answer, vectors=True),
    gate=Gate("cosine", token_vectors),
)
