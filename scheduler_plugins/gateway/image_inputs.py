"""Images in online requests: data URIs (JSON) or raw bytes (MessagePack), checked before anything decodes them.

A request's images travel to a worker as their encoded bytes; what the
gateway can refuse without decoding pixels it refuses here, each a 400 naming
the input (``images[3]``): a string that is not a ``data:`` URI of base64, more
bytes than `max_image_bytes`, bytes in which Pillow recognises no image format,
or a header whose width x height passes `max_image_pixels` (a decompression
bomb is refused from its header, never decoded). Pillow reads only the header
here. A file that is damaged past its header (truncated) fails on the worker's
decode, and the worker answers the same 400 naming the input.
"""

from __future__ import annotations

import base64
import binascii
import io
import warnings
from typing import Any

from ...configs import GatewaySettings
from .wire import RequestError


def image_bytes(values: list[Any], what: str, limits: GatewaySettings) -> list[bytes]:
    """Each image's encoded bytes, checked (`what`: the field, for the 400s); raw bytes or data URIs."""
    if not values:
        raise RequestError(422, f"{what} is empty")
    if len(values) > limits.max_inputs:
        raise RequestError(422, f"{len(values)} {what}; at most {limits.max_inputs} per request")
    images = []
    for i, value in enumerate(values):
        data = value if isinstance(value, bytes) else _data_uri(value, f"{what}[{i}]")
        _check(data, f"{what}[{i}]", limits)
        images.append(data)
    return images


def is_data_uri(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("data:")


def _data_uri(value: Any, where: str) -> bytes:
    if not is_data_uri(value):
        shown = repr(value[:40]) if isinstance(value, str) else type(value).__name__
        raise RequestError(
            400, f"{where} is not an image: expected a data URI (data:image/...;base64,...), got {shown}"
        )
    head, comma, body = value.partition(",")
    if not comma or not head.endswith(";base64"):
        raise RequestError(400, f"{where} is not a base64 data URI (data:image/...;base64,...)")
    try:
        return base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(400, f"{where} is not valid base64: {exc}") from None


def _check(data: bytes, where: str, limits: GatewaySettings) -> None:
    """The size, the format and the header's pixel count: nothing here decodes pixels."""
    from PIL import Image

    if len(data) > limits.max_image_bytes:
        raise RequestError(400, f"{where} has {len(data):,} bytes, over the limit of {limits.max_image_bytes:,}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit below is ours
        try:
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
        except Image.DecompressionBombError as exc:
            raise RequestError(400, f"{where} is over the pixel limit (a decompression bomb?): {exc}") from None
        except (OSError, ValueError, SyntaxError):
            raise RequestError(
                400, f"{where} is not an image: no format Pillow reads starts its {len(data):,} bytes"
            ) from None
    if width * height > limits.max_image_pixels:
        raise RequestError(
            400,
            f"{where} is {width}x{height} = {width * height:,} pixels, over the limit of {limits.max_image_pixels:,} "
            "(a decompression bomb?)",
        )
