"""The sentence-transformers embedding runtime.

Texts are tokenized once (token_counts.TokenEncoder: the model's own fast
tokenizer, truncating as ``preprocess`` does), ahead of the device in the
tokenizer thread; their lengths cut the token-budget batches (see
token_batching) and their ids, padded per batch, go through the model's
forward, so the vectors are exactly what a direct sentence-transformers call
gives, minus the padding it would have computed. A model whose first module
is not a plain text Transformer, or whose pooling leaves a prompt out (it
needs the prompt's length), goes through the model's own ``preprocess`` per
batch instead, the step ``encode`` runs. ``encode`` itself is not called: on every
call it also puts the model in eval mode and checks every parameter's
device, a fixed cost that is a noticeable share of a short query's compute.
Prompts (configs/prompts.py) are the caller's: ``None`` is the model's
default, as in ``encode``; the text goes through ``preprocess``, which
prepends it and tells the pooling how many tokens it took.
"""

from __future__ import annotations

import numpy as np

from ...configs import ModelSpec
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..devices import DevicePlan
from .token_counts import TokenEncoder, Tokens, count_tokens
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
        plain = type(model[0]).__name__ == "Transformer"
        threads = self.tokenizer_threads
        self.encoder = TokenEncoder.of(self.tokenizer, spec.max_seq_length, threads) if plain else None
        self.input_names = list(getattr(self.tokenizer, "model_input_names", ["input_ids", "attention_mask"]))
        self.include_prompt = all(getattr(module, "include_prompt", True) for module in model)
        dim = model.get_embedding_dimension()
        if dim != spec.dim:
            raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model gives {dim}")

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        """Token counts after truncation (the prompt included, as the model sees it), and how many were truncated."""
        prompt = self.prompts.text(prompt=prompt)
        prompted = [prompt + t for t in texts] if prompt else texts
        if self.encoder is not None:
            return self.encoder.encode(prompted)  # the ids kept: `embed` given these tokenizes nothing again
        return count_tokens(self.tokenizer, self.spec.max_seq_length, prompted)

    def embed(
        self,
        texts: list[str],
        measured: Measured | None = None,
        prompt: str | None = None,
        adapters: Adapters = None,
    ) -> tuple[np.ndarray, int]:
        """float32 vectors in input order, and the count of truncated texts.

        `measured`: ``token_lengths(texts, prompt)``, when the caller has it already. `prompt`: the text
        before each input; None: the model's default prompt. `adapters`: each text's LoRA adapter.
        """
        prompt = self.prompts.text(prompt=prompt)
        encoder = self.encoder
        if encoder is None or (prompt and not self.include_prompt):
            return self.in_batches(
                len(texts),
                lambda: measured or self.token_lengths(texts, prompt),
                lambda batch: self._forward([texts[i] for i in batch], prompt),
                self.spec.dim,
                adapters,
            )
        if isinstance(measured, Tokens):
            return self.in_token_batches(
                len(texts), measured.part, self._forward_ids, self.spec.dim, measured, adapters
            )
        prompted = [prompt + t for t in texts] if prompt else texts
        return self.in_token_batches(
            len(texts),
            lambda start, end: encoder.encode(prompted[start:end]),
            self._forward_ids,
            self.spec.dim,
            adapters=adapters,
        )

    def _forward_ids(self, tokens: Tokens, batch: np.ndarray) -> np.ndarray:
        """One forward batch from ids tokenized before: padded here, then as `_forward` from the features on."""
        import torch

        assert self.encoder is not None
        arrays = self.encoder.pad(tokens, batch)
        features = {name: torch.from_numpy(arrays[name]).to(self.torch_device) for name in self.input_names}
        return self._vectors({**features, "modality": "text"})

    def _forward(self, texts: list[str], prompt: str) -> np.ndarray:
        """One forward batch, as ``encode`` computes it (see the module docstring)."""
        from sentence_transformers.util import batch_to_device

        return self._vectors(batch_to_device(self.model.preprocess(texts, prompt=prompt or None), self.torch_device))

    def close(self) -> None:
        if self.encoder is not None:
            self.encoder.close()
        super().close()

    def _vectors(self, features: dict) -> np.ndarray:
        """The model's forward on one batch's features, truncated and normalized as ``encode`` does."""
        import torch
        from sentence_transformers.util import truncate_embeddings

        with torch.inference_mode():
            vectors = self.model(features)["sentence_embedding"]
            if self.model.truncate_dim is not None:
                vectors = truncate_embeddings(vectors, self.model.truncate_dim)
            if self.spec.normalize:
                vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
            return vectors.float().cpu().numpy()
