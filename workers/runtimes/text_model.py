"""What the torch runtimes of the other kinds (sparse, multi-vector, classifiers) share.

A transformers or sentence-transformers model with its tokenizer (cast,
eval mode, memory and close are TorchModel's); token counts after
truncation; the tokenizer's padded batch on the device; and `in_rows`, the
token-budget batching loop for outputs whose size differs per text (a
sparse vector's terms, a text's token vectors), beside `in_batches` for
fixed-width ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..devices import DevicePlan
from .token_counts import count_tokens
from .torch_model import TorchModel

T = TypeVar("T")


class TextModel(TorchModel):
    def __init__(
        self,
        spec: ModelSpec,
        plan: DevicePlan,
        model: Any,
        tokenizer: Any,
        device_thread: DeviceThread | None,
        dtype: str | None,
    ) -> None:
        """`model`: loaded in fp32 on `plan.device`; `dtype`: the model's own choice, None takes the worker's."""
        import torch

        super().__init__(spec, plan, model, device_thread, dtype, tokenizer)
        self.torch_device = torch.device(plan.device)

    def token_lengths(self, texts: list[str]) -> Measured:
        """Token counts after truncation, and how many texts were truncated."""
        return count_tokens(self.tokenizer, self.spec.max_seq_length, texts)

    def in_rows(
        self,
        texts: list[str],
        forward: Callable[[list[str]], Sequence[T]],
        measured: Measured | None = None,
        adapters: Adapters = None,
    ) -> tuple[list[T], int]:
        """One output per text in input order (of any size), and how many were truncated; batches by tokens.

        `measured`: ``token_lengths(texts)``, when the caller has it already; `adapters`: each text's adapter.
        """
        out: list[Any] = [None] * len(texts)
        if not texts:
            return out, 0
        lengths, truncated = measured or self.token_lengths(texts)
        for batch in self.forward_batches(lengths):
            with self.device_thread.turn(), self.through(adapters, batch):
                for i, row in zip(batch, forward([texts[i] for i in batch]), strict=True):
                    out[i] = row
        return out, truncated

    def encode_batch(self, texts: list[str]) -> dict[str, Any]:
        """The tokenizer's padded batch on the device, cut at the model's window."""
        features = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.spec.max_seq_length, return_tensors="pt"
        )
        return {k: v.to(self.torch_device) for k, v in features.items()}
