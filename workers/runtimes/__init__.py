"""Which runtime loads a catalog entry: its kind's, for the runtime and dtype chosen for this device kind.

Every runtime is a ``BatchedRuntime`` (token_batching: its forward batches
are token-budget batches, one device turn each). Which class computes a
model is its kind's (configs/kinds: `Kind.runtimes`, runtime name -> class
path, imported here when a model loads); each is constructed ``(spec, plan,
device_thread, dtype)``. The dense ones share an interface, stated below as
protocols that mypy checks against each class: an `Embedder` (torch, ONNX,
simulated) or a `Scorer` (torch, ONNX cross-encoders); the other kinds offer
their own operation's call. A model without a choice for this device kind
runs on torch in the worker's dtype (the profile's ``dtype``, fp16/bf16 on
GPUs). `load_runtime` is the one loader: the model pool's, the gate's, tuning's.
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ...configs import ModelSpec, RuntimeChoice
from ...configs.adapters import base_of
from ...configs.kinds import kind_of
from ...configs.prompts import ModelPrompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..devices import DevicePlan, apply_torch_threads

logger = logging.getLogger("shoal.worker.runtimes")

# The Python module each runtime needs, and the extra that installs it.
RUNTIME_PACKAGES = {"torch": ("torch", "torch"), "onnx": ("onnxruntime", "onnx")}


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


def load_runtime(spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None) -> Any:
    """`spec`'s runtime, of its kind's class for the chosen runtime; `device_thread`: the worker's, shared by
    every runtime loaded there.

    A LoRA adapter's spec loads its base with the adapter over it, standalone (tuning, the quality gate); a
    worker's pool loads the base once and adds its adapters to it instead (workers/runtimes/lora.py).
    """
    if spec.adapter is not None:
        from .lora import load_adapter_alone

        return load_adapter_alone(spec, load_runtime(base_of(spec), plan, device_thread))
    kind = kind_of(spec)
    runtime, dtype = choice_for(spec, plan)
    if runtime not in kind.runtimes:
        offered = " or ".join(kind.runtimes)
        raise ValueError(f"model {spec.name!r}: kind {spec.kind!r} runs on {offered}, not {runtime!r}")
    if not kind.simulated:
        require_installed(runtime)
    if runtime == "torch" and not kind.simulated:  # an ONNX worker never imports torch: its session has its own threads
        apply_torch_threads(plan)
    began = time.perf_counter()
    module, _, name = kind.runtimes[runtime].partition(":")
    loaded = getattr(importlib.import_module(module), name)(spec, plan, device_thread, dtype)
    how = getattr(loaded, "origin", "weights")
    logger.info(
        "loaded %s (%s) on %s %s (%s) in %.2f s", spec.name, spec.kind, runtime, dtype, how, time.perf_counter() - began
    )
    return loaded
