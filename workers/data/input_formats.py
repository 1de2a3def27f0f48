"""JSON Lines and CSV inputs: which files are which, where their rows are, and reading an item's rows.

A row is a line (of CSV, a line after the header). The planner reads each
text file once (`scan`) and keeps the byte offset of every INDEX_LINES-th
row, so an item is a newline-aligned byte range that its worker reads with
one ranged GET, and every row keeps the number Parquet would give it (its
`source_row`) and a line number for messages. A gzip stream cannot be read
from the middle: a `.gz` file is one item, read whole by one worker (split a
large corpus into several files to spread it).

A line that cannot be read (not JSON, the wrong number of CSV fields, empty,
or without a field the job reads) does not fail its item: its row comes back
all null and `rejected[row]` names the file, line and column, so the job
reports it and exits 1 while every other row is written. CSV values are read
as strings (CSV has no types; strings give every part the same schema), and
a quoted value must not hold a line break (as Spark's CSV default).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from ...scheduler_plugins.protocol import SlicePayload, StorageOptions
from .parquet_slices import InputError, read_slice
from .storage import open_fs

EXTENSIONS = {"parquet": (".parquet",), "jsonl": (".jsonl", ".jsonl.gz"), "csv": (".csv", ".csv.gz")}
INPUT_FORMATS = tuple(EXTENSIONS)
INDEX_LINES = 16  # an item starts at most this many lines before its first row
SCAN_BYTES = 8 << 20
SAMPLE_LINES = 1000  # JSON Lines: the fields of a file are those of its first lines
MIN_BLOCK = 1 << 20
ROW_IN_MESSAGE = re.compile(r"\s*in row (\d+)$")


def format_of(name: str) -> str | None:
    """The format a file's name says, or None."""
    return next((fmt for fmt, ends in EXTENSIONS.items() if name.endswith(ends)), None)


def is_gzip(name: str) -> bool:
    return name.endswith(".gz")


def header_lines(fmt: str) -> int:
    return 1 if fmt == "csv" else 0


