"""Bodies on the wire: MessagePack or JSON, decoded only as far as a legal request goes; errors as statuses.

A body is decoded within `DecodeBounds`, the most values, lists and maps, and
map entries a legal request holds, so a hostile body costs no more than a
legal one of its size: MessagePack with every length bounded, no extension
types, and hooks counting the lists and maps as they are built that stop the
decoding past a bound; JSON after its separators are counted on the raw bytes
(C speed; what strings hold does not count). A 2 MB body of a million
integers is refused before one of them is built. Every problem with a
request is a `RequestError` carrying the HTTP status and a message for the
client; what a message quotes of the client is cut by `shown` or `clip` to
at most `ECHO_CHARS` characters.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

MSGPACK = "application/msgpack"
JSON = "application/json"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")
ECHO_CHARS = 200  # the most of any string from a client an error message quotes
NESTED = 100  # levels of lists and maps: a legal body has 4 (JSON's decoder stops near 1,000, MessagePack's at 1,024)
_OVER_LENGTH = re.compile(r"^(\d+) exceeds max_(str|bin|array|map|ext)_len")


class RequestError(Exception):
    """A request that cannot be answered as asked: status, message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def clip(text: str, most: int = ECHO_CHARS) -> str:
    """`text` cut to its first `most` characters, saying how long it was."""
    return text if len(text) <= most else f"{text[:most]}… ({len(text)} characters)"


def shown(value: Any) -> str:
    """A value from the client as an error message quotes it: a string's first characters, a list's size."""
    if isinstance(value, str):
        return repr(value) if len(value) <= ECHO_CHARS else f"{value[:ECHO_CHARS]!r}… ({len(value)} characters)"
    if isinstance(value, list):
        return f"a list of {len(value)} items"
    if isinstance(value, dict):
        return f"a map of {len(value)} entries"
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return clip(repr(value))  # None, a bool, a number (JSON's integers have at most 4,300 digits)


def media_type(header: str | None, default: str) -> str | None:
    """MSGPACK or JSON for a Content-Type header; None for anything else."""
    if not header:
        return default
    value = header.split(";", 1)[0].strip().lower()
    if value in _MSGPACK_TYPES:
        return MSGPACK
    if value == JSON or value.endswith("+json"):
        return JSON
    return None


def response_type(accept: str | None, request_type: str) -> str:
    """What the client asked for with Accept, else what it sent."""
    accept = (accept or "").lower()
    if any(t in accept for t in _MSGPACK_TYPES):
        return MSGPACK
    if "json" in accept:
        return JSON
    return request_type


@dataclass(frozen=True)
class DecodeBounds:
    """The most a legal body holds (body_limits.decode_bounds): past any of them, decoding stops."""

    values: int  # list items and map entries
    containers: int  # lists and maps
    entries: int  # map entries
    strings: int  # texts, keys, other strings: a JSON body over a bound by its bytes' count is recounted below it
    list_items: int  # items of one list (MessagePack checks it at the list's header)
    map_entries: int  # entries of one map (MessagePack checks it at the map's header)

    def refusal(self, values: int, containers: int, entries: int) -> RequestError | None:
        """The 413 for a body over a bound, else None."""
        for count, most, what in (
            (values, self.values, "values (list items and map entries)"),
            (containers, self.containers, "lists and maps"),
            (entries, self.entries, "map entries"),
        ):
            if count > most:
                return RequestError(413, f"the body holds more than {most} {what}; a request holds at most that")
        return None


class _OverBounds(Exception):
    pass


class _Count:
    """MessagePack's hooks, called as each list and map is built: past a bound, decoding stops there."""

    def __init__(self, bounds: DecodeBounds) -> None:
        self.bounds = bounds
        self.values = self.containers = self.entries = 0

    def list(self, items: list[Any]) -> list[Any]:
        self._add(len(items), 0)
        return items

    def map(self, entries: dict[str, Any]) -> dict[str, Any]:
        self._add(len(entries), len(entries))
        return entries

    def _add(self, values: int, entries: int) -> None:
        self.values += values
        self.containers += 1
        self.entries += entries
        if self.bounds.refusal(self.values, self.containers, self.entries):
            raise _OverBounds

    def refusal(self) -> RequestError:
        refusal = self.bounds.refusal(self.values, self.containers, self.entries)
        assert refusal is not None, "stopped within the bounds"
        return refusal


