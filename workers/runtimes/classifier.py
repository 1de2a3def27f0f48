"""The sequence classifier runtime: a transformers ``*ForSequenceClassification`` model.

Scores are what transformers' ``text-classification`` pipeline gives for the
same texts: its function of the model's float32 logits, in numpy as it
computes them: sigmoid for a multi-label model (``problem_type``
multi_label_classification, or one label), softmax otherwise, the raw logits
for regression. They come back as a (texts, labels) float32 matrix in label-id
order; the operations rank and cut them.

An NLI model (a label named ``entailment``) also classifies by labels given
per job or request, as the ``zero-shot-classification`` pipeline does: each
(text, hypothesis) pair is one row of the forward, the hypothesis the
template with the label in it, the text truncated first.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from ...configs import ModelSpec
from ..batching.device_thread import DeviceThread
from ..batching.token_batching import Adapters, Measured
from ..devices import DevicePlan
from .text_model import TextModel

Function = Literal["sigmoid", "softmax", "none"]
DEFAULT_TEMPLATE = "This example is {}."  # the zero-shot pipeline's


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - np.max(logits, axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


class SequenceClassifier(TextModel):
    def __init__(
        self, spec: ModelSpec, plan: DevicePlan, device_thread: DeviceThread | None = None, dtype: str | None = None
    ) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = spec.resolve_path()
        model = AutoModelForSequenceClassification.from_pretrained(path, local_files_only=True).to(plan.device)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        super().__init__(spec, plan, model, tokenizer, device_thread, dtype)
        config = model.config
        self.labels = labels_of(config, spec)
        self.function: Function = function_of(config.problem_type, config.num_labels)
        # The label whose logit says "the hypothesis holds": what zero-shot labels are scored by.
        self.entailment = next((i for i, label in enumerate(self.labels) if label.lower().startswith("entail")), None)

    def classify(
        self, texts: list[str], measured: Measured | None = None, adapters: Adapters = None
    ) -> tuple[np.ndarray, int]:
        """(texts, labels) scores in input order, and the count of truncated texts.

        `measured`: ``token_lengths(texts)``, when the caller has it already; `adapters`: each text's LoRA adapter.
        """
        logits, truncated = self.in_batches(
            len(texts),
            lambda: measured or self.token_lengths(texts),
            lambda batch: self._logits([texts[i] for i in batch]),
            len(self.labels),
            adapters,
        )
        if self.function == "sigmoid":
            return sigmoid(logits), truncated
        return (softmax(logits) if self.function == "softmax" else logits), truncated

    def zero_shot(
        self,
        texts: list[str],
        labels: list[str],
        template: str = DEFAULT_TEMPLATE,
        multi_label: bool = False,
        adapters: Adapters = None,
    ) -> tuple[np.ndarray, int]:
        """(texts, `labels`) scores of each label's hypothesis about each text, and the count of truncated texts.

        `multi_label`: each label on its own (entailment against contradiction); else one softmax of the
        entailment logits over the labels, as the pipeline (which also treats a single label on its own).
        `adapters`: each text's LoRA adapter.
        """
        if self.entailment is None:
            raise ValueError(f"model {self.spec.name!r} has no entailment label: it scores only its own labels")
        premises = [text for text in texts for _ in labels]
        hypotheses = [template.format(label) for _ in texts for label in labels]
        logits, _ = self.in_batches(
            len(premises),
            lambda: self._pair_lengths(premises, hypotheses),
            lambda batch: self._logits([premises[i] for i in batch], [hypotheses[i] for i in batch]),
            len(self.labels),
            adapters if adapters is None or isinstance(adapters, str) else [a for a in adapters for _ in labels],
        )
        per_label = logits.reshape(len(texts), len(labels), len(self.labels))
        truncated = self.zero_shot_lengths(texts, labels, template)[1]
        if multi_label or len(labels) == 1:
            contradiction = -1 if self.entailment == 0 else 0
            pair = per_label[..., [contradiction, self.entailment]]
            scores = np.exp(pair) / np.exp(pair).sum(-1, keepdims=True)
            return scores[..., 1], truncated
        entailed = per_label[..., self.entailment]
        return np.exp(entailed) / np.exp(entailed).sum(-1, keepdims=True), truncated

    def zero_shot_lengths(self, texts: list[str], labels: list[str], template: str = DEFAULT_TEMPLATE) -> Measured:
        """Each text's tokens beside its longest hypothesis, and how many texts are cut to fit."""
        longest = max((template.format(label) for label in labels), key=len)
        return self._pair_lengths(texts, [longest] * len(texts))

    def _pair_lengths(self, premises: list[str], hypotheses: list[str]) -> Measured:
        """Tokens per (premise, hypothesis) after the premise is cut to fit, and how many were cut."""
        limit = self.spec.max_seq_length
        ids = self.tokenizer(premises, hypotheses, truncation="only_first", max_length=limit + 1)["input_ids"]
        raw = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        return np.minimum(raw, limit), int((raw > limit).sum())

    def _logits(self, texts: list[str], hypotheses: list[str] | None = None) -> np.ndarray:
        import torch

        if hypotheses is None:
            features = self.encode_batch(texts)
        else:  # the premise is cut, never the hypothesis (the label)
            features = self.tokenizer(
                texts,
                hypotheses,
                padding=True,
                truncation="only_first",
                max_length=self.spec.max_seq_length,
                return_tensors="pt",
            )
            features = {k: v.to(self.torch_device) for k, v in features.items()}
        with torch.inference_mode():
            return self.model(**features).logits.float().cpu().numpy()


def labels_of(config: Any, spec: ModelSpec) -> list[str]:
    """A classification head's label names in id order, refused if the catalog's dim says otherwise."""
    labels = [str(config.id2label[i]) for i in range(config.num_labels)]
    if len(labels) != spec.dim:
        raise ValueError(f"model {spec.name!r}: catalog says dim {spec.dim}, the model has {len(labels)} labels")
    return labels


def function_of(problem_type: str | None, num_labels: int) -> Function:
    """The text-classification pipeline's default function for a model's config."""
    if problem_type == "regression":
        return "none"
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"
