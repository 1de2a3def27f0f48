"""Planning a batch job: check the output can be written, list the input shards, split them into items.

Shards are listed with fsspec (a file, a directory, or a glob on any store);
an OUTPUT inside the folder INPUT lists, or that folder inside OUTPUT, is
refused (`check_apart`). They are split by row groups into items of at most `rows_per_item` rows; a row
group larger than that is split by row ranges. JSON Lines and CSV shards are
split by rows too, each item a newline-aligned byte range found by one scan
of the file (workers/data/input_formats.py); a gzipped one is one item. Each item's output part is
named from (shard, row range), so a retried or re-run item writes the same
object. Footers are read in parallel; a shard whose footer cannot be read
still becomes one item, so the failure is reported by the worker that tries
it and lands in the job's dead letters while the rest of the job runs.
"""

from __future__ import annotations

import hashlib
import posixpath
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypedDict

import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import SlicePayload, StorageOptions
from ...workers.data.input_formats import LineIndex, format_of, header_lines, is_gzip, scan
from ...workers.data.storage import atomic_write, open_fs

GLOB_CHARS = "*?["
FOOTER_READERS = 8
FORMAT_NAMES = {"parquet": "Parquet", "jsonl": "JSON Lines", "csv": "CSV"}


class PlanError(ValueError):
    """The job cannot start: bad input location, nothing to do, bad options."""


@dataclass
class Shard:
    url: str
    size: int
    version: str
    row_groups: list[int] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    error: str | None = None
    format: str = "parquet"  # or jsonl, csv (workers/data/input_formats.py), images (a group: image_files.py)
    lines: LineIndex | None = None  # a text shard's rows, once scanned
    root: str = ""  # a group of image files: the folder their paths are under
    files: list[str] = field(default_factory=list)  # and those paths, one row each

    @property
    def rows(self) -> int:
        return sum(self.row_groups)


class PlannedItem(TypedDict):
    """One work item, as the queue's `SubmittedItem` with its payload typed; the queue's id for it is ``JOB/KEY``."""

    key: str
    model: str
    op: str
    rows: int
    payload: SlicePayload  # the operation's options (an EmbedPayload, a RerankPayload) with the slice


@dataclass
class Plan:
    shards: list[Shard]
    items: list[PlannedItem]

    @property
    def rows(self) -> int:
        return sum(item["rows"] for item in self.items)


def check_output(output_url: str, storage_options: StorageOptions | None = None) -> None:
    """Refuse an OUTPUT that cannot be written before any work starts: found at the end, it costs the job.

    A probe file is written and removed, so what is checked is the store's
    own answer (read-only mounts, permissions, a file in the way, refused
    credentials), not a guess from mode bits.
    """
    fs, path = open_fs(output_url, storage_options)
    try:
        if fs.isfile(path):
            raise PlanError(f"output {output_url!r} is a file; give a folder")
        probe = f"{output_url.rstrip('/')}/.shoal-write-check-{uuid.uuid4().hex}"
        atomic_write(probe, b"", storage_options)
        fs.rm_file(open_fs(probe, storage_options)[1])
    except PlanError:
        raise
    except Exception as exc:
        reason = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
        raise PlanError(f"output {output_url!r} cannot be written: {reason}") from None


def check_apart(input_url: str, output_url: str, storage_options: StorageOptions | None = None) -> None:
    """Refuse an OUTPUT inside the folder INPUT lists (a directory, or a glob's folder before its first
    wildcard), that folder itself, or that folder inside OUTPUT.

    The job would skip its own parts, but every other reader of the folder (a
    job with another model or output, a reindex, the user's own tools) would
    meet Parquet parts with no text column, and readers of OUTPUT the input's
    shards. A file named on its own lists no folder: its parts may go beside it.
    """
    fs, path = open_fs(input_url, storage_options)
    output_fs, output = open_fs(output_url, storage_options)
    if type(output_fs) is not type(fs):  # another store (s3:// and s3a:// are one; paths compare without them)
        return
    wildcards = [i for i in map(path.find, GLOB_CHARS) if i >= 0]
    if wildcards:
        folder = path[: min(wildcards)].rpartition("/")[0]
    elif fs.isdir(path):
        folder = path
    else:
        return
    folder, output = folder.rstrip("/"), output.rstrip("/")
    if output == folder:
        raise PlanError(f"output {output_url!r} is the input folder {input_url!r} itself; write OUTPUT beside INPUT")
    if output.startswith(f"{folder}/") or not folder:
        raise PlanError(
            f"output {output_url!r} is inside input {input_url!r}: its parts would be shards to every other job "
            "or reader of the input; write OUTPUT outside INPUT (beside it, not under it)"
        )
    if folder.startswith(f"{output}/") or not output:
        raise PlanError(
            f"input {input_url!r} is inside output {output_url!r}: its shards would be parts to every reader of "
            "the output; write OUTPUT where it does not hold INPUT"
        )


