"""Python clients of the online endpoint's MessagePack protocol (docs/PROTOCOL.md).

`OnlineClient` blocks and keeps one HTTP connection alive (http.client, no
extra dependency); `AsyncOnlineClient` is for asyncio code and many requests
at once (aiohttp). Both return numpy arrays and raise `OnlineError` with the
gateway's status and message; `embed_images` an image model's vectors of images; `sparse` returns each text's term ids and
weights, `multivector` each text's matrix of token vectors; `classify` and
`extract` return each text's labels or entities as the gateway sends them.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict, Unpack
from urllib.parse import urlsplit

import msgpack
import numpy as np

from ..scheduler_plugins.protocol import ServedModel

if TYPE_CHECKING:
    import aiohttp

MSGPACK = "application/msgpack"
DEFAULT_URL = "http://127.0.0.1:8790"
TOKEN_ENV = "SHOAL_GATEWAY_TOKEN"
_DTYPES = {"float32": "<f4", "float16": "<f2", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}


class OnlineError(RuntimeError):
    """The gateway refused or failed a request: HTTP status, its message, Retry-After if any."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Content-Type": MSGPACK, "Accept": MSGPACK}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class SparseVector(NamedTuple):
    """One text's sparse vector (`sparse`): its non-zero term ids, ascending, and their weights."""

    indices: np.ndarray  # int32
    values: np.ndarray  # float32


class MultiVectorOptions(TypedDict, total=False):
    """`multivector`'s keyword options: input_type ("document", default, or "query"), and encode's dtype,
    truncate, precision, dim and ranges, applied to every token's vector."""

    input_type: str
    dtype: str
    truncate: bool
    precision: str
    dim: int
    ranges: list[list[float]]


class Labeled(TypedDict):
    """One of a text's labels (classify), best first."""

    label: str
    score: float


class Span(TypedDict):
    """One of a text's entities (extract): `text` is the text's [start:end]."""

    text: str
    label: str
    score: float
    start: int
    end: int


class ClassifyCall(TypedDict, total=False):
    """`classify`'s keyword options (docs/PROTOCOL.md): top_k, threshold; zero-shot labels, template, multi_label."""

    truncate: bool
    top_k: int
    threshold: float
    labels: list[str]
    template: str
    multi_label: bool


class ExtractCall(TypedDict, total=False):
    """`extract`'s keyword options: aggregation (simple, first, max, average, none), labels, threshold."""

    truncate: bool
    aggregation: str
    labels: list[str]
    threshold: float


class Reply(TypedDict, total=False):
    """A gateway's answer body, as this client reads it (docs/PROTOCOL.md)."""

    model: str
    embeddings: Any  # encode: raw little-endian values of `dtype`, `shape` rows by columns; multivector: one per text
    dtype: str
    shape: list[int]
    shapes: list[list[int]]  # multivector: each text's [tokens, dim]
    sparse: list[dict[str, bytes]]  # sparse: each text's {"indices", "values"}, raw little-endian int32 and float32
    scores: list[float]  # rerank: one per document, in document order
    data: list[ServedModel]  # models
    labels: list[list[Labeled]]  # classify: each text's
    entities: list[list[Span]]  # extract: each text's
    usage: dict[str, int]


def _reply(status: int, body: bytes, retry_after: str | None) -> Reply:
    decoded: Any  # MessagePack: a Reply, or an error body
    try:
        decoded = msgpack.unpackb(body, raw=False) if body else {}
    except Exception:
        decoded = {"error": {"message": body[:200].decode(errors="replace")}}
    if status != 200:
        error = decoded.get("error", {}) if isinstance(decoded, dict) else {}
        raise OnlineError(status, error.get("message", "no message"), float(retry_after) if retry_after else None)
    return decoded


def _vectors(reply: Reply) -> np.ndarray:
    return np.frombuffer(reply["embeddings"], dtype=_DTYPES[reply["dtype"]]).reshape(reply["shape"])


class EncodeOptions(TypedDict, total=False):
    """The keyword options of both clients' `encode`; their defaults are `_encode_body`'s.

    dtype: "float32" (default) or "float16", the reply's vectors; truncate
    (default True): cut texts to the model's window instead of refusing them;
    precision, dim, ranges: the stored vector format, as `shoal embed` writes it
    (default float32, every dimension); prompt_name (e.g. "query") or prompt
    (its text): what goes before each text, by default the model's default prompt.
    """

    dtype: str
    truncate: bool
    precision: str
    dim: int | None
    ranges: list[list[float]] | None
    prompt_name: str | None
    prompt: str | None


