"""Which runtime loads a catalog entry, by its kind."""

from __future__ import annotations

from configs import ModelSpec

from .device_thread import DeviceThread
from .devices import DevicePlan, apply_torch_threads


def load_runtime(spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None):
    """`device_thread`: the worker's, shared by every runtime loaded there."""
    if spec.kind == "sim":
        from .sim_runtime import SimulatedRuntime

        return SimulatedRuntime(spec, plan.kind, device_thread)
    apply_torch_threads(plan)
    if spec.kind == "embedder":
        from .embedder import SentenceEmbedder

        return SentenceEmbedder(spec, plan, device_thread)
    if spec.kind == "reranker":
        from .cross_encoder import CrossEncoderScorer

        return CrossEncoderScorer(spec, plan, device_thread)
    raise ValueError(f"model {spec.name!r}: no runtime for kind {spec.kind!r} yet")
