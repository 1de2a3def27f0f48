"""The SPLADE-style sparse runtime: sentence-transformers' `SparseEncoder`.

Each token-budget batch goes through the model's own ``preprocess`` and
forward (its masked-LM head, log(1 + ReLU), max pooling over tokens: the
steps ``SparseEncoder.encode`` runs), then the same cut to the largest
weights ``encode`` makes with ``max_active_dims`` (the request's `top_k`,
else the model's own setting), so the weights are what a direct ``encode``
gives. Each row is then its non-zero terms, in term-id order. Prompts are
the caller's (configs/prompts.py): ``None`` is the model's default, as in
``encode``.
"""

from __future__ import annotations

import numpy as np

from ...configs import ModelSpec
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Measured
from ..devices import DevicePlan
from .text_model import TextModel

# One row's sparse vector: term ids (int32, ascending) and their weights (float32).
SparseRow = tuple[np.ndarray, np.ndarray]


class SparseEmbedder(TextModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(spec.resolve_path(), device=plan.device, local_files_only=True)
        model.max_seq_length = spec.max_seq_length
        super().__init__(spec, plan, model, model.tokenizer, device_thread, dtype)
        self.prompts = model_prompts(spec)  # spec.dim (the vocabulary's size) shapes nothing: rows are term lists

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        """Token counts after truncation (the prompt included), and how many texts were truncated."""
        prompt = self.prompts.text(prompt=prompt)
        return super().token_lengths([prompt + t for t in texts] if prompt else texts)

    def prompt_tokens(self, prompt: str | None = None) -> int:
        """The tokens `prompt` (None: the model's default) adds to a text: chunk windows leave room for them."""
        return int(self.token_lengths([""], prompt)[0][0] - super().token_lengths([""])[0][0])

    def sparse(
        self, texts: list[str], top_k: int | None = None, prompt: str | None = None, measured: Measured | None = None
    ) -> tuple[list[SparseRow], int]:
        """Per text its non-zero terms (the `top_k` largest if given), and the count of truncated texts.

        `prompt`: the text before each input, None the model's default; `measured`: ``token_lengths(texts,
        prompt)``, when the caller has it already.
        """
        prompt = self.prompts.text(prompt=prompt)
        top_k = top_k if top_k is not None else self.model.max_active_dims
        return self.in_rows(
            texts, lambda batch: self._forward(batch, top_k, prompt), measured or self.token_lengths(texts, prompt)
        )

    def _forward(self, texts: list[str], top_k: int | None, prompt: str) -> list[SparseRow]:
        import torch
        from sentence_transformers.util import batch_to_device, select_max_active_dims

        with torch.inference_mode():
            features = batch_to_device(self.model.preprocess(texts, prompt=prompt or None), self.torch_device)
            weights = self.model(features)["sentence_embedding"]
            if top_k is not None:
                weights = select_max_active_dims(weights, max_active_dims=top_k)
            weights = weights.float().cpu()
        rows, terms = torch.nonzero(weights, as_tuple=True)  # row-major: each row's terms in ascending order
        values = weights[rows, terms].numpy()
        cuts = np.cumsum(np.bincount(rows.numpy(), minlength=len(texts)))[:-1]
        return list(zip(np.split(terms.numpy().astype(np.int32), cuts), np.split(values, cuts), strict=True))
