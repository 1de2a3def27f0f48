"""The image kind's `embed`: images in (files, or a column of bytes or URIs), one vector per row out.

`read` (an I/O thread) fetches the item's encoded images concurrently: its
files under their root (image_files.py planned them), or a column's values:
bytes (``binary``), a URI (a string: any fsspec URL, or a ``data:`` URI), or
a Hugging Face ``datasets`` Image struct (``{bytes, path}``). Nothing is
decoded there: `compute` hands the bytes to the runtime, whose preparing
thread decodes and resizes a batch or two ahead of the device
(workers/runtimes/image_embedder.py). A row whose image cannot be read or
decoded (missing, truncated, not an image, over the byte or pixel limit) gets
a null embedding and a rejection naming its file or its input row and
column; a null value a null embedding, counted. Every other row is written.

A job over a text column of an image model is `embed_operation`'s, through
the model's text tower: one job puts texts into the images' space.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pyarrow as pa

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import EncodePayload, ImagePayload, ItemResult, OnlineResult
from ..data.images import MAX_BYTES, MAX_PIXELS, ImageLimits, ImageRejected, fetch
from ..data.input_formats import read_input
from ..data.lance_fragments import write_fragment
from ..data.parquet_slices import InputError, identity_columns, part_ack, part_table, rejection, write_part
from ..data.vector_precision import VectorFormat, compact
from . import embed_operation
from .embed_operation import EmbedInput
from .online_texts import encoded


@dataclass
class ImageRows:
    table: pa.Table  # the identity and kept columns
    images: list[bytes | ImageRejected | None]  # per row; None: no image (a null value, or `invalid`)
    limits: ImageLimits
    id_column: str | None  # the column naming each row; None: its source file and row
    urls: list[str] | None = None  # image files: each row's, which its rejection names
    column: str | None = None  # an image column: its name, which a rejection names with the row
    uris: dict[int, str] = field(default_factory=dict)  # an image column's rows given as URIs: a rejection names it
    invalid: dict[int, str] = field(default_factory=dict)  # row -> why its line could not be read, whole


@dataclass
class ImageVectors:
    present: list[int]  # rows with an image (decoded or not)
    vectors: np.ndarray  # one per present row
    rejected: dict[int, str]  # row -> why it has no vector


def limits_of(payload: ImagePayload) -> ImageLimits:
    return ImageLimits(payload.get("max_image_bytes", MAX_BYTES), payload.get("max_image_pixels", MAX_PIXELS))


def read(payload: ImagePayload) -> ImageRows | EmbedInput:
    if "files" in payload:
        return _files(payload)
    if payload.get("image_column"):
        return _column(payload)
    return embed_operation.read(payload)


def _files(payload: ImagePayload) -> ImageRows:
    root, files = payload["root"].rstrip("/"), payload["files"]
    urls = [posixpath.join(root, rel) for rel in files]
    limits = limits_of(payload)
    images: list[bytes | ImageRejected | None] = list(fetch(urls, payload.get("storage_options"), limits))
    id_column = payload["id_column"]  # the planner names it (pipeline/jobs/image_files.py)
    assert id_column, "an item of image files names its id column"
    return ImageRows(pa.table({id_column: pa.array(files, pa.string())}), images, limits, id_column, urls=urls)


def _column(payload: ImagePayload) -> ImageRows:
    column = payload["image_column"]
    columns = [column]
    for name in [payload.get("id_column"), *payload.get("keep_columns", [])]:
        if name and name not in columns:
            columns.append(name)
    invalid: dict[int, str] = {}  # a line that cannot be read (JSON Lines, CSV): its whole message
    table = read_input(payload, columns, invalid)
    images: list[bytes | ImageRejected | None] = [None] * table.num_rows
    uris: dict[int, str] = {}
    for row, value in enumerate(_values(table.column(column), payload["input"], column)):
        if isinstance(value, str):
            uris[row] = value
        elif row not in invalid:
            images[row] = value
    limits = limits_of(payload)
    for row, data in zip(uris, fetch(list(uris.values()), payload.get("storage_options"), limits)):
        images[row] = data
    return ImageRows(table, images, limits, payload.get("id_column"), column=column, uris=uris, invalid=invalid)


def _short(uri: str) -> str:
    return uri if len(uri) <= 80 else f"{uri[:77]}..."


def _values(values: pa.ChunkedArray, url: str, column: str) -> list[bytes | str | None]:
    """A column's images: bytes, URI strings, or a datasets Image struct's bytes (else its path)."""
    kind = values.type
    if pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0:
        return [None if v is None else (v.get("bytes") or v.get("path")) for v in values.to_pylist()]
    if pa.types.is_dictionary(kind):
        values = values.cast(kind.value_type)
        kind = values.type
    if any(
        check(kind)
        for check in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_string, pa.types.is_large_string)
    ):
        return values.to_pylist()
    raise InputError(f"{url}: column {column!r} has type {kind}, expected image bytes or URI strings")


def compute(runtime, data: ImageRows | EmbedInput) -> ImageVectors | embed_operation.EmbedComputed:
    if isinstance(data, EmbedInput):
        return embed_operation.compute(runtime, data)
    present = [row for row, image in enumerate(data.images) if image is not None]
    vectors, rejected = runtime.embed_images([data.images[row] for row in present], data.limits)
    return ImageVectors(present, vectors, {present[i]: why for i, why in rejected.items()})


def write(
    payload: ImagePayload,
    data: ImageRows | EmbedInput,
    computed: ImageVectors | embed_operation.EmbedComputed,
    spec: ModelSpec,
) -> ItemResult:
    if isinstance(data, EmbedInput):
        assert isinstance(computed, embed_operation.EmbedComputed)
        return embed_operation.write(payload, data, computed, spec)
    assert isinstance(computed, ImageVectors)
    rows = data.table.num_rows
    answer = np.full(rows, -1, dtype=np.int64)  # the vector each row gets; -1: none
    answer[computed.present] = np.arange(len(computed.present))
    answer[list(computed.rejected)] = -1
    fmt = VectorFormat(**payload.get("vectors", {}))
    stored = compact(computed.vectors, fmt)
    vectors = pa.FixedSizeListArray.from_arrays(
        pa.array(stored.reshape(-1), type=fmt.arrow_type()), fmt.width(spec.dim)
    )
    named: ImagePayload = {**payload, "id_column": data.id_column}
    columns = identity_columns(named, data.table, np.arange(rows))
    columns["embedding"] = vectors.take(pa.array(answer, mask=answer < 0))
    table = part_table(payload, columns, data.table)
    if payload.get("lance"):  # the rows go to a Lance fragment; the part is its marker
        table = write_fragment(payload["lance"], table, payload.get("storage_options"))
    size = write_part(payload["output"], table, payload.get("storage_options"))
    rejected = {**data.invalid, **{row: _named(payload, data, row, why) for row, why in computed.rejected.items()}}
    rejections = [rejected[row] for row in sorted(rejected)]
    null_images = rows - len(computed.present) - len(data.invalid)
    return part_ack(payload, size, rejections, {"rows": rows, "null_images": null_images})


def _named(payload: ImagePayload, data: ImageRows, row: int, why: str) -> str:
    """A rejection naming the image: its file, or its input's row and column."""
    if data.urls is not None:
        return f"{data.urls[row]}: {why}"
    assert data.column is not None
    uri = data.uris.get(row)
    return rejection(payload, row, data.column, f"{_short(uri)}: {why}" if uri else why)


