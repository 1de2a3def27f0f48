"""docs/ARCHITECTURE.md is the code's map: its module tables name every module, and every name it gives is there.

A map with stale paths sends a newcomer to files that moved, and one that misses a module hides it. Each package
section (a heading that names its folder in backticks: workers/, workers/runtimes/) has a table whose first
column names that folder's modules in backticks (pull_loop.py; jobs/engine.py, jobs/embed.py):
every module of the four packages is named there (an `__init__.py` only when it holds more than a docstring), and
every module named there exists. Beyond the tables, each backticked file path (`workers/data/storage.py`,
`jobs/engine.py`, `embedder.py`) and dotted module path (`shoal.workers.data.storage`,
`shoal.configs.model_resolution.folder_digest`) anywhere on the page is looked up in the tree.

A new module, a moved one or a removed one changes the map in the same commit.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("configs", "scheduler_plugins", "workers", "pipeline")
FILE = re.compile(r"`([\w./-]+\.(?:py|yaml|toml|md))`|`([\w-]+(?:/[\w.-]+)+/?)`")
MODULE = re.compile(r"`(shoal(?:\.\w+)+)`")
SECTION = re.compile(r"^#{2,4} `([\w/]+/)`\s*$")  # a package section's heading: `### `workers/``


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


def _mapped() -> dict[str, int]:
    """Module paths from the repository's root that the package sections' tables name, with the line naming them."""
    named: dict[str, int] = {}
    folder = None
    for number, line in enumerate(DOC.read_text().splitlines(), 1):
        if line.startswith("#"):
            heading = SECTION.match(line)
            folder = heading.group(1) if heading else None
        elif folder and line.startswith("| `"):
            named |= {folder + name: number for name in re.findall(r"`([\w/.]+\.py)`", line.split("|")[1])}
    return named


def _only_a_docstring(path: Path) -> bool:
    body = ast.parse(path.read_text()).body
    return all(
        (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        or (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        for node in body
    )


def _modules() -> set[str]:
    """Every module of the four packages, from the root; an `__init__.py` only when it holds more than a docstring."""
    return {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if not (path.name == "__init__.py" and _only_a_docstring(path))
    }


@pytest.mark.unit
def test_the_map_names_every_module_and_every_module_it_names_exists():
    named, modules = _mapped(), _modules()
    assert {"configs/auto.py", "workers/runtimes/embedder.py", "pipeline/jobs/engine.py"} <= set(named)  # parsed
    assert "pipeline/jobs/__init__.py" not in modules and "workers/runtimes/__init__.py" in modules
    gone = {name: f"docs/ARCHITECTURE.md:{line}" for name, line in named.items() if name not in modules}
    assert gone == {}, "the map names modules that are not there (or only hold a docstring): update the map"
    unnamed = sorted(modules - set(named))
    assert unnamed == [], "modules the map does not name: add a row to their package's table in docs/ARCHITECTURE.md"
