"""ONNX exports of catalog models, built once per model fingerprint and kept on disk.

An export is slow (tracing the model, then checking the graph against it)
and a worker may start many times, so the graph is written under
``$SHOAL_CACHE_DIR/onnx`` (default ``~/.cache/shoal``), keyed by a hash of
the model's files and the settings that change its output. An entry is
built in a temporary folder and renamed into place, and its ``artifact.json``
(written last) records the graph's size and sha256: an entry that is
incomplete, truncated or altered is rebuilt, never loaded.

Every export is checked before it is cached: the graph's outputs on a few
fixed texts must reproduce the torch fp32 model's, and no module may be left
in training mode (``torch.onnx.export`` restores the mode a wrapper had; a
wrapper not put in eval mode turns dropout on in the shared model). int8
graphs are the cached fp32 graph after ONNX Runtime's dynamic quantization
(never a second export); how far they move the vectors is the quality gate's
question (pipeline/tuning/quality_gate.py).

The model's fast tokenizer is saved beside the graph (``tokenizer.json``,
its per-call settings in the record) and read by workers/runtimes/onnx_tokenizer.py:
the export, its check and the ONNX runtimes all tokenize through it, so the
graph is checked on exactly the inputs it will be given, and a worker that
runs it never imports transformers or torch.

The model folder's digest is configs' `folder_digest`, the one the client's
model fingerprint starts from.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.configs import ModelSpec
from shoal.configs.model_resolution import folder_digest

from .onnx_tokenizer import GRAPH_INPUTS, TOKENIZER_FILE, GraphTokenizer, TokenizerSettings

logger = logging.getLogger("shoal.worker.onnx")

EXPORT_FORMAT = 2  # bump when the entry's files change (2: the tokenizer's settings in the record)
GRAPH_FILE = "model.onnx"
RECORD_FILE = "artifact.json"
OPSET = 17
# Short, long (truncated at max_seq_length), non-ASCII and empty-ish inputs: what tokenization gets wrong first.
CHECK_TEXTS = [
    "How do I read a Parquet file in chunks?",
    "a",
    "Numbers 3.14159, dates 2026-12-03, and symbols #@!% mixed in.",
    "Café naïve résumé — unicode déjà vu 東京 🚀",
    " ".join(["Long passages are truncated to the model's limit before they reach the graph."] * 60),
]
CHECK_MIN_COSINE = 0.9999  # fp32 graph against fp32 torch: only float reordering may differ
CHECK_MAX_SCORE_ERROR = 1e-3


class ExportCheckFailed(RuntimeError):
    """An exported graph that does not reproduce the torch model: never cached."""


@dataclass(frozen=True)
class Artifact:
    directory: Path
    exported: bool  # built by this call (False: reused from the cache)
    seconds: float  # export and check, or verifying the cached entry

    @property
    def graph(self) -> Path:
        return self.directory / GRAPH_FILE


def cache_root() -> Path:
    return Path(os.environ.get("SHOAL_CACHE_DIR") or "~/.cache/shoal").expanduser() / "onnx"


def entry_for(spec: ModelSpec, dtype: str) -> Path:
    """The cache folder of `spec` in `dtype`: a new model file or setting is a new entry."""
    settings = f"{folder_digest(spec.resolve_path())}|{spec.kind}|{spec.max_seq_length}|{spec.normalize}|{dtype}|{EXPORT_FORMAT}"
    key = hashlib.sha256(settings.encode()).hexdigest()[:20]
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)
    return cache_root() / f"{safe_name}-{dtype}-{key}"


def ensure_artifact(spec: ModelSpec, dtype: str) -> Artifact:
    """The cached, verified export of `spec` in `dtype`; exported and checked first if missing or corrupt."""
    began = time.perf_counter()
    entry = entry_for(spec, dtype)
    problem = _problem_with(entry)
    if problem is None:
        return Artifact(entry, False, time.perf_counter() - began)
    if entry.exists():
        logger.warning("rebuilding the ONNX cache entry %s: %s", entry, problem)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        _build(spec, dtype, staging)
        if entry.exists():  # corrupt (checked above), or a concurrent build that we replace
            if _problem_with(entry) is None:
                return Artifact(entry, False, time.perf_counter() - began)
            shutil.rmtree(entry)
        os.rename(staging, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported %s as ONNX %s in %.1f s to %s", spec.name, dtype, time.perf_counter() - began, entry)
    return Artifact(entry, True, time.perf_counter() - began)


def _problem_with(entry: Path) -> str | None:
    """Why `entry` cannot be used, or None when its graph is the one its record describes."""
    try:
        record = json.loads((entry / RECORD_FILE).read_text())
        graph = entry / GRAPH_FILE
        if graph.stat().st_size != record["graph_bytes"]:
            return f"{GRAPH_FILE} has {graph.stat().st_size} bytes, the record says {record['graph_bytes']}"
        if _sha256(graph) != record["graph_sha256"]:
            return f"{GRAPH_FILE} does not match its recorded sha256"
    except FileNotFoundError as exc:
        return f"missing {Path(exc.filename).name}"
    except (ValueError, KeyError, TypeError) as exc:
        return f"unreadable {RECORD_FILE} ({exc})"
    return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    _feed(digest, path)
    return digest.hexdigest()


def _feed(digest, path: str | Path) -> None:
    """Add a file's bytes to `digest`, a MiB at a time."""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)