@dataclass
class LineIndex:
    """Where a text file's rows are: what the planner needs to cut it into items."""

    rows: int
    offsets: np.ndarray  # byte offset of rows 0, INDEX_LINES, 2 * INDEX_LINES…, then the end of the last row
    columns: list[str] = field(default_factory=list)
    header: bytes = b""  # CSV: the header line

    def byte_range(self, start: int, end: int) -> tuple[int, int, int]:
        """(first byte, end byte, rows to skip) of the newline-aligned bytes holding rows [start, end)."""
        return int(self.offsets[start // INDEX_LINES]), int(self.offsets[-(-end // INDEX_LINES)]), start % INDEX_LINES


def scan(url: str, fmt: str, storage_options: StorageOptions | None = None) -> LineIndex:
    """Read the file once: count its rows, keep every INDEX_LINES-th row's offset, and find its columns."""
    fs, path = open_fs(url, storage_options)
    header = header_lines(fmt)
    starts = [np.zeros(1, dtype=np.int64)] if header == 0 else []
    newlines, size, last, first = 0, 0, b"\n", b""
    with fs.open(path, "rb", compression="gzip" if is_gzip(path) else None) as f:
        while chunk := f.read(SCAN_BYTES):
            first = first or chunk
            found = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == ord("\n")) + size
            numbers = np.arange(newlines, newlines + len(found)) + 1 - header  # the row each newline starts
            starts.append(found[(numbers >= 0) & (numbers % INDEX_LINES == 0)] + 1)
            newlines, size, last = newlines + len(found), size + len(chunk), chunk[-1:]
    lines = newlines + (last != b"\n")
    offsets = np.concatenate([*starts, np.zeros(0, dtype=np.int64)])
    offsets = np.append(offsets[offsets < size], size)
    rows = max(lines - header, 0)
    if fmt == "csv":
        head = first.split(b"\n", 1)[0]
        columns = _csv_names(head) if head.strip() else []
        return LineIndex(rows, offsets, columns, head)
    return LineIndex(rows, offsets, _sample_fields(first))


def _csv_names(header: bytes) -> list[str]:
    return pa_csv.read_csv(io.BytesIO(header + b"\n")).schema.names


def _sample_fields(data: bytes) -> list[str]:
    names: dict[str, None] = {}
    for line in data.split(b"\n")[:SAMPLE_LINES]:
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            names.update(dict.fromkeys(value))
    return list(names)


def read_input(
    payload: SlicePayload, columns: list[str], rejected: dict[int, str], strings: tuple[str, ...] = ()
) -> pa.Table:
    """The item's rows of `columns`, from Parquet or text; rows of lines that cannot be read are all null.

    `rejected[row]` says why of each such row; `strings`: columns that must
    hold text (read as strings, so a number there is that line's error).
    """
    fmt = payload.get("format", "parquet")
    if fmt == "parquet":
        return read_slice(payload, columns)
    url = payload["input"]
    lines = _lines(payload)
    reader: _Reader = _Csv(url, payload["header"].encode(), columns) if fmt == "csv" else _JsonLines(columns, strings)
    table, bad = _parse(reader, lines, url, payload["first_line"])
    missing = reader.missing_fields(table, lines, bad)
    where = lambda row: f"{url} line {payload['first_line'] + row}"  # noqa: E731
    rejected.update({row: f"{where(row)}: {problem}" for row, problem in bad.items()})
    rejected.update({row: f"{where(row)}, column {name!r}: no such field" for row, name in missing.items()})
    if not bad and not missing:
        return table
    mask = np.zeros(table.num_rows, dtype=bool)
    mask[[*bad, *missing]] = True
    nulls = pa.array(mask)
    return pa.table(
        {
            name: pc.if_else(nulls, pa.scalar(None, col.type), col)
            for name, col in zip(table.column_names, table.columns)
        }
    )


def _lines(payload: SlicePayload) -> list[bytes]:
    """The item's lines, without their line ends."""
    url = payload["input"]
    fs, path = open_fs(url, payload.get("storage_options"))
    start, end = payload["byte_range"]
    try:
        if is_gzip(path):  # no random access: decompress from the start
            with fs.open(path, "rb", compression="gzip") as f:
                data = f.read()[start:end]
        else:
            data = fs.cat_file(path, start=start, end=end)
    except FileNotFoundError as exc:
        raise InputError(f"{url}: file not found") from exc
    except (OSError, EOFError) as exc:  # storage trouble, or a damaged gzip stream: retried, then dead letters
        raise OSError(f"{url}: cannot read: {exc}") from exc
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    first, last = payload.get("rows") or (0, len(lines))
    return lines[first:last]


class _Reader:
    placeholder = b""

    def parse(self, data: bytes) -> tuple[pa.Table | None, dict[int, str]]:
        """The table, or None and the rows found bad (raises InputError when it cannot say which)."""
        raise NotImplementedError

    def prechecked(self, lines: list[bytes]) -> dict[int, str]:
        """Lines known bad before parsing."""
        return {}

    def problem(self, line: bytes) -> str | None:
        """What is wrong with one line read alone, if anything."""
        table, bad = self.parse(line)
        if table is None:
            return next(iter(bad.values()), "cannot be read")
        return None if table.num_rows == 1 else f"{table.num_rows} rows on one line"

    def missing_fields(self, table: pa.Table, lines: list[bytes], bad: dict[int, str]) -> dict[int, str]:
        return {}


def _parse(reader: _Reader, lines: list[bytes], url: str, first_line: int) -> tuple[pa.Table, dict[int, str]]:
    """Parse the lines whole; each line found bad is set aside (a placeholder row) and the rest parsed again."""
    bad = {i: "empty line" for i, line in enumerate(lines) if not line.strip()}
    bad.update(reader.prechecked(lines))
    searched = False
    while True:
        data = b"\n".join(reader.placeholder if i in bad else line for i, line in enumerate(lines))
        table, found = reader.parse(data)
        found = {row: problem for row, problem in found.items() if 0 <= row < len(lines) and row not in bad}
        if table is not None and table.num_rows == len(lines):
            return table, bad
        if not found and not searched:  # no row named: read the lines one by one
            searched = True
            found = {i: p for i, line in enumerate(lines) if i not in bad and (p := reader.problem(line))}
        if not found:
            span = f"lines {first_line}-{first_line + len(lines) - 1}"
            rows = table.num_rows if table is not None else "no"
            raise InputError(f"{url} {span}: read as {rows} rows from {len(lines)} lines")
        bad.update(found)


class _JsonLines(_Reader):
    placeholder = b"{}"

    def __init__(self, columns: list[str], strings: tuple[str, ...]) -> None:
        self.columns = columns
        schema = pa.schema([(name, pa.string()) for name in strings])
        self.options = pa_json.ParseOptions(explicit_schema=schema)

    def parse(self, data: bytes) -> tuple[pa.Table | None, dict[int, str]]:
        try:
            table = pa_json.read_json(
                io.BytesIO(data),
                read_options=pa_json.ReadOptions(block_size=max(len(data) + 1, MIN_BLOCK)),
                parse_options=self.options,
            )
        except pa.ArrowInvalid as exc:
            message = str(exc)
            row = ROW_IN_MESSAGE.search(message)  # -1: the message names no row
            problem = "not valid JSON Lines: " + (message[: row.start()] if row else message).strip()
            return None, {int(row.group(1)) if row else -1: problem}
        return pa.table({name: self._column(table, name) for name in self.columns}), {}

    def _column(self, table: pa.Table, name: str) -> pa.ChunkedArray:
        if name in table.column_names:
            return table.column(name)
        return pa.chunked_array([pa.nulls(table.num_rows, pa.string())])

    def missing_fields(self, table: pa.Table, lines: list[bytes], bad: dict[int, str]) -> dict[int, str]:
        """Rows whose line lacks a field the job reads (a JSON null is a null, as in Parquet)."""
        missing: dict[int, str] = {}
        for name in self.columns:
            nulls = np.flatnonzero(table.column(name).is_null().to_numpy(zero_copy_only=False))
            for row in nulls:
                if row not in bad and row not in missing and name not in json.loads(lines[row]):
                    missing[int(row)] = name
        return missing


class _Csv(_Reader):
    def __init__(self, url: str, header: bytes, columns: list[str]) -> None:
        self.names = _csv_names(header)
        absent = [c for c in columns if c not in self.names]
        if absent:
            raise InputError(f"{url} line 1: no column {absent[0]!r} (columns are: {', '.join(self.names)})")
        self.columns = columns
        self.placeholder = b",".join([b'""'] * len(self.names))

    def prechecked(self, lines: list[bytes]) -> dict[int, str]:
        """Lines with an unclosed quote: read whole, it would run into the lines after it."""
        return {
            i: "a quoted value is not closed on its line (line breaks inside values are not read)"
            for i, line in enumerate(lines)
            if line.count(b'"') % 2
        }

    def parse(self, data: bytes) -> tuple[pa.Table | None, dict[int, str]]:
        invalid: dict[int, str] = {}

        def skip(row: pa_csv.InvalidRow) -> str:
            invalid[(row.number or 0) - 1] = f"{row.actual_columns} fields, expected {row.expected_columns}"
            return "skip"

        try:
            table = pa_csv.read_csv(
                io.BytesIO(data),
                read_options=pa_csv.ReadOptions(
                    column_names=self.names, use_threads=False, block_size=max(len(data) + 1, MIN_BLOCK)
                ),
                parse_options=pa_csv.ParseOptions(invalid_row_handler=skip),
                convert_options=pa_csv.ConvertOptions(
                    include_columns=self.columns, column_types={name: pa.string() for name in self.columns}
                ),
            )
        except pa.ArrowInvalid:
            return None, invalid
        return (None if invalid else table), invalid
