"""Batching by tokens: sort by length, fill each batch up to a padded-token budget.

A forward pass costs roughly (batch size x longest sequence in the batch).
Sorting by token length and cutting batches where that product would pass the
budget leaves almost no padding and keeps peak memory bounded, whatever mix
of short and long texts arrives.

`plan_batches` is the plan alone (pure, also used by tuning and benchmarks);
`BatchedRuntime` is what every runtime builds on: it runs a forward function
over the plan, one device turn per batch, and puts the rows back in input
order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from .device_thread import DeviceThread

if TYPE_CHECKING:
    from ...configs import ModelSpec

# Token counts after truncation, and how many inputs were truncated (see token_counts).
Measured = tuple[np.ndarray, int]
# Rows tokenized before the device's first forward of a call; the rest tokenize in the tokenizer thread
# while those compute. Small, so the device waits for little; large enough that the two groups, each sorted
# by length, pad almost as little as one (every batch but each group's last is full).
HEAD_ROWS = 256
# On a CPU a forward costs about its padded tokens, and little besides: a batch there holds only sequences at
# least this fraction of its longest one's length. A small call of mixed lengths (an online round of a few
# dozen texts) pads to ~1.8x its tokens as one batch, ~1.1x as several (MiniLM fp32 on 2 AVX2 cores: calls of
# 32 texts 117 -> 142 texts/s, of 512 texts 174 -> 191). Not on a GPU, where each forward's own cost counts.
CPU_SIMILAR_LENGTHS = 0.7
# The adapter each input of a call goes through, on a base with LoRA layers (workers/runtimes/lora.py): one
# adapter's name for every input, a name per input (None: that input through the base alone), or None: the
# base alone for all.
Adapters = str | Sequence[str | None] | None


class RowAdapters(Protocol):
    """A base's LoRA layers (workers/runtimes/lora.LoraLayers), as the batching loops use them."""

    def rows(self, names: Sequence[str | None]) -> AbstractContextManager[Any]: ...


