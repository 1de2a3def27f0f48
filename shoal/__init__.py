"""Shoal: many small embedding and reranking models on one Dask cluster.

Everything installs under this one name, so a user's own ``configs`` or
``workers`` package never shadows Shoal's: ``shoal.pipeline`` (the client
and the ``shoal`` CLI), ``shoal.scheduler_plugins`` (``dask scheduler
--preload shoal.scheduler_plugins``), ``shoal.workers`` (``dask worker
--preload shoal.workers``) and ``shoal.configs``. In the repository they
are the top-level folders, mapped here by pyproject.toml's ``package-dir``.

The public API is importable from here, loaded on first use so that a
preload of ``shoal.workers`` or ``shoal.scheduler_plugins`` does not import
the client.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if not os.path.isdir(os.path.join(__path__[0], "pipeline")):
    # A source tree (not a wheel): the packages are this folder's siblings. Found here first, so a
    # script that puts its tree on sys.path (benchmarks/harness.py) runs that tree's code, not the
    # code of whatever tree the environment's editable install points to.
    __path__.append(os.path.dirname(__path__[0]))

if TYPE_CHECKING:
    from shoal.pipeline.client import AsyncOnlineClient as AsyncOnlineClient
    from shoal.pipeline.client import OnlineClient as OnlineClient
    from shoal.pipeline.client import OnlineError as OnlineError

_PUBLIC = {
    "OnlineClient": "shoal.pipeline.client",
    "AsyncOnlineClient": "shoal.pipeline.client",
    "OnlineError": "shoal.pipeline.client",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    return getattr(importlib.import_module(_PUBLIC[name]), name)
