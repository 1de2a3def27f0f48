"""docs/ARCHITECTURE.md names the code by path and module: every name it gives must still be there.

A map with stale paths sends a newcomer to files that moved; this reads each
backticked file path (`workers/data/storage.py`, `jobs/engine.py`,
`embedder.py`) and dotted module path (`shoal.workers.data.storage`,
`shoal.configs.model_resolution.folder_digest`) and looks them up in the tree.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("configs", "scheduler_plugins", "workers", "pipeline")
FILE = re.compile(r"`([\w./-]+\.(?:py|yaml|toml|md))`|`([\w-]+(?:/[\w.-]+)+/?)`")
MODULE = re.compile(r"`(shoal(?:\.\w+)+)`")


def _is_code_path(name: str) -> bool:
    """Not a placeholder (`OUTPUT/_manifest.json`, `configs/NAME.yaml`) or an example's input folder."""
    parts = name.rstrip("/").split("/")
    if any(part.isupper() or part.split(".")[0].isupper() for part in parts):
        return False
    return len(parts) == 1 or any((base / parts[0]).is_dir() for base in [ROOT, *(ROOT / p for p in PACKAGES)])


def _file_exists(name: str) -> bool:
    """At the repository's root, under one of the packages, or (a bare file name) anywhere in them."""
    bases = [ROOT, *(ROOT / package for package in PACKAGES)]
    if any((base / name).exists() for base in bases):
        return True
    return "/" not in name and any(any((ROOT / package).rglob(name)) for package in PACKAGES)


def _module_exists(dotted: str) -> bool:
    """`shoal.a.b` is a package or module of the tree; a last part that is not is defined or imported in it."""
    parts = dotted.split(".")[1:]
    for cut in range(len(parts), 0, -1):
        path = ROOT.joinpath(*parts[:cut])
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        if source.exists():
            rest = parts[cut:]
            return len(rest) <= 1 and (not rest or re.search(_defines(rest[0]), source.read_text(), re.M) is not None)
    return not parts  # `shoal` itself


def _defines(name: str) -> str:
    """A def, class, assignment or import of `name` at the start of a line."""
    return rf"^\s*(?:(?:async\s+)?def|class)\s+{name}\b|^\s*{name}\s*[:=]|^(?:from|import)\s.*\b{name}\b"


def _named(pattern: re.Pattern[str]) -> set[str]:
    text = DOC.read_text()
    return {next(group for group in match.groups() if group) for match in pattern.finditer(text)}


@pytest.mark.unit
def test_every_file_path_in_the_architecture_page_exists():
    names = {name for name in _named(FILE) if _is_code_path(name)}
    assert {"workers/runtimes/", "jobs/engine.py", "embedder.py"} <= names  # the patterns still find them
    assert not _file_exists("workers/storage.py")  # as the page said before workers/ had subpackages
    assert sorted(name for name in names if not _file_exists(name)) == []


@pytest.mark.unit
def test_every_module_path_in_the_architecture_page_exists():
    names = {name for name in _named(MODULE) if name.split(".")[1] in PACKAGES}  # not Dask config keys
    assert "shoal.workers.data.storage" in names
    assert not _module_exists("shoal.workers.storage") and not _module_exists("shoal.configs.no_such_name")
    assert sorted(name for name in names if not _module_exists(name)) == []
