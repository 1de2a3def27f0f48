"""Span extractors (GLiNER): the entities of the labels a job or request names, found in each text.

Recognised from a GLiNER folder (``gliner_config.json``); its width is the
span representation's (``hidden_size``), its window the encoder's positions.
GLiNER scores every span of up to ``max_width`` words against every label, so
its cost grows faster than an encoder's with a batch's longest text: its token
budget is smaller (2,048 tokens ran 1.5x faster than 8,192 on the CPU, issue
35). Its operation is ``extract``, as a token classifier's, and its route
answers in the same shape; it takes ``labels`` (required), ``threshold`` and
``multi_label``, and reads each text whole up to its ``max_len`` words (no
windows). The quality gate does not judge it.
"""

from __future__ import annotations

from typing import Any

from .. import ConfigError
from .kind import Body, Fields, InvalidRequest, JobOptions, Kind, Route
from .request_options import labels_and_threshold
from .token_classifier import answer

GLINER_CONFIG = "gliner_config.json"
SPAN_TOKEN_BUDGET = {"cpu": 2048, "cuda": 16384}


def check(options: JobOptions, spec: Any) -> None:
    if not options.get("labels"):
        raise ConfigError(f"model {spec.name!r} is a span extractor (GLiNER): name the entities with --labels")
    if "chunk" in options:
        raise ConfigError(f"model {spec.name!r} reads each text whole up to its max_len words: no --chunk windows")


def parse(options: Body, fields: Fields, spec: Any) -> None:
    labels_and_threshold(options, fields)
    if "labels" not in fields:
        raise InvalidRequest(
            "invalid request: {value} is a span extractor (GLiNER): name the entities in labels", spec.name
        )
    multi_label = options.get("multi_label", False)
    if not isinstance(multi_label, bool):
        raise InvalidRequest("invalid request: multi_label must be true or false, not {value}", multi_label)
    if multi_label:
        fields["multi_label"] = True


KIND = Kind(
    name="span_extractor",
    command="extract",
    operations={"extract": "shoal.workers.operations.extract_operation"},
    runtimes={"torch": "shoal.workers.runtimes.span_extractor:SpanExtractor"},
    recognises=lambda files: (files.folder / GLINER_CONFIG).is_file(),
    width=lambda files: files.gliner_width(),
    token_budget=SPAN_TOKEN_BUDGET,
    options=frozenset({"threshold", "labels", "multi_label"}),
    check=check,
    route=Route("extract entities", frozenset({"labels", "threshold", "multi_label"}), parse, answer),
)
