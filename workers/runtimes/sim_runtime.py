"""A simulated device, for cluster experiments without the hardware.

SIMULATION: no model runs. Loading sleeps the catalog's `load_seconds` and
claims `memory_bytes`; each token-budget batch sleeps `batch_fixed_seconds +
per_token_seconds x padded tokens`. Vectors are deterministic pseudo-random
unit vectors of the text (its prompt prepended, as a real model reads it). It goes through the same pool, pull loop and queue
as the real runtimes, so many workers and models fit on a few cores and the
scheduling can be studied on its own.
"""

from __future__ import annotations

import hashlib
import time

import numpy as np

from ...configs import ModelSpec
from ...configs.prompts import model_prompts
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, BatchedRuntime, Measured
from ..devices import DevicePlan

CHARS_PER_TOKEN = 4


class SimulatedRuntime(BatchedRuntime):
    tokenizer = None  # texts are counted by length: nothing to chunk with

    def __init__(
        self,
        spec: ModelSpec,
        plan: DevicePlan | None = None,
        device_thread: DeviceThread | None = None,
        dtype: str = "float32",
    ) -> None:
        """`plan` and `dtype` as every runtime takes them; the device simulated is `plan`'s kind (the CPU's)."""
        super().__init__(spec, plan.kind if plan else "cpu", device_thread)
        self.prompts = model_prompts(spec)
        time.sleep(spec.load_seconds)

    def memory_bytes(self) -> int:
        return self.spec.memory_bytes

    def token_lengths(self, texts: list[str], prompt: str | None = None) -> Measured:
        limit = self.spec.max_seq_length
        extra = len(self.prompts.text(prompt=prompt))
        raw = np.fromiter((2 + (extra + len(t)) // CHARS_PER_TOKEN for t in texts), dtype=np.int64, count=len(texts))
        return np.minimum(raw, limit), int((raw > limit).sum())

    def embed(
        self, texts: list[str], measured: Measured | None = None, prompt: str | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """`adapters`: a simulated model has no LoRA layers: refused unless None."""
        prompt = self.prompts.text(prompt=prompt)
        lengths, truncated = measured or self.token_lengths(texts, prompt)
        texts = [prompt + t for t in texts] if prompt else texts

        def forward(batch: np.ndarray) -> np.ndarray:
            padded = len(batch) * int(lengths[batch].max())
            seconds = self.spec.batch_fixed_seconds + self.spec.per_token_seconds * padded
            if seconds > 0:  # a zero-compute model costs nothing here (sleep(0) is a syscall)
                time.sleep(seconds)
            return self._vectors([texts[i] for i in batch])

        return self.in_batches(len(texts), lambda: (lengths, truncated), forward, self.spec.dim, adapters)

    def _vectors(self, texts: list[str]) -> np.ndarray:
        """Pseudo-random unit vectors drawn from a hash of each text: the same text, the same vector."""
        dim = self.spec.dim
        digests = b"".join(hashlib.shake_128(f"{self.spec.name}|{t}".encode()).digest(2 * dim) for t in texts)
        vectors = np.frombuffer(digests, dtype="<i2").reshape(len(texts), dim).astype(np.float32) + 0.5
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    def close(self) -> None:
        pass
