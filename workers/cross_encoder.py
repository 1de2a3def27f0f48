"""The sentence-transformers cross-encoder (reranker) runtime.

(query, passage) pairs are tokenized once to learn their lengths, cut into
token-budget batches (see token_batching), and each batch goes through the
model's own ``predict`` so the scores are what a direct ``CrossEncoder.predict``
of the same pairs gives, minus the padding it would have computed.
"""

from __future__ import annotations

import numpy as np

from configs import ModelSpec

from .device_thread import DeviceThread
from .devices import DevicePlan
from .token_batching import plan_batches
from .token_counts import count_tokens


class CrossEncoderScorer:
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        """`dtype`: the model's own choice (its profile entry); None takes the worker's."""
        import torch
        from sentence_transformers import CrossEncoder

        self.spec = spec
        self.device_thread = device_thread or DeviceThread()
        self.model = CrossEncoder(
            spec.resolve_path(), device=plan.device, max_length=spec.max_seq_length, local_files_only=True
        )
        self.dtype = dtype or plan.dtype
        if self.dtype != "float32":
            self.model.to(getattr(torch, self.dtype))
        self.model.eval()
        self.tokenizer = self.model.tokenizer
        self.token_budget = spec.budget_for(plan.kind)
        if self.model.num_labels != spec.dim:
            raise ValueError(
                f"model {spec.name!r}: catalog says dim {spec.dim}, the model has {self.model.num_labels} labels"
                " (a reranker has dim 1)"
            )

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            b.numel() * b.element_size() for b in self.model.buffers()
        )

    def token_lengths(self, queries: list[str], passages: list[str]) -> tuple[np.ndarray, int]:
        """Token counts of each pair after truncation, and how many pairs were truncated."""
        return count_tokens(self.tokenizer, self.spec.max_seq_length, queries, passages)

    def score(
        self, queries: list[str], passages: list[str], measured: tuple[np.ndarray, int] | None = None
    ) -> tuple[np.ndarray, int]:
        """One float32 score per pair in input order, and the count of truncated pairs.

        `measured`: ``token_lengths(queries, passages)``, when the caller has it already.
        """
        out = np.empty(len(queries), dtype=np.float32)
        if not queries:
            return out, 0
        lengths, truncated = measured or self.token_lengths(queries, passages)
        for batch in plan_batches(lengths, self.token_budget, self.spec.max_batch_size):
            with self.device_thread.turn():
                scores = self.model.predict(
                    [(queries[i], passages[i]) for i in batch],
                    batch_size=len(batch),
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            out[batch] = np.asarray(scores, dtype=np.float32).reshape(len(batch))
        return out, truncated

    def close(self) -> None:
        import torch

        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
