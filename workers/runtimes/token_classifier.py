"""The token classifier runtime: a transformers ``*ForTokenClassification`` model, its spans aggregated.

Every text is tokenized once with character offsets. Its windows (one, cut
at the model's window, or with a `stride` all of them, overlapping by that
many tokens, as the ``token-classification`` pipeline's ``stride``) go
through the model in token-budget batches; each text's windows are then
aggregated by that pipeline's own post-processing (``simple``, ``first``,
``max``, ``average``, or ``none``: one entity per token), so labels, scores
and character offsets are what the pipeline gives for the same text. An
entity's text is the source's ``text[start:end]``, not the pipeline's
``word`` (decoded tokens, lower-cased by an uncased tokenizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import numpy as np

from ...configs import ModelSpec
from ...scheduler_plugins.protocol import Aggregation
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters
from ..devices import DevicePlan
from .classifier import labels_of
from .text_model import TextModel

AGGREGATIONS: tuple[Aggregation, ...] = get_args(Aggregation)


@dataclass(frozen=True)
class Entity:
    """One span of a text: `text` is the source's text[start:end] (character offsets)."""

    text: str
    label: str
    score: float
    start: int
    end: int


class TokenClassifier(TextModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        from transformers import AutoModelForTokenClassification, AutoTokenizer, TokenClassificationPipeline

        path = spec.resolve_path()
        model = AutoModelForTokenClassification.from_pretrained(path, local_files_only=True).to(plan.device)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if not getattr(tokenizer, "is_fast", False):
            raise ValueError(f"model {spec.name!r}: spans need a fast (Rust) tokenizer's character offsets")
        super().__init__(spec, plan, model, tokenizer, device_thread, dtype)
        self.labels = labels_of(model.config, spec)
        # The pipeline only for its post-processing: the forward is ours, in token-budget batches.
        self.pipeline = TokenClassificationPipeline(model=model, tokenizer=tokenizer, device=model.device)

    def entities(
        self,
        texts: list[str],
        aggregation: Aggregation = "simple",
        stride: int | None = None,
        window: int = 0,
        adapters: Adapters = None,
    ) -> tuple[list[list[Entity]], int]:
        """Each text's entities in order of their start, and how many texts were cut at the window.

        `stride`: read all of a long text, in windows overlapping by `stride` tokens (never cut then);
        `window`: tokens a window holds, special tokens included (0: the model's whole window);
        `adapters`: each text's LoRA adapter.
        """
        if not texts:
            return [], 0
        if stride is not None and aggregation == "none":
            raise ValueError("windows overlapping by a stride need an aggregation other than none")
        window = window or self.spec.max_seq_length
        content = window - self.tokenizer.num_special_tokens_to_add(pair=False)
        if stride is not None and stride >= content:  # the tokenizer would panic (a BaseException) instead
            raise ValueError(
                f"chunk tokens={window} leaves {content} tokens of text per window beside the model's special "
                f"tokens, not more than overlap={stride}"
            )
        encoded = self.tokenizer(
            texts,
            truncation=True,
            max_length=window,
            stride=stride or 0,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            return_attention_mask=False,
        )
        source = np.asarray(encoded["overflow_to_sample_mapping"], dtype=np.int64)
        firsts = np.concatenate([[True], source[1:] != source[:-1]])
        # Without a stride a text is its first window, cut there; the rest of it is not read.
        windows = np.arange(len(source)) if stride is not None else np.flatnonzero(firsts)
        truncated = 0 if stride is not None else len(np.unique(source[~firsts]))
        logits: dict[int, np.ndarray] = {}
        lengths = np.fromiter((len(encoded["input_ids"][w]) for w in windows), dtype=np.int64, count=len(windows))
        for batch in self.forward_batches(lengths):
            with self.device_thread.turn(), self.through(adapters, source[windows[batch]]):
                rows = self._logits(encoded, windows[batch])
            logits.update(zip(windows[batch].tolist(), rows))
        per_text: list[list[int]] = [[] for _ in texts]
        for window in windows.tolist():
            per_text[int(source[window])].append(window)
        return [self._aggregate(texts[i], encoded, ws, logits, aggregation) for i, ws in enumerate(per_text)], truncated

    def _logits(self, encoded: Any, windows: np.ndarray) -> list[np.ndarray]:
        """float32 logits of each window, its own length (the padding cut off)."""
        import torch

        lengths = [len(encoded["input_ids"][w]) for w in windows]
        width = max(lengths)
        ids = np.full((len(windows), width), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        type_ids = np.zeros((len(windows), width), dtype=np.int64)
        for row, w in enumerate(windows):
            ids[row, : lengths[row]] = encoded["input_ids"][w]
            if "token_type_ids" in encoded:
                type_ids[row, : lengths[row]] = encoded["token_type_ids"][w]
        mask = (np.arange(width) < np.asarray(lengths)[:, None]).astype(np.int64)
        features = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in encoded:
            features["token_type_ids"] = type_ids
        with torch.inference_mode():
            out = self.model(**{k: torch.from_numpy(v).to(self.torch_device) for k, v in features.items()})
            batch = out.logits.float().cpu().numpy()
        return [batch[row, :n] for row, n in enumerate(lengths)]

    def _aggregate(
        self, text: str, encoded: Any, windows: list[int], logits: dict[int, np.ndarray], aggregation: Aggregation
    ) -> list[Entity]:
        """The pipeline's post-processing of one text's windows."""
        import torch
        from transformers.pipelines.token_classification import AggregationStrategy

        outputs = [
            {
                "logits": torch.from_numpy(logits[w])[None],
                "input_ids": torch.tensor(encoded["input_ids"][w])[None],
                "offset_mapping": torch.tensor(encoded["offset_mapping"][w])[None],
                "special_tokens_mask": torch.tensor(encoded["special_tokens_mask"][w])[None],
                "sentence": text,
                "is_last": n == len(windows) - 1,
            }
            for n, w in enumerate(windows)
        ]
        found = self.pipeline.postprocess(outputs, aggregation_strategy=AggregationStrategy(aggregation))
        return [
            Entity(
                text[int(e["start"]) : int(e["end"])],
                str(e.get("entity_group", e.get("entity"))),
                float(e["score"]),
                int(e["start"]),
                int(e["end"]),
            )
            for e in found
        ]
