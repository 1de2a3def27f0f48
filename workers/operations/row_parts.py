"""One answer per input row, or per window of it: the part every text operation writes.

`embed`, `sparse`, `multivector` and the classifiers read a text column the
same way (embed_operation.read) and write the same part: the identity and
kept columns, one answer column, and, when the job chunks, one row per
token window with `chunk`, `start` and `end` (character offsets into the
source text). A row without a text (null, or rejected while reading) gets
a null answer, is counted, and is never dropped; a rejected one is listed,
so the job exits 1. A job with a Lance dataset writes the rows there and
the part is its marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np
import pyarrow as pa

from ...scheduler_plugins.protocol import EmbedPayload, ItemResult, KindPayload
from ..data.chunking import ChunkSettings, Windows, token_windows
from ..data.lance_fragments import write_fragment
from ..data.parquet_slices import identity_columns, part_ack, part_table, write_part

if TYPE_CHECKING:
    from .embed_operation import EmbedInput


P = TypeVar("P", bound=KindPayload)


@dataclass
class KindInput(Generic[P]):
    """What the other kinds' `read` gives: the item's texts, read as `embed` reads them, and its options."""

    rows: EmbedInput
    payload: P  # top_k, input_type, ...: what the operation's compute asks of the model


def row_texts(data: EmbedInput, tokenizer, chunk: ChunkSettings | None) -> tuple[list[int], list[str], Windows | None]:
    """The rows with a text, and what the model computes: their texts, or their token windows under `chunk`."""
    present = [i for i, text in enumerate(data.texts) if text is not None]
    texts = [text for text in data.texts if text is not None]
    windows = token_windows(tokenizer, texts, chunk) if chunk else None
    return present, windows.texts if windows else texts, windows


def within_window(chunk: ChunkSettings, window: int, prompt_tokens: int) -> ChunkSettings:
    """`chunk` with windows short enough that a prompt of `prompt_tokens` and a window fit `window` together."""
    room = max(1, window - prompt_tokens)
    if chunk.tokens <= room:
        return chunk
    return ChunkSettings(tokens=room, overlap=min(chunk.overlap, room - 1))


def output_rows(rows: int, present: list[int], windows: Windows | None) -> dict[str, np.ndarray]:
    """Per output row: its source row, its answer (-1: null text) and, when chunked, chunk, start, end."""
    present_rows = np.asarray(present, dtype=np.int64)
    if windows is None:  # one row per source row, in order
        answer = np.full(rows, -1, dtype=np.int64)
        answer[present_rows] = np.arange(len(present_rows))
        return {"source": np.arange(rows, dtype=np.int64), "answer": answer}
    absent = np.setdiff1d(np.arange(rows, dtype=np.int64), present_rows)
    none = np.zeros(len(absent), dtype=np.int64)
    source = np.concatenate([present_rows[windows.source], absent])
    chunk = np.concatenate([windows.chunk, none])
    order = np.lexsort((chunk, source))
    return {
        "source": source[order],
        "answer": np.concatenate([np.arange(len(windows.texts)), none - 1])[order],
        "chunk": chunk[order],
        "start": np.concatenate([windows.start, none])[order],
        "end": np.concatenate([windows.end, none])[order],
    }


def write_rows(
    payload: EmbedPayload,
    data: EmbedInput,
    present: list[int],
    windows: Windows | None,
    truncated: int,
    name: str,
    answers: pa.Array,
) -> ItemResult:
    """Write the item's part, `answers` (one per text computed, in order) as column `name`; its ack."""
    out = output_rows(data.table.num_rows, present, windows)
    null = out["answer"] < 0
    source = data.table.take(pa.array(out["source"])) if windows else data.table
    columns = identity_columns(payload, source, out["source"])
    if windows:  # null for a null text: it has no window
        columns["chunk"] = pa.array(out["chunk"].astype(np.int32), mask=null)
        columns["start"] = pa.array(out["start"], mask=null)
        columns["end"] = pa.array(out["end"], mask=null)
    columns[name] = answers.take(pa.array(out["answer"], mask=null))
    table = part_table(payload, columns, source)
    if payload.get("lance"):  # the rows go to a Lance fragment; the part is its marker
        table = write_fragment(payload["lance"], table, payload.get("storage_options"))
    size = write_part(payload["output"], table, payload.get("storage_options"))
    rejections = [data.invalid[row] for row in sorted(data.invalid)]
    counts: ItemResult = {
        "rows": len(out["source"]),
        "null_texts": data.table.num_rows - len(present) - len(rejections),
        "empty_texts": sum(1 for t in data.texts if t is not None and not t.strip()),
        "truncated": truncated,
        "chunks": len(windows.texts) if windows else 0,
    }
    return part_ack(payload, size, rejections, counts)
