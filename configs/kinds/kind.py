"""What a kind of model is: one `Kind` object per kind, defined in its own module beside this one.

A kind holds everything that differs between kinds of model, so the rest of
Shoal asks the registry (`shoal.configs.kinds`) instead of branching on a
kind's name:

- how it is recognised from a model's files, and the spec fields it reads
  from them (width, normalisation, token budget);
- the one name of its operation (the batch op its items name, the online op
  its requests run, the ``/v1/<op>/`` route) and the `shoal` command that runs it;
- the options its jobs take, and the checks they need before any work;
- its online route: the request options it takes and the reply's shape;
- how the quality gate judges it;
- its worker side, by import path: each runtime's class (load, measured
  memory, forward batches, close) and each operation's module (read, compute
  and write of a batch item; ``online`` for a group of requests).

This side is torch-free: the scheduler, the gateway and the client import it.
The worker side is imported only where a model loads or an item runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import DEFAULT_TOKEN_BUDGET, ConfigError

if TYPE_CHECKING:
    from .. import ModelSpec
    from ..model_resolution import ModelFiles

# A job's options, each only when the job asks for it (pipeline/jobs): chunk, vectors, prompt, top_k, input_type,
# threshold, labels, template, multi_label, aggregation.
JobOptions = Mapping[str, Any]
# An online request's fields beyond its texts, as the body gave them, and what travels to the worker.
Body = dict[str, Any]
Fields = dict[str, Any]

# How each job option is spelled on the command line, for messages.
OPTION_FLAGS = {
    "chunk": "--chunk",
    "vectors": "--precision/--dim",
    "prompt": "--prompt/--prompt-name",
    "top_k": "--top-k",
    "input_type": "--input-type",
    "threshold": "--threshold",
    "labels": "--labels",
    "template": "--template",
    "multi_label": "--multi-label",
    "aggregation": "--aggregation",
}


class InvalidRequest(ValueError):
    """An online request's option that its model's kind refuses: the gateway answers 400 with the message.

    The client's value is kept apart (`value`, its place ``{value}`` in the message), so the gateway quotes
    it its own way (gateway/wire.py `shown`: a long string cut, a list by its size), never whole.
    """

    def __init__(self, message: str, value: Any = None) -> None:
        super().__init__(message)
        self.message, self.value = message, value

    def told(self, shown: Callable[[Any], str]) -> str:
        """The message with the value as `shown` quotes it."""
        return self.message.replace("{value}", shown(self.value))


def _no_checks(options: JobOptions, spec: ModelSpec) -> None:
    """A kind whose options need no check beyond being its own."""


def _never(files: ModelFiles) -> bool:
    return False


def _width(files: ModelFiles) -> int:
    return files.width()


def _window(files: ModelFiles) -> int:
    return files.max_seq_length()


@dataclass(frozen=True)
class Route:
    """A kind's online route, ``POST /v1/<operation>/{model}``, served by the gateway's one handler of them all.

    The gateway checks the texts (and, with `vectors`, the vector format) as an encode request's, refuses a
    field outside `options`, then `parse` checks the options into the fields that travel to the worker
    (`InvalidRequest`: a 400), and `answer` shapes the workers' joined result as the reply.
    """

    action: str  # what a model of another kind "cannot ...", in the 400 naming it
    options: frozenset[str] = frozenset()  # body fields beyond texts and truncate
    parse: Callable[[Body, Fields, ModelSpec], None] = lambda options, fields, spec: None
    # (the request's fields as sent, the workers' joined result, a binary reply (MessagePack): numbers as raw bytes)
    answer: Callable[[Fields, Any, bool], dict[str, Any]] = lambda fields, result, binary: {}
    vectors: bool = False  # takes dtype, precision, dim and ranges, checked as /v1/encode checks them


@dataclass(frozen=True)
class Gate:
    """How the quality gate (pipeline/tuning/quality_gate.py) holds a candidate runtime to fp32 torch."""

    measure: str  # quality_gate.MEASURES: cosine, kendall, labels, spans
    outputs: Callable[[Any, list[str]], Any]  # a loaded runtime's outputs on the gate's sample texts (timed too)
    retrieval: bool = False  # also nDCG@10 on the judged set (a dense embedder)


@dataclass(frozen=True)
class Kind:
    """One kind of model: every way it differs from the others (the module docstring lists them)."""

    name: str  # ModelSpec.kind
    command: str  # the `shoal` command whose jobs it runs: embed, rerank, classify, extract
    # op -> the worker module computing it (read, compute, write; online); the first is the kind's own operation
    operations: Mapping[str, str]
    # runtime -> "module:Class" of the worker side, constructed (spec, plan, device_thread, dtype); torch first
    runtimes: Mapping[str, str]
    recognises: Callable[[ModelFiles], bool] = _never  # from a model's files (registry order decides)
    width: Callable[[ModelFiles], int] = _width  # ModelSpec.dim, from the files
    window: Callable[[ModelFiles], int] = _window  # ModelSpec.max_seq_length, from the files
    normalizes: Callable[[ModelFiles], bool] = _never  # ModelSpec.normalize, from the files
    token_budget: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_TOKEN_BUDGET))
    options: frozenset[str] = frozenset()  # the job options it takes (OPTION_FLAGS)
    check: Callable[[JobOptions, ModelSpec], None] = _no_checks  # rules beyond `options` (ConfigError)
    route: Route | None = None  # its own /v1/<operation>/ route
    api: str | None = None  # or the gateway's API formats that serve it (api_formats): embed, rerank
    gate: Gate | None = None
    inputs: frozenset[str] = frozenset({"texts"})  # what its jobs and requests give it: texts, images
    tunable: bool = False  # `shoal tune` sweeps its forward batches (token budget and batch cap; images per forward)
    adapters: bool = False  # its torch runtime runs LoRA adapters (configs/adapters.py, workers/runtimes/lora.py)
    prompts_from_files: bool = False  # the model's named prompts (config_sentence_transformers.json) apply
    simulated: bool = False  # no weights, no torch: a stand-in device for cluster experiments

    @property
    def operation(self) -> str:
        """The kind's own operation: its jobs' op, its online requests' op, its route."""
        return next(iter(self.operations))

    @property
    def measured(self) -> bool:
        """`auto` (and `shoal tune`'s phase 0) measure which of its runtimes x dtypes is fastest under the gate;
        a kind on torch alone runs in the workers' dtype."""
        return len(self.runtimes) > 1 and not self.simulated

    def check_job(self, options: JobOptions, spec: ModelSpec) -> None:
        """Refuse a job's options the model cannot meet, before any work (ConfigError: exit 2)."""
        self.check(options, spec)
        refused = [name for name in options if name not in self.options]
        if refused:
            from . import KINDS

            name = refused[0]
            takers = [kind.name for kind in KINDS if name in kind.options]
            raise ConfigError(
                f"model {spec.name!r} is of kind {self.name!r}, which takes no {OPTION_FLAGS.get(name, name)}"
                + (f": an option of {', '.join(takers)} models" if takers else "")
            )
