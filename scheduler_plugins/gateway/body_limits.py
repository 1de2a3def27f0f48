"""A request's size limits, checked on the decoded body before pydantic sees it.

pydantic validates every element of a list, and for a union builds an error
for each failing element of each member: a 2 MB Cohere body of a million
integers took 23 s (and 2.5 GB) to refuse, on the event loop. Here each list
field's length is checked first (``len``), then its elements' types by a loop
that stops at the first wrong one and names it, so what a body costs is
bounded by the limits, not by its size. The schemas in api_formats declare
these fields `SkipValidation`: pydantic checks the small fields only.

Limits (GatewaySettings): `max_inputs` texts, `max_documents` documents,
`max_input_tokens` ids in one token array and `max_request_tokens` in all;
here, `MAX_FIELDS` fields (of any map) and `MAX_DIMENSIONS` per `ranges` list;
the decoder (wire) holds a whole body to `decode_bounds`.
"""

from __future__ import annotations

from typing import Any

from ...configs import GatewaySettings
from .wire import DecodeBounds, RequestError, clip

MAX_FIELDS = 64  # fields of a body's top map (a route takes at most a dozen; other vendors' extras are ignored)
MAX_DIMENSIONS = 65_536  # entries of each `ranges` list: wider than any embedding model
SLACK_VALUES = 1024  # fields, labels, nesting: what a body holds besides its inputs


ENTRIES_PER_INPUT = 8  # a Cohere document may be a map: its text, and a few fields of the client's


def decode_bounds(limits: GatewaySettings) -> DecodeBounds:
    """The most a legal body holds, what its decoding may build: token ids, then inputs, dominate."""
    inputs = max(limits.max_inputs, limits.max_documents)
    return DecodeBounds(
        values=ENTRIES_PER_INPUT * inputs + limits.max_request_tokens + 2 * MAX_DIMENSIONS + SLACK_VALUES,
        containers=inputs + SLACK_VALUES,
        entries=ENTRIES_PER_INPUT * inputs + SLACK_VALUES,
        strings=inputs + 2 * ENTRIES_PER_INPUT * inputs + SLACK_VALUES,  # the inputs, the maps' keys and values
        list_items=max(inputs, limits.max_input_tokens, MAX_DIMENSIONS),  # the longest list a route takes
        map_entries=MAX_FIELDS,
    )


def kind_of(value: Any) -> str:
    """A value's JSON kind, for a message: `a number`, `null`, `a list`, ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return type(value).__name__  # MessagePack's bytes


def fields(body: Any) -> dict[str, Any]:
    """The body as a map of at most MAX_FIELDS fields."""
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a map (an object), not {kind_of(body)}")
    if len(body) > MAX_FIELDS:
        raise RequestError(400, f"invalid request: the body has {len(body)} fields; a request has at most {MAX_FIELDS}")
    return body


def count(items: list[Any], field: str, most: int, what: str | None = None) -> None:
    """At least one item, at most `most` (422)."""
    if not items:
        raise RequestError(422, f"{what or field} is empty")
    if len(items) > most:
        raise RequestError(422, f"{len(items)} {what or field}; at most {most} per request")


def strings(body: dict[str, Any], field: str, most: int, what: str | None = None, optional: bool = False) -> None:
    """`body[field]`, when given, a list of 1 to `most` strings (or null, when `optional`)."""
    if field not in body or (optional and body[field] is None):
        return  # pydantic says it is missing, or the route what null means
    items = body[field]
    if not isinstance(items, list):
        raise RequestError(400, f"invalid request: {field} must be a list of strings, not {kind_of(items)}")
    count(items, field, most, what)
    _all(items, str, field, "a string")


def _all(items: list[Any], kind: type, field: str, expected: str) -> None:
    """Every item of exactly `kind` (a bool is no number), else a 400 naming the first that is not."""
    if set(map(type, items)) - {kind}:
        first = next(i for i, item in enumerate(items) if type(item) is not kind)
        raise RequestError(400, f"invalid request: {field}[{first}] is {kind_of(items[first])}, not {expected}")


def images(body: dict[str, Any], field: str, most: int) -> None:
    """An image model's `body[field]`, when given and not null: 1 to `most` raw bytes or data URIs (each then
    checked by image_inputs)."""
    items = body.get(field)
    if items is None:
        return
    if not isinstance(items, list):
        raise RequestError(400, f"invalid request: {field} must be a list of images, not {kind_of(items)}")
    count(items, field, most)
    if set(map(type, items)) - {bytes, str}:
        first = next(i for i, item in enumerate(items) if type(item) not in (bytes, str))
        raise RequestError(400, f"invalid request: {field}[{first}] is {kind_of(items[first])}, not an image")


def documents(body: dict[str, Any], most: int) -> None:
    """Cohere's documents, strings or maps with a `text`, made the list of their texts."""
    if "documents" not in body:
        return
    items = body["documents"]
    if not isinstance(items, list):
        raise RequestError(400, f"invalid request: documents must be a list, not {kind_of(items)}")
    count(items, "documents", most)
    texts = [item["text"] if type(item) is dict and type(item.get("text")) is str else item for item in items]
    if set(map(type, texts)) - {str}:
        first = next(i for i, text in enumerate(texts) if type(text) is not str)
        raise RequestError(
            400, f"invalid request: documents[{first}] is {kind_of(texts[first])}, not a string or a map with a text"
        )
    body["documents"] = texts


