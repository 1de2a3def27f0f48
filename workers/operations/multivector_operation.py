"""The `multivector` operation: one vector per token of each row (or window), ColBERT-style.

Stored as ``list<fixed_size_list<T, dim>>``: each row is its kept tokens'
vectors in token order (padding and skiplist tokens already dropped by the
model), in the precision and dimension dense vectors take (vector_precision:
float32, float16, int8/uint8 with the job's calibrated ranges, binary
packed; a Matryoshka cut re-normalizes each token's vector). One column,
so a row's vectors and their count cannot drift apart: what LanceDB's
multivector columns and Qdrant's multivectors take. The payload's
`input_type` picks ColBERT's document encoding (the default: a corpus) or
its query encoding (the query prefix, expansion to the query length).
Online, `online` answers a group of requests with one call per input type:
each text's matrix as raw little-endian bytes with its shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pyarrow as pa

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import EncodePayload, ItemResult, KindPayload, OnlineResult, TextsPayload
from ..data.chunking import Windows
from ..data.vector_precision import VectorFormat, compact
from ..runtimes.multi_vector import InputType, MultiVectorEmbedder
from .embed_operation import read as read_texts
from .online_texts import answer_texts, encoded
from .row_parts import KindInput, row_texts, within_window, write_rows


@dataclass
class MultiComputed:
    present: list[int]  # the rows with a text, in order: one matrix each (or one per window)
    windows: Windows | None
    rows: list[np.ndarray]  # (tokens, dim) float32 per text computed
    truncated: int


def read(payload: KindPayload) -> KindInput[KindPayload]:
    return KindInput(read_texts(payload), payload)


def compute(runtime: MultiVectorEmbedder, data: KindInput[KindPayload]) -> MultiComputed:
    input_type = data.payload.get("input_type", "document")
    chunk = data.rows.chunk
    if chunk:
        chunk = within_window(chunk, runtime.spec.max_seq_length, runtime.prompt_tokens(input_type))
    present, texts, windows = row_texts(data.rows, runtime.tokenizer, chunk)
    rows, truncated = runtime.multivector(texts, input_type)
    return MultiComputed(present, windows, rows, truncated)


def multivector_column(rows: list[np.ndarray], fmt: VectorFormat, dim: int) -> pa.Array:
    """One list of stored vectors per row."""
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    stored = compact(np.concatenate(rows) if rows else np.zeros((0, dim), np.float32), fmt)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(stored.reshape(-1), type=fmt.arrow_type()), fmt.width(dim))
    return pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32()), vectors)


def write(payload: KindPayload, data: KindInput[KindPayload], computed: MultiComputed, spec: ModelSpec) -> ItemResult:
    column = multivector_column(computed.rows, VectorFormat(**payload.get("vectors", {})), spec.dim)
    return write_rows(payload, data.rows, computed.present, computed.windows, computed.truncated, "embedding", column)


def online(runtime: MultiVectorEmbedder, payloads: list[TextsPayload]) -> list[OnlineResult]:
    """{"texts", "truncate"[, "input_type", "dtype", "precision", "dim", "ranges"]} per request
    -> {"outputs": [{"embeddings", "shape"}] per text, "tokens"}."""
    return answer_texts(
        runtime,
        payloads,
        _input_type,
        lambda texts, measured, input_type, _: runtime.multivector(texts, input_type, measured)[0],  # no adapters
        _answer,
        runtime.token_lengths,
    )


def _input_type(payload: TextsPayload) -> InputType:
    return payload.get("input_type", "document")


def _answer(payload: TextsPayload, rows: Sequence[np.ndarray]) -> OnlineResult:
    """Every text's vectors in the request's format (as `encode` stores them), cut apart per text."""
    result = encoded(np.concatenate(rows), cast(EncodePayload, payload))
    if "error" in result:
        return result
    data, width = result["embeddings"], result["shape"][1]
    per_vector = len(data) // max(1, result["shape"][0])
    cuts = np.concatenate([[0], np.cumsum([len(row) for row in rows])]) * per_vector
    outputs = [{"embeddings": data[a:b], "shape": [len(row), width]} for a, b, row in zip(cuts, cuts[1:], rows)]
    return {"outputs": outputs}  # the dtype is the request's: the gateway names it (kind_routes)