def list_shards(
    input_url: str,
    storage_options: StorageOptions | None = None,
    output_url: str | None = None,
    input_format: str | None = None,
) -> list[Shard]:
    """Every Parquet file INPUT names, in a stable order, with size and version; `output_url` apart from it."""
    try:
        return _list_shards(input_url, storage_options, output_url, input_format)
    except PlanError:
        raise
    except Exception as exc:  # credentials, endpoint, permissions: say which input
        raise PlanError(f"cannot list input {input_url!r}: {type(exc).__name__}: {exc}") from exc


def _list_shards(
    input_url: str, storage_options: StorageOptions | None, output_url: str | None, input_format: str | None
) -> list[Shard]:
    """A file's format is `input_format` if given, else its name's (`.parquet`, `.jsonl[.gz]`, `.csv[.gz]`;
    any other is read as Parquet). A directory gives the files of one format: `input_format`'s, else
    Parquet if it holds any, else the one text format it holds."""
    fs, path = open_fs(input_url, storage_options)
    fs.invalidate_cache()  # filesystems are shared per process: a scheduled run must see today's shards
    if any(ch in path for ch in GLOB_CHARS):
        # Hidden names are temporary files (ours among them), never input.
        paths = [p for p in fs.glob(path) if not posixpath.basename(p).startswith(".") and fs.isfile(p)]
        wanted = input_format or format_of(path) or "parquet"
    elif fs.isdir(path):
        # As Spark and Dask do, a directory's _metadata-style and hidden files and folders are skipped.
        root = path.rstrip("/")
        paths = [
            p
            for p in fs.find(path)
            if format_of(p) and not any(name.startswith(("_", ".")) for name in posixpath.relpath(p, root).split("/"))
        ]
        wanted = input_format or _directory_format(input_url, paths)
        paths = [p for p in paths if format_of(p) == wanted]
    elif fs.exists(path):
        return _shards(fs, [path], input_format)  # a file named on its own is input, even inside OUTPUT
    else:
        raise PlanError(f"input {input_url!r} does not exist")
    if not paths:
        raise PlanError(f"input {input_url!r} matches no {FORMAT_NAMES[wanted]} files")
    if output_url:
        check_apart(input_url, output_url, storage_options)
    return _shards(fs, paths, input_format)


def _shards(fs, paths: list[str], input_format: str | None) -> list[Shard]:
    infos = [fs.info(p) for p in sorted(paths)]
    return [
        Shard(
            url=fs.unstrip_protocol(info["name"]),
            size=int(info.get("size") or 0),
            version=object_version(info) or _content_hash(fs, info["name"]),
            format=input_format or format_of(info["name"]) or "parquet",
        )
        for info in infos
    ]


def _directory_format(input_url: str, paths: list[str]) -> str:
    """Parquet if the directory holds any, else its one text format; both: the user says which."""
    formats = {format_of(p) or "parquet" for p in paths}
    if "parquet" in formats or not formats:
        return "parquet"
    if len(formats) > 1:
        raise PlanError(
            f"input {input_url!r} holds both JSON Lines and CSV files: give --input-format, "
            f"or a glob such as {input_url.rstrip('/')}/*.jsonl"
        )
    return formats.pop()


def object_version(info: Mapping[str, object]) -> str | None:
    """What changes when the object changes: etag, generation or mtime."""
    for key in ("ETag", "etag", "md5Hash", "generation", "mtime", "LastModified", "last_modified"):
        if info.get(key) not in (None, ""):
            return f"{key}:{info[key]}".replace('"', "")
    return None


def _content_hash(fs, path: str) -> str:
    """For stores that report no version: resume and reindex need one, so read the file."""
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def read_footers(shards: list[Shard], storage_options: StorageOptions | None = None) -> None:
    """Fill each shard's row-group sizes (a text shard's: its rows as one group, and its line index), or its error."""

    def read(shard: Shard) -> None:
        fs, path = open_fs(shard.url, storage_options)
        try:
            if shard.format != "parquet":
                shard.lines = scan(shard.url, shard.format, storage_options)
                shard.row_groups, shard.columns = [shard.lines.rows], shard.lines.columns
                return
            with fs.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                metadata = parquet.metadata
                shard.columns = parquet.schema_arrow.names
            shard.row_groups = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
        except Exception as exc:  # reported per shard, never fatal to the job
            shard.error = f"{type(exc).__name__}: {exc}"

    with ThreadPoolExecutor(FOOTER_READERS) as pool:
        list(pool.map(read, shards))


