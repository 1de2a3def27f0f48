"""Which runtime loads a catalog entry: by its kind, and the runtime and dtype chosen for this device kind.

Every runtime is a ``BatchedRuntime`` (token_batching: its forward batches
are token-budget batches, one device turn each) and offers the operations one
interface, stated below as protocols that mypy checks against each class: an
`Embedder` (torch, ONNX, simulated) or a `Scorer` (torch, ONNX cross-encoders).
A model without a choice for this device kind runs on torch in the worker's
dtype (the profile's ``dtype``, fp16/bf16 on GPUs). The other kinds (sparse,
multi-vector, classifiers, GLiNER: `KIND_RUNTIMES`) run on torch only, each with its
own call for its operation; `load_model`, the pool's loader, loads any kind.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shoal.configs import ModelSpec, RuntimeChoice
from shoal.configs.adapters import base_of
from shoal.configs.prompts import ModelPrompts
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.batching.token_batching import Adapters, Measured
from shoal.workers.devices import DevicePlan, apply_torch_threads

logger = logging.getLogger("shoal.worker.runtimes")

# The Python module each runtime needs, and the extra that installs it.
RUNTIME_PACKAGES = {"torch": ("torch", "torch"), "onnx": ("onnxruntime", "onnx")}
# The runtime class of each kind beyond embedder and reranker, (module here, class): torch only, in the
# model's pinned dtype or the worker's. Each offers its own operation's call (workers/operations).
KIND_RUNTIMES = {
    "sparse": ("sparse_encoder", "SparseEmbedder"),
    "multivector": ("multi_vector", "MultiVectorEmbedder"),
    "classifier": ("classifier", "SequenceClassifier"),
    "token_classifier": ("token_classifier", "TokenClassifier"),
    "span_extractor": ("span_extractor", "SpanExtractor"),  # GLiNER
    "image_embedder": ("image_embedder", "ImageEmbedder"),  # CLIP, SigLIP
}


class Runtime(Protocol):
    """A loaded model, as the model pool holds it."""

    spec: ModelSpec
    token_budget: int  # padded tokens per forward batch (token_batching)

    def memory_bytes(self) -> int: ...

    def close(self) -> None: ...


class Embedder(Runtime, Protocol):
    """Texts to float32 vectors, in input order, with the count of truncated texts."""

    prompts: ModelPrompts  # the model's named prompts (configs/prompts.py)
    tokenizer: Any  # the HF tokenizer that chunking counts with; None on the simulated runtime (it cannot chunk)

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured: ...

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]: ...


@runtime_checkable
class Scorer(Runtime, Protocol):
    """(query, passage) pairs to one float32 score each, with the count of truncated pairs."""

    def token_lengths(self, queries: list[str], passages: list[str]) -> Measured: ...

    def score(
        self, queries: list[str], passages: list[str], measured: Measured | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]: ...


class RuntimeNotInstalled(RuntimeError):
    """A profile or catalog names a runtime whose package this worker lacks."""


def require_installed(runtime: str) -> None:
    """Fail before any load, naming the extra that installs what `runtime` needs."""
    module, extra = RUNTIME_PACKAGES[runtime]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise RuntimeNotInstalled(
            f"runtime {runtime!r} needs the Python package {module!r}, which does not import here ({exc}): "
            f"pip install 'shoal[{extra}]'"
        ) from None


def choice_for(spec: ModelSpec, plan: DevicePlan) -> tuple[str, str]:
    """(runtime, dtype) for `spec` on this worker's device kind; "auto" dtype is the worker's."""
    choice = spec.runtimes.get(plan.kind) or RuntimeChoice()
    dtype = plan.dtype if choice.dtype == "auto" else choice.dtype
    if choice.runtime == "onnx" and dtype not in ("float32", "int8"):
        dtype = "float32"  # the worker's half precision is a torch setting; ONNX graphs run fp32 or int8
    return choice.runtime, dtype


def load_model(spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None) -> Runtime:
    """The model pool's loader: the runtime of a spec of any kind (`load_runtime` for embedders and rerankers).

    A LoRA adapter's spec loads its base with the adapter over it, standalone (tuning, the quality gate); a
    worker's pool loads the base once and adds its adapters to it instead (workers/runtimes/lora.py).
    """
    if spec.adapter is not None:
        from .lora import load_adapter_alone

        return load_adapter_alone(spec, load_model(base_of(spec), plan, device_thread))
    if spec.kind not in KIND_RUNTIMES:
        return load_runtime(spec, plan, device_thread)
    runtime, dtype = choice_for(spec, plan)
    if runtime != "torch":
        raise ValueError(f"model {spec.name!r}: kind {spec.kind!r} runs on torch only, not {runtime!r}")
    require_installed(runtime)
    apply_torch_threads(plan)
    began = time.perf_counter()
    module, name = KIND_RUNTIMES[spec.kind]
    loaded = getattr(importlib.import_module(f"{__name__}.{module}"), name)(spec, plan, device_thread, dtype)
    logger.info("loaded %s (%s) on torch %s in %.2f s", spec.name, spec.kind, dtype, time.perf_counter() - began)
    return loaded


def load_runtime(spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None) -> Embedder | Scorer:
    """`device_thread`: the worker's, shared by every runtime loaded there."""
    if spec.kind == "sim":
        from .sim_runtime import SimulatedRuntime

        return SimulatedRuntime(spec, plan.kind, device_thread)
    if spec.kind not in ("embedder", "reranker"):
        raise ValueError(f"model {spec.name!r} is of kind {spec.kind!r}: no embedder or reranker runtime loads it")
    runtime, dtype = choice_for(spec, plan)
    require_installed(runtime)
    began = time.perf_counter()
    if runtime == "torch":  # an ONNX worker never imports torch: its session has its own threads
        apply_torch_threads(plan)
    loaded: Embedder | Scorer
    if runtime == "onnx":
        from .onnx_runtime import OnnxCrossEncoder, OnnxEmbedder

        onnx = (OnnxEmbedder if spec.kind == "embedder" else OnnxCrossEncoder)(spec, plan, dtype, device_thread)
        loaded, how = onnx, "exported and checked" if onnx.artifact.exported else "cached export"
    elif spec.kind == "embedder":
        from .embedder import SentenceEmbedder

        loaded, how = SentenceEmbedder(spec, plan, device_thread, dtype), "weights"
    else:
        from .cross_encoder import CrossEncoderScorer

        loaded, how = CrossEncoderScorer(spec, plan, device_thread, dtype), "weights"
    logger.info("loaded %s on %s %s (%s) in %.2f s", spec.name, runtime, dtype, how, time.perf_counter() - began)
    return loaded
