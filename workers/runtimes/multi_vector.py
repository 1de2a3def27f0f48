"""The multi-vector (ColBERT-style) runtime: sentence-transformers' `MultiVectorEncoder`.

It loads sentence-transformers' own multi-vector folders and PyLate's
ColBERT ones (a transformer and a Dense projection; the query and document
prefix tokens, query length and skiplist in its config), without PyLate:
PyLate pins another sentence-transformers and its index packages another
torch. Each token-budget batch goes through the model's ``preprocess`` and
forward for its input type, the steps ``encode_document`` and
``encode_query`` run: the document or query prefix, the projection, the
mask that drops padding and skiplist tokens (punctuation, in documents
only), the per-token normalization, and the model's own token pooling and
``truncate_dim`` when it has them. Each text gives a (tokens, dim) float32
matrix. A query with ColBERT's query expansion is padded with mask tokens to
its fixed length, and keeps every position, as ColBERT scores it.

The document window is the spec's ``max_seq_length`` (the model's
``document_length`` unless the catalog says less); queries keep the model's
own length.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Measured
from ..devices import DevicePlan
from .text_model import TextModel
from .token_counts import count_tokens

InputType = Literal["query", "document"]
# The prompt each input type takes, first found first, as encode_query / encode_document choose it.
PROMPT_NAMES: dict[str, tuple[str, ...]] = {"query": ("query",), "document": ("document", "passage", "corpus")}


class MultiVectorEmbedder(TextModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        from sentence_transformers import MultiVectorEncoder

        model = MultiVectorEncoder(spec.resolve_path(), device=plan.device, local_files_only=True)
        transformer: Any = model[0]
        transformer.document_length = spec.max_seq_length
        super().__init__(spec, plan, model, model.tokenizer, device_thread, dtype)
        named: dict[str, str] = {name: text or "" for name, text in model.prompts.items()}
        self.prompts = {
            kind: next((named[name] for name in names if name in named), "") for kind, names in PROMPT_NAMES.items()
        }
        if not self.prompts["document"] and model.default_prompt_name:  # encode_document falls back to it
            self.prompts["document"] = named[model.default_prompt_name]
        dim = model.get_embedding_dimension()
        if dim != spec.dim:
            raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model gives {dim}")

    def token_lengths(self, texts: list[str], input_type: InputType = "document") -> Measured:
        """Tokens each text takes in the forward (a query's expansion included), and how many were truncated."""
        prompt = self.prompts[input_type]
        prompted = [prompt + t for t in texts] if prompt else texts
        transformer = self.model[0]
        expansion = transformer.query_expansion if input_type == "query" else None
        if expansion is None:
            limit = (transformer.query_length if input_type == "query" else None) or self.spec.max_seq_length
            return count_tokens(self.tokenizer, limit, prompted)
        if expansion["strategy"] == "fixed":
            limit = expansion["length"]
        else:  # "min": the expansion length is a floor; the query length (or the window) still caps
            limit = max(transformer.query_length or self.spec.max_seq_length, expansion["length"])
        lengths, truncated = count_tokens(self.tokenizer, limit, prompted)
        return np.maximum(lengths, expansion["length"]), truncated

    def prompt_tokens(self, input_type: InputType = "document") -> int:
        """The tokens the input type's prompt (ColBERT's prefix) adds to a text: chunk windows leave room."""
        prompt, limit = self.prompts[input_type], self.spec.max_seq_length
        return int(
            count_tokens(self.tokenizer, limit, [prompt])[0][0] - count_tokens(self.tokenizer, limit, [""])[0][0]
        )

    def multivector(
        self, texts: list[str], input_type: InputType = "document", measured: Measured | None = None
    ) -> tuple[list[np.ndarray], int]:
        """Per text its (tokens, dim) float32 vectors, and the count of truncated texts.

        `measured`: ``token_lengths(texts, input_type)``, when the caller has it already.
        """
        return self.in_rows(
            texts, lambda batch: self._forward(batch, input_type), measured or self.token_lengths(texts, input_type)
        )

    def _forward(self, texts: list[str], task: InputType) -> list[np.ndarray]:
        import torch
        from sentence_transformers.util import batch_to_device

        model = self.model
        with torch.inference_mode():
            features = batch_to_device(
                model.preprocess(texts, prompt=self.prompts[task] or None, task=task), self.torch_device
            )
            features = model(features, task=task)
            masks = features["attention_mask"].bool()
            rows = [vectors[mask] for vectors, mask in zip(features["token_embeddings"], masks, strict=True)]
        if model.token_pooling is not None:
            rows = model.token_pooling.pool(rows, task=task)
        if model.truncate_dim is not None:
            rows = [torch.nn.functional.normalize(row[..., : model.truncate_dim].float(), dim=-1) for row in rows]
        return [row.float().cpu().numpy() for row in rows]