def openai_input(body: dict[str, Any], limits: GatewaySettings) -> None:
    """OpenAI's four shapes of `input`: a text, texts, a token array, token arrays.

    The ids' types are checked where they are decoded, off the event loop
    (token_arrays.decode): up to `max_request_tokens` of them.
    """
    if "input" not in body or isinstance(body["input"], str):
        return
    given = body["input"]
    if not isinstance(given, list):
        raise RequestError(
            400,
            f"invalid request: input must be a string, a list of strings, a token array or a list of token arrays, "
            f"not {kind_of(given)}",
        )
    if given and type(given[0]) is int:  # one token array
        count(given, "input", limits.max_input_tokens, "token ids in input")
        _all(given, int, "input", "a token id")
        return
    count(given, "input", limits.max_inputs)
    if type(given[0]) is not list:
        _all(given, str, "input", "a string")
        return
    _all(given, list, "input", "a token array")
    longest = max(map(len, given))
    if longest > limits.max_input_tokens or not min(map(len, given)):
        first = next(i for i, ids in enumerate(given) if not ids or len(ids) > limits.max_input_tokens)
        raise RequestError(
            422, f"input[{first}] holds {len(given[first])} token ids; from 1 to {limits.max_input_tokens} per input"
        )
    total = sum(map(len, given))
    if total > limits.max_request_tokens:
        raise RequestError(422, f"{total} token ids in input; at most {limits.max_request_tokens} per request")


def ranges(body: dict[str, Any]) -> None:
    """`ranges`, when given: two lists of at most MAX_DIMENSIONS numbers (their values are api_formats')."""
    given = body.get("ranges")
    if given is None:
        return
    if not (type(given) is list and len(given) == 2 and all(type(side) is list for side in given)):
        raise RequestError(400, "invalid request: ranges must be two lists of equal length (minimum, maximum)")
    for side, name in zip(given, ("ranges[0]", "ranges[1]"), strict=True):
        if len(side) > MAX_DIMENSIONS:
            raise RequestError(422, f"{name} has {len(side)} dimensions; at most {MAX_DIMENSIONS}")
        if set(map(type, side)) - {int, float}:
            first = next(i for i, value in enumerate(side) if type(value) not in (int, float))
            raise RequestError(400, f"invalid request: {name}[{first}] is {kind_of(side[first])}, not a number")


def location(parts: tuple[int | str, ...]) -> str:
    """A pydantic error's location, each part as the client named it (cut: a field name may be 1 MB)."""
    return ".".join(clip(str(part)) for part in parts) or "body"
