"""The online routes of the other kinds: sparse and multi-vector encodes (and the classifiers').

Each route is a `KindRoute`: its path, the model kinds it serves, the online
operation its items run on a worker (workers/operations), how a request body
becomes a `TextsCall` (checked against the gateway's limits as an encode
request's texts are), and how the workers' answer, joined over the request's
parts (request_parts), becomes the reply. The gateway serves every route in
`KIND_ROUTES` with one handler (`Gateway.kind_route`), so a kind's route is
an entry here.

Shapes (docs/PROTOCOL.md): MessagePack replies carry numbers as raw
little-endian bytes, as `/v1/encode` does; JSON replies carry lists.

- ``POST /v1/sparse/{model}`` ``{"texts", "truncate", "top_k"}`` ->
  ``{"model", "sparse": [{"indices", "values"}], "usage"}``: each text's
  non-zero term ids (int32, ascending) and weights (float32).
- ``POST /v1/multivector/{model}`` ``{"texts", "truncate", "input_type",
  "dtype", "precision", "dim", "ranges"}`` -> ``{"model", "dtype",
  "embeddings", "shapes", "usage"}``: each text's (tokens, dim) matrix.
- ``POST /v1/classify/{model}`` ``{"texts", "truncate", "top_k", "threshold",
  "labels", "template", "multi_label"}`` -> ``{"model", "labels", "usage"}``:
  each text's [{"label", "score"}], best first (zero-shot with `labels`).
- ``POST /v1/extract/{model}`` ``{"texts", "truncate", "aggregation",
  "labels", "threshold"}`` -> ``{"model", "entities", "usage"}``: each text's
  [{"text", "label", "score", "start", "end"}], character offsets.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np

from shoal.configs import GatewaySettings, ModelSpec

from .gateway import api_formats as api
from .gateway import body_limits
from .gateway.wire import MSGPACK, RequestError, clip, shown
from .protocol import Aggregation, ClassifyTexts, OnlineResult, TextsPayload

# The fields an encode request's texts come with, checked by api_formats.encode_call.
TEXT_FIELDS = {"texts", "truncate"}


@dataclass
class TextsCall:
    """A request of a kind route: its model and what travels to the worker."""

    model: str
    fields: TextsPayload

    def payload(self) -> TextsPayload:
        return self.fields

    @property
    def inputs(self) -> int:
        return len(self.fields["texts"])


@dataclass(frozen=True)
class KindRoute:
    path: str  # under /v1/, with the model name after it
    kinds: tuple[str, ...]  # the model kinds it serves
    action: str  # what a model of another kind "cannot ..."
    op: str  # the online operation a worker runs (workers/operations ONLINE_OPERATIONS)
    call: Callable[[str, Any, ModelSpec, GatewaySettings], TextsCall]  # (model, body, spec, limits)
    answer: Callable[[TextsCall, OnlineResult, str], api.ResponseBody]  # (call, result, reply media type)


def _split(body: Any, options: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The body's text fields and its own options; 400 for a field the route does not take."""
    unknown = sorted(str(key) for key in body_limits.fields(body) if key not in TEXT_FIELDS | options)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RequestError(
            400, f"invalid request: {', '.join(map(clip, unknown[:5]))}{more}: not a field of this route"
        )
    return {k: v for k, v in body.items() if k in TEXT_FIELDS}, {k: v for k, v in body.items() if k in options}


def _texts(model: str, fields: dict[str, Any], limits: GatewaySettings) -> TextsPayload:
    call = api.encode_call(model, fields, limits)
    return {"texts": call.texts, "truncate": call.truncate}


# -- sparse --------------------------------------------------------------------------


def sparse_call(model: str, body: Any, spec: ModelSpec, limits: GatewaySettings) -> TextsCall:
    texts, options = _split(body, {"top_k"})
    payload = _texts(model, texts, limits)
    top_k = options.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 1:
            raise RequestError(400, f"invalid request: top_k must be a positive integer, not {shown(top_k)}")
        payload["top_k"] = top_k
    return TextsCall(model, payload)