def _encode_body(
    texts: list[str],
    *,
    dtype: str = "float32",
    truncate: bool = True,
    precision: str = "float32",
    dim: int | None = None,
    ranges: list[list[float]] | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
) -> bytes:
    given = {"dim": dim, "ranges": ranges, "prompt_name": prompt_name, "prompt": prompt}
    compact = {k: v for k, v in given.items() if v is not None}
    if precision != "float32":
        compact["precision"] = precision
    return msgpack.packb({"texts": list(texts), "dtype": dtype, "truncate": truncate, **compact})


class ImageOptions(TypedDict, total=False):
    """The keyword options of both clients' `embed_images`: dtype, precision, dim, ranges, as `encode`'s."""

    dtype: str
    precision: str
    dim: int | None
    ranges: list[list[float]] | None


# An image as `embed_images` takes it: its encoded bytes (JPEG, PNG, WebP...), a file's path, or a PIL image.
ImageSource = bytes | str | os.PathLike | Any


def _image_bytes(image: ImageSource) -> bytes:
    """The encoded bytes sent for an image: a file's own, a PIL image saved as PNG (lossless)."""
    if isinstance(image, bytes):
        return image
    if isinstance(image, str | os.PathLike):
        with open(image, "rb") as f:
            return f.read()
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _images_body(
    images: Sequence[ImageSource],
    *,
    dtype: str = "float32",
    precision: str = "float32",
    dim: int | None = None,
    ranges: list[list[float]] | None = None,
) -> bytes:
    compact: dict[str, object] = {k: v for k, v in {"dim": dim, "ranges": ranges}.items() if v is not None}
    if precision != "float32":
        compact["precision"] = precision
    return msgpack.packb({"images": [_image_bytes(image) for image in images], "dtype": dtype, **compact})


def _rerank_body(query: str, documents: list[str], truncate: bool) -> bytes:
    return msgpack.packb({"query": query, "documents": list(documents), "truncate": truncate})


def _texts_body(texts: list[str], options: ClassifyCall | ExtractCall | MultiVectorOptions) -> bytes:
    return msgpack.packb({"texts": list(texts), **options})


def _sparse_body(texts: list[str], top_k: int | None, truncate: bool) -> bytes:
    return msgpack.packb({"texts": list(texts), "truncate": truncate, **({"top_k": top_k} if top_k else {})})


def _sparse_vectors(reply: Reply) -> list[SparseVector]:
    return [
        SparseVector(np.frombuffer(r["indices"], "<i4"), np.frombuffer(r["values"], "<f4")) for r in reply["sparse"]
    ]


def _matrices(reply: Reply) -> list[np.ndarray]:
    dtype = _DTYPES[reply["dtype"]]
    return [np.frombuffer(data, dtype).reshape(shape) for data, shape in zip(reply["embeddings"], reply["shapes"])]


