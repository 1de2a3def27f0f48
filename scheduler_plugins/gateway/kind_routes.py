"""The kinds' own online routes, ``POST /v1/<operation>/{model}``: one handler's steps for all of them.

Each kind with a `Route` (configs/kinds) has the route of its operation:
``/v1/sparse``, ``/v1/multivector``, ``/v1/classify``, ``/v1/extract``
(docs/PROTOCOL.md). What differs by kind is the kind's: the options it takes,
how they are checked into what travels to the worker, and the reply's shape.
What every such route shares is here: the texts checked against the gateway's
limits as an encode request's are (and, for a route that takes them, the
vector format's fields), a field the model's route does not take refused, the
kind's refusals as 400s, and the model's name at the head of the reply.
MessagePack replies carry numbers as raw little-endian bytes, as
``/v1/encode`` does; JSON replies carry lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ...configs import GatewaySettings, ModelSpec
from ...configs.kinds import InvalidRequest, Route, kind_of
from ..protocol import OnlineResult, TextsPayload
from . import api_formats as api
from . import body_limits
from .wire import MSGPACK, RequestError, clip, shown

# The fields every route's texts come with, and the vector format's (a route with `vectors`), checked by
# api_formats.encode_call as an encode request's are.
TEXT_FIELDS = {"texts", "truncate"}
VECTOR_FIELDS = {"dtype", "precision", "dim", "ranges"}


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


def route_of(spec: ModelSpec) -> Route:
    """The route of `spec`'s kind (the gateway serves a model only on its own kind's operation's route)."""
    route = kind_of(spec).route
    assert route is not None, f"kind {spec.kind!r} has no route of its own"
    return route


def texts_call(model: str, body: Any, spec: ModelSpec, limits: GatewaySettings) -> TextsCall:
    """The request's texts and its options, checked by its model's kind; a 400 for what it refuses."""
    route = route_of(spec)
    shared = TEXT_FIELDS | (VECTOR_FIELDS if route.vectors else set())
    unknown = sorted(str(key) for key in body_limits.fields(body) if key not in shared | route.options)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise RequestError(
            400, f"invalid request: {', '.join(map(clip, unknown[:5]))}{more}: not a field of this route"
        )
    call = api.encode_call(model, {k: v for k, v in body.items() if k in shared}, limits)
    fields: TextsPayload = {"texts": call.texts, "truncate": call.truncate}
    if route.vectors:
        call.check_dim(spec)
        fields["dtype"] = call.dtype
        if call.precision != "float32":
            fields["precision"] = call.precision
        if call.dim is not None:
            fields["dim"] = call.dim
        if call.ranges is not None:
            fields["ranges"] = call.ranges
    try:  # the kind's options, checked into the fields that travel
        route.parse({k: v for k, v in body.items() if k in route.options}, cast(dict[str, Any], fields), spec)
    except InvalidRequest as exc:
        raise RequestError(400, exc.told(shown)) from None
    return TextsCall(model, fields)


def answer(spec: ModelSpec, call: TextsCall, result: OnlineResult, reply: str) -> api.ResponseBody:
    """The workers' joined result in the reply's shape: the model's name, then its kind's answer."""
    return {"model": call.model, **route_of(spec).answer(cast(dict[str, Any], call.fields), result, reply == MSGPACK)}
