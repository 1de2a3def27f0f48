"""Which runtime loads a catalog entry, by its kind."""

from __future__ import annotations

from configs import ModelSpec

from .devices import DevicePlan


def load_runtime(spec: ModelSpec, plan: DevicePlan):
    if spec.kind == "embedder":
        from .embedder import SentenceEmbedder

        return SentenceEmbedder(spec, plan)
    raise ValueError(f"model {spec.name!r}: no runtime for kind {spec.kind!r} yet")
