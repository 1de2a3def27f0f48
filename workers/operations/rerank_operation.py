"""The `rerank` operation: score (query, passage) pairs with a cross-encoder.

Two input shapes, chosen by the payload's ``mode``:

- ``pairs``: each row is one (query, passage) pair; the output row has its
  ``score``.
- ``candidates``: each row is a query with a list of candidate passages (and
  optionally their ids); the output row has the candidates in score order
  with ranks (``ranking``).

Every input row gives exactly one output row. A row that cannot be scored
(null query or passage, no candidates, a null candidate, ids that do not
match the candidates, more candidates than ``max_candidates``) gets a null
result and is reported with its file, row and column in the ack, so it is
never silently lost and never takes the other rows of its part down with it.
Stages as in operations.py: ``read`` (I/O thread), ``compute`` (model),
``write`` (I/O thread).

Online, `online` answers a group of requests (``/v1/rerank``, Cohere's
``/v1|v2/rerank``) in one model call: each request's scores in document order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ItemResult, OnlineResult, RerankPayload, ScorePayload
from ..data.input_formats import read_input
from ..data.parquet_slices import (
    InputError,
    identity_columns,
    part_ack,
    part_table,
    rejection,
    text_column,
    write_part,
)
from ..runtimes import Runtime, Scorer
from .online_texts import input_adapters, too_long


@dataclass
class RerankInput:
    table: pa.Table
    queries: list[str] = field(default_factory=list)  # one per pair to score
    passages: list[str] = field(default_factory=list)
    owners: list[int] = field(default_factory=list)  # the row each pair belongs to
    rejected: dict[int, str] = field(default_factory=dict)  # row -> why it has no result


@dataclass
class RerankComputed:
    scores: np.ndarray  # one per pair
    truncated: int


def read(payload: RerankPayload) -> RerankInput:
    mode = payload["mode"]
    query_col = payload["query_column"]
    item_col = payload["passage_column"] if mode == "pairs" else payload["candidates_column"]
    assert item_col, "a rerank job names the column its mode reads (pipeline/jobs/rerank)"
    columns = [query_col]
    for name in [
        item_col,
        payload.get("candidate_ids_column"),
        payload.get("id_column"),
        *payload.get("keep_columns", []),
    ]:
        if name and name not in columns:
            columns.append(name)
    unreadable: dict[int, str] = {}  # rows of lines that cannot be read: all null
    table = read_input(payload, columns, unreadable, strings=(query_col, *([item_col] if mode == "pairs" else [])))
    url = payload["input"]
    data = RerankInput(table)
    bad_queries: dict[int, str] = {}
    queries = text_column(table, query_col, url, bad_queries)
    bad_passages: dict[int, str] = {}
    if mode == "pairs":
        _read_pairs(data, payload, item_col, queries, text_column(table, item_col, url, bad_passages))
    else:
        _read_candidates(data, payload, item_col, queries, _string_lists(table, item_col, url))
    # Undecodable text reads as null above; its rejection says what it really is.
    for column, bad in ((item_col, bad_passages), (query_col, bad_queries)):
        for row, problem in bad.items():
            data.rejected[row] = rejection(payload, row, column, problem)
    data.rejected.update(unreadable)
    return data


def _read_pairs(data: RerankInput, payload: RerankPayload, column: str, queries: list, passages: list) -> None:
    for row, (query, passage) in enumerate(zip(queries, passages)):
        if query is None:
            data.rejected[row] = rejection(payload, row, payload["query_column"], "the query is null")
        elif passage is None:
            data.rejected[row] = rejection(payload, row, column, "the passage is null")
        else:
            data.queries.append(query)
            data.passages.append(passage)
            data.owners.append(row)


def _read_candidates(data: RerankInput, payload: RerankPayload, column: str, queries: list, candidates: list) -> None:
    ids_col = payload.get("candidate_ids_column")
    id_lengths = _list_lengths(data.table, ids_col, payload["input"]) if ids_col else None
    limit = payload["max_candidates"]
    for row, (query, passages) in enumerate(zip(queries, candidates)):
        problem, where = None, column
        if query is None:
            problem, where = "the query is null", payload["query_column"]
        elif not passages:
            problem = "the query has no candidates"
        elif len(passages) > limit:
            problem = f"{len(passages)} candidates, over the limit of {limit} (--max-candidates)"
        elif None in passages:
            problem = f"candidate {passages.index(None)} is null"
        elif ids_col and id_lengths is not None and id_lengths[row] != len(passages):
            problem, where = f"{id_lengths[row] or 0} ids for {len(passages)} candidates", ids_col
        if problem:
            data.rejected[row] = rejection(payload, row, where, problem)
            continue
        data.queries.extend([query] * len(passages))
        data.passages.extend(passages)
        data.owners.extend([row] * len(passages))


def _string_lists(table: pa.Table, name: str, url: str) -> list[list[str | None] | None]:
    column = table.column(name)
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
        pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
    ):
        raise InputError(f"{url}: column {name!r} has type {kind}, expected a list of strings")
    try:
        return column.to_pylist()
    except UnicodeDecodeError as exc:
        raise InputError(f"{url}: column {name!r} holds a candidate that is not valid UTF-8: {exc}") from None


def _list_lengths(table: pa.Table, name: str, url: str) -> list[int | None]:
    column = table.column(name)
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise InputError(f"{url}: column {name!r} has type {column.type}, expected a list of candidate ids")
    return pc.list_value_length(column).to_pylist()


def compute(runtime: Scorer, data: RerankInput) -> RerankComputed:
    return RerankComputed(*runtime.score(data.queries, data.passages))


def write(payload: RerankPayload, data: RerankInput, computed: RerankComputed, spec: ModelSpec) -> ItemResult:
    rows = data.table.num_rows
    columns = identity_columns(payload, data.table, np.arange(rows))
    if payload["mode"] == "pairs":
        scores = np.zeros(rows, dtype=np.float32)
        scores[data.owners] = computed.scores
        valid = np.zeros(rows, dtype=bool)
        valid[data.owners] = True
        columns["score"] = pa.array(scores, mask=~valid)
    else:
        columns["ranking"] = _ranking(payload, data, computed.scores)
    size = write_part(payload["output"], part_table(payload, columns, data.table), payload.get("storage_options"))
    rejected = [data.rejected[row] for row in sorted(data.rejected)]
    return part_ack(
        payload, size, rejected, {"rows": rows, "pairs": len(data.queries), "truncated": computed.truncated}
    )


def _ranking(payload: RerankPayload, data: RerankInput, scores: np.ndarray) -> pa.Array:
    """list<struct<rank, index, [id], score>> per row, best first; null for rejected rows."""
    rows = data.table.num_rows
    owners = np.asarray(data.owners, dtype=np.int64)
    counts = np.bincount(owners, minlength=rows) if owners.size else np.zeros(rows, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    order = np.empty(owners.size, dtype=np.int64)  # pair positions, each row's best first
    for row in np.flatnonzero(counts):
        lo, hi = offsets[row], offsets[row + 1]
        order[lo:hi] = lo + np.argsort(-scores[lo:hi], kind="stable")
    index = (order - np.repeat(offsets[:-1], counts)).astype(np.int32)
    rank = (np.arange(owners.size) - np.repeat(offsets[:-1], counts) + 1).astype(np.int32)
    fields = {"rank": pa.array(rank), "index": pa.array(index)}
    ids_col = payload.get("candidate_ids_column")
    if ids_col:
        fields["id"] = _candidate_ids(data.table.column(ids_col), counts, offsets, index)
    fields["score"] = pa.array(scores[order].astype(np.float32))
    valid = counts > 0
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.StructArray.from_arrays(list(fields.values()), list(fields)), mask=pa.array(~valid)
    )


def _candidate_ids(column: pa.ChunkedArray, counts: np.ndarray, offsets: np.ndarray, index: np.ndarray) -> pa.Array:
    """Each scored row's candidate ids, in that row's ranked order (types kept)."""
    lists = column.combine_chunks()
    lengths = np.nan_to_num(pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(float)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])[:-1]  # where each row's ids begin in the flattened values
    take = np.repeat(starts, counts) + index
    return pc.list_flatten(lists).take(pa.array(take))


def online(runtime: Runtime, payloads: list[ScorePayload]) -> list[OnlineResult]:
    """{"query", "documents", "truncate"} per request -> {"scores" (document order), "tokens"}; requests for
    different LoRA adapters of one base in one call, each pair through its request's `adapter`."""
    if not isinstance(runtime, Scorer):
        return [{"error": f"model {runtime.spec.name!r} cannot score pairs", "status": 501} for _ in payloads]
    results: list[OnlineResult] = [{} for _ in payloads]
    answered, queries, documents = [], [], []
    for i, payload in enumerate(payloads):
        pair_queries = [payload["query"]] * len(payload["documents"])
        if not payload.get("truncate", True) and runtime.token_lengths(pair_queries, payload["documents"])[1]:
            results[i] = too_long(runtime.spec.max_seq_length)
            continue
        answered.append(i)
        queries.extend(pair_queries)
        documents.extend(payload["documents"])
    if not queries:
        return results
    measured = runtime.token_lengths(queries, documents)
    lengths = measured[0]
    scores, _ = runtime.score(queries, documents, measured, adapters=input_adapters(payloads, answered, "documents"))
    start = 0
    for i in answered:
        end = start + len(payloads[i]["documents"])
        results[i] = {"scores": scores[start:end].astype(float).tolist(), "tokens": int(lengths[start:end].sum())}
        start = end
    return results