def sparse_answer(call: TextsCall, result: OnlineResult, kind: str) -> api.ResponseBody:
    rows = result["outputs"]
    if kind != MSGPACK:
        rows = [
            {
                "indices": np.frombuffer(row["indices"], "<i4").tolist(),
                "values": np.frombuffer(row["values"], "<f4").tolist(),
            }
            for row in rows
        ]
    return {"model": call.model, "sparse": rows, "usage": {"tokens": result.get("tokens", 0)}}


# -- multi-vector ------------------------------------------------------------------


def multivector_call(model: str, body: Any, spec: ModelSpec, limits: GatewaySettings) -> TextsCall:
    texts, options = _split(body, {"input_type", "dtype", "precision", "dim", "ranges"})
    input_type = options.pop("input_type", "document")
    if input_type not in ("query", "document"):
        raise RequestError(400, f"invalid request: input_type must be 'query' or 'document', not {shown(input_type)}")
    call = api.encode_call(model, {**texts, **options}, limits)  # the vector format's checks, as encode's
    call.check_dim(spec)
    payload: TextsPayload = {"texts": call.texts, "truncate": call.truncate, "input_type": input_type}
    payload["dtype"] = call.dtype
    if call.precision != "float32":
        payload["precision"] = call.precision
    if call.dim is not None:
        payload["dim"] = call.dim
    if call.ranges is not None:
        payload["ranges"] = call.ranges
    return TextsCall(model, payload)


def multivector_answer(call: TextsCall, result: OnlineResult, kind: str) -> api.ResponseBody:
    fields = call.fields
    precision = fields.get("precision", "float32")
    dtype = precision if precision != "float32" else fields.get("dtype", "float32")
    rows = result["outputs"]
    matrices: list[Any] = [row["embeddings"] for row in rows]
    if kind != MSGPACK:
        wire = api.WIRE_DTYPES[dtype]
        matrices = [
            np.frombuffer(row["embeddings"], wire)
            .reshape(row["shape"])
            .astype(np.float32 if wire[1] == "f" else wire)
            .tolist()
            for row in rows
        ]
    return {
        "model": call.model,
        "dtype": dtype,
        "embeddings": matrices,
        "shapes": [row["shape"] for row in rows],
        "usage": {"tokens": result.get("tokens", 0)},
    }


# -- classifiers --------------------------------------------------------------------

MAX_LABELS = 64  # zero-shot labels per request: each is one forward row per text


def classify_call(model: str, body: Any, spec: ModelSpec, limits: GatewaySettings) -> TextsCall:
    texts, options = _split(body, {"top_k", "threshold", "labels", "template", "multi_label"})
    payload: ClassifyTexts = {**_texts(model, texts, limits)}
    _label_options(options, payload)
    top_k = options.get("top_k")
    if top_k is not None:
        if type(top_k) is not int or top_k < 1:
            raise RequestError(400, f"invalid request: top_k must be a positive integer, not {shown(top_k)}")
        payload["top_k"] = top_k
    template, multi_label = options.get("template"), options.get("multi_label")
    if (template is not None or multi_label is not None) and not payload.get("labels"):
        raise RequestError(400, "invalid request: template and multi_label score zero-shot labels: give labels")
    if template is not None:
        if not isinstance(template, str) or not _one_placeholder(template):
            raise RequestError(
                400, f"invalid request: template must be a string with {{}} for the label: {shown(template)}"
            )
        payload["template"] = template
    if multi_label is not None:
        if type(multi_label) is not bool:
            raise RequestError(400, f"invalid request: multi_label must be true or false, not {shown(multi_label)}")
        payload["multi_label"] = multi_label
    return TextsCall(model, payload)


