"""The `embed` operation: one input slice in, one output part out.

Split in three stages so the pull loop can overlap them: `read` (storage,
in an I/O thread), `compute` (the model, on the device thread), `write`
(storage again). Every input row gives exactly one output row (with a
`chunk` setting: one row per window of its text, see chunking): null texts
get a null embedding and are counted, never dropped. Vectors are stored in
the item's format (see vector_precision): float32 unless asked otherwise.
Online, `online` answers a group of requests (``/v1/encode``, OpenAI's
``/v1/embeddings``) in one model call per prompt: each request's vectors as
raw little-endian bytes with their shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ...configs import ModelSpec
from ...configs.prompts import PromptError
from ...scheduler_plugins.protocol import EmbedPayload, EncodePayload, ItemResult, OnlineResult
from ..data.chunking import ChunkSettings, Windows
from ..data.input_formats import read_input
from ..data.parquet_slices import rejection, text_column
from ..data.vector_precision import VectorFormat, compact
from ..runtimes import Embedder
from .online_texts import encoded, input_adapters, too_long
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


def online(runtime: Embedder, payloads: list[EncodePayload]) -> list[OnlineResult]:
    """{"texts", "truncate", "dtype"[, "precision", "dim", "ranges", "prompt_name" or "prompt"]} per request
    -> {"embeddings", "shape", "dtype", "tokens"}.

    With a precision other than float32, "dtype" names it and the bytes are
    the quantized values (binary: packed bits), as a batch job stores them.
    Requests are run together per prompt text (configs/prompts.py; none
    given: the model's default), those for different LoRA adapters of one
    base too (each text through its request's `adapter`); an unknown prompt
    name is that request's 400.
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
        vectors, _ = runtime.embed(texts, measured, prompt, adapters=input_adapters(payloads, answered, "texts"))
        start = 0
        for i in answered:
            payload = payloads[i]
            end = start + len(payload["texts"])
            results[i] = encoded(vectors[start:end], payload)
            results[i]["tokens"] = int(lengths[start:end].sum())
            start = end
    return results
