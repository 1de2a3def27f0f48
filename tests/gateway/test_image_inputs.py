"""Online image inputs refused before decoding: not a data URI, bad base64, too many bytes, not an image, a bomb."""

from __future__ import annotations

import pytest

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.gateway.image_inputs import image_bytes
from shoal.scheduler_plugins.gateway.wire import RequestError
from tests.support.image_models import data_uri, decompression_bomb, draw_images, encoded, truncated

LIMITS = GatewaySettings()


def refused(values: list, limits: GatewaySettings = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as caught:
        image_bytes(values, "images", limits)
    return caught.value


def test_data_uris_and_raw_bytes_give_the_images_bytes() -> None:
    jpeg, png = (encoded(image, fmt) for image, fmt in zip(draw_images(2), ("JPEG", "PNG")))
    assert image_bytes([data_uri(jpeg), png], "images", LIMITS) == [jpeg, png]
    assert image_bytes([data_uri(png, "image/png")], "input", LIMITS) == [png]
    # damaged past its header: the gateway cannot tell without decoding; the worker's decode names it
    assert image_bytes([truncated(jpeg)], "images", LIMITS) == [truncated(jpeg)]


def test_each_refusal_is_a_400_naming_the_input() -> None:
    good = data_uri(encoded(draw_images(1)[0]))
    error = refused([good, "https://example.com/cat.jpg"])
    assert error.status == 400 and error.message.startswith("images[1] is not an image: expected a data URI")
    assert refused([good, good, "data:image/png;base64,@@@"]).message.startswith("images[2] is not valid base64")
    assert refused(["data:image/png,raw"]).message.startswith("images[0] is not a base64 data URI")
    error = refused([good, data_uri(b"%PDF-1.7 this is a document")])
    assert error.status == 400
    assert error.message == "images[1] is not an image: no format Pillow reads starts its 27 bytes"
    assert refused([data_uri(decompression_bomb(), "image/png")]).message == (
        "images[0] is 10000x10000 = 100,000,000 pixels, over the limit of 89,478,485 (a decompression bomb?)"
    )
    small = GatewaySettings(max_image_bytes=100)
    assert refused([good], small).message.startswith("images[0] has ")
    assert refused([good], small).message.endswith("bytes, over the limit of 100")


def test_the_count_is_bounded_and_not_empty() -> None:
    assert refused([]).status == 422
    error = refused([data_uri(encoded(draw_images(1)[0]))] * 3, GatewaySettings(max_inputs=2))
    assert error.status == 422 and "at most 2" in error.message