def _build(spec: ModelSpec, dtype: str, staging: Path) -> None:
    """fp32: export, check, then write the record that makes the entry valid; int8: the fp32 entry quantized."""
    if dtype == "int8":
        _quantize(ensure_artifact(spec, "float32"), staging)
        return
    import torch

    if spec.kind == "embedder":
        reference_model, wrapper, inputs = _embedder_graph(spec)
    elif spec.kind == "reranker":
        reference_model, wrapper, inputs = _reranker_graph(spec)
    else:
        raise ValueError(f"model {spec.name!r}: no ONNX export for kind {spec.kind!r}")
    settings = _save_tokenizer(spec, reference_model.tokenizer, staging)
    tokenizer = GraphTokenizer(staging / TOKENIZER_FILE, settings)
    names = input_names(reference_model.tokenizer)
    features = _tokenize(tokenizer, names, spec, inputs)
    graph = staging / GRAPH_FILE
    wrapper.eval()  # the trap: export restores the wrapper's mode onto the shared model
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer notes on shapes the dynamic axes cover
        torch.onnx.export(
            wrapper,
            tuple(torch.from_numpy(features[n]) for n in names),
            str(graph),
            input_names=names,
            output_names=["output"],
            dynamic_axes={**{n: {0: "batch", 1: "tokens"} for n in names}, "output": {0: "batch"}},
            opset_version=OPSET,
            dynamo=False,
            external_data=False,
        )
    left_training = [name or "(root)" for name, module in reference_model.named_modules() if module.training]
    if left_training:
        raise ExportCheckFailed(f"model {spec.name!r}: export left modules in training mode: {left_training[:3]}")
    _check_export(spec, reference_model, tokenizer, names, graph, inputs)
    record = {
        "model": spec.name,
        "kind": spec.kind,
        "dtype": dtype,
        "inputs": names,
        "max_seq_length": spec.max_seq_length,
        "tokenizer": settings.to_dict(),
        "torch": torch.__version__,
    }
    _write_record(staging, record)


def _quantize(fp32: Artifact, staging: Path) -> None:
    """The fp32 entry's graph through ONNX Runtime's dynamic int8 quantization, beside its tokenizer."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs each skipped tensor and a hint on the root logger
    try:
        quantize_dynamic(str(fp32.graph), str(staging / GRAPH_FILE), weight_type=QuantType.QInt8)
    finally:
        root.setLevel(level)
    shutil.copyfile(fp32.directory / TOKENIZER_FILE, staging / TOKENIZER_FILE)
    record = json.loads((fp32.directory / RECORD_FILE).read_text())
    _write_record(staging, {**record, "dtype": "int8"})


def _write_record(staging: Path, record: dict) -> None:
    """The record, with the graph's size and sha256: written last, it makes the entry valid."""
    graph = staging / GRAPH_FILE
    record = {**record, "graph_bytes": graph.stat().st_size, "graph_sha256": _sha256(graph)}
    (staging / RECORD_FILE).write_text(json.dumps(record, indent=1))


