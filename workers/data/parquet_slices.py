"""Reading an item's input slice and writing its output part, on any fsspec store.

Inputs are read straight from storage, only the columns an item needs and
only its row groups; parts are written atomically (see storage). The pieces
every operation's part and ack have in common are here too: the columns that
identify each output row, the kept columns and stamp, where a rejected row
is, and the ack's common fields.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import ItemResult, SlicePayload, StorageOptions
from .storage import atomic_write, open_fs

REPORTED_REJECTIONS = 20  # rejected rows listed per part (ack and manifest); the count is always exact


class InputError(ValueError):
    """Bad input data: retrying cannot help, so the item goes to dead letters."""


def read_slice(payload: SlicePayload, columns: list[str]) -> pa.Table:
    """The item's rows of `columns` (the first is required to be there)."""
    url = payload["input"]
    fs, path = open_fs(url, payload.get("storage_options"))
    try:
        with fs.open(path, "rb") as f:
            parquet = pq.ParquetFile(f)
            names = parquet.schema_arrow.names
            missing = [c for c in columns if c not in names]
            if missing:
                raise InputError(f"{url}: no column {missing[0]!r} (columns are: {', '.join(names)})")
            first, last = payload.get("row_groups") or (0, parquet.num_row_groups)
            table = parquet.read_row_groups(list(range(first, last)), columns=columns)
    except InputError:
        raise
    except FileNotFoundError as exc:
        raise InputError(f"{url}: file not found") from exc
    except pa.ArrowInvalid as exc:
        raise InputError(f"{url}: not a readable Parquet file: {exc}") from exc
    except OSError as exc:
        # Storage trouble or a damaged file body: worth a retry; after the
        # job's max attempts it lands in dead letters with this message.
        raise OSError(f"{url}: cannot read: {exc}") from exc
    rows = payload.get("rows")
    if rows is not None:
        table = table.slice(rows[0], rows[1] - rows[0])
    return table


def text_column(table: pa.Table, name: str, url: str, invalid: dict[int, str] | None = None) -> list[str | None]:
    """The text column as Python strings (None for nulls), or a clear error.

    Parquet writers do not all check that strings are UTF-8. A value that is
    not becomes None here and `invalid[row]` says why, so one bad row is
    reported (the caller's rejection) instead of failing its whole item on
    every retry; without `invalid` the first such row is an `InputError`.
    """
    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise InputError(f"{url}: column {name!r} has type {column.type}, expected strings")
    try:
        return column.to_pylist()
    except UnicodeDecodeError:  # rare: decode row by row to find the bad ones
        pass
    raw = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary()).to_pylist()
    texts: list[str | None] = []
    for row, value in enumerate(raw):
        try:
            texts.append(None if value is None else value.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problem = f"not valid UTF-8 (byte 0x{value[exc.start]:02x} at offset {exc.start})"
            if invalid is None:
                raise InputError(f"{url}: column {name!r}, row {row} of the slice: {problem}") from None
            invalid[row] = problem
            texts.append(None)
    return texts


def write_part(url: str, table: pa.Table, storage_options: StorageOptions | None) -> int:
    """Write `table` as one Parquet object at `url`, atomically; returns its size."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    atomic_write(url, buffer.getvalue(), storage_options)
    return buffer.tell()


def first_row(payload: SlicePayload) -> int:
    """The row of the input file where the item's slice starts (0 for an item of whole row groups)."""
    return (payload.get("row_range") or [0, 0])[0]


def rejection(payload: SlicePayload, row: int, column: str, problem: str) -> str:
    """`file row N, column C: problem`, with N counted within the file, for a row that gets no result.

    A text input's row is named by its line (see input_formats), as an editor shows it.
    """
    where = f"line {payload['first_line'] + row}" if "first_line" in payload else f"row {first_row(payload) + row}"
    return f"{payload['input']} {where}, column {column!r}: {problem}"


def identity_columns(payload: SlicePayload, source: pa.Table, rows: np.ndarray) -> dict[str, pa.Array]:
    """What identifies each output row: the id column when the job names one, else its source file and row.

    `source`: the input rows aligned with the output rows; `rows`: their
    indices within the slice.
    """
    id_col = payload.get("id_column")
    if id_col:
        return {id_col: source.column(id_col)}
    return {
        "source_file": pa.DictionaryArray.from_arrays(
            pa.array(np.zeros(len(rows), dtype=np.int32)), pa.array([payload["input"]])
        ),
        "source_row": pa.array(first_row(payload) + np.asarray(rows, dtype=np.int64)),
    }


def part_table(payload: SlicePayload, columns: dict[str, pa.Array], source: pa.Table) -> pa.Table:
    """The part: `columns`, then the kept input columns, with the item's stamp in its metadata.

    The stamp (input version, model fingerprint, options) lets a re-run trust
    this part (see pipeline/jobs/resume).
    """
    for name in payload.get("keep_columns", []):
        if name not in columns:
            columns[name] = source.column(name)
    return pa.table(columns).replace_schema_metadata(payload.get("part_metadata"))


def part_ack(payload: SlicePayload, size: int, rejections: list[str], counts: ItemResult) -> ItemResult:
    """The result sent with the item's ack: where its part is, its counts (`rows` among them), the first rejections."""
    return {
        **counts,
        "part": payload["part"],
        "input": payload["input"],
        "row_range": payload.get("row_range"),
        "bytes": size,
        "rejected": len(rejections),
        "rejections": rejections[:REPORTED_REJECTIONS],
    }
