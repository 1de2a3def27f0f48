"""Model fingerprints: what must match for old outputs to stay valid."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache

from configs import ModelSpec

CHUNK = 1 << 20


@lru_cache(maxsize=32)
def _hash_directory(path: str, stamp: tuple) -> str:
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode())
            with open(full, "rb") as f:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
    return digest.hexdigest()


def _stamp(path: str) -> tuple:
    return tuple(
        (os.path.join(root, name), os.stat(os.path.join(root, name)).st_mtime_ns)
        for root, _, files in sorted(os.walk(path))
        for name in sorted(files)
    )


def model_fingerprint(spec: ModelSpec) -> str:
    """sha256 over the weights and the settings that change the vectors.

    A simulated model has no weights (its source is empty, which would hash
    the working directory): its vectors come from its name (sim_runtime).
    """
    settings = f"{spec.kind}|{spec.dim}|{spec.max_seq_length}|{spec.normalize}"
    if spec.prompts is not None or spec.default_prompt_name is not None:  # the catalog's own prompts
        settings += f"|{json.dumps([spec.prompts, spec.default_prompt_name], sort_keys=True)}"
    if spec.kind == "sim":
        weights = f"sim:{spec.name}"
    else:
        path = spec.resolve_path()
        weights = _hash_directory(path, _stamp(path))
    return hashlib.sha256(f"{weights}|{settings}".encode()).hexdigest()
