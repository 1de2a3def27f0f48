"""Models without a catalog entry: a local folder or a Hugging Face id from the local cache.

A sentence-transformers or CrossEncoder folder already states what a catalog
entry would repeat: its kind (``config_sentence_transformers.json``), output
dimension (the last Pooling or Dense module), window (``max_seq_length``),
whether it ends in a Normalize module, and roughly how much memory its
weights take.

The kind is the first of the registry's (configs/kinds) that recognises the
folder, each from the files its library writes (its module says which): a
GLiNER folder, a stated sentence-transformers model type (cross-encoder,
sparse, multi-vector), any other sentence-transformers folder (a dense
embedder), a bare transformers folder by its ``architectures``. The kind also
says which width is the model's (``dim``), and whether normalisation is read.
A catalog entry's ``kind`` overrides all of it.

Reading those from the files lets `--model` take any model the
machine holds, as TEI and infinity do, while the catalog stays for short
names and overrides (token budgets, batch caps).

A Hugging Face id is found in the local Hub cache, else downloaded into it (configs/hub.py); a folder in
object storage (an fsspec URL) is copied to a local cache (configs/model_store.py). Either way the spec's
source pins what the client fingerprinted (``hf:ORG/NAME@COMMIT``, ``URL/@KEY``), so workers load exactly
those files, fetched into their own caches. Nothing here imports torch: the scheduler and the client
resolve models too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypedDict

from . import ConfigError, ModelSpec
from .hub import HF_PREFIX, hub_snapshot, hub_source_path
from .kinds import DEFAULT, recognise
from .kinds.span_extractor import GLINER_CONFIG
from .model_store import WEIGHT_SUFFIXES, is_store_url, local_copy, unpinned

SKIPPED_FOLDERS = {"onnx", "openvino", ".git"}  # other runtimes' copies of the same weights
UNBOUNDED_LENGTH = 1_000_000  # tokenizers without a limit state ~1e30

# A JSON object from a model's own files (config.json, modules.json, ...): whatever its library wrote.
JsonObject = dict[str, Any]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable JSON: {exc}") from None


def _mapping(path: Path) -> JsonObject:
    """A JSON object file, or {} when it is absent (or holds something else)."""
    value = _json(path)
    return value if isinstance(value, dict) else {}


@dataclass
class ModelFiles:
    """What a model folder says about itself."""

    folder: Path

    def modules(self) -> list[JsonObject]:
        modules = _json(self.folder / "modules.json")
        return modules if isinstance(modules, list) else []

    def _module_config(self, module: JsonObject) -> JsonObject:
        return _mapping(self.folder / module.get("path", "") / "config.json")

    def _transformer_folder(self) -> Path:
        for module in self.modules():
            if module.get("type", "").endswith("Transformer"):
                return self.folder / module.get("path", "")
        return self.folder

    def kind(self) -> str:
        """What the folder computes: the first kind of the registry that recognises it (configs/kinds)."""
        return recognise(self).name

    def stated(self) -> JsonObject:
        """What sentence-transformers states of the model (``config_sentence_transformers.json``)."""
        return _mapping(self.folder / "config_sentence_transformers.json")

    def module_types(self) -> list[str]:
        """The class of each sentence-transformers module, in order (none: a bare transformers folder)."""
        return [module.get("type", "") for module in self.modules()]

    def architectures(self) -> list[str]:
        return _mapping(self.folder / "config.json").get("architectures") or []

    def sequence_classifier(self) -> bool:
        return any(a.endswith("ForSequenceClassification") for a in self.architectures())

    def labels(self) -> int:
        """The classification head's labels (a bare cross-encoder's one score counts one)."""
        backbone = _mapping(self._transformer_folder() / "config.json")
        return len(backbone.get("id2label") or {}) or int(backbone.get("num_labels", 1))

    def vocabulary(self) -> int:
        """The vocabulary's size: a sparse vector's width."""
        return int(_mapping(self._transformer_folder() / "config.json").get("vocab_size") or 0) or self._no_dim()

    def gliner_width(self) -> int:
        """A GLiNER model's span representation width (its labels are named per call)."""
        return int(_mapping(self.folder / GLINER_CONFIG).get("hidden_size") or 0) or self._no_dim()

    def width(self) -> int:
        """An embedding's width: the transformer's, unless a Pooling or Dense module sets it (the last decides)."""
        backbone = _mapping(self._transformer_folder() / "config.json")
        dim = backbone.get("hidden_size") or backbone.get("d_model") or 0
        for module in self.modules():
            name = module.get("type", "")
            config = self._module_config(module)
            if name.endswith("Pooling"):
                dim = config.get("embedding_dimension") or config.get("word_embedding_dimension") or dim
            elif name.endswith("Dense"):
                dim = config.get("out_features", dim)
        return int(dim) if dim else self._no_dim()

    def _no_dim(self) -> int:
        raise ConfigError(f"{self.folder}: cannot tell the embedding dimension (no Pooling module, no hidden_size)")

    def max_seq_length(self) -> int:
        gliner = _mapping(self.folder / GLINER_CONFIG)
        if gliner:  # the encoder's positions; GLiNER itself also cuts a text at `max_len` words
            encoder = gliner.get("encoder_config") or {}
            return int(encoder.get("max_position_embeddings") or 512)
        folder = self._transformer_folder()
        transformer = _mapping(folder / "sentence_bert_config.json")
        # A multi-vector model's documents' window (its prefix token included): the transformer's, or PyLate's.
        document_length = transformer.get("document_length") or _mapping(
            self.folder / "config_sentence_transformers.json"
        ).get("document_length")
        if document_length:
            return int(document_length)
        stated = transformer.get("max_seq_length")
        limits = [stated] if stated else []
        tokenizer_limit = _mapping(folder / "tokenizer_config.json").get("model_max_length")
        if not stated and tokenizer_limit and tokenizer_limit < UNBOUNDED_LENGTH:
            limits.append(tokenizer_limit)
        positions = _mapping(folder / "config.json").get("max_position_embeddings")
        if positions and not limits:
            limits.append(positions)
        if not limits:
            raise ConfigError(f"{self.folder}: cannot tell the model's window (no max_seq_length, no model_max_length)")
        return int(min(limits))

    def prompts(self) -> tuple[dict[str, str], str | None]:
        """The named prompts and the default prompt's name that ``config_sentence_transformers.json`` states."""
        path = self.folder / "config_sentence_transformers.json"
        config = _mapping(path)
        prompts = config.get("prompts") or {}
        default = config.get("default_prompt_name")
        if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
            raise ConfigError(f"{path}: prompts must map names to texts, not {prompts!r}")
        if default is not None and not isinstance(default, str):
            raise ConfigError(f"{path}: default_prompt_name must be a name, not {default!r}")
        return {str(k): v for k, v in prompts.items()}, default

    def normalize(self) -> bool:
        """A Normalize module; PyLate's ColBERT (model_type ColBERT) normalized inside its forward, with none."""
        stated = _mapping(self.folder / "config_sentence_transformers.json")
        return stated.get("model_type") == "ColBERT" or any(
            m.get("type", "").endswith("Normalize") for m in self.modules()
        )

    def weight_bytes(self) -> int:
        """Bytes of the weight files (safetensors if any, else .bin/.pt): the estimate before a load."""
        files: list[Path] = []
        for root, dirs, names in os.walk(self.folder):
            dirs[:] = [d for d in dirs if d not in SKIPPED_FOLDERS]
            files += [Path(root) / n for n in names if n.endswith(WEIGHT_SUFFIXES)]
        safetensors = [f for f in files if f.suffix == ".safetensors"]
        return sum(f.stat().st_size for f in (safetensors or files))

    def spec(self, name: str, source: str) -> ModelSpec:
        kind = recognise(self)
        return ModelSpec(
            name=name,
            kind=kind.name,
            source=source,
            dim=kind.width(self),
            max_seq_length=kind.window(self),
            normalize=kind.normalizes(self),
            memory_bytes=max(1, self.weight_bytes()),
            token_budget=dict(kind.token_budget),
        )