def plan_batches(
    lengths: np.ndarray, token_budget: int, max_batch_size: int, similar: float | None = None
) -> list[np.ndarray]:
    """Indices of each batch, longest sequences first.

    Every batch satisfies len(batch) * max(lengths[batch]) <= token_budget,
    except a single sequence longer than the budget, which gets a batch alone.
    With `similar`, a batch also holds only sequences at least that fraction
    of its longest one's length (CPU_SIMILAR_LENGTHS).
    """
    lengths = np.asarray(lengths)
    if lengths.size == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    batches: list[np.ndarray] = []
    start = 0
    while start < order.size:
        longest = max(int(lengths[order[start]]), 1)
        end = min(order.size, start + max(1, min(max_batch_size, token_budget // longest)))
        if similar is not None:
            shorter = lengths[order[start + 1 : end]] < similar * longest  # sorted: the first starts the next
            if shorter.any():
                end = start + 1 + int(np.argmax(shorter))
        batches.append(order[start:end])
        start = end
    return batches


def padding_fraction(lengths: np.ndarray, batches: list[np.ndarray]) -> float:
    """Share of computed tokens that are padding, for tuning and benchmarks."""
    lengths = np.asarray(lengths)
    computed = sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    real = int(lengths.sum())
    return 0.0 if computed == 0 else (computed - real) / computed


class BatchedRuntime:
    """A model runtime's common part: its spec, its token budget on this device kind, its device turns."""

    def __init__(self, spec: ModelSpec, device_kind: str, device_thread: DeviceThread | None, cores: int = 1) -> None:
        """`device_thread`: the worker's; None (a standalone runtime) takes its turns on the calling thread.
        `cores`: the cores this worker owns (its device plan's threads)."""
        self.spec = spec
        self.token_budget = spec.budget_for(device_kind)
        self.device_thread = device_thread or DeviceThread()
        # Tokenizes ahead of the device (the Rust tokenizer releases the GIL): one thread, in call order.
        # Not on a CPU device: there the forward's own threads take every core, and a tokenizer thread
        # beside them leaves each parallel region waiting for a descheduled thread (ONNX MiniLM on 2 cores:
        # about 0.5 s slower per 1,024-row item, docs/BENCHMARKS.md); it tokenizes in series, still once.
        self.tokenize_ahead = device_kind != "cpu"
        self.similar = CPU_SIMILAR_LENGTHS if device_kind == "cpu" else None
        self._tokenizer_thread: ThreadPoolExecutor | None = None
        # Threads one tokenizing call splits its texts over: on a CPU device every core the worker owns
        # (they are idle while it tokenizes, in series with the forward); elsewhere all but the one the
        # device thread needs to keep the device fed.
        self.tokenizer_threads = max(1, cores if device_kind == "cpu" else cores - 1)
        self.lora: RowAdapters | None = None  # the LoRA layers of a base serving adapters (workers/model_pool)

    def through(self, adapters: Adapters, rows: np.ndarray) -> AbstractContextManager[Any]:
        """Around one forward batch of the inputs at `rows`: each through its adapter in `adapters`."""
        if self.lora is None:
            if adapters is not None and (isinstance(adapters, str) or any(adapters)):
                raise RuntimeError(f"model {self.spec.name!r} has no adapters loaded")
            return nullcontext()
        if adapters is None or isinstance(adapters, str):
            return self.lora.rows([adapters] * len(rows))
        return self.lora.rows([adapters[i] for i in rows.tolist()])

    def in_batches(
        self,
        count: int,
        measure: Callable[[], Measured],
        forward: Callable[[np.ndarray], np.ndarray],
        width: int | None = None,
        adapters: Adapters = None,
    ) -> tuple[np.ndarray, int]:
        """float32 rows of `count` inputs in input order, and how many inputs were truncated.

        `measure()` gives the inputs' token lengths (asked only when there are
        inputs: a tokenizer may refuse an empty list); `forward(batch)` computes
        the rows of one batch of input indices, inside one device turn, so
        online work waiting runs between batches. `width`: values per row, or
        None for one value per input (scores). `adapters`: each input's adapter.
        """
        shape = (count,) if width is None else (count, width)
        out = np.empty(shape, dtype=np.float32)
        if not count:
            return out, 0
        lengths, truncated = measure()
        for batch in self.forward_batches(lengths):
            with self.device_thread.turn(), self.through(adapters, batch):
                out[batch] = np.reshape(forward(batch), (len(batch), *shape[1:]))
        return out, truncated

    def forward_batches(self, lengths: np.ndarray) -> list[np.ndarray]:
        """The forward batches of a call's inputs of these token lengths, on this runtime's device."""
        return plan_batches(lengths, self.token_budget, self.spec.max_batch_size, self.similar)

    def stop_tokenizing(self) -> None:
        """At close: the tokenizer thread ends (after the work it has)."""
        if self._tokenizer_thread is not None:
            self._tokenizer_thread.shutdown(wait=False)

    def in_token_batches(
        self,
        count: int,
        tokenize: Callable[[int, int], Any],
        forward: Callable[[Any, np.ndarray], np.ndarray],
        width: int | None = None,
        given: Any = None,
        adapters: Adapters = None,
    ) -> tuple[np.ndarray, int]:
        """As `in_batches`, each input tokenized once and ahead of the device.

        `tokenize(start, end)` tokenizes inputs [start, end) (a `token_counts.Tokens`); `forward(tokens,
        batch)` computes one batch of their indices from those ids, in one device turn. The first
        HEAD_ROWS inputs tokenize first; the rest tokenize in the tokenizer thread while the head's batches
        compute, so the device waits only for the head's tokens (on a device other than the CPU:
        `tokenize_ahead`; on the CPU all at once, in series). `given`: the inputs' Tokens, tokenized
        already (an online group's): the tokenizer thread is not asked, so an online group never waits
        behind a batch item's tokenizing there. `adapters`: each input's adapter.
        """
        shape = (count,) if width is None else (count, width)
        out = np.empty(shape, dtype=np.float32)
        if not count:
            return out, 0
        parts: list[tuple[int, Any]]
        if given is not None:
            parts = [(0, given)]
        elif not self.tokenize_ahead:
            parts = [(0, tokenize(0, count))]
        else:
            if self._tokenizer_thread is None:
                self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="shoal-tokenize")
            cuts = [0, HEAD_ROWS, count] if count > 2 * HEAD_ROWS else [0, count]
            parts = [(start, self._tokenizer_thread.submit(tokenize, start, end)) for start, end in zip(cuts, cuts[1:])]
        truncated = 0
        for start, part in parts:
            tokens = part.result() if isinstance(part, Future) else part
            truncated += tokens[1]
            for batch in self.forward_batches(tokens[0]):
                with self.device_thread.turn(), self.through(adapters, start + batch):
                    out[start + batch] = np.reshape(forward(tokens, batch), (len(batch), *shape[1:]))
        return out, truncated