def _save_tokenizer(spec: ModelSpec, tokenizer, staging: Path) -> TokenizerSettings:
    """The model's fast tokenizer as ``tokenizer.json``, and the settings transformers applies per call."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ExportCheckFailed(
            f"model {spec.name!r}: its tokenizer ({type(tokenizer).__name__}) is not a fast one, with no "
            f"{TOKENIZER_FILE} for ONNX workers: run it on torch, not onnx"
        )
    backend.save(str(staging / TOKENIZER_FILE))
    return TokenizerSettings.of(tokenizer)


def input_names(tokenizer) -> list[str]:
    """The graph's inputs: what the model's tokenizer gives it, in its order."""
    return [name for name in tokenizer.model_input_names if name in GRAPH_INPUTS]


def _graph_module(model, names: list[str], head: Callable):
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


def _embedder_graph(spec: ModelSpec):
    """The SentenceTransformer in fp32, a module from token ids to final vectors, and the texts to check it on."""
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

    return model, _graph_module(model, input_names(model.tokenizer), vectors_of), CHECK_TEXTS


def _reranker_graph(spec: ModelSpec):
    """The CrossEncoder in fp32, a module from pair token ids to its final scores, and the pairs to check it on."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(spec.resolve_path(), device="cpu", max_length=spec.max_seq_length, local_files_only=True)
    model.eval()
    activation = model.activation_fn or torch.nn.Identity()

    def scores_of(output):
        scores = activation(output["scores"].float())
        return scores.reshape(scores.shape[0], -1)[:, 0]

    pairs = [(CHECK_TEXTS[0], text) for text in CHECK_TEXTS] + [(CHECK_TEXTS[4], CHECK_TEXTS[2])]
    return model, _graph_module(model, input_names(model.tokenizer), scores_of), pairs


def _tokenize(tokenizer: GraphTokenizer, names: list[str], spec: ModelSpec, inputs: list) -> dict[str, np.ndarray]:
    """The graph's inputs for check texts (embedder) or (query, passage) pairs (reranker)."""
    if spec.kind == "reranker":
        return tokenizer.graph_inputs(names, spec.max_seq_length, [q for q, _ in inputs], [p for _, p in inputs])
    return tokenizer.graph_inputs(names, spec.max_seq_length, inputs)


def _check_export(
    spec: ModelSpec, model, tokenizer: GraphTokenizer, names: list[str], graph: Path, inputs: list
) -> None:
    """The graph must give what the torch fp32 model gives, through the runtime's own tokenization.

    Texts are checked without a prompt: a prompt is text the runtime prepends, never part of the graph.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    feeds = _tokenize(tokenizer, names, spec, inputs)
    got = session.run(None, feeds)[0]
    if spec.kind == "reranker":
        expected = np.asarray(model.predict(inputs, batch_size=len(inputs), show_progress_bar=False), dtype=np.float32)
        error = float(np.abs(got.reshape(-1) - expected.reshape(-1)).max())
        if not error <= CHECK_MAX_SCORE_ERROR:
            raise ExportCheckFailed(
                f"model {spec.name!r}: the ONNX graph's scores differ from torch fp32 by up to {error:.2e} "
                f"(allowed {CHECK_MAX_SCORE_ERROR:.0e})"
            )
        return
    expected = model.encode(
        inputs, prompt="", batch_size=len(inputs), convert_to_numpy=True, normalize_embeddings=spec.normalize
    )
    cosine = np.sum(got * expected, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(expected, axis=1))
    if got.shape != expected.shape or not float(cosine.min()) >= CHECK_MIN_COSINE:
        raise ExportCheckFailed(
            f"model {spec.name!r}: the ONNX graph does not reproduce torch fp32 vectors "
            f"(shape {got.shape} vs {expected.shape}, cosine min {float(cosine.min()):.6f}, "
            f"needed {CHECK_MIN_COSINE})"
        )
