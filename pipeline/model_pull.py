"""`shoal models pull`: a model fetched ahead of its first use, into the cache its first use reads, and what was
fetched.

A Hugging Face id (``ORG/NAME``, ``--revision`` a branch, tag or commit) is downloaded into the Hub cache by
huggingface_hub (configs/hub.py); a folder in object storage (an fsspec URL) is copied into the Shoal cache
(configs/model_store.py); a catalog name pulls its source. Pulling ``main`` again fetches what changed since.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from ..configs import Catalog, ConfigError
from ..configs.hub import HF_PREFIX, download
from ..configs.model_resolution import ModelFiles, looks_like_path
from ..configs.model_store import is_store_url, local_copy, unpinned


def pull(name: str, revision: str | None, catalog: Catalog, storage_options: dict[str, Any], console: Console) -> None:
    """Fetch `name` (a Hub id, a store URL or a catalog name) and print what was fetched, and what it is."""
    source, options = name, storage_options
    if name in catalog.models:
        source, options = catalog.models[name].source, catalog.models[name].storage_options or storage_options
    if is_store_url(source):
        url, _ = unpinned(source)
        copy = local_copy(url, options)
        fetched = "fetched" if copy.fetched else "already cached (nothing fetched)"
        console.print(f"pulled {url} (listing {copy.key[:16]}): {fetched}, into {copy.folder}", highlight=False)
        _describe(name, copy.folder, console)
        return
    if source.startswith(HF_PREFIX) or not (source.startswith("package:") or looks_like_path(source)):
        repo_id, _, pinned = source.removeprefix(HF_PREFIX).partition("@")
        if Path(repo_id).expanduser().is_dir() or repo_id.count("/") != 1:
            raise ConfigError(f"{name!r} is not a Hugging Face id (ORG/NAME), a store URL or a catalog name")
        pulled = download(repo_id, revision or pinned or "main", refresh=True)
        fetched = (
            f"{pulled.fetched} files fetched ({pulled.fetched_bytes / 1e6:.1f} MB)"
            if pulled.fetched
            else "already cached (nothing fetched)"
        )
        console.print(f"pulled {repo_id} at {pulled.commit}: {fetched}, into {pulled.folder}", highlight=False)
        _describe(name, Path(pulled.folder), console)
        return
    console.print(f"{name}: a local folder or package ({source}); nothing to pull", highlight=False)


def _describe(name: str, folder: Path, console: Console) -> None:
    spec = ModelFiles(folder).spec(name, str(folder))
    console.print(
        f"{name}: kind {spec.kind}, dim {spec.dim}, window {spec.max_seq_length} tokens, "
        f"weights {spec.memory_bytes / 1e6:.1f} MB",
        highlight=False,
    )
