"""The sentence-transformers cross-encoder (reranker) runtime.

(query, passage) pairs are tokenized once to learn their lengths, cut into
token-budget batches (see token_batching), and each batch goes through the
model's own ``predict`` so the scores are what a direct ``CrossEncoder.predict``
of the same pairs gives, minus the padding it would have computed.
"""

from __future__ import annotations

import numpy as np

from shoal.configs import ModelSpec
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.batching.token_batching import Measured
from shoal.workers.devices import DevicePlan

from .token_counts import count_tokens
from .torch_model import TorchModel


class CrossEncoderScorer(TorchModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        """`dtype`: the model's own choice (its profile entry); None takes the worker's."""
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(
            spec.resolve_path(), device=plan.device, max_length=spec.max_seq_length, local_files_only=True
        )
        super().__init__(spec, plan, model, device_thread, dtype)
        if model.num_labels != spec.dim:
            raise ValueError(
                f"model {spec.name!r}: catalog says dim {spec.dim}, the model has {model.num_labels} labels"
                " (a reranker has dim 1)"
            )

    def token_lengths(self, queries: list[str], passages: list[str]) -> Measured:
        """Token counts of each pair after truncation, and how many pairs were truncated."""
        return count_tokens(self.tokenizer, self.spec.max_seq_length, queries, passages)

    def score(
        self, queries: list[str], passages: list[str], measured: Measured | None = None
    ) -> tuple[np.ndarray, int]:
        """One float32 score per pair in input order, and the count of truncated pairs.

        `measured`: ``token_lengths(queries, passages)``, when the caller has it already.
        """
        return self.in_batches(
            len(queries),
            lambda: measured or self.token_lengths(queries, passages),
            lambda batch: self._predict([(queries[i], passages[i]) for i in batch]),
        )

    def _predict(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """One forward batch through the model's own ``predict``."""
        return np.asarray(
            self.model.predict(pairs, batch_size=len(pairs), convert_to_numpy=True, show_progress_bar=False),
            dtype=np.float32,
        )
