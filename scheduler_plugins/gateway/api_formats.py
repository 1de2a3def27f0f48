"""The shapes of the online API: Shoal's own, OpenAI's embeddings, Cohere's rerank.

Every request becomes one of two calls, `EncodeCall` (texts to vectors) or
`ScoreCall` (a query against documents), checked against the gateway's
limits; every worker result is turned back into the shape the client used.
Shoal's own shape carries vectors as raw little-endian bytes plus their shape.
The size limits and the list fields' elements are checked first, on the
decoded body (body_limits); pydantic then validates the other fields.
"""

from __future__ import annotations

import base64
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, SkipValidation, ValidationError

from ...configs import GatewaySettings, ModelSpec
from ...configs.kinds.embedder import WIRE_DTYPES
from ..protocol import EncodePayload, OnlineResult, Precision, ScorePayload
from . import body_limits
from .image_inputs import image_bytes, is_data_uri
from .wire import MSGPACK, RequestError

PACKED = ("binary", "ubinary")  # 1 bit a dimension, 8 to a byte

# An answer's body, JSON or MessagePack, in one of the shapes below (docs/PROTOCOL.md).
ResponseBody = Mapping[str, object]


@dataclass
class EncodeCall:
    model: str
    texts: list[str]
    truncate: bool = True
    dtype: str = "float32"
    precision: Precision = "float32"  # int8/uint8/binary/ubinary: quantized as a batch job stores them
    dim: int | None = None  # the first `dim` dimensions, re-normalised
    ranges: list[list[float]] | None = None  # int8/uint8: the batch job's calibration (its manifest's vectors.ranges)
    prompt_name: str | None = None  # one of the model's named prompts; the worker resolves it (configs/prompts.py)
    prompt: str | None = None  # or the prompt text itself; neither: the model's default prompt
    images: list[bytes] | None = None  # an image model's inputs instead of texts (image_inputs.py checked them)
    image_limits: tuple[int, int] = (0, 0)  # their max bytes and pixels, the gateway's: the worker decodes within

    def payload(self) -> EncodePayload:
        payload: EncodePayload = {"truncate": self.truncate, "dtype": self.dtype}
        if self.images is not None:
            payload["images"] = self.images
            payload["max_image_bytes"], payload["max_image_pixels"] = self.image_limits
        else:
            payload["texts"] = self.texts
        if self.dim is not None:
            payload["dim"] = self.dim
        if self.ranges is not None:
            payload["ranges"] = self.ranges
        if self.prompt_name is not None:
            payload["prompt_name"] = self.prompt_name
        if self.prompt is not None:
            payload["prompt"] = self.prompt
        if self.precision != "float32":
            payload["precision"] = self.precision
        return payload

    def check_dim(self, spec: ModelSpec) -> None:
        """A shorter dimension only: the model's vectors cannot be made longer. Packed bits are whole bytes."""
        if self.dim is not None and self.dim > spec.dim:
            raise RequestError(
                400, f"model {self.model!r} gives {spec.dim} dimensions, fewer than the {self.dim} asked for"
            )
        dim = self.dim or spec.dim
        if self.precision in PACKED and dim % 8:
            raise RequestError(
                400, f"precision {self.precision} packs 8 dimensions a byte: dim {dim} is not a multiple of 8"
            )

    @property
    def inputs(self) -> int:
        return len(self.images) if self.images is not None else len(self.texts)


@dataclass
class ScoreCall:
    model: str
    query: str
    documents: list[str]
    truncate: bool = True

    def payload(self) -> ScorePayload:
        return {"query": self.query, "documents": self.documents, "truncate": self.truncate}

    @property
    def inputs(self) -> int:
        return len(self.documents)


# -- request bodies -------------------------------------------------------------


# The list fields are SkipValidation[...]: body_limits checks them first (length, then elements, stopping at
# the first wrong one); pydantic validates the rest.


