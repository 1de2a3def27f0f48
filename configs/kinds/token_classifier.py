"""Token classifiers (NER): each text's entities, spans of tokens labelled alike.

Recognised from a bare transformers ``*ForTokenClassification`` folder; its
width is its labels' count. Its operation is ``extract``, shared with the span
extractor: `shoal extract` and ``POST /v1/extract/{model}`` ``{"texts",
"truncate", "aggregation", "labels", "threshold"}`` -> ``{"model",
"entities", "usage"}``: each text's [{"text", "label", "score", "start",
"end"}], character offsets. Token labels become spans by `aggregation`
(transformers' ``aggregation_strategy``, ``simple`` by default). The gate
holds 98 % of the spans either side finds to both, their scores within 0.02.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from .. import ConfigError
from . import request_options
from .kind import Body, Fields, Gate, InvalidRequest, JobOptions, Kind, Route

# How token labels become spans: transformers' token-classification aggregation_strategy.
Aggregation = Literal["none", "simple", "first", "max", "average"]
AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)


def recognises(files: Any) -> bool:
    return not files.module_types() and any(a.endswith("ForTokenClassification") for a in files.architectures())


def check(options: JobOptions, spec: Any) -> None:
    if "chunk" in options and options.get("aggregation") == "none":
        raise ConfigError("chunked windows are merged into spans: give an aggregation other than none")


def parse(options: Body, fields: Fields, spec: Any) -> None:
    request_options.labels_and_threshold(options, fields)
    aggregation = options.get("aggregation")
    if aggregation is not None:
        if aggregation not in AGGREGATIONS:
            allowed = ", ".join(AGGREGATIONS)
            raise InvalidRequest(f"invalid request: aggregation must be one of {allowed}, not {{value}}", aggregation)
        fields["aggregation"] = aggregation


def answer(fields: Fields, result: Any, binary: bool) -> dict[str, Any]:
    return {"entities": result["outputs"], "usage": request_options.tokens(result)}


def spans(runtime: Any, texts: list[str]) -> Any:
    """The spans a job writes (simple aggregation): what the gate compares."""
    return runtime.entities(texts)[0]


KIND = Kind(
    name="token_classifier",
    command="extract",
    operations={"extract": "shoal.workers.operations.extract_operation"},
    runtimes={"torch": "shoal.workers.runtimes.token_classifier:TokenClassifier"},
    recognises=recognises,
    adapters=True,
    width=lambda files: files.labels(),
    options=frozenset({"chunk", "threshold", "labels", "aggregation"}),
    check=check,
    route=Route("extract entities", frozenset({"aggregation", "labels", "threshold"}), parse, answer),
    gate=Gate("spans", spans),
)
