"""The sentence-transformers cross-encoder (reranker) runtime.

(query, passage) pairs are tokenized once (token_counts.TokenEncoder: the
model's own fast tokenizer, truncating longest-first as ``preprocess`` does),
ahead of the device where there is one; their lengths cut the token-budget
batches (see token_batching) and their ids, padded per batch, go through the
model's modules and activation as ``CrossEncoder.predict`` runs them, so the
scores are what a direct ``predict`` of the same pairs gives, minus the
padding it would have computed. A model whose first module is not a plain
text Transformer goes through ``predict`` per batch instead.
"""

from __future__ import annotations

import numpy as np

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..devices import DevicePlan
from .token_counts import TokenEncoder, Tokens, count_tokens
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
        import torch

        super().__init__(spec, plan, model, device_thread, dtype)
        if model.num_labels != spec.dim:
            raise ValueError(
                f"model {spec.name!r}: catalog says dim {spec.dim}, the model has {model.num_labels} labels"
                " (a reranker has dim 1)"
            )
        self.torch_device = torch.device(plan.device)
        plain = len(model) == 1 and type(model[0]).__name__ == "Transformer"
        threads = self.tokenizer_threads
        self.encoder = TokenEncoder.of(self.tokenizer, spec.max_seq_length, threads) if plain else None
        self.input_names = list(getattr(self.tokenizer, "model_input_names", ["input_ids", "attention_mask"]))

    def token_lengths(self, queries: list[str], passages: list[str]) -> Measured:
        """Token counts of each pair after truncation, and how many pairs were truncated."""
        if self.encoder is not None:
            return self.encoder.encode(queries, passages)  # the ids kept: `score` given these tokenizes nothing again
        return count_tokens(self.tokenizer, self.spec.max_seq_length, queries, passages)

    def score(
        self, queries: list[str], passages: list[str], measured: Measured | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """One float32 score per pair in input order, and the count of truncated pairs.

        `measured`: ``token_lengths(queries, passages)``, when the caller has it already; `adapters`: each
        pair's LoRA adapter.
        """
        encoder = self.encoder
        if encoder is None:
            return self.in_batches(
                len(queries),
                lambda: measured or self.token_lengths(queries, passages),
                lambda batch: self._predict([(queries[i], passages[i]) for i in batch]),
                adapters=adapters,
            )
        if isinstance(measured, Tokens):
            return self.in_token_batches(len(queries), measured.part, self._forward_ids, None, measured, adapters)
        return self.in_token_batches(
            len(queries),
            lambda start, end: encoder.encode(queries[start:end], passages[start:end]),
            self._forward_ids,
            adapters=adapters,
        )

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        super().close()

    def _forward_ids(self, tokens: Tokens, batch: np.ndarray) -> np.ndarray:
        """One forward batch from ids tokenized before, then the activation as ``predict`` applies it."""
        import torch

        assert self.encoder is not None
        arrays = self.encoder.pad(tokens, batch)
        features = {name: torch.from_numpy(arrays[name]).to(self.torch_device) for name in self.input_names}
        with torch.inference_mode():
            scores = self.model({**features, "modality": "text"})["scores"].float()
            if self.model.activation_fn is not None:
                scores = self.model.activation_fn(scores)
            if self.model.num_labels == 1 and scores.ndim > 1:
                scores = scores.squeeze(-1)
            return scores.cpu().numpy()

    def _predict(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        """One forward batch through the model's own ``predict``."""
        return np.asarray(
            self.model.predict(pairs, batch_size=len(pairs), convert_to_numpy=True, show_progress_bar=False),
            dtype=np.float32,
        )
