"""The `extract` operation: the entities of each row's text, from a token classifier or a span extractor.

Stored as ``entities: list<struct<text: string, label: string, score:
float32, start: int64, end: int64>>`` in order of `start`: the spans,
labels and scores transformers' ``token-classification`` pipeline gives
with the job's ``aggregation_strategy``, `start` and `end` character
offsets into the source text, `text` the source's ``text[start:end]``. One
row per input row always: under a `chunk` setting a long text is read in
windows of `tokens` overlapping by `overlap` (the pipeline's ``stride``), and
the entities of every window, offsets already into the whole text, are
merged as the pipeline merges them. `labels` keeps only entities of those
labels and `threshold` those scoring at least it. A span extractor (GLiNER)
finds the entities of the `labels` it is given, scoring at least `threshold`
(0.5 by default), `multi_label` letting a span carry several; it reads a
text whole up to its `max_len` words (no windows). Online, `online` (op `tag`) answers
a group of requests with one model call per aggregation: each text's
entities as [{"text", "label", "score", "start", "end"}].
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ClassifyPayload, ClassifyTexts, ItemResult, OnlineResult
from ..batching.token_batching import Measured
from ..runtimes.span_extractor import SpanExtractor
from ..runtimes.token_classifier import Aggregation, Entity, TokenClassifier
from .embed_operation import read as read_texts
from .online_texts import answer_texts
from .row_parts import KindInput, row_texts, write_rows

ENTITY = pa.struct(
    [("text", pa.string()), ("label", pa.string()), ("score", pa.float32()), ("start", pa.int64()), ("end", pa.int64())]
)
ExtractComputed = tuple[list[int], list[list[Entity]], int]
DEFAULT_AGGREGATION: Aggregation = "simple"


def read(payload: ClassifyPayload) -> KindInput:
    return KindInput(read_texts(payload), payload)


def compute(runtime: TokenClassifier | SpanExtractor, data: KindInput) -> ExtractComputed:
    present, texts, _ = row_texts(data.rows, runtime.tokenizer, None)  # windows are the runtime's own: one row each
    if isinstance(runtime, SpanExtractor):
        found, truncated = _spans(runtime, texts, data.payload)
        return present, found, truncated
    chunk = data.rows.chunk
    found, truncated = runtime.entities(
        texts,
        aggregation_of(data.payload),
        stride=chunk.overlap if chunk else None,
        window=chunk.tokens if chunk else 0,
    )
    return present, [kept(entities, data.payload) for entities in found], truncated


SpanQuery = tuple[tuple[str, ...], float | None, bool]  # what a span extractor is asked: labels, threshold, multi


def span_query(payload: ClassifyTexts) -> SpanQuery:
    return tuple(payload.get("labels") or ()), payload.get("threshold"), payload.get("multi_label", False)


def _spans(
    runtime: SpanExtractor, texts: list[str], payload: ClassifyPayload | ClassifyTexts
) -> tuple[list[list[Entity]], int]:
    labels = payload.get("labels") or []
    return runtime.entities(texts, labels, payload.get("threshold"), payload.get("multi_label", False))


def aggregation_of(payload: ClassifyPayload | ClassifyTexts) -> Aggregation:
    aggregation = payload.get("aggregation", DEFAULT_AGGREGATION)
    assert aggregation in ("none", "simple", "first", "max", "average"), aggregation  # checked where it entered
    return aggregation


def kept(entities: list[Entity], payload: ClassifyPayload | ClassifyTexts) -> list[Entity]:
    """The entities of the asked labels scoring at least the threshold."""
    labels, threshold = set(payload.get("labels") or ()), payload.get("threshold")
    return [e for e in entities if (not labels or e.label in labels) and (threshold is None or e.score >= threshold)]


def entities_column(rows: list[list[Entity]]) -> pa.Array:
    """One list of entities per row."""
    flat = [entity for row in rows for entity in row]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    fields = [
        pa.array([e.text for e in flat], pa.string()),
        pa.array([e.label for e in flat], pa.string()),
        pa.array([e.score for e in flat], pa.float32()),
        pa.array([e.start for e in flat], pa.int64()),
        pa.array([e.end for e in flat], pa.int64()),
    ]
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.StructArray.from_arrays(fields, fields=list(ENTITY))
    )


def write(payload: ClassifyPayload, data: KindInput, computed: ExtractComputed, spec: ModelSpec) -> ItemResult:
    present, found, truncated = computed
    return write_rows(payload, data.rows, present, None, truncated, "entities", entities_column(found))


def online(runtime: TokenClassifier | SpanExtractor, payloads: list[ClassifyTexts]) -> list[OnlineResult]:
    """{"texts", "truncate"[, "aggregation", "labels", "threshold", "multi_label"]} per request
    -> {"outputs": [[{"text", "label", "score", "start", "end"}, ...] per text], "tokens"}."""
    if isinstance(runtime, SpanExtractor):  # one model call per distinct labels, threshold and multi_label
        spans = runtime

        def find(
            texts: list[str], measured: Measured, key: SpanQuery, adapters: list[str | None]
        ) -> list[list[Entity]]:
            return spans.entities(texts, list(key[0]), key[1], key[2])[0]

        return answer_texts(runtime, payloads, span_query, find, _answer)
    return answer_texts(
        runtime,
        payloads,
        aggregation_of,
        lambda texts, measured, aggregation, adapters: runtime.entities(texts, aggregation, adapters=adapters)[0],
        _answer,
    )


def _answer(payload: ClassifyTexts, rows: Sequence[list[Entity]]) -> OnlineResult:
    return {
        "outputs": [
            [
                {"text": e.text, "label": e.label, "score": e.score, "start": e.start, "end": e.end}
                for e in kept(entities, payload)
            ]
            for entities in rows
        ]
    }
