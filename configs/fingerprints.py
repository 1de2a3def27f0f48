"""Model fingerprints: what must match for old outputs to stay valid."""

from __future__ import annotations

import hashlib
import json

from . import ModelSpec
from .kinds import kind_of
from .model_resolution import folder_digest


def model_fingerprint(spec: ModelSpec) -> str:
    """sha256 over the weights and the settings that change the vectors.

    A simulated model has no weights (its source is empty, which would hash
    the working directory): its vectors come from its name (sim_runtime).
    """
    settings = f"{spec.kind}|{spec.dim}|{spec.max_seq_length}|{spec.normalize}"
    if spec.prompts is not None or spec.default_prompt_name is not None:  # the catalog's own prompts
        settings += f"|{json.dumps([spec.prompts, spec.default_prompt_name], sort_keys=True)}"
    if kind_of(spec).simulated:
        weights = f"sim:{spec.name}"
    else:
        weights = folder_digest(spec.resolve_path())
    if spec.adapter is not None:  # a LoRA adapter: its own weights over its base's
        weights += f"|adapter:{folder_digest(spec.adapter.source)}"
    return hashlib.sha256(f"{weights}|{settings}".encode()).hexdigest()
