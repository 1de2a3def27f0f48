"""Which runtime loads a catalog entry, by its kind."""

from __future__ import annotations

from configs import ModelSpec

from .device_turns import DeviceTurns
from .devices import DevicePlan, apply_torch_threads


def load_runtime(spec: ModelSpec, plan: DevicePlan, turns: DeviceTurns | None = None):
    """`turns`: the worker's device, shared by every runtime loaded there."""
    if spec.kind == "sim":
        from .sim_runtime import SimulatedRuntime

        return SimulatedRuntime(spec, plan.kind, turns)
    apply_torch_threads(plan)
    if spec.kind == "embedder":
        from .embedder import SentenceEmbedder

        return SentenceEmbedder(spec, plan, turns)
    if spec.kind == "reranker":
        from .cross_encoder import CrossEncoderScorer

        return CrossEncoderScorer(spec, plan, turns)
    raise ValueError(f"model {spec.name!r}: no runtime for kind {spec.kind!r} yet")
