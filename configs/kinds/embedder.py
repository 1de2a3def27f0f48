"""Dense embedders: one vector per text (sentence-transformers, or a bare transformers encoder, mean-pooled).

Recognised from a sentence-transformers folder (``modules.json``) that no
other kind claims, and taken for any model nothing else recognises. Its
operation is ``embed``: the batch op, and online ``/v1/encode``, OpenAI's
``/v1/embeddings`` (the gateway's API formats). Runs on torch or ONNX
Runtime, so `auto` and `shoal tune` choose between them; the gate holds a
candidate to fp32's vectors by cosine and by nDCG@10 on the judged set.
"""

from __future__ import annotations

from typing import Any

from .kind import Gate, Kind

RUNTIMES = "shoal.workers.runtimes"
# How each vector precision's values travel as bytes, little-endian (online answers: /v1/encode, /v1/multivector).
WIRE_DTYPES = {"float32": "<f4", "float16": "<f2", "int8": "i1", "uint8": "u1", "binary": "i1", "ubinary": "u1"}


def vectors(runtime: Any, texts: list[str]) -> Any:
    """The vectors of `texts`: what the gate compares and times."""
    return runtime.embed(texts)[0]


KIND = Kind(
    name="embedder",
    command="embed",
    operations={"embed": "shoal.workers.operations.embed_operation"},
    api="embed",
    runtimes={"torch": f"{RUNTIMES}.embedder:SentenceEmbedder", "onnx": f"{RUNTIMES}.onnx_runtime:OnnxEmbedder"},
    tunable=True,
    recognises=lambda files: bool(files.module_types()),
    normalizes=lambda files: files.normalize(),
    adapters=True,
    options=frozenset({"chunk", "vectors", "prompt"}),
    gate=Gate("cosine", vectors, retrieval=True),
    prompts_from_files=True,
)
