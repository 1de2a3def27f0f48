"""Building a model's ONNX graph: the torch model traced from token ids to its final output, and int8 from fp32.

The graph holds the whole model as the torch runtime runs it (pooling,
truncated dimensions and normalization for an embedder; the activation for a
cross-encoder), so an ONNX worker only tokenizes and runs it. The model's
fast tokenizer is saved beside the graph (``tokenizer.json``, with the
settings transformers applies per call) and read back through
onnx_tokenizer: the trace, the check (onnx_check) and the ONNX runtimes all
tokenize through it, so the graph is checked on exactly the inputs it will be
given, and a worker that runs it never imports transformers or torch.

int8 is the fp32 graph through ONNX Runtime's dynamic quantization, never a
second trace. Only the export cache (onnx_cache) calls this module, into its
staging folder.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...configs import ModelSpec
from .onnx_check import PAIRS, TEXTS, CheckInputs, ExportCheckFailed, check_export
from .onnx_tokenizer import GRAPH_INPUTS, TOKENIZER_FILE, GraphTokenizer, TokenizerSettings

GRAPH_FILE = "model.onnx"
OPSET = 17


class GraphForm:
    """What an ONNX runtime's graph computes (each runtime names its own): how it is traced from the torch model,
    and how the graph is checked against it before it is cached (onnx_cache)."""

    name: str = ""  # a model's second graph (an image model's towers) is its own cache entry: its name keys it

    def export(self, spec: ModelSpec, folder: Path) -> TracedGraph:
        """The fp32 graph traced into ``folder/model.onnx``, with what its check needs."""
        raise NotImplementedError

    def check(self, spec: ModelSpec, traced: TracedGraph, graph: Path) -> None:
        """Raise `ExportCheckFailed` unless `graph` reproduces the torch fp32 model `traced` came from."""
        raise NotImplementedError


@dataclass(frozen=True)
class TokenGraph(GraphForm):
    """A graph from token ids to a text model's final output, traced and checked on its example texts."""

    build: Callable[[ModelSpec], tuple[Any, Any]]  # (the fp32 torch model, a module from token ids to its output)
    example: CheckInputs

    def export(self, spec: ModelSpec, folder: Path) -> TracedGraph:
        return export_graph(spec, folder, self)

    def check(self, spec: ModelSpec, traced: TracedGraph, graph: Path) -> None:
        assert traced.tokenizer is not None
        check_export(spec, traced.model, traced.tokenizer, traced.input_names, graph, self.example)


@dataclass(frozen=True)
class TracedGraph:
    """A graph just written, with what its check needs: the torch model it came from, and its tokenizer."""

    model: Any  # the fp32 SentenceTransformer or CrossEncoder: the check's reference
    tokenizer: GraphTokenizer | None  # None: a graph of no token ids (an image tower's)
    settings: TokenizerSettings | None
    input_names: list[str]


def input_names(tokenizer: Any) -> list[str]:
    """The graph's inputs: what the model's (transformers) tokenizer gives it, in its order."""
    return [name for name in tokenizer.model_input_names if name in GRAPH_INPUTS]


def export_graph(spec: ModelSpec, folder: Path, form: TokenGraph) -> TracedGraph:
    """Trace `spec`'s fp32 model as `form` builds it, on its example, into ``folder/model.onnx``, its tokenizer
    beside it."""

    example = form.example
    model, wrapper = form.build(spec)
    settings = _save_tokenizer(spec, model.tokenizer, folder)
    tokenizer = GraphTokenizer(folder / TOKENIZER_FILE, settings)
    names = input_names(model.tokenizer)
    features = example.feeds(tokenizer, names, spec.max_seq_length)
    wrapper.eval()  # the trap: export restores the wrapper's mode onto the shared model
    trace_to_onnx(wrapper, features, names, {0: "batch", 1: "tokens"}, folder)
    return TracedGraph(model, tokenizer, settings, names)