def check_columns(shards: list[Shard], required: list[str]) -> None:
    """Fail before submitting when no readable shard has the columns the job needs.

    Shards that lack them while others have them stay in the plan: their items
    fail with the same message and land in dead letters; the rest of the job runs.
    """
    readable = [s for s in shards if s.error is None]
    for column in required:
        if readable and all(column not in s.columns for s in readable):
            example = readable[0]
            raise PlanError(
                f"{example.url}: no column {column!r} (columns are: {', '.join(example.columns)})"
                + (f"; and {len(readable) - 1} more shards lack it too" if len(readable) > 1 else "")
            )


def part_name(shard_url: str, start: int, end: int) -> str:
    """A part's name from its shard and row range: stable across runs."""
    stem = posixpath.splitext(posixpath.basename(shard_url))[0]
    digest = hashlib.sha1(shard_url.encode()).hexdigest()[:8]
    return f"part-{stem}-{digest}-{start:010d}-{end:010d}.parquet"


def slices(row_groups: list[int], rows_per_item: int) -> list[tuple[int, int, int, int]]:
    """(first row group, end row group, start row, end row) of each item.

    Whole row groups are grouped up to `rows_per_item`; a larger row group is
    cut into row ranges of that size. Rows are numbered within the shard.
    """
    out: list[tuple[int, int, int, int]] = []
    offset = 0
    group_start, group_rows = 0, 0
    for index, count in enumerate(row_groups):
        if count > rows_per_item:
            if group_rows:
                out.append((group_start, index, offset - group_rows, offset))
            for lo in range(0, count, rows_per_item):
                hi = min(lo + rows_per_item, count)
                out.append((index, index + 1, offset + lo, offset + hi))
            group_start, group_rows = index + 1, 0
        elif group_rows + count > rows_per_item:
            out.append((group_start, index, offset - group_rows, offset))
            group_start, group_rows = index, count
        else:
            group_rows += count
        offset += count
    if group_rows:
        out.append((group_start, len(row_groups), offset - group_rows, offset))
    return out


def plan_items(
    shards: list[Shard],
    output_url: str,
    rows_per_item: int,
    model: str,
    op: str,
    payload: SlicePayload,
) -> list[PlannedItem]:
    """Work items for every shard; `payload` carries the op's own options."""
    output_url = output_url.rstrip("/")
    items: list[PlannedItem] = []
    for index, shard in enumerate(shards):
        if shard.lines is not None:
            items += _text_items(index, shard, output_url, rows_per_item, model, op, payload)
            continue
        if shard.error is not None:
            spans = [(0, 0, 0, 0)]
        else:
            spans = slices(shard.row_groups, rows_per_item)
        for first_group, end_group, start, end in spans:
            name = part_name(shard.url, start, end)
            group_offset = sum(shard.row_groups[:first_group])
            whole_groups = start == group_offset and end == group_offset + sum(shard.row_groups[first_group:end_group])
            items.append(
                {
                    "key": f"{index:06d}-{start}-{end}",
                    "model": model,
                    "op": op,
                    "rows": end - start,
                    "payload": {
                        **payload,
                        "input": shard.url,
                        "row_groups": None if shard.error else [first_group, end_group],
                        "rows": None if whole_groups else [start - group_offset, end - group_offset],
                        "row_range": [start, end],
                        "part": name,
                        "output": f"{output_url}/{name}",
                    },
                }
            )
    return items


def _text_items(
    index: int, shard: Shard, output_url: str, rows_per_item: int, model: str, op: str, payload: SlicePayload
) -> list[PlannedItem]:
    """A JSON Lines or CSV shard's items: `rows_per_item` rows each, or the whole file when gzipped."""
    lines = shard.lines
    assert lines is not None
    step = max(lines.rows if is_gzip(shard.url) else rows_per_item, 1)
    items: list[PlannedItem] = []
    for start in range(0, lines.rows, step):
        end = min(start + step, lines.rows)
        first_byte, end_byte, skip = lines.byte_range(start, end)
        name = part_name(shard.url, start, end)
        item_payload: SlicePayload = {
            **payload,
            "input": shard.url,
            "format": shard.format,
            "byte_range": [first_byte, end_byte],  # of the decompressed stream, for a gzipped file
            "row_groups": None,
            "rows": [skip, skip + end - start],  # the item's rows among the range's lines
            "row_range": [start, end],
            "first_line": start + header_lines(shard.format) + 1,
            "part": name,
            "output": f"{output_url}/{name}",
        }
        if shard.format == "csv":
            item_payload["header"] = lines.header.decode("utf-8", "replace")
        key = f"{index:06d}-{start}-{end}"
        items.append({"key": key, "model": model, "op": op, "rows": end - start, "payload": item_payload})
    return items
