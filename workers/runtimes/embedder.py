"""The sentence-transformers embedding runtime.

Texts are tokenized once to learn their lengths, cut into token-budget
batches (see token_batching), and each batch goes through the model's own
``preprocess`` and forward, the steps ``encode`` runs per batch, so the
vectors are exactly what a direct sentence-transformers call gives, minus the
padding it would have computed. ``encode`` itself is not called: on every
call it also puts the model in eval mode and checks every parameter's
device, a fixed cost that is a noticeable share of a short query's compute.
Prompts (configs/prompts.py) are the caller's: ``None`` is the model's
default, as in ``encode``; the text goes through ``preprocess``, which
prepends it and tells the pooling how many tokens it took.
"""

from __future__ import annotations

import numpy as np

from shoal.configs import ModelSpec
from shoal.configs.prompts import model_prompts
from shoal.workers.batching.device_thread import DeviceThread
from shoal.workers.batching.token_batching import Measured
from shoal.workers.devices import DevicePlan

from .token_counts import count_tokens
from .torch_model import TorchModel


class SentenceEmbedder(TorchModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        """`dtype`: the model's own choice (its profile entry); None takes the worker's."""
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        model = SentenceTransformer(spec.resolve_path(), device=plan.device, local_files_only=True)
        model.max_seq_length = spec.max_seq_length
        super().__init__(spec, plan, model, device_thread, dtype)
        self.torch_device = torch.device(plan.device)
        self.prompts = model_prompts(spec)
        dim = model.get_embedding_dimension()
        if dim != spec.dim:
            raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model gives {dim}")

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        """Token counts after truncation (the prompt included, as the model sees it), and how many were truncated."""
        prompt = self.prompts.text(prompt=prompt)
        prompted = [prompt + t for t in texts] if prompt else texts
        return count_tokens(self.tokenizer, self.spec.max_seq_length, prompted)

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None
    ) -> tuple[np.ndarray, int]:
        """float32 vectors in input order, and the count of truncated texts.

        `measured`: ``token_lengths(texts, prompt)``, when the caller has it already. `prompt`: the text
        before each input; None: the model's default prompt.
        """
        prompt = self.prompts.text(prompt=prompt)
        return self.in_batches(
            len(texts),
            lambda: measured or self.token_lengths(texts, prompt),
            lambda batch: self._forward([texts[i] for i in batch], prompt),
            self.spec.dim,
        )

    def _forward(self, texts: list[str], prompt: str) -> np.ndarray:
        """One forward batch, as ``encode`` computes it (see the module docstring)."""
        import torch
        from sentence_transformers.util import batch_to_device, truncate_embeddings

        with torch.inference_mode():
            features = batch_to_device(self.model.preprocess(texts, prompt=prompt or None), self.torch_device)
            vectors = self.model(features)["sentence_embedding"]
            if self.model.truncate_dim is not None:
                vectors = truncate_embeddings(vectors, self.model.truncate_dim)
            if self.spec.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            return vectors.float().cpu().numpy()
