"""LoRA adapters as models: a PEFT folder over a base model, named BASE+ADAPTER.

A PEFT LoRA folder (``adapter_config.json`` beside ``adapter_model.safetensors``)
is accepted wherever a model is: a catalog entry whose source is the folder,
``--model ./adapters/legal-v3``, or ``BASE+ADAPTER`` where BASE is any model
name and ADAPTER a folder or a catalog adapter's own name. Its spec is its
base's (kind, window, dimension, prompts, weights) with `ModelSpec.adapter`
set, and its name is always ``BASE+ADAPTER``: that is how it is asked for
online, listed, measured and reported.

The base is the one ``adapter_config.json`` names (``base_model_name_or_path``:
a catalog name, a catalog entry's source, a folder or a cached Hugging Face id),
unless the catalog entry or the name says which. Before any work an adapter is
refused, naming both, when its base is not here, when its base's kind takes no
adapters, or when it does not fit the base: a LoRA module the base lacks, or
whose shape differs (read from both safetensors headers, without torch). PEFT
itself then loads it on the worker (workers/runtimes/lora.py).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import AdapterSpec, ConfigError, ModelSpec, RuntimeChoice
from .kinds import KINDS, kind_of

if TYPE_CHECKING:
    from . import Catalog

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
SEPARATOR = "+"  # BASE+ADAPTER
PEFT_PREFIX = "base_model.model."  # how PEFT names the wrapped model's modules in an adapter's weights
BASE_ROWS = "__base__"  # PEFT's name for inputs of a mixed batch that go through the base alone
# PEFT's Python objects around one adapted module's matrices (its lora_A and lora_B Linear modules, dropout,
# scaling entries), counted in an adapter's bytes so that a budget of N adapters is N adapters' resident memory:
# 200 adapters of 4 modules each grew a worker by 62-66 kB an adapter, 4 kB of it matrices (peft 0.21,
# tests/worker/test_adapter_fleet.py).
PEFT_MODULE_BYTES = 15 * 1024


def lora_modules(tensor_names: Iterable[str]) -> int:
    """How many modules an adapter's tensors adapt: one lora_A matrix each."""
    return sum(1 for name in tensor_names if ".lora_A." in name)


def is_adapter_folder(path: str | Path) -> bool:
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def model_name(base: str, adapter: str) -> str:
    return f"{base}{SEPARATOR}{adapter}"


def unknown_model(name: str, served: list[str]) -> str:
    """Why `name` is not served (a gateway's 404): what is served, and for BASE+ADAPTER, BASE's adapters first."""
    known = ", ".join(sorted(served)) or "none"
    base, separator, adapter = name.partition(SEPARATOR)
    own = sorted(n for n in served if n.startswith(base + SEPARATOR)) if separator else []
    if separator and (base in served or own):
        return (
            f"unknown adapter {adapter!r} of model {base!r}: its adapters served here are "
            f"{', '.join(own) or 'none'}; this gateway serves: {known}"
        )
    return f"unknown model {name!r}; this gateway serves: {known}"


def base_of(spec: ModelSpec) -> ModelSpec:
    """The base an adapter runs on, as a model of its own: what a worker loads once for all its adapters.

    LoRA layers live in the torch model, so the base of adapters runs on torch whatever runtime the base
    alone was chosen; a base chosen for another runtime is then a second copy under its own name.
    """
    assert spec.adapter is not None, f"model {spec.name!r} is no adapter"
    torch_only = {device: choice for device, choice in spec.runtimes.items() if choice.runtime == "torch"}
    name = spec.adapter.base if torch_only == spec.runtimes else f"{spec.adapter.base} (torch)"
    # Pinned to torch on every device kind: a worker chooses an unpinned model's runtime (workers/runtime_choice).
    pinned = {device: torch_only.get(device) or RuntimeChoice(runtime="torch") for device in ("cpu", "cuda")}
    return spec.model_copy(update={"name": name, "adapter": None, "runtimes": pinned})