def folder_digest(path: str) -> str:
    """sha256 over every file's relative name and bytes, in a fixed order: what a model folder holds.

    The model fingerprint (configs/fingerprints) and the ONNX export
    cache's key (workers/runtimes/onnx_cache) both start from it. The files are read
    again only when one is added, removed or modified.
    """
    files: list[str] = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        files += [os.path.join(root, name) for name in sorted(names)]
    return _digest(path, tuple((file, os.stat(file).st_mtime_ns) for file in files))


@lru_cache(maxsize=32)
def _digest(path: str, files: tuple[tuple[str, int], ...]) -> str:
    digest = hashlib.sha256()
    for file, _ in files:
        digest.update(os.path.relpath(file, path).encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def looks_like_path(name: str) -> bool:
    """Meant as a folder (not a hub id): it starts like a path, or names something on disk that is not a folder."""
    return name.startswith((".", "/", "~")) or (os.sep in name and Path(name).expanduser().exists())


def resolve_unlisted(name: str, known: list[str], storage_options: dict[str, Any] | None = None) -> ModelSpec:
    """The spec of a model that is not in the catalog: a local folder, a folder in object storage (an fsspec
    URL, read with `storage_options`), or a Hugging Face id (cached, else downloaded)."""
    unknown = f"unknown model {name!r}; the catalog has: {', '.join(known) or 'none'}"
    if is_store_url(name):
        copy = local_copy(name, storage_options or {})
        return (
            ModelFiles(copy.folder)
            .spec(name, copy.source)
            .model_copy(update={"storage_options": dict(storage_options or {})})
        )
    folder = Path(name).expanduser()
    if folder.is_dir():
        folder = folder.resolve()
        return ModelFiles(folder).spec(str(folder), str(folder))
    if looks_like_path(name) or name.count("/") > 1:
        raise ConfigError(f"{unknown}; and there is no such folder ({folder.resolve()})")
    repo_id, _, revision = name.partition("@")
    try:
        snapshot, revision = hub_snapshot(repo_id, revision or None)
    except ConfigError as exc:
        raise ConfigError(f"{unknown}; it is not a local folder, and {exc}") from None
    return ModelFiles(snapshot).spec(repo_id, f"{HF_PREFIX}{repo_id}@{revision}")


class SourceFields(TypedDict):
    """What a catalog entry may leave out, read from its source's files."""

    kind: str
    dim: int
    max_seq_length: int
    normalize: bool
    memory_bytes: int
    token_budget: dict[str, int]


def fields_from_source(name: str, source: str, storage_options: dict[str, Any] | None = None) -> SourceFields:
    """What a catalog entry leaves out (kind, dim, window, normalize, memory, the kind's token budget), read from
    its source's files."""
    if source.startswith(HF_PREFIX):
        folder = Path(hub_source_path(source))
    elif is_store_url(source):
        url, key = unpinned(source)
        folder = local_copy(url, storage_options or {}, key).folder
    elif source.startswith("package:"):
        folder = Path(ModelSpec(name=name, kind=DEFAULT.name, source=source, dim=1, max_seq_length=1).resolve_path())
    else:
        folder = Path(source).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"source directory {source!r} does not exist")
    spec = ModelFiles(folder).spec(name, source)
    return SourceFields(
        kind=spec.kind,
        dim=spec.dim,
        max_seq_length=spec.max_seq_length,
        normalize=spec.normalize,
        memory_bytes=spec.memory_bytes,
        token_budget=spec.token_budget,
    )


def pin_source(spec: ModelSpec) -> ModelSpec:
    """`spec` with its source pinned to what it holds now: a Hub id's commit (``hf:ORG/NAME`` resolved, and
    fetched if not cached), a store folder's listing key. Workers then load exactly what the client read."""
    if spec.source.startswith(HF_PREFIX) and "@" not in spec.source:
        repo_id = spec.source.removeprefix(HF_PREFIX)
        return spec.model_copy(update={"source": f"{HF_PREFIX}{repo_id}@{hub_snapshot(repo_id)[1]}"})
    if is_store_url(spec.source) and unpinned(spec.source)[1] is None:
        return spec.model_copy(update={"source": local_copy(spec.source, spec.storage_options).source})
    return spec
