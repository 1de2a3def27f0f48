"""Sparse encoders (SPLADE): each text's weight per vocabulary term, kept as its non-zero terms.

Recognised from a sentence-transformers ``SparseEncoder`` folder (its
``model_type``, or modules of ``sparse_encoder``); its width is the
vocabulary's. Its operation is ``sparse``: `shoal embed` of a sparse model
(``--top-k`` keeps each row's largest terms) and ``POST /v1/sparse/{model}``
``{"texts", "truncate", "top_k"}`` -> ``{"model", "sparse": [{"indices",
"values"}], "usage"}``: each text's term ids (int32, ascending) and weights
(float32), raw little-endian bytes in MessagePack, lists in JSON. The gate
compares every term's weight (zeros where a row has none) by cosine.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import request_options
from .kind import Body, Fields, Gate, Kind, Route


def recognises(files: Any) -> bool:
    stated = files.stated().get("model_type") == "SparseEncoder"
    return stated or any(".sparse_encoder." in t for t in files.module_types())


def parse(options: Body, fields: Fields, spec: Any) -> None:
    request_options.top_k(options, fields)


def answer(fields: Fields, result: Any, binary: bool) -> dict[str, Any]:
    rows = result["outputs"]
    if not binary:
        rows = [
            {
                "indices": np.frombuffer(row["indices"], "<i4").tolist(),
                "values": np.frombuffer(row["values"], "<f4").tolist(),
            }
            for row in rows
        ]
    return {"sparse": rows, "usage": request_options.tokens(result)}


def weights(runtime: Any, texts: list[str]) -> np.ndarray:
    """Every term's weight per text, zero where a text has none: what the gate compares."""
    outputs = np.zeros((len(texts), runtime.spec.dim), dtype=np.float32)
    for row, (terms, values) in zip(outputs, runtime.sparse(texts)[0]):
        row[terms] = values
    return outputs


KIND = Kind(
    name="sparse",
    command="embed",
    operations={"sparse": "shoal.workers.operations.sparse_operation"},
    runtimes={"torch": "shoal.workers.runtimes.sparse_encoder:SparseEmbedder"},
    recognises=recognises,
    width=lambda files: files.vocabulary(),
    options=frozenset({"chunk", "prompt", "top_k"}),
    route=Route("give sparse vectors", frozenset({"top_k"}), parse, answer),
    gate=Gate("cosine", weights),
)
