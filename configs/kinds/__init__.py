"""The registry of the kinds of model: everything that differs by kind is asked of it.

Each kind is one `Kind` (kind.py) in its own module here, torch-free, so the
scheduler, the gateway and the client import it as the workers do; its worker
side (runtimes, operations) is named by import path and imported only where
a model loads or an item runs. `KINDS` lists them in recognition order: a
model's files are offered to each kind in turn, and the first that recognises
them decides (a dense embedder when none does).

Adding a kind: its module here (a `KIND`), its worker module (a runtime class,
and an operation module unless it shares one), and its line in `KINDS`
(docs/ARCHITECTURE.md, "Kinds of model").
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from . import (
    classifier,
    embedder,
    image_embedder,
    multivector,
    reranker,
    sim,
    span_extractor,
    sparse,
    token_classifier,
)
from .kind import Gate, InvalidRequest, JobOptions, Kind, Route

if TYPE_CHECKING:
    from .. import ModelSpec
    from ..model_resolution import ModelFiles

__all__ = ["DEFAULT", "KINDS", "Gate", "InvalidRequest", "JobOptions", "Kind", "Route", "kind_of", "recognise"]

# In recognition order. A GLiNER folder holds a transformer too, and a CLIP or SigLIP one may be a
# sentence-transformers folder; a sentence-transformers folder's stated model
# type (cross-encoder, sparse, multi-vector) decides before its modules make it a dense embedder; a bare
# transformers folder is told by its architecture.
KINDS: tuple[Kind, ...] = (
    span_extractor.KIND,
    image_embedder.KIND,
    reranker.KIND,
    sparse.KIND,
    multivector.KIND,
    embedder.KIND,
    token_classifier.KIND,
    classifier.KIND,
    sim.KIND,
)
DEFAULT = embedder.KIND  # a model no kind recognises: a transformer, mean-pooled


@cache
def _by_name() -> dict[str, Kind]:
    return {kind.name: kind for kind in KINDS}


def names() -> list[str]:
    return list(_by_name())


def kind_of(spec_or_name: ModelSpec | str) -> Kind:
    """The kind of a spec (ModelSpec validated its name), or of a kind's name (KeyError if none)."""
    name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.kind
    return _by_name()[name]


def recognise(files: ModelFiles) -> Kind:
    """The kind of a model folder, from what its library wrote."""
    return next((kind for kind in KINDS if kind.recognises(files)), DEFAULT)


def for_command(command: str) -> tuple[Kind, ...]:
    """The kinds whose jobs `shoal COMMAND` runs."""
    return tuple(kind for kind in KINDS if kind.command == command)


def for_operation(operation: str) -> tuple[Kind, ...]:
    """The kinds whose own operation is `operation`: the models its route and its jobs take."""
    return tuple(kind for kind in KINDS if kind.operation == operation)


@cache
def for_api(api: str) -> tuple[Kind, ...]:
    """The kinds the gateway's API formats of `api` serve (`embed`: /v1/encode, OpenAI's and Cohere's embeddings;
    `rerank`: /v1/rerank, Cohere's rerank)."""
    return tuple(kind for kind in KINDS if kind.api == api)


@cache
def operation_module(operation: str) -> str:
    """The worker module computing `operation` (ValueError when no kind runs it)."""
    modules = {kind.operations[operation] for kind in KINDS if operation in kind.operations}
    if not modules:
        raise ValueError(f"no kind of model runs the operation {operation!r}")
    (module,) = modules  # kinds that share an operation share its module (tests/kinds/test_registry.py)
    return module


def routes() -> dict[str, str]:
    """The online routes of the kinds that have their own: operation -> what a model of another kind cannot do."""
    return {kind.operation: kind.route.action for kind in KINDS if kind.route is not None}
