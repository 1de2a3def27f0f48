"""The `embed` operation: one input slice in, one output part out.

Split in three stages so the pull loop can overlap them: `read` (storage,
in an I/O thread), `compute` (the model, on the device thread), `write`
(storage again). Every input row gives exactly one output row (with a
`chunk` setting: one row per window of its text, see chunking): null texts
get a null embedding and are counted, never dropped. Vectors are stored in
the item's format (see vector_precision): float32 unless asked otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from shoal.configs import ModelSpec
from shoal.scheduler_plugins.protocol import EmbedPayload, ItemResult
from shoal.workers.data.chunking import ChunkSettings, Windows, token_windows
from shoal.workers.data.input_formats import read_input
from shoal.workers.data.lance_fragments import write_fragment
from shoal.workers.data.parquet_slices import identity_columns, part_ack, part_table, rejection, text_column, write_part
from shoal.workers.data.vector_precision import VectorFormat, compact
from shoal.workers.runtimes import Embedder


@dataclass
class EmbedInput:
    table: pa.Table
    texts: list[str | None]
    invalid: dict[int, str] = field(default_factory=dict)  # row -> why its text cannot be read
    chunk: ChunkSettings | None = None  # split texts into token windows (see chunking)
    prompt: str | None = None  # the job's prompt text (configs/prompts.py); None: the model's default


@dataclass
class EmbedComputed:
    present: list[int]  # the rows with a text, in order: one vector each (or one per window)
    windows: Windows | None  # the texts' token windows, when chunked
    vectors: np.ndarray
    truncated: int


def read(payload: EmbedPayload) -> EmbedInput:
    text_col = payload["text_column"]
    columns = [text_col]
    for name in [payload.get("id_column"), *payload.get("keep_columns", [])]:
        if name and name not in columns:
            columns.append(name)
    invalid: dict[int, str] = {}  # row -> why it has no vector, whole: file, line or row, column, problem
    table = read_input(payload, columns, invalid, strings=(text_col,))
    undecodable: dict[int, str] = {}
    texts = text_column(table, text_col, payload["input"], undecodable)
    invalid.update({row: rejection(payload, row, text_col, problem) for row, problem in undecodable.items()})
    chunk = ChunkSettings(**payload["chunk"]) if payload.get("chunk") else None
    return EmbedInput(table, texts, invalid, chunk, payload.get("prompt"))


def compute(runtime: Embedder, data: EmbedInput) -> EmbedComputed:
    present = [i for i, text in enumerate(data.texts) if text is not None]
    texts = [text for text in data.texts if text is not None]
    windows = token_windows(runtime.tokenizer, texts, _room_for_prompt(runtime, data)) if data.chunk else None
    vectors, truncated = runtime.embed(windows.texts if windows else texts, prompt=data.prompt)
    return EmbedComputed(present, windows, vectors, truncated)


def _room_for_prompt(runtime: Embedder, data: EmbedInput) -> ChunkSettings:
    """The chunk settings with windows short enough that the prompt and a window fit the model's window together."""
    assert data.chunk is not None
    # What the prompt adds to a text's tokens (None: the model's default prompt).
    prompt_tokens = int(runtime.token_lengths([""], data.prompt)[0][0] - runtime.token_lengths([""], "")[0][0])
    room = max(1, runtime.spec.max_seq_length - prompt_tokens)
    if data.chunk.tokens <= room:
        return data.chunk
    return ChunkSettings(tokens=room, overlap=min(data.chunk.overlap, room - 1))


def _output_rows(rows: int, present: list[int], windows: Windows | None) -> dict[str, np.ndarray]:
    """Per output row: its source row, its vector (-1: null text) and, when chunked, chunk, start, end."""
    present_rows = np.asarray(present, dtype=np.int64)
    if windows is None:  # one row per source row, in order
        vector = np.full(rows, -1, dtype=np.int64)
        vector[present_rows] = np.arange(len(present_rows))
        return {"source": np.arange(rows, dtype=np.int64), "vector": vector}
    absent = np.setdiff1d(np.arange(rows, dtype=np.int64), present_rows)
    none = np.zeros(len(absent), dtype=np.int64)
    source = np.concatenate([present_rows[windows.source], absent])
    chunk = np.concatenate([windows.chunk, none])
    order = np.lexsort((chunk, source))
    return {
        "source": source[order],
        "vector": np.concatenate([np.arange(len(windows.texts)), none - 1])[order],
        "chunk": chunk[order],
        "start": np.concatenate([windows.start, none])[order],
        "end": np.concatenate([windows.end, none])[order],
    }


def write(payload: EmbedPayload, data: EmbedInput, computed: EmbedComputed, spec: ModelSpec) -> ItemResult:
    fmt = VectorFormat(**payload.get("vectors", {}))
    out = _output_rows(data.table.num_rows, computed.present, computed.windows)
    rows, width, valid = len(out["source"]), fmt.width(spec.dim), out["vector"] >= 0
    stored = compact(computed.vectors, fmt)
    flat = np.zeros((rows, width), dtype=stored.dtype)
    flat[valid] = stored[out["vector"][valid]]
    mask = None if valid.all() else pa.array(~valid)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), type=fmt.arrow_type()), width, mask=mask)
    source = data.table.take(pa.array(out["source"])) if "chunk" in out else data.table
    columns = identity_columns(payload, source, out["source"])
    if "chunk" in out:  # null for a null text: it has no window
        null = ~valid
        columns["chunk"] = pa.array(out["chunk"].astype(np.int32), mask=null)
        columns["start"] = pa.array(out["start"], mask=null)
        columns["end"] = pa.array(out["end"], mask=null)
    columns["embedding"] = embedding
    table = part_table(payload, columns, source)
    if payload.get("lance"):  # the rows go to a Lance fragment; the part is its marker
        table = write_fragment(payload["lance"], table, payload.get("storage_options"))
    size = write_part(payload["output"], table, payload.get("storage_options"))
    # Kept with a null embedding, like a null text, but reported: the job exits 1.
    rejections = [data.invalid[row] for row in sorted(data.invalid)]
    counts: ItemResult = {
        "rows": rows,
        "null_texts": data.table.num_rows - len(computed.present) - len(rejections),
        "empty_texts": sum(1 for t in data.texts if t is not None and not t.strip()),
        "truncated": computed.truncated,
        "chunks": len(computed.windows.texts) if computed.windows else 0,
    }
    return part_ack(payload, size, rejections, counts)
