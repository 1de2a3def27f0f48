"""Images as inputs: their bytes from storage, data URIs or request bodies, decoded with Pillow under limits.

An image kind's row is an image file, a column value of bytes, or a URI (any
fsspec URL, ``data:`` URIs included). Decoding checks, in this order and before
any pixel is decoded where it can: the bytes are at most `max_bytes`; Pillow
recognises a format (else "not an image"); the header's width x height is at
most `max_pixels` (a decompression bomb: a few kilobytes that would decode to
gigabytes); then the pixels load whole (a truncated or damaged file fails
here). Each failure is an `ImageRejected` whose message says which check and
the figures, so a batch job names the row and an online request the input,
and nothing else stops. Resizing and normalising are the model's own image
processor's (workers/runtimes/image_embedder.py), on the same thread as the
decoding, never on the device thread.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image

from ...configs import MAX_IMAGE_PIXELS
from ...scheduler_plugins.protocol import StorageOptions
from .storage import open_fs

MAX_PIXELS = MAX_IMAGE_PIXELS  # Pillow's own default: past it, Pillow itself warns of a bomb
MAX_BYTES = 64 << 20  # one encoded image in a batch job (the gateway's default is configs' MAX_IMAGE_BYTES)
FETCH_THREADS = 16  # concurrent reads of one item's image files or URIs
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


class ImageRejected(ValueError):
    """One image that cannot be used: the message says why (its caller says which row or input)."""


@dataclass(frozen=True)
class ImageLimits:
    """What an image may be: encoded bytes and decoded pixels (a batch job's options, a gateway's settings)."""

    max_bytes: int = MAX_BYTES
    max_pixels: int = MAX_PIXELS


DEFAULT_LIMITS = ImageLimits()


def decode(data: bytes, limits: ImageLimits = DEFAULT_LIMITS) -> Image.Image:
    """The image in `data`, loaded (its pixels decoded), or `ImageRejected` saying what is wrong with it."""
    if not data:
        raise ImageRejected("empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise ImageRejected(f"{len(data):,} bytes, over the limit of {limits.max_bytes:,}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # the limit below is ours
        try:
            image = Image.open(io.BytesIO(data))
        except Image.DecompressionBombError as exc:
            raise ImageRejected(f"over the pixel limit (a decompression bomb?): {exc}") from None
        except Image.UnidentifiedImageError:
            raise ImageRejected(f"not an image: no format Pillow reads starts its {len(data):,} bytes") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise ImageRejected(f"not a readable image: {_first_line(exc)}") from None
        width, height = image.size
        if width * height > limits.max_pixels:
            raise ImageRejected(
                f"{width}x{height} = {width * height:,} pixels, over the limit of {limits.max_pixels:,} "
                "(a decompression bomb?)"
            )
        try:
            image.load()
        except Image.DecompressionBombError as exc:  # a frame larger than the header said
            raise ImageRejected(f"over the pixel limit (a decompression bomb?): {exc}") from None
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise ImageRejected(f"{image.format} {width}x{height} cannot be decoded: {_first_line(exc)}") from None
    return image


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMAGE_EXTENSIONS)


def fetch(
    urls: Sequence[str], storage_options: StorageOptions | None = None, limits: ImageLimits = DEFAULT_LIMITS
) -> list[bytes | ImageRejected]:
    """Each URL's bytes (fsspec's: a ``data:`` URI holds its own), read concurrently, or why it could not be read.

    A missing object, or one over `max_bytes` (one ranged read of at most a byte more, so a huge object is
    never held whole), is that row's rejection; any other storage error raises (`OSError`: the item is
    retried, as a shard's read is).
    """
    if not urls:
        return []
    with ThreadPoolExecutor(min(FETCH_THREADS, len(urls)), thread_name_prefix="shoal-fetch") as pool:
        return list(pool.map(lambda url: _fetch_one(url, storage_options, limits), urls))


def _fetch_one(url: str, storage_options: StorageOptions | None, limits: ImageLimits) -> bytes | ImageRejected:
    try:
        fs, path = open_fs(url, storage_options)
        data = fs.cat_file(path, start=0, end=limits.max_bytes + 1)
        if len(data) > limits.max_bytes:
            return ImageRejected(f"over the limit of {limits.max_bytes:,} bytes")
        return data
    except FileNotFoundError:
        return ImageRejected("no such file")
    except IsADirectoryError:
        return ImageRejected("a folder, not a file")
    except (ValueError, ImportError) as exc:  # an unknown protocol, a malformed URL
        return ImageRejected(f"not a URL that can be read: {_first_line(exc)}")
    except OSError as exc:
        raise OSError(f"{url}: cannot read: {exc}") from exc
