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
from shoal.workers.data.chunking import ChunkSettings, Windows
from shoal.workers.data.input_formats import read_input
from shoal.workers.data.parquet_slices import rejection, text_column
from shoal.workers.data.vector_precision import VectorFormat, compact
from shoal.workers.runtimes import Embedder

from .row_parts import row_texts, within_window, write_rows


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
    present, texts, windows = row_texts(
        data, runtime.tokenizer, _room_for_prompt(runtime, data) if data.chunk else None
    )
    vectors, truncated = runtime.embed(texts, prompt=data.prompt)
    return EmbedComputed(present, windows, vectors, truncated)


def _room_for_prompt(runtime: Embedder, data: EmbedInput) -> ChunkSettings:
    """The chunk settings with windows short enough that the prompt and a window fit the model's window together."""
    assert data.chunk is not None
    # What the prompt adds to a text's tokens (None: the model's default prompt).
    prompt_tokens = int(runtime.token_lengths([""], data.prompt)[0][0] - runtime.token_lengths([""], "")[0][0])
    return within_window(data.chunk, runtime.spec.max_seq_length, prompt_tokens)


def write(payload: EmbedPayload, data: EmbedInput, computed: EmbedComputed, spec: ModelSpec) -> ItemResult:
    fmt = VectorFormat(**payload.get("vectors", {}))
    stored = compact(computed.vectors, fmt)
    width = fmt.width(spec.dim)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(stored.reshape(-1), type=fmt.arrow_type()), width)
    return write_rows(payload, data, computed.present, computed.windows, computed.truncated, "embedding", embedding)