class AdapterFolder:
    """What a PEFT adapter folder says of itself: its base, its method, its weights' names and shapes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        path = folder / ADAPTER_CONFIG
        try:
            self.config: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not readable JSON: {exc}") from None
        if not isinstance(self.config, dict):
            raise ConfigError(f"{path}: expected a JSON object")
        peft_type = str(self.config.get("peft_type", "")).upper()
        if peft_type != "LORA":
            raise ConfigError(f"{path}: peft_type {peft_type or 'missing'!r}; Shoal serves LoRA adapters (LORA)")
        if self.config.get("use_dora"):
            raise ConfigError(f"{path}: a DoRA adapter (use_dora): PEFT cannot mix DoRA adapters in one batch")
        self.weights = next((folder / name for name in ADAPTER_WEIGHTS if (folder / name).is_file()), None)
        if self.weights is None:
            raise ConfigError(f"adapter {folder}: no weights ({' or '.join(ADAPTER_WEIGHTS)})")

    @property
    def base_reference(self) -> str:
        """The base the adapter was trained on, as PEFT wrote it."""
        return str(self.config.get("base_model_name_or_path") or "")

    def memory_bytes(self) -> int:
        """Its tensors' bytes as stored and PEFT's objects around them (a worker measures it again in its base's
        dtype); a pickled .bin's tensors are not listed without torch: its file's size."""
        assert self.weights is not None
        if self.weights.suffix != ".safetensors":
            return max(1, self.weights.stat().st_size)
        header = tensor_header(self.weights)
        stored = sum(entry["data_offsets"][1] - entry["data_offsets"][0] for entry in header.values())
        return max(1, stored + PEFT_MODULE_BYTES * lora_modules(header))

    def check_fits(self, base: ModelSpec) -> None:
        """ConfigError unless every LoRA module of the adapter is a weight of the base's, of a fitting shape."""
        if not kind_of(base).adapters:  # the kinds whose torch runtimes run LoRA adapters (workers/runtimes/lora.py)
            takers = ", ".join(kind.name for kind in KINDS if kind.adapters)
            raise ConfigError(
                f"adapter {self.folder}: base model {base.name!r} is of kind {base.kind!r}; LoRA adapters are "
                f"served over models of kind {takers}"
            )
        assert self.weights is not None
        if self.weights.suffix != ".safetensors":
            return  # a pickled adapter: PEFT's own load on the worker checks it
        base_shapes = _base_shapes(Path(base.resolve_path()))
        if not base_shapes:
            return  # a base without safetensors weights: likewise
        for key, shape in tensor_shapes(self.weights).items():
            module, _, part = key.removeprefix(PEFT_PREFIX).partition(".lora_")
            if not part or len(shape) != 2:
                continue
            target = base_shapes.get(f"{module}.weight")
            if target is None:
                raise ConfigError(
                    f"adapter {self.folder} does not fit base model {base.name!r}: it adapts {module!r}, "
                    f"which {base.name!r} lacks (an adapter of another architecture; it names base "
                    f"{self.base_reference!r})"
                )
            fits = shape[1] == target[-1] if part.startswith("A") else shape[0] == target[0]
            if len(target) != 2 or not fits:
                raise ConfigError(
                    f"adapter {self.folder} does not fit base model {base.name!r}: its {key} is {list(shape)}, "
                    f"{base.name!r}'s {module}.weight is {list(target)} (an adapter of another architecture; "
                    f"it names base {self.base_reference!r})"
                )


def tensor_header(path: Path) -> dict[str, dict[str, Any]]:
    """A safetensors file's header (8 bytes of length, then JSON): each tensor's dtype, shape and offsets."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
    except (OSError, ValueError, struct.error) as exc:
        raise ConfigError(f"{path}: not a readable safetensors file: {exc}") from None
    return {key: value for key, value in header.items() if key != "__metadata__"}


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Each tensor's shape, from the file's header: no weights read."""
    return {key: list(value["shape"]) for key, value in tensor_header(path).items()}


def _base_shapes(folder: Path) -> dict[str, list[int]]:
    """The tensor shapes of a model folder's safetensors weights (a sentence-transformers folder's modules too)."""
    shapes: dict[str, list[int]] = {}
    for path in sorted(folder.rglob("*.safetensors")):
        if not {"onnx", "openvino", ".git"} & set(path.relative_to(folder).parts):
            shapes.update(tensor_shapes(path))
    return shapes