def trace_to_onnx(module: Any, feeds: dict[str, Any], names: list[str], axes: dict[int, str], folder: Path) -> None:
    """Trace `module` (in eval mode) on `feeds` into `folder`'s graph: its inputs `names`, each with dynamic
    `axes`, one output "output" of dynamic batch; the settings every graph of the cache is exported with."""
    import torch

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes on shapes the dynamic axes cover
        torch.onnx.export(
            module,
            tuple(torch.from_numpy(feeds[n]) for n in names),
            str(folder / GRAPH_FILE),
            input_names=names,
            output_names=["output"],
            dynamic_axes={**{n: axes for n in names}, "output": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
            external_data=False,
        )


QUANTIZATION = "dynamic-s8-per-channel"  # part of an int8 entry's cache key: a change here is a new entry


def quantize_graph(fp32_graph: Path, int8_graph: Path) -> None:
    """ONNX Runtime's dynamic int8 quantization of every linear layer of `fp32_graph`, a scale per output channel.

    One scale per weight matrix lets a few large weights set the step for
    all of them; per channel, MiniLM's vectors move several times less from
    fp32's, at the same speed (docs/BENCHMARKS.md, "int8 per channel").
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs each skipped tensor and a hint on the root logger
    try:
        quantize_dynamic(str(fp32_graph), str(int8_graph), weight_type=QuantType.QInt8, per_channel=True)
    finally:
        root.setLevel(level)


def _save_tokenizer(spec: ModelSpec, tokenizer: Any, folder: Path) -> TokenizerSettings:
    """The model's fast tokenizer as ``tokenizer.json``, and the settings transformers applies per call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportCheckFailed(
            f"model {spec.name!r}: its tokenizer ({type(tokenizer).__name__}) is not a fast one, with no "
            f"{TOKENIZER_FILE} for ONNX workers: run it on torch, not onnx"
        )
    backend.save(str(folder / TOKENIZER_FILE))
    return TokenizerSettings.of(tokenizer)


def _graph_module(model: Any, names: list[str], head: Callable[[Any], Any]) -> Any:
    """A module from the graph's input tensors (in `names` order) to `head` of the model's output.

    The model is registered as the module's child, so ``eval()`` on the
    module reaches it; `head` must contain no module whose mode matters.
    """
    import torch

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            features = dict(zip(names, tensors))
            features["modality"] = "text"
            return head(self.model(features))

    return Graph()


def _embedder_graph(spec: ModelSpec) -> tuple[Any, Any]:
    """The SentenceTransformer in fp32, and a module from token ids to its final vectors."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import truncate_embeddings

    model = SentenceTransformer(spec.resolve_path(), device="cpu", local_files_only=True)
    model.max_seq_length = spec.max_seq_length
    model.eval()
    if any(getattr(module, "include_prompt", True) is False for module in model):
        # Its pooling skips the prompt's tokens (INSTRUCTOR-style): the graph's input has no prompt length.
        raise ExportCheckFailed(f"model {spec.name!r} pools without its prompt's tokens: run it on torch, not onnx")

    def vectors_of(output):
        vectors = output["sentence_embedding"]
        if model.truncate_dim is not None:
            vectors = truncate_embeddings(vectors, model.truncate_dim)
        if spec.normalize:
            vectors = torch.nn.functional.normalize(vectors, p=2, dim=1)
        return vectors

    return model, _graph_module(model, input_names(model.tokenizer), vectors_of)


def _reranker_graph(spec: ModelSpec) -> tuple[Any, Any]:
    """The CrossEncoder in fp32, and a module from pair token ids to its final scores."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(spec.resolve_path(), device="cpu", max_length=spec.max_seq_length, local_files_only=True)
    model.eval()
    activation = model.activation_fn or torch.nn.Identity()

    def scores_of(output):
        scores = activation(output["scores"].float())
        return scores.reshape(scores.shape[0], -1)[:, 0]

    return model, _graph_module(model, input_names(model.tokenizer), scores_of)


# The builders are looked up when a graph is built, not here: one name for each, wherever it is read from.
VECTORS = TokenGraph(lambda spec: _embedder_graph(spec), TEXTS)  # texts to their final vectors
SCORES = TokenGraph(lambda spec: _reranker_graph(spec), PAIRS)  # (query, passage) pairs to their final scores
