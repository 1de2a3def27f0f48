"""Static tools follow Shoal's imports in the tree as it lies on disk (issue 46; docs/ARCHITECTURE.md, "Imports"):
the library's packages import each other relatively, and a relative import resolves by directory, so
`from ...workers.runtimes import x` in pipeline/jobs/embed.py is shoal.workers.runtimes installed and
workers/runtimes/ in the repository. An absolute `shoal.*` import in the library would resolve only through the
editable install's import hook, which no IDE, pyright or import-graph tool follows."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

PACKAGES = ("configs", "pipeline", "scheduler_plugins", "workers")


def library_files() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    return [n for n in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(n, (ast.Import, ast.ImportFrom))]


def resolves_on_disk(path: Path, node: ast.ImportFrom) -> list[str]:
    """What of a relative import names no file or folder on disk, found by directory as a static tool finds it."""
    base = path.parent
    for _ in range(node.level - 1):
        base = base.parent
    if not base.is_relative_to(ROOT) or base == ROOT.parent:
        return [f"{'.' * node.level}{node.module or ''} goes above the repository"]
    target = base.joinpath(*(node.module or "").split(".")) if node.module else base
    if not ((target / "__init__.py").is_file() or target.with_suffix(".py").is_file()):
        return [f"{'.' * node.level}{node.module or ''}: no {target.relative_to(ROOT)}(.py)"]
    if not (target / "__init__.py").is_file():
        return []  # names imported from a module: its attributes
    init = ast.parse((target / "__init__.py").read_text())
    defined = {
        *(n.name for n in init.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
        *(t.id for n in ast.walk(init) if isinstance(n, (ast.Assign, ast.AnnAssign)) for t in _targets(n)),
        *(a.asname or a.name.split(".")[0] for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names),
    }  # fmt: skip
    return [
        f"{'.' * node.level}{node.module or ''} has no {a.name}"
        for a in node.names
        if a.name not in defined and not (target / a.name).is_dir() and not (target / f"{a.name}.py").is_file()
    ]


def _targets(node: ast.Assign | ast.AnnAssign) -> list[ast.Name]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return [t for t in targets if isinstance(t, ast.Name)]


def test_the_library_imports_its_own_packages_relatively_and_each_import_resolves_by_directory():
    absolute, unresolved = [], []
    for path in library_files():
        where = path.relative_to(ROOT)
        for node in imports(path):
            if isinstance(node, ast.Import):
                absolute += [
                    f"{where}:{node.lineno} import {a.name}" for a in node.names if a.name.split(".")[0] == "shoal"
                ]
            elif node.level == 0 and (node.module or "").split(".")[0] == "shoal":
                absolute.append(f"{where}:{node.lineno} from {node.module}")
            elif node.level:
                unresolved += [f"{where}:{node.lineno} {miss}" for miss in resolves_on_disk(path, node)]
    assert absolute == [], "import Shoal's packages relatively (/work/tools/relative_imports.py):\n" + "\n".join(
        absolute
    )
    assert unresolved == [], "\n".join(unresolved)