def extract_call(model: str, body: Any, spec: ModelSpec, limits: GatewaySettings) -> TextsCall:
    texts, options = _split(body, {"aggregation", "labels", "threshold", "multi_label"})
    payload: ClassifyTexts = {**_texts(model, texts, limits)}
    _label_options(options, payload)
    if spec.kind == "span_extractor":  # GLiNER: it finds the labels it is given, whatever aggregation means
        return TextsCall(model, _span_options(options, payload, model))
    if "multi_label" in options:
        raise RequestError(
            400, "invalid request: multi_label is a span extractor's; a token classifier labels each token once"
        )
    aggregation = options.get("aggregation")
    if aggregation is not None:
        if aggregation not in get_args(Aggregation):
            allowed = ", ".join(get_args(Aggregation))
            raise RequestError(400, f"invalid request: aggregation must be one of {allowed}, not {shown(aggregation)}")
        payload["aggregation"] = aggregation
    return TextsCall(model, payload)


def _span_options(options: dict[str, Any], payload: ClassifyTexts, model: str) -> ClassifyTexts:
    if "labels" not in payload:
        raise RequestError(400, f"invalid request: {model} is a span extractor (GLiNER): name the entities in labels")
    if "aggregation" in options:
        raise RequestError(400, "invalid request: aggregation is a token classifier's; a span extractor scores spans")
    multi_label = options.get("multi_label", False)
    if not isinstance(multi_label, bool):
        raise RequestError(400, f"invalid request: multi_label must be true or false, not {shown(multi_label)}")
    if multi_label:
        payload["multi_label"] = True
    return payload


def _label_options(options: dict[str, Any], payload: ClassifyTexts) -> None:
    """`labels` (distinct non-empty strings) and `threshold` (a number), checked, into `payload`."""
    labels = options.get("labels")
    if labels is not None:
        if isinstance(labels, list) and len(labels) > MAX_LABELS:  # before looking at each
            raise RequestError(400, f"invalid request: {len(labels)} labels; at most {MAX_LABELS} per request")
        if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x for x in labels):
            raise RequestError(400, "invalid request: labels must be a list of non-empty strings")
        if len(set(labels)) != len(labels):
            raise RequestError(400, f"invalid request: labels must be distinct, {MAX_LABELS} at most")
        try:
            "".join(labels).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(400, "invalid request: labels must be valid UTF-8 text") from None
        payload["labels"] = labels
    threshold = options.get("threshold")
    if threshold is not None:
        if type(threshold) not in (int, float) or not math.isfinite(threshold):
            raise RequestError(400, f"invalid request: threshold must be a number, not {shown(threshold)}")
        payload["threshold"] = float(threshold)


def _one_placeholder(template: str) -> bool:
    """One bare ``{}`` and no other field: a format spec (``{:>999999999}``) would build a string of its width."""
    try:
        fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(template)]
    except ValueError:  # an unmatched brace
        return False
    return [field for field in fields if field[0] is not None] == [("", "", None)]


def classify_answer(call: TextsCall, result: OnlineResult, kind: str) -> api.ResponseBody:
    return {"model": call.model, "labels": result["outputs"], "usage": {"tokens": result.get("tokens", 0)}}


def extract_answer(call: TextsCall, result: OnlineResult, kind: str) -> api.ResponseBody:
    return {"model": call.model, "entities": result["outputs"], "usage": {"tokens": result.get("tokens", 0)}}


KIND_ROUTES = [
    KindRoute("sparse", ("sparse",), "give sparse vectors", "encode_sparse", sparse_call, sparse_answer),
    KindRoute(
        "multivector",
        ("multivector",),
        "give token vectors",
        "encode_multivector",
        multivector_call,
        multivector_answer,
    ),
    KindRoute("classify", ("classifier",), "classify texts", "label", classify_call, classify_answer),
    KindRoute(
        "extract", ("token_classifier", "span_extractor"), "extract entities", "tag", extract_call, extract_answer
    ),
]
