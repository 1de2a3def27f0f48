"""The `embed` operation: one input slice in, one output part out.

Split in three stages so the pull loop can overlap them: `read` (storage,
in an I/O thread), `compute` (the model, on the device thread), `write`
(storage again). Every input row gives exactly one output row: null texts
get a null embedding and are counted, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from configs import ModelSpec

from .parquet_slices import REPORTED_REJECTIONS, read_slice, text_column, write_part


@dataclass
class EmbedInput:
    table: pa.Table
    texts: list[str | None]
    invalid: dict[int, str] = field(default_factory=dict)  # row -> why its text cannot be read


def read(payload: dict[str, Any]) -> EmbedInput:
    text_col = payload["text_column"]
    columns = [text_col]
    for name in [payload.get("id_column"), *payload.get("keep_columns", [])]:
        if name and name not in columns:
            columns.append(name)
    table = read_slice(payload, columns)
    invalid: dict[int, str] = {}
    texts = text_column(table, text_col, payload["input"], invalid)
    return EmbedInput(table, texts, invalid)


def compute(runtime, data: EmbedInput) -> dict[str, Any]:
    present = [i for i, text in enumerate(data.texts) if text is not None]
    vectors, truncated = runtime.embed([data.texts[i] for i in present])
    return {"present": present, "vectors": vectors, "truncated": truncated}


def write(payload: dict[str, Any], data: EmbedInput, computed: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    rows, dim = data.table.num_rows, spec.dim
    flat = np.zeros((rows, dim), dtype=np.float32)
    valid = np.zeros(rows, dtype=bool)
    flat[computed["present"]] = computed["vectors"]
    valid[computed["present"]] = True
    mask = None if valid.all() else pa.array(~valid)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), dim, mask=mask)
    columns: dict[str, pa.Array] = {}
    id_col = payload.get("id_column")
    if id_col:
        columns[id_col] = data.table.column(id_col)
    else:  # no id column: where each row came from identifies it
        first = (payload.get("row_range") or [0, 0])[0]
        columns["source_file"] = pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(rows, dtype=np.int32)), pa.array([payload["input"]])
        )
        columns["source_row"] = pa.array(np.arange(first, first + rows, dtype=np.int64))
    columns["embedding"] = embedding
    for name in payload.get("keep_columns", []):
        if name != id_col and name != "embedding":
            columns[name] = data.table.column(name)
    # The stamp (input version, model fingerprint, options) lets a re-run trust this part.
    table = pa.table(columns).replace_schema_metadata(payload.get("part_metadata"))
    size = write_part(payload["output"], table, payload.get("storage_options"))
    empty = sum(1 for t in data.texts if t is not None and not t.strip())
    first = (payload.get("row_range") or [0, 0])[0]
    rejections = [  # kept with a null embedding, like a null text, but reported: the job exits 1
        f"{payload['input']} row {first + row}, column {payload['text_column']!r}: {problem}"
        for row, problem in sorted(data.invalid.items())
    ]
    return {
        "rows": rows,
        "part": payload["part"],
        "input": payload["input"],
        "row_range": payload.get("row_range"),
        "bytes": size,
        "null_texts": rows - len(computed["present"]) - len(rejections),
        "empty_texts": empty,
        "truncated": computed["truncated"],
        "rejected": len(rejections),
        "rejections": rejections[:REPORTED_REJECTIONS],
    }

