"""Sequence classifiers: each text's labels and scores, best first; an NLI model also scores zero-shot labels.

Recognised from a bare transformers ``*ForSequenceClassification`` folder
with more than one label (one label is a bare cross-encoder: a reranker);
its width is its labels' count. Its operation is ``classify``: `shoal
classify` and ``POST /v1/classify/{model}`` ``{"texts", "truncate", "top_k",
"threshold", "labels", "template", "multi_label"}`` -> ``{"model", "labels",
"usage"}``: each text's [{"label", "score"}], best first (zero-shot with
`labels`). The gate holds the top label to fp32's on 99 % of texts and every
score within 0.02.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import ConfigError
from . import request_options
from .kind import Body, Fields, Gate, InvalidRequest, JobOptions, Kind, Route


def recognises(files: Any) -> bool:
    return not files.module_types() and files.sequence_classifier() and files.labels() > 1


def has_entailment(spec: Any) -> bool:
    """Whether the model's config.json names an entailment label; True when the folder is not here to read."""
    config = Path(spec.resolve_path()) / "config.json"
    if not config.is_file():  # a folder only the workers have: they refuse it themselves
        return True
    labels = json.loads(config.read_text()).get("id2label") or {}
    return any(str(label).lower().startswith("entail") for label in labels.values())


def check(options: JobOptions, spec: Any) -> None:
    """Zero-shot labels need an NLI model, and a template holding the label; a template or multi-label needs them."""
    labels = options.get("labels")
    if ("template" in options or options.get("multi_label")) and not labels:
        raise ConfigError("a template or multi-label scores zero-shot labels: give the labels too")
    if not labels:
        return
    template = options.get("template")
    if template is not None and not request_options.one_placeholder(template):
        raise ConfigError(f"the template {template!r} has no {{}} for the label")
    if not has_entailment(spec):
        raise ConfigError(
            f"model {spec.name!r} has no entailment label: zero-shot labels need an NLI model "
            "(one with a label named entailment); without labels it scores its own"
        )


def parse(options: Body, fields: Fields, spec: Any) -> None:
    request_options.labels_and_threshold(options, fields)
    request_options.top_k(options, fields)
    template, multi_label = options.get("template"), options.get("multi_label")
    if (template is not None or multi_label is not None) and not fields.get("labels"):
        raise InvalidRequest("invalid request: template and multi_label score zero-shot labels: give labels")
    if template is not None:
        if not isinstance(template, str) or not request_options.one_placeholder(template):
            raise InvalidRequest("invalid request: template must be a string with {} for the label: {value}", template)
        fields["template"] = template
    request_options.multi_label(options, fields)


def answer(fields: Fields, result: Any, binary: bool) -> dict[str, Any]:
    return {"labels": result["outputs"], "usage": request_options.tokens(result)}


def label_scores(runtime: Any, texts: list[str]) -> Any:
    """Every label's score per text: what the gate compares."""
    return runtime.classify(texts)[0]


KIND = Kind(
    name="classifier",
    command="classify",
    operations={"classify": "shoal.workers.operations.classify_operation"},
    runtimes={"torch": "shoal.workers.runtimes.classifier:SequenceClassifier"},
    recognises=recognises,
    adapters=True,
    width=lambda files: files.labels(),
    options=frozenset({"chunk", "top_k", "threshold", "labels", "template", "multi_label"}),
    check=check,
    route=Route(
        "classify texts", frozenset({"top_k", "threshold", "labels", "template", "multi_label"}), parse, answer
    ),
    gate=Gate("labels", label_scores),
)
