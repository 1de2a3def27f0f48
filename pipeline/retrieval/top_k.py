"""Exact top-k retrieval by cosine, in the client, over embeddings a job wrote.

The vectors are read back from the embed job's parts (the manifest's list is
the truth) and compared with one matrix product per block of queries, so
memory stays at (block x corpus) scores. Exact, no index: meant for corpora
that fit in the client's memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.storage import open_fs
from ..jobs.manifest import MANIFEST_NAME
from ..jobs.planner import PlanError, list_shards

QUERY_BLOCK = 1024


@dataclass
class Vectors:
    ids: list[Any]  # rows whose embedding is not null, in the output's order
    matrix: np.ndarray  # float32, one row per id
    nulls: int  # rows with a null embedding (null text), left out


def read_vectors(output_url: str, id_column: str, storage_options: StorageOptions | None = None) -> Vectors:
    """The id and embedding of every row an embed job wrote under `output_url`."""
    fs, root = open_fs(f"{output_url.rstrip('/')}/{MANIFEST_NAME}", storage_options)
    with fs.open(root, "rb") as f:
        manifest = json.load(f)
    ids: list[Any] = []
    blocks: list[np.ndarray] = []
    nulls = 0
    for part in manifest["parts"]:
        url = f"{output_url.rstrip('/')}/{part['name']}"
        part_fs, path = open_fs(url, storage_options)
        with part_fs.open(path, "rb") as f:
            table = pq.read_table(f, columns=[id_column, "embedding"])
        column = table.column("embedding").combine_chunks()
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        dim = column.type.list_size
        flat = column.values.to_numpy(zero_copy_only=False).reshape(-1, dim)[
            column.offset : column.offset + len(column)
        ]
        blocks.append(flat[valid].astype(np.float32, copy=False))
        ids.extend(np.asarray(table.column(id_column).to_pylist(), dtype=object)[valid].tolist())
        nulls += int((~valid).sum())
    if not blocks:
        raise PlanError(f"{output_url}: the embed job wrote no parts")
    return Vectors(ids, np.concatenate(blocks), nulls)


def top_k(queries: np.ndarray, corpus: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, cosine scores) of each query's k nearest corpus rows, best first.

    Ties are broken by corpus position, so the result is deterministic.
    """
    corpus = _unit(corpus)
    return _nearest(queries, lambda block: block @ corpus.T, corpus.shape[0], k)


def top_k_documents(queries: np.ndarray, corpus: Vectors, k: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    """For a chunked corpus: documents ranked by their best chunk's cosine.

    Returns (document ids in first-seen order, each query's k nearest as
    indices into them, their scores). A document with many chunks counts
    once, so k documents come back, not k chunks of a few documents.
    """
    codes_by_id: dict[Any, int] = {}
    codes = np.fromiter(
        (codes_by_id.setdefault(i, len(codes_by_id)) for i in corpus.ids), dtype=np.int64, count=len(corpus.ids)
    )
    order = np.argsort(codes, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(codes[order]) != 0])
    chunks = _unit(corpus.matrix)[order]
    indices, scores = _nearest(
        queries, lambda block: np.maximum.reduceat(block @ chunks.T, starts, axis=1), len(starts), k
    )
    return list(codes_by_id), indices, scores


def _nearest(queries: np.ndarray, score, candidates: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k best of `candidates` columns of `score(unit query block)`, best first, ties by position."""
    k = min(k, candidates)
    indices = np.empty((queries.shape[0], k), dtype=np.int64)
    scores = np.empty((queries.shape[0], k), dtype=np.float32)
    for lo in range(0, queries.shape[0], QUERY_BLOCK):
        block = score(_unit(queries[lo : lo + QUERY_BLOCK]))
        nearest = (
            np.argpartition(-block, k - 1, axis=1)[:, :k] if k < candidates else np.tile(np.arange(k), (len(block), 1))
        )
        for row, found in enumerate(nearest):
            found_scores = block[row, found]
            ranked = np.lexsort((found, -found_scores))
            indices[lo + row] = found[ranked]
            scores[lo + row] = found_scores[ranked]
    return indices, scores


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms == 0, 1, norms)).astype(np.float32, copy=False)


def read_texts(
    input_url: str, id_column: str, text_column: str, storage_options: StorageOptions | None = None
) -> dict[Any, str | None]:
    """id -> text of every row of a Parquet input (file, directory or glob); ids must be unique."""
    texts: dict[Any, str | None] = {}
    for shard in list_shards(input_url, storage_options):
        fs, path = open_fs(shard.url, storage_options)
        with fs.open(path, "rb") as f:
            table = pq.read_table(f, columns=[id_column, text_column])
        for row, (key, text) in enumerate(zip(table.column(id_column).to_pylist(), _strings(table, text_column))):
            if key in texts:
                raise PlanError(f"{shard.url} row {row}: id {key!r} in column {id_column!r} is not unique")
            texts[key] = text
    return texts


def _strings(table: pa.Table, name: str) -> list[str | None]:
    column = table.column(name)
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return column.to_pylist()
