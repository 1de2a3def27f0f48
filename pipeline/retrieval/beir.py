"""Reading a retrieval set in BEIR's layout: corpus, queries and qrels.

A dataset is a directory with

    corpus.parquet  | corpus.jsonl     id (or _id), text, optional title
    queries.parquet | queries.jsonl    id (or _id), text
    qrels.parquet | qrels.jsonl | qrels/<split>.tsv
                                       query_id (or query-id), corpus_id (or corpus-id), score

which is BEIR's own layout (`corpus.jsonl`, `queries.jsonl`, `qrels/test.tsv`)
plus Parquet. As in BEIR, a passage's text is its title and text joined by a
space when it has a title. Ids are read as strings.
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ...scheduler_plugins.protocol import StorageOptions
from ...workers.data.storage import open_fs
from ..jobs.planner import PlanError

# One row of a dataset's file as its format gives it (JSON Lines, TSV, Parquet): whatever fields and types the
# dataset's authors wrote; each read names the field it needs, and a missing one is a PlanError.
Row = dict[str, Any]


@dataclass
class RetrievalSet:
    name: str
    corpus: pa.Table  # id: string, text: string
    queries: pa.Table  # id: string, text: string
    qrels: dict[str, dict[str, int]]  # query id -> {corpus id: relevance}


def load_beir(location: str, split: str = "test", storage_options: StorageOptions | None = None) -> RetrievalSet:
    fs, root = open_fs(location, storage_options)
    if not fs.isdir(root):
        raise PlanError(f"dataset {location!r} is not a directory")

    def find(*names: str) -> str:
        for name in names:
            if fs.exists(posixpath.join(root, name)):
                return posixpath.join(root, name)
        raise PlanError(f"dataset {location!r} has none of: {', '.join(names)}")

    corpus = _texts(fs, find("corpus.parquet", "corpus.jsonl"), with_title=True)
    queries = _texts(fs, find("queries.parquet", "queries.jsonl"), with_title=False)
    qrels = _qrels(fs, find("qrels.parquet", "qrels.jsonl", f"qrels/{split}.tsv"))
    return RetrievalSet(posixpath.basename(root.rstrip("/")), corpus, queries, qrels)


def _rows(fs, path: str) -> list[Row]:
    with fs.open(path, "rb") as f:
        data = f.read()
    if path.endswith(".parquet"):
        return pq.read_table(io.BytesIO(data)).to_pylist()
    if path.endswith(".tsv"):
        return list(csv.DictReader(io.StringIO(data.decode()), delimiter="\t"))
    rows = []
    for number, line in enumerate(data.decode().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise PlanError(f"{path} line {number}: not valid JSON: {exc}") from exc
    return rows


def _field(row: Row, names: tuple[str, ...], path: str, number: int) -> Any:
    for name in names:
        if name in row:
            return row[name]
    raise PlanError(f"{path} row {number}: no {' or '.join(repr(n) for n in names)} field")


def _texts(fs, path: str, with_title: bool) -> pa.Table:
    ids, texts = [], []
    for number, row in enumerate(_rows(fs, path)):
        ids.append(str(_field(row, ("id", "_id"), path, number)))
        text = _field(row, ("text",), path, number)
        title = row.get("title") if with_title else None
        texts.append(f"{title} {text}".strip() if title and text is not None else text)
    if len(set(ids)) != len(ids):
        raise PlanError(f"{path}: ids are not unique")
    return pa.table({"id": pa.array(ids, pa.string()), "text": pa.array(texts, pa.string())})


def _qrels(fs, path: str) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    for number, row in enumerate(_rows(fs, path)):
        query = str(_field(row, ("query_id", "query-id"), path, number))
        doc = str(_field(row, ("corpus_id", "corpus-id"), path, number))
        qrels.setdefault(query, {})[doc] = int(_field(row, ("score",), path, number))
    return qrels
