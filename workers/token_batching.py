"""Batching by tokens: sort by length, fill each batch up to a padded-token budget.

A forward pass costs roughly (batch size x longest sequence in the batch).
Sorting by token length and cutting batches where that product would pass the
budget leaves almost no padding and keeps peak memory bounded, whatever mix
of short and long texts arrives.
"""

from __future__ import annotations

import numpy as np


def plan_batches(lengths: np.ndarray, token_budget: int, max_batch_size: int) -> list[np.ndarray]:
    """Indices of each batch, longest sequences first.

    Every batch satisfies len(batch) * max(lengths[batch]) <= token_budget,
    except a single sequence longer than the budget, which gets a batch alone.
    """
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < order.size:
        longest = max(int(lengths[order[start]]), 1)
        size = max(1, min(max_batch_size, token_budget // longest))
        batches.append(order[start : start + size])
        start += size
    return batches


def padding_fraction(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """Share of computed tokens that are padding, for benchmarks and tuning."""
    lengths = np.asarray(lengths)
    computed = sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    real = int(lengths.sum())
    return 0.0 if computed == 0 else (computed - real) / computed