class _Native(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EncodeBody(_Native):
    texts: SkipValidation[list[str] | None] = None
    # An image model's: raw bytes (MessagePack) or data URIs; image_inputs checks each.
    images: SkipValidation[list[bytes | str] | None] = None
    truncate: bool = True
    dtype: Literal["float32", "float16"] = "float32"
    precision: Precision = "float32"
    dim: int | None = Field(default=None, gt=0)
    ranges: SkipValidation[list[list[float]] | None] = None
    prompt_name: str | None = None
    prompt: str | None = None


class RerankBody(_Native):
    query: str
    documents: SkipValidation[list[str]]
    truncate: bool = True


class _Compat(BaseModel):
    # Other vendors' fields that change nothing here (user, …) are ignored.
    model_config = ConfigDict(extra="ignore", strict=True)


class OpenAIEmbeddingsBody(_Compat):
    model: str
    # OpenAI's four shapes: a text, texts, a token array, token arrays (cl100k_base ids: token_arrays.py).
    input: SkipValidation[str | list[str] | list[int] | list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    prompt_name: str | None = None  # Shoal's extension (TEI has it too): one of the model's named prompts

    def token_arrays(self) -> list[list[int]] | None:
        """The input as token arrays, or None if it is text."""
        given = self.input
        if isinstance(given, str) or not given or isinstance(given[0], str):
            return None
        return cast(list[list[int]], [given] if isinstance(given[0], int) else given)  # validated: all alike

    def texts(self) -> list[str]:
        """The input as texts, when `token_arrays` is None."""
        return [self.input] if isinstance(self.input, str) else cast(list[str], self.input)


class CohereRerankBody(_Compat):
    model: str
    query: str
    # Strings, or maps with a `text` (Cohere's two shapes): body_limits.documents makes them strings.
    documents: SkipValidation[list[str]]
    top_n: int | None = Field(default=None, gt=0)
    return_documents: bool = False


class CohereEmbedBody(_Compat):
    """Cohere's v2 embed: texts, or images as data URIs (input_type "image"); float vectors."""

    model: str
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = None
    texts: SkipValidation[list[str] | None] = None
    images: SkipValidation[list[str] | None] = None
    embedding_types: list[str] | None = None
    output_dimension: int | None = Field(default=None, gt=0)
    truncate: Literal["NONE", "START", "END"] = "END"


SHOWN_ERRORS = 5  # validation errors an answer lists


def _validate(schema: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` (its limits checked) as `schema`; a 400 listing the first few problems."""
    try:
        return schema.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)[:SHOWN_ERRORS]
        problems = "; ".join(f"{body_limits.location(err['loc'])}: {err['msg']}" for err in errors)
        if exc.error_count() > SHOWN_ERRORS:
            problems += f" (and {exc.error_count() - SHOWN_ERRORS} more)"
        # A field name may hold a lone surrogate; the message must still encode in any reply.
        problems = problems.encode("utf-8", "backslashreplace").decode()
        raise RequestError(400, f"invalid request: {problems}") from None


def _encodable(texts: list[str], what: str) -> None:
    """Refuse text that has no UTF-8 form (a lone surrogate, which JSON's \\ud800 escapes allow).

    Such a string passes every other check but cannot be serialized on its
    way to a worker; caught here it is the one request's 400, never a failed
    message that carries other requests with it.
    """
    for i, text in enumerate(texts):
        if text.isascii():
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RequestError(
                400,
                f"{what}[{i}] is not valid UTF-8 text: U+{ord(text[exc.start]):04X} at character "
                f"{exc.start} is a lone surrogate (or a byte that is not UTF-8)",
            ) from None


def _within_limits(
    texts: list[str], what: str, truncate: bool, limits: GatewaySettings, most: int | None = None
) -> list[str]:
    """`texts` cut to `max_input_chars` (or refused without truncation); at most `most` of them (max_inputs)."""
    body_limits.count(texts, what, most or limits.max_inputs)
    _encodable(texts, what)
    cap = limits.max_input_chars
    for i, text in enumerate(texts):
        if len(text) > cap:
            if not truncate:
                raise RequestError(
                    422, f"{what}[{i}] has {len(text)} characters, over the limit of {cap} (truncate is off)"
                )
            texts = [t[:cap] for t in texts]
            break
    return texts


def _prompt(name: str | None, text: str | None, limits: GatewaySettings) -> None:
    """A prompt name or text, not both; a text within the input limits (the worker checks the name)."""
    if name is not None and text is not None:
        raise RequestError(400, "invalid request: give prompt_name or prompt, not both")
    if name is not None:
        _encodable([name], "prompt_name")
    if text is not None:
        _encodable([text], "prompt")
        if len(text) > limits.max_input_chars:
            raise RequestError(422, f"prompt has {len(text)} characters, over the limit of {limits.max_input_chars}")


def encode_call(model: str, body: Any, limits: GatewaySettings, takes_images: bool = False) -> EncodeCall:
    """`takes_images`: the model embeds images (`images` instead of `texts`)."""
    fields = body_limits.fields(body)
    if "texts" not in fields and "images" not in fields:
        raise RequestError(400, "invalid request: texts: Field required (or images, for an image model)")
    body_limits.strings(fields, "texts", limits.max_inputs, optional=True)
    body_limits.images(fields, "images", limits.max_inputs)
    body_limits.ranges(fields)
    request = _validate(EncodeBody, fields)
    if (request.texts is None) == (request.images is None):
        raise RequestError(400, "invalid request: give texts or images, one of them")
    if request.images is not None and not takes_images:
        raise RequestError(400, f"model {model!r} embeds no images: give texts")
    _prompt(request.prompt_name, request.prompt, limits)
    images = None if request.images is None else image_bytes(request.images, "images", limits)
    texts = [] if request.texts is None else _within_limits(request.texts, "texts", request.truncate, limits)
    if request.precision in ("int8", "uint8") and request.ranges is None:
        raise RequestError(
            422,
            f"precision {request.precision} needs `ranges`: the [min, max] per dimension of the batch job whose "
            "vectors these are compared with (its _manifest.json vectors.ranges)",
        )
    if request.ranges is not None:
        _check_ranges(request.ranges)
    return EncodeCall(
        model,
        texts,
        request.truncate,
        request.dtype,
        request.precision,
        request.dim,
        request.ranges,
        request.prompt_name,
        request.prompt,
        images,
        _image_limits(limits),
    )


def _image_limits(limits: GatewaySettings) -> tuple[int, int]:
    return limits.max_image_bytes, limits.max_image_pixels


def _check_ranges(ranges: list[list[float]]) -> None:
    """Two equal lists, each maximum above its minimum: a span of 0 would divide by zero in quantization
    (every value of that dimension came back -128)."""
    if len(ranges) != 2 or len(ranges[0]) != len(ranges[1]):
        raise RequestError(400, "invalid request: ranges must be two lists of equal length (minimum, maximum)")
    for i, (low, high) in enumerate(zip(*ranges, strict=True)):
        if not (math.isfinite(low) and math.isfinite(high) and high > low):
            raise RequestError(
                400, f"invalid request: ranges dimension {i}: the maximum ({high}) must be above the minimum ({low})"
            )


def score_call(model: str, body: Any, limits: GatewaySettings) -> ScoreCall:
    fields = body_limits.fields(body)
    body_limits.strings(fields, "documents", limits.max_documents)
    request = _validate(RerankBody, fields)
    (query,) = _within_limits([request.query], "query", request.truncate, limits)
    documents = _within_limits(request.documents, "documents", request.truncate, limits, limits.max_documents)
    return ScoreCall(model, query, documents, request.truncate)


def openai_request(body: Any, limits: GatewaySettings) -> OpenAIEmbeddingsBody:
    fields = body_limits.fields(body)
    body_limits.openai_input(fields, limits)
    return _validate(OpenAIEmbeddingsBody, fields)


def openai_call(
    request: OpenAIEmbeddingsBody, texts: list[str], limits: GatewaySettings, takes_images: bool = False
) -> EncodeCall:
    """`texts`: the request's input, its token arrays decoded (token_arrays.decode). For an image model
    (`takes_images`), an input of data URIs is its images (every one: texts and images are two requests)."""
    _prompt(request.prompt_name, None, limits)
    uris = [is_data_uri(text) for text in texts]
    if takes_images and any(uris):
        if not all(uris):
            text = uris.index(False)
            raise RequestError(
                400, f"input[{text}] is text and input[{uris.index(True)}] an image (a data URI): send them apart"
            )
        images = image_bytes(texts, "input", limits)
        return EncodeCall(request.model, [], dim=request.dimensions, images=images, image_limits=_image_limits(limits))
    return EncodeCall(
        request.model,
        _within_limits(texts, "input", True, limits),
        dim=request.dimensions,
        prompt_name=request.prompt_name,
    )


def cohere_embed_request(body: Any, limits: GatewaySettings) -> CohereEmbedBody:
    fields = body_limits.fields(body)
    body_limits.strings(fields, "texts", limits.max_inputs, optional=True)
    body_limits.strings(fields, "images", limits.max_inputs, optional=True)
    return _validate(CohereEmbedBody, fields)


def cohere_embed_call(request: CohereEmbedBody, limits: GatewaySettings, takes_images: bool) -> EncodeCall:
    """Texts or images (data URIs), never both; float vectors only; truncation at the end, or none."""
    if (request.texts is None) == (request.images is None):
        raise RequestError(400, "invalid request: give texts or images, one of them")
    if (request.input_type == "image") != (request.images is not None):
        raise RequestError(400, 'invalid request: images go with input_type "image", and only they')
    if request.embedding_types not in (None, ["float"]):
        raise RequestError(400, f"embedding_types {request.embedding_types}: only float is served")
    if request.truncate == "START":
        raise RequestError(400, "truncate START is not served: END (the default) or NONE")
    if request.images is not None:
        if not takes_images:
            raise RequestError(400, f"model {request.model!r} embeds no images: give texts")
        images = image_bytes(request.images, "images", limits)
        return EncodeCall(
            request.model, [], dim=request.output_dimension, images=images, image_limits=_image_limits(limits)
        )
    truncate = request.truncate != "NONE"
    texts = _within_limits(request.texts or [], "texts", truncate, limits)
    return EncodeCall(request.model, texts, truncate, dim=request.output_dimension)


def cohere_call(body: Any, limits: GatewaySettings) -> tuple[ScoreCall, CohereRerankBody]:
    fields = body_limits.fields(body)
    body_limits.documents(fields, limits.max_documents)
    request = _validate(CohereRerankBody, fields)
    (query,) = _within_limits([request.query], "query", True, limits)
    documents = _within_limits(request.documents, "documents", True, limits, limits.max_documents)
    return ScoreCall(request.model, query, documents), request


# -- responses --------------------------------------------------------------------


def _matrix(result: OnlineResult) -> np.ndarray:
    return np.frombuffer(result["embeddings"], dtype=WIRE_DTYPES[result["dtype"]]).reshape(result["shape"])


def encode_response(call: EncodeCall, result: OnlineResult, kind: str) -> ResponseBody:
    response: dict[str, object] = {"model": call.model, "dtype": result["dtype"], "shape": result["shape"]}
    if kind == MSGPACK:
        response["embeddings"] = result["embeddings"]
    else:
        matrix = _matrix(result)
        response["embeddings"] = (matrix.astype(np.float32) if matrix.dtype.kind == "f" else matrix).tolist()
    response["usage"] = {"tokens": result.get("tokens", 0)}
    return response


def rerank_response(call: ScoreCall, result: OnlineResult) -> ResponseBody:
    return {"model": call.model, "scores": result["scores"], "usage": {"tokens": result.get("tokens", 0)}}


def openai_response(call: EncodeCall, request: OpenAIEmbeddingsBody, result: OnlineResult) -> ResponseBody:
    vectors = _matrix(result).astype("<f4", copy=False)
    if request.encoding_format == "base64":
        data = [base64.b64encode(row.tobytes()).decode() for row in vectors]
    else:
        data = vectors.tolist()
    tokens = result.get("tokens", 0)
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(data)],
        "model": call.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def cohere_embed_response(call: EncodeCall, result: OnlineResult) -> ResponseBody:
    """Cohere's v2 embed answer: embeddings by type (float), the texts echoed, billed units."""
    response: dict[str, object] = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type",
        "embeddings": {"float": _matrix(result).astype("<f4", copy=False).tolist()},
        "meta": {
            "api_version": {"version": "2"},
            "billed_units": {"images": call.inputs}
            if call.images is not None
            else {"input_tokens": result.get("tokens", 0)},
        },
    }
    if call.images is None:
        response["texts"] = call.texts
    return response


def cohere_response(call: ScoreCall, request: CohereRerankBody, result: OnlineResult, version: str) -> ResponseBody:
    """Cohere's rerank answer, of its API `version` ("1": /v1/rerank, "2": /v2/rerank, the same shape)."""
    scores = result["scores"]
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: request.top_n or len(scores)]
    results = []
    for i in order:
        entry: dict[str, object] = {"index": i, "relevance_score": scores[i]}
        if request.return_documents:
            entry["document"] = {"text": call.documents[i]}
        results.append(entry)
    return {
        "id": str(uuid.uuid4()),
        "results": results,
        "meta": {"api_version": {"version": version}, "billed_units": {"search_units": 1}},
    }