def online(runtime, payloads: list[EncodePayload]) -> list[OnlineResult]:
    """A group of an image model's online requests: those of texts as `encode` answers them (the text tower),
    those of images (their encoded bytes, checked by the gateway up to their headers) decoded and computed
    together, in image batches; a request with an image that does not decode is its 400, naming the input."""
    results: list[OnlineResult] = [{} for _ in payloads]
    texts = [i for i, payload in enumerate(payloads) if "images" not in payload]
    for i, result in zip(texts, embed_operation.online(runtime, [payloads[i] for i in texts])):
        results[i] = result
    by_limits: dict[ImageLimits, list[int]] = {}
    for i, payload in enumerate(payloads):
        if "images" in payload:
            by_limits.setdefault(limits_of(cast(ImagePayload, payload)), []).append(i)
    for limits, answered in by_limits.items():
        images = [image for i in answered for image in payloads[i]["images"]]
        vectors, rejected = runtime.embed_images(images, limits)
        start = 0
        for i in answered:
            payload = payloads[i]
            end = start + len(payload["images"])
            bad = next((row for row in range(start, end) if row in rejected), None)
            if bad is None:
                results[i] = {**encoded(vectors[start:end], payload), "tokens": 0}
            else:
                index = payload.get("first_input", 0) + bad - start
                results[i] = {"error": f"input {index} is not an image that decodes: {rejected[bad]}", "status": 400}
            start = end
    return results
