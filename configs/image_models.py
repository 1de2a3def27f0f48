"""CLIP and SigLIP folders as their files describe them: what an image kind's catalog entry would repeat.

Three layouts hold one: a transformers folder (``config.json`` of model type
``clip`` or ``siglip`` at its root), a sentence-transformers folder whose
Transformer module wraps one (sentence-transformers 3+), or one laid out as
the hub's ``clip-ViT-*`` folders are (the legacy ``CLIPModel`` module in its
own folder). Torch-free: the client and the scheduler read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_TYPES = ("clip", "siglip")  # transformers model types with image and text towers this kind computes
TOWER_MODULES = ("Transformer", "CLIPModel")  # sentence-transformers modules that may hold one


def _mapping(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _modules(folder: Path) -> list[dict[str, Any]]:
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    return modules if isinstance(modules, list) else []


def tower_folder(folder: Path) -> Path | None:
    """The folder of the CLIP or SigLIP model `folder` holds (itself or a module's), or None."""
    modules = _modules(folder)
    candidates = [folder / m.get("path", "") for m in modules if str(m.get("type", "")).endswith(TOWER_MODULES)]
    for candidate in candidates if modules else [folder]:
        if _mapping(candidate / "config.json").get("model_type") in MODEL_TYPES:
            return candidate
    return None


def width(folder: Path) -> int:
    """The vectors' width: a Dense module's, else the projection's (CLIP), else the vision tower's (SigLIP)."""
    tower = tower_folder(folder)
    assert tower is not None
    config = _mapping(tower / "config.json")
    dim = config.get("projection_dim") or (config.get("vision_config") or {}).get("hidden_size") or 0
    for module in _modules(folder):
        if str(module.get("type", "")).endswith("Dense"):
            dim = _mapping(folder / module.get("path", "") / "config.json").get("out_features", dim)
    return int(dim)


def window(folder: Path) -> int:
    """The text tower's window: sentence-transformers' stated one, else its positions within its tokenizer's."""
    tower = tower_folder(folder)
    assert tower is not None
    stated = _mapping(tower / "sentence_bert_config.json").get("max_seq_length")
    if stated:
        return int(stated)
    positions = int((_mapping(tower / "config.json").get("text_config") or {}).get("max_position_embeddings") or 77)
    tokenizer = _mapping(tower / "tokenizer_config.json").get("model_max_length")
    return min(positions, int(tokenizer)) if isinstance(tokenizer, int | float) and tokenizer > 0 else positions


def normalizes(folder: Path) -> bool:
    """A transformers folder's vectors are normalised (how CLIP and SigLIP compare); a sentence-transformers
    folder's only behind a Normalize module, as ``encode`` gives them."""
    modules = _modules(folder)
    return not modules or any(str(m.get("type", "")).endswith("Normalize") for m in modules)
