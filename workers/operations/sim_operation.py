"""The `sim` operation: work items for the simulated runtime, with no storage.

SIMULATION, for cluster experiments (benchmarks/pull_vs_push.py): an item
describes how many texts of how many tokens it holds instead of naming a
Parquet slice, so nothing is read or written and only the simulated device's
sleeps (workers/runtimes/sim_runtime.py) cost time. It goes through the same pull
loop, model pool and queue as `embed`.

Payload, one of:

- ``{"tokens": [t0, t1, ...]}``: one text per entry, of that many tokens;
- ``{"texts": n, "min_tokens": a, "max_tokens": b, "seed": s}``: n texts whose
  token counts are drawn uniformly in [a, b] from `seed` (deterministic, so a
  retried item costs the same); `max_tokens` defaults to `min_tokens`.

The result acked is ``{"rows": n, "tokens": real tokens, "truncated": k}``.
"""

from __future__ import annotations

import numpy as np

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import ItemResult, SimPayload
from ..runtimes import Embedder
from ..runtimes.sim_runtime import CHARS_PER_TOKEN

# SimulatedRuntime counts 2 + len(text) // CHARS_PER_TOKEN tokens per text.
_SPECIAL_TOKENS = 2


def token_counts(payload: SimPayload) -> list[int]:
    if "tokens" in payload:
        return [max(_SPECIAL_TOKENS, int(t)) for t in payload["tokens"]]
    n = int(payload["texts"])
    low = int(payload.get("min_tokens", 16))
    high = int(payload.get("max_tokens", low))
    rng = np.random.default_rng(int(payload.get("seed", 0)))
    return [max(_SPECIAL_TOKENS, int(t)) for t in rng.integers(low, high + 1, size=n)]


def read(payload: SimPayload) -> list[str]:
    """Fake texts the simulated runtime will count as the wanted token lengths."""
    return ["x" * (CHARS_PER_TOKEN * (t - _SPECIAL_TOKENS)) for t in token_counts(payload)]


def compute(runtime: Embedder, texts: list[str]) -> int:
    """The count of truncated texts."""
    _, truncated = runtime.embed(texts)  # the simulated device sleeps here
    return truncated


def write(payload: SimPayload, texts: list[str], truncated: int, spec: ModelSpec) -> ItemResult:
    tokens = sum(_SPECIAL_TOKENS + len(t) // CHARS_PER_TOKEN for t in texts)
    return {"rows": len(texts), "tokens": tokens, "truncated": truncated}