class OnlineClient:
    """Blocking client over one keep-alive connection; use one per thread."""

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def encode(self, model: str, texts: list[str], **options: Unpack[EncodeOptions]) -> np.ndarray:
        """(len(texts), dim) vectors; `options` as EncodeOptions says."""
        return _vectors(self._post(f"/v1/encode/{model}", _encode_body(texts, **options)))

    def embed_images(self, model: str, images: Sequence[ImageSource], **options: Unpack[ImageOptions]) -> np.ndarray:
        """(len(images), dim) vectors of an image model (CLIP, SigLIP): its texts' space, which `encode` gives.

        `images`: encoded bytes, file paths or PIL images, sent as raw bytes; a non-image is `OnlineError` 400.
        """
        return _vectors(self._post(f"/v1/encode/{model}", _images_body(images, **options)))

    def rerank(self, model: str, query: str, documents: list[str], *, truncate: bool = True) -> np.ndarray:
        """One score per document, in document order."""
        return np.asarray(self._post(f"/v1/rerank/{model}", _rerank_body(query, documents, truncate))["scores"])

    def sparse(
        self, model: str, texts: list[str], *, top_k: int | None = None, truncate: bool = True
    ) -> list[SparseVector]:
        """Each text's sparse (SPLADE) vector; `top_k`: its K largest weights only."""
        return _sparse_vectors(self._post(f"/v1/sparse/{model}", _sparse_body(texts, top_k, truncate)))

    def multivector(self, model: str, texts: list[str], **options: Unpack[MultiVectorOptions]) -> list[np.ndarray]:
        """Each text's (tokens, dim) token vectors (ColBERT); `options` as MultiVectorOptions says."""
        return _matrices(self._post(f"/v1/multivector/{model}", _texts_body(texts, options)))

    def classify(self, model: str, texts: list[str], **options: Unpack[ClassifyCall]) -> list[list[Labeled]]:
        """Each text's labels, best first; `options` as ClassifyCall says."""
        return self._post(f"/v1/classify/{model}", _texts_body(texts, options))["labels"]

    def extract(self, model: str, texts: list[str], **options: Unpack[ExtractCall]) -> list[list[Span]]:
        """Each text's entities, in order of `start`; `options` as ExtractCall says."""
        return self._post(f"/v1/extract/{model}", _texts_body(texts, options))["entities"]

    def models(self) -> list[ServedModel]:
        return self._request("GET", "/v1/models", None)["data"]

    def _post(self, path: str, body: bytes) -> Reply:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: bytes | None) -> Reply:
        for attempt in (1, 2):  # a kept-alive connection the server closed: reconnect once
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
            try:
                self._conn.request(method, path, body=body, headers=_headers(self._token))
                response = self._conn.getresponse()
                data = response.read()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()
                if attempt == 2:
                    raise
                continue
            return _reply(response.status, data, response.getheader("Retry-After"))
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> OnlineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncOnlineClient:
    """asyncio client; one instance serves any number of concurrent requests."""

    def __init__(
        self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0, connections: int = 100
    ) -> None:
        self._url = url.rstrip("/")
        self._token = token if token is not None else os.environ.get(TOKEN_ENV)
        self._timeout = timeout
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    async def encode(self, model: str, texts: list[str], **options: Unpack[EncodeOptions]) -> np.ndarray:
        """(len(texts), dim) vectors; `options` as EncodeOptions says."""
        return _vectors(await self._request("POST", f"/v1/encode/{model}", _encode_body(texts, **options)))

    async def embed_images(
        self, model: str, images: Sequence[ImageSource], **options: Unpack[ImageOptions]
    ) -> np.ndarray:
        """As `OnlineClient.embed_images`."""
        return _vectors(await self._request("POST", f"/v1/encode/{model}", _images_body(images, **options)))

    async def rerank(self, model: str, query: str, documents: list[str], *, truncate: bool = True) -> np.ndarray:
        reply = await self._request("POST", f"/v1/rerank/{model}", _rerank_body(query, documents, truncate))
        return np.asarray(reply["scores"])

    async def sparse(
        self, model: str, texts: list[str], *, top_k: int | None = None, truncate: bool = True
    ) -> list[SparseVector]:
        body = _sparse_body(texts, top_k, truncate)
        return _sparse_vectors(await self._request("POST", f"/v1/sparse/{model}", body))

    async def multivector(
        self, model: str, texts: list[str], **options: Unpack[MultiVectorOptions]
    ) -> list[np.ndarray]:
        return _matrices(await self._request("POST", f"/v1/multivector/{model}", _texts_body(texts, options)))

    async def classify(self, model: str, texts: list[str], **options: Unpack[ClassifyCall]) -> list[list[Labeled]]:
        return (await self._request("POST", f"/v1/classify/{model}", _texts_body(texts, options)))["labels"]

    async def extract(self, model: str, texts: list[str], **options: Unpack[ExtractCall]) -> list[list[Span]]:
        return (await self._request("POST", f"/v1/extract/{model}", _texts_body(texts, options)))["entities"]

    async def models(self) -> list[ServedModel]:
        return (await self._request("GET", "/v1/models", None))["data"]

    async def _request(self, method: str, path: str, body: bytes | None) -> Reply:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        async with self._session.request(
            method, self._url + path, data=body, headers=_headers(self._token)
        ) as response:
            return _reply(response.status, await response.read(), response.headers.get("Retry-After"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncOnlineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
