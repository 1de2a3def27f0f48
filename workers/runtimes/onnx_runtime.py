"""ONNX Runtime behind the same interface as the torch runtimes.

The graph comes from the export cache (onnx_cache): exported (onnx_export)
and checked (onnx_check) once per model fingerprint, reused on every later
start. Texts are tokenized by the model's own tokenizer, saved beside the
graph and read with the `tokenizers` library (onnx_tokenizer), so a worker
running ONNX imports neither torch nor transformers. Each text (or pair) is
tokenized once, ahead of the device in the tokenizer thread
(token_counts.TokenEncoder); the lengths cut the same token-budget batches as
the torch path, and each batch's ids, padded, run one device turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...configs import ModelSpec
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, BatchedRuntime, Measured
from ..devices import DevicePlan
from .onnx_cache import Artifact, ensure_artifact
from .onnx_export import SCORES, VECTORS, GraphForm
from .onnx_tokenizer import TOKENIZER_FILE, GraphTokenizer
from .token_counts import TokenEncoder, Tokens


def open_session(spec: ModelSpec, plan: DevicePlan, graph: Path) -> Any:
    """An ONNX Runtime session of `graph` on `plan`'s device, with the worker's threads (every ONNX runtime's)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = plan.threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ONNX Runtime's threads spin between runs by default: on a worker's few cores they would take
    # the CPU its tokenizer, I/O threads and event loop need between batches.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # A provider is named alone, or with its options.
    providers: list[str | tuple[str, dict[str, int]]] = ["CPUExecutionProvider"]
    if plan.kind == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(
                f"model {spec.name!r}: runtime onnx on {plan.device} needs onnxruntime-gpu (pip install onnxruntime-gpu)"
            )
        providers = [("CUDAExecutionProvider", {"device_id": int(plan.device.split(":")[1])})]
    return ort.InferenceSession(str(graph), options, providers=providers)


class OnnxModel(BatchedRuntime):
    """What both ONNX runtimes share: the cached graph, its session and its tokenizer."""

    form: GraphForm  # what the graph computes: each runtime's own

    def __init__(self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None, dtype: str) -> None:
        super().__init__(spec, plan.kind, device_thread, plan.threads)
        self.artifact: Artifact = ensure_artifact(spec, dtype, self.form)
        record = self.artifact.record()
        self.input_names = record.inputs
        assert record.tokenizer is not None  # a graph of token ids has its tokenizer's settings
        self.tokenizer = GraphTokenizer(self.artifact.directory / TOKENIZER_FILE, record.tokenizer)
        encoder = TokenEncoder.of(self.tokenizer, spec.max_seq_length, self.tokenizer_threads)
        if encoder is None:
            raise ValueError(f"model {spec.name!r}: its tokenizer pads on the left or has no padding token")
        self.encoder = encoder
        self.session = open_session(spec, plan, self.artifact.graph)

    @property
    def origin(self) -> str:
        """Where the graph came from, for the load's log line."""
        return "exported and checked" if self.artifact.exported else "cached export"

    def memory_bytes(self) -> int:
        return self.artifact.graph.stat().st_size

    def _run(self, tokens: Tokens, batch: np.ndarray) -> np.ndarray:
        """One forward batch: its ids (tokenized as at export), padded, through the graph."""
        arrays = self.encoder.pad(tokens, batch)
        return self.session.run(None, {name: arrays[name] for name in self.input_names})[0]

    def close(self) -> None:
        self.session = None
        self.stop_tokenizing()
        self.encoder.close()


class OnnxEmbedder(OnnxModel):
    """Prompts as the torch embedder applies them: prepended to each text before tokenizing."""

    form = VECTORS

    def __init__(self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None, dtype: str) -> None:
        super().__init__(spec, plan, device_thread, dtype)
        self.prompts = model_prompts(spec)

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        """Token counts after truncation (the prompt included), and how many texts were truncated."""
        prompt = self.prompts.text(prompt=prompt)
        return self.encoder.encode([prompt + t for t in texts])

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """float32 vectors in input order, and the count of truncated texts; `prompt`: None is the default.
        `adapters`: an ONNX graph has no LoRA layers (adapters run on torch): refused unless None."""
        if isinstance(measured, Tokens):
            return self.in_token_batches(len(texts), measured.part, self._run, self.spec.dim, measured, adapters)
        prompt = self.prompts.text(prompt=prompt)
        prompted = [prompt + t for t in texts]
        return self.in_token_batches(
            len(texts),
            lambda start, end: self.encoder.encode(prompted[start:end]),
            self._run,
            self.spec.dim,
            adapters=adapters,
        )


class OnnxCrossEncoder(OnnxModel):
    form = SCORES

    def token_lengths(self, queries: list[str], passages: list[str]) -> Measured:
        """Token counts of each pair after truncation, and how many pairs were truncated."""
        return self.encoder.encode(queries, passages)

    def score(
        self, queries: list[str], passages: list[str], measured: Measured | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """One float32 score per pair in input order, and the count of truncated pairs (`adapters`: as `embed`)."""
        if isinstance(measured, Tokens):
            return self.in_token_batches(len(queries), measured.part, self._run, None, measured, adapters)
        return self.in_token_batches(
            len(queries),
            lambda start, end: self.encoder.encode(queries[start:end], passages[start:end]),
            self._run,
            adapters=adapters,
        )
