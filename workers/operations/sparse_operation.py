"""The `sparse` operation: one SPLADE vector per row (or per window), as its non-zero terms.

Stored as ``list<struct<index: int32, value: float32>>`` in term-id order:
one column, so a row's ids and weights cannot drift apart, a null text is
one null, and each row reads as the {indices, values} pairs that search
engines take a sparse vector in (Qdrant's and Milvus's sparse vectors,
Elasticsearch's and OpenSearch's term weights) with no second column to
keep aligned. `top_k` keeps each row's largest weights (the model's own
``max_active_dims`` when absent). Online, `online` answers a group of
requests with one model call: each text's term ids and weights as raw
little-endian int32 and float32 bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ItemResult, KindPayload, OnlineResult, TextsPayload
from ..data.chunking import Windows
from ..runtimes.sparse_encoder import SparseEmbedder, SparseRow
from .embed_operation import read as read_texts
from .online_texts import answer_texts
from .row_parts import KindInput, row_texts, within_window, write_rows

TERM = pa.struct([("index", pa.int32()), ("value", pa.float32())])
SparseComputed = tuple[list[int], list[SparseRow], int, Windows | None]


def read(payload: KindPayload) -> KindInput[KindPayload]:
    return KindInput(read_texts(payload), payload)


def compute(runtime: SparseEmbedder, data: KindInput[KindPayload]) -> SparseComputed:
    chunk = data.rows.chunk
    if chunk:
        chunk = within_window(chunk, runtime.spec.max_seq_length, runtime.prompt_tokens(data.rows.prompt))
    present, texts, windows = row_texts(data.rows, runtime.tokenizer, chunk)
    rows, truncated = runtime.sparse(texts, data.payload.get("top_k"), data.rows.prompt)
    return present, rows, truncated, windows


def sparse_column(rows: list[SparseRow]) -> pa.Array:
    """One list of terms per row."""
    lengths = np.fromiter((len(index) for index, _ in rows), dtype=np.int32, count=len(rows))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    index = np.concatenate([r[0] for r in rows]) if rows else np.zeros(0, np.int32)
    value = np.concatenate([r[1] for r in rows]) if rows else np.zeros(0, np.float32)
    terms = pa.StructArray.from_arrays([pa.array(index, pa.int32()), pa.array(value, pa.float32())], fields=list(TERM))
    return pa.ListArray.from_arrays(pa.array(offsets), terms)


def write(payload: KindPayload, data: KindInput[KindPayload], computed: SparseComputed, spec: ModelSpec) -> ItemResult:
    present, rows, truncated, windows = computed
    return write_rows(payload, data.rows, present, windows, truncated, "sparse", sparse_column(rows))


def online(runtime: SparseEmbedder, payloads: list[TextsPayload]) -> list[OnlineResult]:
    """{"texts", "truncate"[, "top_k"]} per request -> {"outputs": [{"indices", "values"}] per text, "tokens"}."""
    return answer_texts(
        runtime,
        payloads,
        _top_k,
        lambda texts, measured, top_k, _: runtime.sparse(texts, top_k, measured=measured)[0],  # no adapters
        lambda payload, rows: {"outputs": [_wire(row) for row in rows]},
    )


def _top_k(payload: TextsPayload) -> int | None:
    return payload.get("top_k")


def _wire(row: SparseRow) -> dict[str, bytes]:
    return {"indices": row[0].astype("<i4").tobytes(), "values": row[1].astype("<f4").tobytes()}
