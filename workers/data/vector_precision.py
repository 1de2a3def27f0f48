"""Compact vectors: Matryoshka truncation and int8/uint8/binary quantization, as stored and as served.

Vector stores take int8 and binary vectors (8 bits and 1 bit a dimension,
against float32's 32), and Matryoshka-trained models are meant to be cut to a shorter
dimension. Both are sentence-transformers' own functions
(``truncate_embeddings`` semantics, then ``quantize_embeddings``), applied
to the float32 vectors the runtime computed, so the stored values are what
a user would get calling them on the same vectors.

int8/uint8 map each dimension's [min, max] onto 256 steps. Those ranges must
be the same for every vector of a corpus (else scores across parts mean
nothing), so they are computed once per job from a sample (`ranges_of`),
stored in the output and sent with every item: resumed and reindexed parts
use the same ranges.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...scheduler_plugins.protocol import PRECISIONS as PRECISIONS  # the names, defined with the messages
from ...scheduler_plugins.protocol import Precision, VectorFields

CALIBRATED = ("int8", "uint8")
ARROW_TYPES = {
    "float32": pa.float32(),
    "float16": pa.float16(),
    "int8": pa.int8(),
    "uint8": pa.uint8(),
    "binary": pa.int8(),
    "ubinary": pa.uint8(),
}


class VectorFormat(BaseModel):
    """How vectors are stored: precision, optional shorter dimension, and int8/uint8 ranges."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    precision: Precision = "float32"
    dim: int | None = Field(default=None, gt=0)
    ranges: list[list[float]] | None = None  # [[min per dim], [max per dim]], int8/uint8 only

    @model_validator(mode="after")
    def _ranges_fit(self) -> VectorFormat:
        if self.ranges is not None:
            if len(self.ranges) != 2 or len(self.ranges[0]) != len(self.ranges[1]):
                raise ValueError("ranges must be two lists of equal length: the minimum and maximum of each dimension")
            if self.dim is not None and len(self.ranges[0]) != self.dim:
                raise ValueError(f"ranges cover {len(self.ranges[0])} dimensions, dim is {self.dim}")
        return self

    @property
    def is_default(self) -> bool:
        return self.precision == "float32" and self.dim is None

    @property
    def needs_ranges(self) -> bool:
        return self.precision in CALIBRATED

    def check_model(self, model_dim: int, model: str) -> None:
        if self.dim is not None and self.dim > model_dim:
            raise ValueError(f"dim {self.dim} is more than model {model!r} gives ({model_dim})")
        dim = self.dim or model_dim
        if self.precision in ("binary", "ubinary") and dim % 8:
            # Whole bytes only: a reader unpacks 8 x width bits, so padding bits would read as dimensions.
            raise ValueError(f"precision {self.precision} packs 8 dimensions a byte: dim {dim} is not a multiple of 8")

    def width(self, model_dim: int) -> int:
        """Values per stored vector: the dimension, or its bytes for the packed binary formats."""
        dim = self.dim or model_dim
        return -(-dim // 8) if self.precision in ("binary", "ubinary") else dim

    def arrow_type(self) -> pa.DataType:
        return ARROW_TYPES[self.precision]

    def payload(self) -> VectorFields:
        """As an item's payload carries it: only what is set."""
        fields: VectorFields = {"precision": self.precision}
        if self.dim is not None:
            fields["dim"] = self.dim
        if self.ranges is not None:
            fields["ranges"] = self.ranges
        return fields


def shorten(vectors: np.ndarray, dim: int | None) -> np.ndarray:
    """The first `dim` dimensions, re-normalised to unit length (a Matryoshka model's shorter vector)."""
    if dim is None or dim >= vectors.shape[1]:
        return vectors
    cut = np.ascontiguousarray(vectors[:, :dim], dtype=np.float32)
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return cut / np.where(norms == 0, 1, norms)


def ranges_of(sample: np.ndarray, dim: int | None = None) -> list[list[float]]:
    """Per-dimension [min, max] of a sample of (shortened) float32 vectors, as quantize_embeddings computes them."""
    sample = shorten(np.asarray(sample, dtype=np.float32), dim)
    if sample.shape[0] == 0:
        raise ValueError("the calibration sample has no vectors (no row with a text)")
    return [sample.min(axis=0).tolist(), sample.max(axis=0).tolist()]


def compact(vectors: np.ndarray, fmt: VectorFormat) -> np.ndarray:
    """float32 vectors in the stored format (shortened first, then quantized)."""
    vectors = shorten(vectors, fmt.dim)
    if fmt.precision == "float32":
        return vectors.astype(np.float32, copy=False)
    if fmt.precision == "float16":
        return vectors.astype(np.float16)
    from sentence_transformers.util.quantization import quantize_embeddings

    if fmt.needs_ranges and fmt.ranges is None:
        raise ValueError(f"precision {fmt.precision} needs calibration ranges (a job computes them from a sample)")
    ranges = np.asarray(fmt.ranges, dtype=np.float32) if fmt.ranges is not None else None
    quantized = quantize_embeddings(vectors, precision=fmt.precision, ranges=ranges)
    assert isinstance(quantized, np.ndarray)  # one matrix in, one matrix out (a list in would give a list)
    return quantized
