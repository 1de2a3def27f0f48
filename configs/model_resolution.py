"""Models without a catalog entry: a local folder or a Hugging Face id from the local cache.

A sentence-transformers or CrossEncoder folder already states what a catalog
entry would repeat: its kind (``config_sentence_transformers.json``), output
dimension (the last Pooling or Dense module), window (``max_seq_length``),
whether it ends in a Normalize module, and roughly how much memory its
weights take.

The kind, from the files each library writes:

- ``config_sentence_transformers.json`` ``model_type``: ``CrossEncoder`` is a
  reranker, ``SparseEncoder`` (SPLADE: a masked-LM head, max pooling; or
  modules from sentence-transformers' ``sparse_encoder``) sparse;
- one vector per token (multivector): ``model_type`` ``MultiVectorEncoder``
  (sentence-transformers') or ``ColBERT`` (PyLate's), ``skiplist_words``
  stated, modules from ``multi_vector_encoder``, or a transformer and a
  Dense projection with no pooling; its window is ``document_length``;
- any other sentence-transformers folder (``modules.json``) a dense embedder;
- a GLiNER folder (``gliner_config.json``) a span extractor: entities of
  labels named per job or request; its width is the span representation's
  (``hidden_size``), its window the encoder's positions;
- a bare transformers folder by ``config.json`` ``architectures``:
  ``*ForTokenClassification`` a token classifier, ``*ForSequenceClassification``
  a reranker with one label and a classifier with more, anything else an embedder.

A catalog entry's ``kind`` overrides all of it.

Reading those from the files lets `--model` take any model the
machine holds, as TEI and infinity do, while the catalog stays for short
names and overrides (token budgets, batch caps).

Hugging Face ids are looked up in the local hub cache only
(``models--ORG--NAME/refs/main`` -> ``snapshots/REV``): nothing is fetched,
``HF_HUB_OFFLINE`` stays on. The spec's source pins the revision
(``hf:ORG/NAME@REV``), so workers load exactly the files the client
fingerprinted, from their own cache. Nothing here imports torch: the
scheduler and the client resolve models too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, TypedDict

from . import DEFAULT_TOKEN_BUDGET, ConfigError, ModelSpec, image_models

HF_PREFIX = "hf:"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
SKIPPED_FOLDERS = {"onnx", "openvino", ".git"}  # other runtimes' copies of the same weights
UNBOUNDED_LENGTH = 1_000_000  # tokenizers without a limit state ~1e30

# A JSON object from a model's own files (config.json, modules.json, ...): whatever its library wrote.
JsonObject = dict[str, Any]
ModelKind = Literal[
    "embedder",
    "reranker",
    "sparse",
    "multivector",
    "classifier",
    "token_classifier",
    "span_extractor",
    "image_embedder",
]
GLINER_CONFIG = "gliner_config.json"
# GLiNER scores every span of up to max_width words against every label: its cost grows faster than the
# encoder's with a batch's longest text, so it runs smaller batches than an encoder (docs/BENCHMARKS.md,
# issue 35: 2,048 tokens ran 1.5x faster than 8,192 on the CPU).
SPAN_TOKEN_BUDGET = {"cpu": 2048, "cuda": 16384}


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, found as huggingface_hub finds it, read at call time."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _repo_folder(repo_id: str) -> Path:
    return hub_cache_dir() / ("models--" + repo_id.replace("/", "--"))


def hub_snapshot(repo_id: str, revision: str | None = None) -> tuple[Path, str]:
    """(snapshot folder, revision) of a cached model; ConfigError saying where it looked and how to fetch it."""
    repo = _repo_folder(repo_id)
    if revision is None:
        try:
            revision = (repo / "refs" / "main").read_text().strip()
        except OSError:
            revision = None
    if not revision or not (repo / "snapshots" / revision).is_dir():
        looked = repo / "snapshots" / revision if revision else repo / "refs" / "main"
        raise ConfigError(
            f"model {repo_id!r} is not in the Hugging Face cache (looked in {looked}); nothing is downloaded at "
            f"run time: fetch it where there is internet with `hf download {repo_id}` and copy the cache "
            f"(HF_HOME or HF_HUB_CACHE), or save it to a folder with `SentenceTransformer({repo_id!r}).save(DIR)` "
            f"and pass --model DIR"
        )
    return repo / "snapshots" / revision, revision


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

    def kind(self) -> ModelKind:
        """What the folder computes, from what its library wrote (the module docstring lists the rules)."""
        if (self.folder / GLINER_CONFIG).is_file():
            return "span_extractor"
        if image_models.tower_folder(self.folder) is not None:
            return "image_embedder"
        stated = _mapping(self.folder / "config_sentence_transformers.json")
        if stated.get("model_type") == "CrossEncoder":
            return "reranker"
        types = [module.get("type", "") for module in self.modules()]
        if stated.get("model_type") == "SparseEncoder" or any(".sparse_encoder." in t for t in types):
            return "sparse"
        if self._colbert(stated, types):
            return "multivector"
        if types:
            return "embedder"
        architectures = _mapping(self.folder / "config.json").get("architectures") or []
        if any(a.endswith("ForTokenClassification") for a in architectures):
            return "token_classifier"
        if any(a.endswith("ForSequenceClassification") for a in architectures):
            # One logit scores a pair (a bare cross-encoder); named labels classify a text.
            return "classifier" if self._labels() > 1 else "reranker"
        return "embedder"

    @staticmethod
    def _colbert(stated: JsonObject, types: list[str]) -> bool:
        """One vector per token: sentence-transformers' MultiVectorEncoder, or PyLate's ColBERT (its model_type,
        its skiplist, or a transformer and a Dense projection with no pooling)."""
        if stated.get("model_type") in ("MultiVectorEncoder", "ColBERT") or "skiplist_words" in stated:
            return True
        if any(".multi_vector_encoder." in t for t in types):
            return True
        projected = any(t.endswith("Transformer") for t in types) and any(t.endswith("Dense") for t in types)
        return projected and not any(t.endswith("Pooling") for t in types)

    def _labels(self) -> int:
        config = _mapping(self.folder / "config.json")
        return len(config.get("id2label") or {}) or int(config.get("num_labels", 1))

    def dim(self, kind: str) -> int:
        if kind == "image_embedder":
            return image_models.width(self.folder)
        if kind == "span_extractor":  # the span representation's width (its labels are named per call)
            return int(_mapping(self.folder / GLINER_CONFIG).get("hidden_size") or 0) or self._no_dim()
        backbone = _mapping(self._transformer_folder() / "config.json")
        if kind in ("reranker", "classifier", "token_classifier"):
            return len(backbone.get("id2label") or {}) or int(backbone.get("num_labels", 1))
        if kind == "sparse":  # one weight per vocabulary term
            return int(backbone.get("vocab_size") or 0) or self._no_dim()
        dim = backbone.get("hidden_size") or backbone.get("d_model") or 0
        for module in self.modules():  # the last module that sets a width decides it
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
        kind = self.kind()
        image = kind == "image_embedder"
        return ModelSpec(
            name=name,
            kind=kind,
            source=source,
            dim=self.dim(kind),
            max_seq_length=image_models.window(self.folder) if image else self.max_seq_length(),
            normalize=image_models.normalizes(self.folder)
            if image
            else self.normalize()
            if kind in ("embedder", "multivector")
            else False,
            memory_bytes=max(1, self.weight_bytes()),
            token_budget=dict(SPAN_TOKEN_BUDGET) if kind == "span_extractor" else dict(DEFAULT_TOKEN_BUDGET),
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


def resolve_unlisted(name: str, known: list[str]) -> ModelSpec:
    """The spec of a model that is not in the catalog: a local folder, or a cached Hugging Face id."""
    unknown = f"unknown model {name!r}; the catalog has: {', '.join(known) or 'none'}"
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


def fields_from_source(name: str, source: str) -> SourceFields:
    """What a catalog entry leaves out (kind, dim, window, normalize, memory), read from its source's files."""
    if source.startswith(HF_PREFIX):
        folder = Path(hub_source_path(source))
    elif source.startswith("package:"):
        folder = Path(ModelSpec(name=name, kind="embedder", source=source, dim=1, max_seq_length=1).resolve_path())
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
    )


def hub_source_path(source: str) -> str:
    """The local snapshot folder of an ``hf:ORG/NAME@REV`` source, on this machine."""
    repo_id, _, revision = source.removeprefix(HF_PREFIX).partition("@")
    return str(hub_snapshot(repo_id, revision or None)[0])


def cached_models() -> list[str]:
    """Hugging Face ids with a snapshot in the local cache, for `shoal models`."""
    root = hub_cache_dir()
    if not root.is_dir():
        return []
    return sorted(
        entry.name.removeprefix("models--").replace("--", "/")
        for entry in root.iterdir()
        if entry.name.startswith("models--") and (entry / "snapshots").is_dir()
    )