def _structure(data: bytes, bounds: DecodeBounds) -> tuple[int, int, int, int]:
    """Upper bounds on JSON's (values, containers, entries) and its commas: each value but a container's first
    follows a comma, each entry has a colon. Commas first: past the values bound, the rest is not counted."""
    commas = data.count(b",")
    if commas >= bounds.values:
        return commas + 1, 0, 0, commas
    containers = data.count(b"[") + data.count(b"{")
    return commas + containers + 1, containers, data.count(b":"), commas


def _json_refusal(body: bytes, bounds: DecodeBounds) -> RequestError | None:
    """Whether a JSON body holds more than the bounds, counted on its bytes before any value is built."""
    if bounds.refusal(*_structure(body, bounds)[:3]) is None:
        return None
    # Perhaps commas, brackets and colons in texts: count what lies outside the strings, once their number
    # (by their quotes) shows that splitting the body at them costs no more than decoding a legal body.
    if body.count(b'"') - body.count(b'\\"') > 2 * bounds.strings:  # escaped quotes (JSON in a text) left out
        return RequestError(413, f"the body holds more than {bounds.strings} strings; a request holds at most that")
    if b"\\" in body:  # escaped backslashes, then escaped quotes: what is left of a quote ends or starts a string
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    values, containers, entries, commas = _structure(b"".join(body.split(b'"')[0::2]), bounds)
    if containers > NESTED * (commas + 1):  # lists and maps in few branches: a tree that deep has no place here
        return RequestError(400, f"the body is nested too deeply (at least {containers // (commas + 1)} levels)")
    return bounds.refusal(values, containers, entries)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode(body: bytes, kind: str, bounds: DecodeBounds) -> Any:
    """The body's value, within `bounds`; a `RequestError` saying why it is not one."""
    if not body:
        raise RequestError(400, "the request body is empty")
    if kind == MSGPACK:
        return _decode_msgpack(body, bounds)
    refusal = _json_refusal(body, bounds)
    if refusal is not None:
        raise refusal
    try:
        return orjson.loads(body)  # about three times the standard library's speed: a large body holds the loop less
    except orjson.JSONDecodeError:
        pass  # the standard library accepts what orjson does not (lone surrogates, named later by the texts' check)
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except RecursionError:  # the decoder recurses per bracket
        raise RequestError(400, "the body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, bytes that are not UTF-8, an integer of over 4,300 digits
        raise RequestError(400, f"the body is not valid JSON: {clip(str(exc))}") from None


def _decode_msgpack(body: bytes, bounds: DecodeBounds) -> Any:
    count = _Count(bounds)
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=len(body),
            max_bin_len=len(body),
            max_array_len=bounds.list_items,
            max_map_len=bounds.map_entries,
            max_ext_len=0,
            # Bytes that are not UTF-8 become lone surrogates, refused by api_formats with the
            # index of the text that holds them (a decode error here could not name it).
            unicode_errors="surrogateescape",
            list_hook=count.list,
            object_hook=count.map,
        )
    except _OverBounds:
        raise count.refusal() from None
    except msgpack.StackError:
        raise RequestError(400, "the body is nested too deeply (MessagePack: over 1,024 levels)") from None
    except msgpack.FormatError:  # the one type byte MessagePack never uses
        reason = "it holds the byte 0xc1, which MessagePack never uses"
        raise RequestError(400, f"the body is not valid MessagePack: {reason}") from None
    except msgpack.ExtraData:
        raise RequestError(400, "the body is not valid MessagePack: bytes follow its first value") from None
    except ValueError as exc:
        raise _msgpack_error(str(exc), bounds) from None


def _msgpack_error(message: str, bounds: DecodeBounds) -> RequestError:
    over = _OVER_LENGTH.match(message)
    if over and over.group(2) == "array":
        return RequestError(
            413, f"the body holds a list of {over.group(1)} items; a list holds at most {bounds.list_items}"
        )
    if over and over.group(2) == "map":
        return RequestError(
            400, f"invalid request: a map of {over.group(1)} entries; a map has at most {bounds.map_entries}"
        )
    if over and over.group(2) == "ext":
        reason = "extension types (the timestamp type included) are not accepted"
    elif over:
        reason = f"a {over.group(2)} of {over.group(1)} bytes in a body of fewer"
    elif "incomplete input" in message:
        reason = "it is truncated: the body ends inside a value"
    elif "not allowed for map key" in message:
        reason = "a map key that is not a string"
    else:
        reason = clip(message)
    return RequestError(400, f"the body is not valid MessagePack: {reason}")


def encode(obj: Any, kind: str) -> bytes:
    if kind == MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":")).encode()
