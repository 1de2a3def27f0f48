"""Every process a test starts is stopped however the test ends: tests start processes only through
tests/support/processes.py (`Processes`, `started`, `run`), which puts each in a session of its own and stops it,
with whatever it started, when its block exits. This test fails on any other way of starting one in tests/."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
HELPER = TESTS / "support" / "processes.py"
# Calls that start a process and leave it running (or, for subprocess.run and friends, a `shoal` or `dask` command
# whose embedded cluster or worker processes outlive it on a timeout: subprocess.run kills the command alone).
STARTERS = {"Popen", "fork", "forkpty", "spawnv", "spawnve", "spawnl", "spawnlp", "posix_spawn", "Process", "Pool"}
RUNNERS = {"run", "call", "check_call", "check_output"}
COMMANDS = {"SHOAL", "DASK"}  # tests/support/paths.py: the installed `shoal` and `dask` commands


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _runs_a_command_that_starts_processes(call: ast.Call) -> bool:
    """subprocess.run([SHOAL, ...]) and the like."""
    if not (isinstance(call.func, ast.Attribute) and _name(call.func.value) == "subprocess"):
        return False
    if call.func.attr not in RUNNERS or not call.args or not isinstance(call.args[0], ast.List):
        return False
    first = call.args[0].elts[0] if call.args[0].elts else None
    return first is not None and _name(first) in COMMANDS


def starts_outside_the_helper(path: Path) -> list[str]:
    """`path:line what` for each process started in `path` other than through the helper."""
    found = []
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        where = f"{shown}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call):
            name = _name(node.func)
            if name in STARTERS and not (name in {"Process", "Pool"} and "multiprocessing" not in ast.unparse(node)):
                found.append(f"{where} {ast.unparse(node.func)}(...)")
            elif _runs_a_command_that_starts_processes(node):
                found.append(f"{where} {ast.unparse(node.func)}([{_name(node.args[0].elts[0])}, ...])")  # type: ignore[attr-defined]
            found += [f"{where} start_new_session=" for k in node.keywords if k.arg == "start_new_session"]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(m and m.partition(".")[0] == "multiprocessing" for m in modules):
                found.append(f"{where} imports multiprocessing")
    return found


def test_tests_start_processes_only_through_the_helper_that_stops_them():
    found = [hit for path in sorted(TESTS.rglob("*.py")) if path != HELPER for hit in starts_outside_the_helper(path)]
    assert found == [], "start these with tests.support.processes (Processes, started, run):\n" + "\n".join(found)


def test_the_check_finds_each_way_of_starting_a_process(tmp_path):
    source = tmp_path / "a_test.py"
    source.write_text(
        "import subprocess, os, multiprocessing\n"
        "subprocess.Popen(['x'])\n"
        "subprocess.run([SHOAL, 'embed'], timeout=1)\n"
        "subprocess.run(['mount', 'x'])\n"  # a system tool that starts nothing: allowed
        "os.fork()\n"
        "multiprocessing.Process(target=print)\n"
        "thing.start(['x'], start_new_session=True)\n"
    )
    hits = {hit.split(" ", 1)[1] for hit in starts_outside_the_helper(source)}
    assert hits == {
        "imports multiprocessing",
        "subprocess.Popen(...)",
        "subprocess.run([SHOAL, ...])",
        "os.fork(...)",
        "multiprocessing.Process(...)",
        "start_new_session=",
    }
