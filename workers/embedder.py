"""The sentence-transformers embedding runtime.

Texts are tokenized once to learn their lengths, cut into token-budget
batches (see token_batching), and each batch goes through the model's own
``encode`` so the vectors are exactly what a direct sentence-transformers
call gives, minus the padding it would have computed.
"""

from __future__ import annotations

import numpy as np

from configs import ModelSpec

from .device_turns import DeviceTurns
from .devices import DevicePlan
from .token_batching import plan_batches


class SentenceEmbedder:
    def __init__(self, spec: ModelSpec, plan: DevicePlan, turns: DeviceTurns | None = None) -> None:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.spec = spec
        self.turns = turns or DeviceTurns()
        self.model = SentenceTransformer(
            spec.resolve_path(), device=plan.device, local_files_only=True
        )
        self.model.max_seq_length = spec.max_seq_length
        if plan.dtype != "float32":
            self.model.to(getattr(torch, plan.dtype))
        self.model.eval()
        self.token_budget = spec.budget_for(plan.kind)
        dim = self.model.get_embedding_dimension()
        if dim != spec.dim:
            raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model gives {dim}")

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) + sum(
            b.numel() * b.element_size() for b in self.model.buffers()
        )

    def token_lengths(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """Token counts after truncation, and how many texts were truncated."""
        limit = self.spec.max_seq_length
        ids = self.model.tokenizer(
            texts,
            add_special_tokens=True,
            truncation=True,
            max_length=limit + 1,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        raw = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        return np.minimum(raw, limit), int((raw > limit).sum())

    def embed(self, texts: list[str], measured: tuple[np.ndarray, int] | None = None) -> tuple[np.ndarray, int]:
        """float32 vectors in input order, and the count of truncated texts.

        `measured`: ``token_lengths(texts)``, when the caller has it already.
        """
        out = np.empty((len(texts), self.spec.dim), dtype=np.float32)
        if not texts:
            return out, 0
        lengths, truncated = measured or self.token_lengths(texts)
        for batch in plan_batches(lengths, self.token_budget, self.spec.max_batch_size):
            with self.turns.turn():
                vectors = self.model.encode(
                    [texts[i] for i in batch],
                    batch_size=len(batch),
                    normalize_embeddings=self.spec.normalize,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
            out[batch] = vectors.astype(np.float32, copy=False)
        return out, truncated

    def close(self) -> None:
        import torch

        self.model = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
