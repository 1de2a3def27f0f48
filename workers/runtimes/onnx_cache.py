"""The ONNX export cache: one verified entry per model fingerprint and dtype, built once and kept on disk.

An export is slow (tracing the model, then checking the graph against it:
onnx_export, onnx_check) and a worker may start many times, so the graph is
written under ``$SHOAL_CACHE_DIR/onnx`` (default ``~/.cache/shoal``), keyed by
a hash of the model's files (configs' `folder_digest`, the one the model
fingerprint of a job's outputs starts from) and the settings that change its
output. An entry is built in a temporary folder and renamed into place, so
workers starting together never see half of one, and its ``artifact.json``
(written last) records the graph's size and sha256: an entry that is
incomplete, truncated or altered is rebuilt, never loaded.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from ...configs import ModelSpec, cache_dir
from ...configs.model_resolution import folder_digest
from .onnx_export import GRAPH_FILE, QUANTIZATION, GraphForm, quantize_graph
from .onnx_tokenizer import TOKENIZER_FILE, TokenizerSettings

logger = logging.getLogger("shoal.worker.onnx")

EXPORT_FORMAT = 2  # bump when the entry's files change (2: the tokenizer's settings in the record)
RECORD_FILE = "artifact.json"


class ExportRecord(BaseModel):
    """``artifact.json``: what the graph was built from and takes, and the size and hash that make it valid."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    kind: str
    dtype: str
    inputs: list[str]  # the graph's input names, in order
    max_seq_length: int
    tokenizer: TokenizerSettings | None = None  # None: a graph of no token ids (an image tower's)
    torch: str
    graph_bytes: int
    graph_sha256: str


@dataclass(frozen=True)
class Artifact:
    directory: Path
    exported: bool  # built by this call (False: reused from the cache)
    seconds: float  # export and check, or verifying the cached entry

    @property
    def graph(self) -> Path:
        return self.directory / GRAPH_FILE

    def record(self) -> ExportRecord:
        return ExportRecord.model_validate_json((self.directory / RECORD_FILE).read_text())


def entry_for(spec: ModelSpec, dtype: str, form: str = "") -> Path:
    """The cache folder of `spec` in `dtype`, of its graph named `form` ("": its one graph): a new model file
    or setting is a new entry."""
    settings = f"{folder_digest(spec.resolve_path())}|{spec.kind}|{spec.max_seq_length}|{spec.normalize}|{dtype}|{EXPORT_FORMAT}"
    if dtype == "int8":
        settings += f"|{QUANTIZATION}"
    if form:
        settings += f"|{form}"
    key = hashlib.sha256(settings.encode()).hexdigest()[:20]
    safe_name = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)
    return cache_dir() / "onnx" / f"{safe_name}{'-' + form if form else ''}-{dtype}-{key}"


def ensure_artifact(spec: ModelSpec, dtype: str, form: GraphForm) -> Artifact:
    """The cached, verified export of `spec` in `dtype`, as `form`; exported and checked first if missing or corrupt."""
    began = time.perf_counter()
    entry = entry_for(spec, dtype, form.name)
    problem = _problem_with(entry)
    if problem is None:
        return Artifact(entry, False, time.perf_counter() - began)
    if entry.exists():
        logger.warning("rebuilding the ONNX cache entry %s: %s", entry, problem)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        _build(spec, dtype, staging, form)
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
        record = Artifact(entry, False, 0.0).record()
        graph = entry / GRAPH_FILE
        if graph.stat().st_size != record.graph_bytes:
            return f"{GRAPH_FILE} has {graph.stat().st_size} bytes, the record says {record.graph_bytes}"
        if _sha256(graph) != record.graph_sha256:
            return f"{GRAPH_FILE} does not match its recorded sha256"
    except FileNotFoundError as exc:
        return f"missing {Path(exc.filename).name}"
    except ValueError as exc:  # pydantic's ValidationError included
        return f"unreadable {RECORD_FILE} ({exc})"
    return None


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _build(spec: ModelSpec, dtype: str, staging: Path, form: GraphForm) -> None:
    """The entry's files in `staging`: fp32 exported and checked; int8 the fp32 entry quantized."""
    graph = staging / GRAPH_FILE
    if dtype == "int8":
        fp32 = ensure_artifact(spec, "float32", form)
        quantize_graph(fp32.graph, graph)
        if (fp32.directory / TOKENIZER_FILE).is_file():
            shutil.copyfile(fp32.directory / TOKENIZER_FILE, staging / TOKENIZER_FILE)
        sealed = {"dtype": dtype, "graph_bytes": graph.stat().st_size, "graph_sha256": _sha256(graph)}
        record = fp32.record().model_copy(update=sealed)
    else:
        record = _export_and_check(spec, staging, form)
    (staging / RECORD_FILE).write_text(record.model_dump_json(indent=1))  # written last: it makes the entry valid


def _export_and_check(spec: ModelSpec, staging: Path, form: GraphForm) -> ExportRecord:
    """The fp32 graph traced into `staging` and checked against torch, and the record describing it."""
    import torch

    graph = staging / GRAPH_FILE
    traced = form.export(spec, staging)
    form.check(spec, traced, graph)
    return ExportRecord(
        model=spec.name,
        kind=spec.kind,
        dtype="float32",
        inputs=traced.input_names,
        max_seq_length=spec.max_seq_length,
        tokenizer=traced.settings,
        torch=torch.__version__,
        graph_bytes=graph.stat().st_size,
        graph_sha256=_sha256(graph),
    )
