"""Tiny classifiers for tests: random BERTs with classification heads, saved as bare transformers folders.

Each folder is what `save_pretrained` writes (config.json with its labels, weights, MiniLM's tokenizer), the
layout a fine-tuned classifier on the Hugging Face hub has; Shoal tells its kind from config.json's
`architectures` (configs/model_resolution.py). Wide initial weights spread the scores, so orderings and
argmaxes mean something.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.models import TINY_DIM, _seeded_bert

SENTIMENT = ["negative", "neutral", "positive"]
TOPICS = ["politics", "sports", "science", "art", "music"]
NLI = ["contradiction", "neutral", "entailment"]  # an NLI head: zero-shot labels through entailment
BIO = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
PROBE = "Alice Smith of Acme Corporation met the mayor of Paris on Tuesday, unbelievably early."


def build_tiny_sequence_classifier(
    target: Path, labels: list[str], multi_label: bool = False, seed: int = 0, hidden: int = TINY_DIM
) -> Path:
    """A `BertForSequenceClassification` with `labels`; `multi_label`: problem_type multi_label_classification."""
    from transformers import BertForSequenceClassification

    problem = {"problem_type": "multi_label_classification"} if multi_label else {}
    folder, config = _labelled_bert(target, labels, seed, hidden, initializer_range=0.5, **problem)
    BertForSequenceClassification(config).save_pretrained(folder)
    return folder.rename(target / "model")


def build_tiny_token_classifier(target: Path, labels: list[str] = BIO, seed: int = 0, hidden: int = TINY_DIM) -> Path:
    """A `BertForTokenClassification` with BIO `labels`, its head's bias centring each label's logit on a probe
    sentence (a random BERT's tokens share most of their hidden state: uncentred, one label wins them all), the
    first label's raised by half a logit: on the demo corpus about a third of tokens are then O, the rest B-/I-."""
    import torch
    from transformers import AutoTokenizer, BertForTokenClassification

    folder, config = _labelled_bert(target, labels, seed, hidden, initializer_range=0.3)
    model = BertForTokenClassification(config).eval()
    probe = AutoTokenizer.from_pretrained(folder)(PROBE, return_tensors="pt")
    with torch.no_grad():
        model.classifier.bias -= model(**probe).logits[0].mean(dim=0)
        model.classifier.bias[0] += 0.5
    model.save_pretrained(folder)
    return folder.rename(target / "model")


def _labelled_bert(target: Path, labels: list[str], seed: int, hidden: int, **config):
    """`_seeded_bert` with a head of `labels`, named as transformers' configs name them."""
    return _seeded_bert(
        target,
        seed,
        hidden,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        **config,
    )


def build_tiny_gliner(target: Path, seed: int = 0, hidden: int = TINY_DIM, max_words: int = 64) -> Path:
    """A GLiNER span extractor (gliner's span model) on a tiny random BERT, saved as GLiNER saves it:
    `gliner_config.json` (the encoder's config inline), weights and the tokenizer; it loads without the
    backbone folder. `max_words`: its `max_len`, the words of a text it reads."""
    import shutil

    from gliner import GLiNER, GLiNERConfig
    from transformers import BertModel

    backbone, config = _seeded_bert(target, seed, hidden, initializer_range=0.3)
    BertModel(config).save_pretrained(backbone)
    model = GLiNER.from_config(
        GLiNERConfig(model_name=str(backbone), hidden_size=hidden, max_width=6, max_len=max_words)
    )
    folder = target / "model"
    model.save_pretrained(folder)
    shutil.rmtree(backbone)  # a GLiNER folder stands alone, as on the hub
    return folder