def adapter_spec(base: ModelSpec, folder: Path, name: str | None = None) -> ModelSpec:
    """The spec of the adapter in `folder` over `base`, refused (naming both) when it does not fit."""
    if base.adapter is not None:
        raise ConfigError(f"adapter {folder}: its base {base.name!r} is itself an adapter; name the base model")
    files = AdapterFolder(folder)
    files.check_fits(base)
    own = name or folder.name
    if SEPARATOR in own:
        raise ConfigError(f"adapter {folder}: its name {own!r} may not contain {SEPARATOR!r} (BASE+ADAPTER names it)")
    return base.model_copy(
        update={
            "name": model_name(base.name, own),
            "adapter": AdapterSpec(base=base.name, name=own, source=str(folder), memory_bytes=files.memory_bytes()),
        }
    )


def find_base(catalog: Catalog, reference: str, folder: Path) -> ModelSpec:
    """The base `reference` names: a catalog name, a catalog entry's source (a folder or a Hub id), else a
    folder or a cached Hugging Face id; ConfigError naming the adapter and the base when it is not here."""
    if not reference:
        raise ConfigError(
            f"adapter {folder}: its {ADAPTER_CONFIG} names no base (base_model_name_or_path); "
            "name one as BASE+ADAPTER or with the catalog entry's `base`"
        )
    for spec in catalog.models.values():
        if spec.adapter is None and (spec.name == reference or _same_source(spec.source, reference)):
            return spec
    try:
        return catalog.get(reference)
    except ConfigError as exc:
        raise ConfigError(f"adapter {folder} names base model {reference!r}, which is not here: {exc}") from None


def _same_source(source: str, reference: str) -> bool:
    if source.startswith("hf:"):
        return source.removeprefix("hf:").partition("@")[0] == reference
    if not source or source.startswith("package:"):
        return False
    return Path(source).expanduser().resolve() == Path(reference).expanduser().resolve()


def resolve_adapter(catalog: Catalog, name: str) -> ModelSpec | None:
    """The spec `name` means when it is an adapter not listed by that name: a folder, or BASE+ADAPTER; else None."""
    folder = Path(name).expanduser()
    if is_adapter_folder(folder):
        folder = folder.resolve()
        return adapter_spec(find_base(catalog, AdapterFolder(folder).base_reference, folder), folder)
    base_name, separator, adapter = name.partition(SEPARATOR)
    if not separator or not base_name or not adapter:
        return None
    listed = [spec for spec in catalog.models.values() if spec.adapter is not None and spec.adapter.name == adapter]
    folder = Path(adapter).expanduser()
    if not is_adapter_folder(folder):
        if not listed:
            served = sorted(spec.name for spec in catalog.models.values() if spec.adapter is not None)
            raise ConfigError(
                f"unknown adapter {adapter!r} in {name!r}: not a folder with {ADAPTER_CONFIG}, and the catalog's "
                f"adapters are: {', '.join(served) or 'none'}"
            )
        folder = Path(listed[0].adapter.source)  # type: ignore[union-attr]  # listed: adapters only
    base = catalog.get(base_name)
    return adapter_spec(base, folder.resolve(), listed[0].adapter.name if listed else None)  # type: ignore[union-attr]


def catalog_adapter(catalog: Catalog, key: str, entry: dict[str, Any], where: str) -> ModelSpec:
    """A catalog entry whose source is an adapter folder: ``KEY: {source: FOLDER[, base: MODEL]}``.

    KEY is the adapter's name, or BASE+NAME, which names its base too; its base is otherwise `base`, else the
    one its adapter_config.json names.
    """
    unknown = set(entry) - {"source", "base"}
    if unknown:
        raise ConfigError(
            f"{where}: models.{key}: an adapter entry takes only source and base (it batches with its base), "
            f"not {', '.join(sorted(unknown))}"
        )
    folder = Path(entry["source"])
    base_name, separator, own = key.rpartition(SEPARATOR)
    if not separator:
        base_name, own = "", key
    given = entry.get("base") or base_name
    if entry.get("base") and base_name and entry["base"] != base_name:
        raise ConfigError(f"{where}: models.{key}: its name says base {base_name!r}, its `base` {entry['base']!r}")
    try:
        base = catalog.get(given) if given else find_base(catalog, AdapterFolder(folder).base_reference, folder)
        return adapter_spec(base, folder, own)
    except ConfigError as exc:
        raise ConfigError(f"{where}: models.{key}: {exc}") from None
