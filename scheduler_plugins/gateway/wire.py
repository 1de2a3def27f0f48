"""Bodies on the wire: MessagePack or JSON, decoded under limits, errors as statuses.

MessagePack is decoded with every length bounded by the body size limit and
no extension types, so a small hostile body cannot make the scheduler
allocate much or build unexpected objects. Every problem with a request is a
`RequestError` carrying the HTTP status and a message for the client.
"""

from __future__ import annotations

import json
from typing import Any

import msgpack

MSGPACK = "application/msgpack"
JSON = "application/json"
_MSGPACK_TYPES = (MSGPACK, "application/x-msgpack", "application/vnd.msgpack")


class RequestError(Exception):
    """A request that cannot be answered as asked: status, message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


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


def decode(body: bytes, kind: str, max_bytes: int) -> Any:
    if not body:
        raise RequestError(400, "the request body is empty")
    try:
        if kind == MSGPACK:
            return msgpack.unpackb(
                body,
                raw=False,
                strict_map_key=True,
                max_str_len=max_bytes,
                max_bin_len=max_bytes,
                max_array_len=max_bytes,
                max_map_len=max_bytes,
                max_ext_len=0,
                # Bytes that are not UTF-8 become lone surrogates, refused by api_formats with the
                # index of the text that holds them (a decode error here could not name it).
                unicode_errors="surrogateescape",
            )
        return json.loads(body)
    except RecursionError:  # JSON's decoder recurses per bracket; msgpack's has its own StackError
        raise RequestError(400, "the body is nested too deeply") from None
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, UnicodeDecodeError) as exc:
        name = "MessagePack" if kind == MSGPACK else "JSON"
        raise RequestError(400, f"the body is not valid {name}: {exc}") from None


def encode(obj: Any, kind: str) -> bytes:
    if kind == MSGPACK:
        return msgpack.packb(obj, use_bin_type=True)
    return json.dumps(obj, separators=(",", ":")).encode()
