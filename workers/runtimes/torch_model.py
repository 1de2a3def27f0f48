"""What the torch runtimes (embedder.py, cross_encoder.py, text_model.py's kinds) share.

The sentence-transformers model, cast to the runtime's dtype and in eval
mode; its tokenizer; the memory its weights take; and closing, which gives
the CUDA cache back so the pool's next load finds the memory free.
"""

from __future__ import annotations

from typing import Any

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import BatchedRuntime
from ..devices import DevicePlan


class TorchModel(BatchedRuntime):
    def __init__(
        self,
        spec: ModelSpec,
        plan: DevicePlan,
        model: Any,
        device_thread: DeviceThread | None,
        dtype: str | None,
        tokenizer: Any = None,
    ) -> None:
        """`model`: loaded in fp32 on `plan.device`; `dtype`: the model's own choice, None takes the worker's;
        `tokenizer`: the model's, when it has none of its own (a transformers model)."""
        import torch

        super().__init__(spec, plan.kind, device_thread, plan.threads)
        self.dtype = dtype or plan.dtype
        if self.dtype != "float32":
            model.to(getattr(torch, self.dtype))
        model.eval()
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer

    def memory_bytes(self) -> int:
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def close(self) -> None:
        import torch

        self.model = None
        self.stop_tokenizing()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
