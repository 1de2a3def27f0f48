#!/usr/bin/env python
"""The test suite's time (issue 46): `make test-fast` and `make test` as the README runs them, several passes in a
row, each pass's wall time, CPU and outcome beside the rest of the machine's load, and where the time goes (the
slowest test files and tests, from pytest's JUnit XML).

Goals: `make test` within 10 minutes and passing every time, `make test-fast` under a minute. On a shared
machine the wall time grows with the load (each pass records it); the CPU seconds (pytest and every process it
started) move much less.

    flock /work/tools/.bench.lock .venv/bin/python benchmarks/suite_time.py              # both tiers, one pass
    git clone -q . /tmp/fresh && make -C /tmp/fresh install
    .venv/bin/python benchmarks/suite_time.py --tree /tmp/fresh --parts full --passes 3   # a fresh clone, 3 in a row
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

import harness  # first: the repository on sys.path, the workers' environment defaults

TARGETS = {"fast": "test-fast", "full": "test"}
GOALS = {"fast": 60.0, "full": 600.0}  # seconds


def junit_times(path: Path) -> dict[str, Any]:
    """Test counts and outcomes, seconds per test file and the slowest tests, from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, f"{path}: no testsuite"
    by_file: dict[str, float] = defaultdict(float)
    tests = []
    for case in suite.iter("testcase"):
        seconds = float(case.get("time", 0))
        module = case.get("classname", "")
        by_file[module.replace(".", "/") + ".py"] += seconds
        tests.append((seconds, f"{module.replace('.', '/')}.py::{case.get('name')}"))
    return {
        "tests": int(suite.get("tests", 0)),
        "failures": int(suite.get("failures", 0)),
        "errors": int(suite.get("errors", 0)),
        "skipped": int(suite.get("skipped", 0)),
        "slowest_files": [[f, round(s, 1)] for f, s in sorted(by_file.items(), key=lambda kv: -kv[1])[:15]],
        "slowest_tests": [[t, round(s, 1)] for s, t in sorted(tests, reverse=True)[:20]],
    }


def one_pass(tree: Path, part: str, number: int) -> dict[str, Any]:
    """`make TARGET` in `tree`, timed; its JUnit XML read back."""
    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        env = {**os.environ, "PYTEST_ADDOPTS": f"-p no:cacheprovider --junitxml={junit}"}
        with harness.Meter() as meter:
            done = subprocess.run(["make", "-C", str(tree), TARGETS[part]], env=env, capture_output=True, text=True)
        row: dict[str, Any] = {"part": part, "pass": number, "exit_code": done.returncode, **meter.record()}
        row["summary"] = (done.stdout.strip().splitlines() or [""])[-1]
        if junit.exists():
            row.update(junit_times(junit))
    print(f"{part} pass {number}: {row['wall_s']:.0f} s, exit {row['exit_code']}, {row['summary']}", flush=True)
    return row


def figures(result: dict[str, Any]) -> list[harness.Figure]:
    """Each pass's wall time against its goal and whether it passed, with its CPU and the load it ran under."""
    found = []
    for row in result["passes"]:
        part, goal = row["part"], GOALS[row["part"]]
        name = f"make {TARGETS[part]}, pass {row['pass']} (load {row['loadavg_1m_before']}-{row['loadavg_1m_after']})"
        found.append(
            harness.Figure(f"{name}: wall", round(row["wall_s"]), "s", f"<= {goal:.0f} s", row["wall_s"] <= goal)
        )
        found.append(harness.Figure(f"{name}: CPU", round(row["own_cpu_s"]), "s"))
        failed = row.get("failures", 0) + row.get("errors", 0) + (row["exit_code"] != 0 and not row.get("tests"))
        found.append(harness.Figure(f"{name}: failed of {row.get('tests', '?')}", failed, "", "0", failed == 0))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", default=str(harness.ROOT), help="the checkout whose `make test` runs (its .venv)")
    parser.add_argument("--parts", default="fast,full", help="fast (make test-fast), full (make test)")
    parser.add_argument("--passes", type=int, default=1, help="passes of each part, in a row")
    parser.add_argument("--json", default=str(harness.result_path("suite_time")))
    args = parser.parse_args()
    tree = Path(args.tree).resolve()
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    result: dict[str, Any] = {
        "conditions": harness.conditions(tree=str(tree), tree_commit=commit.stdout.strip()),
        "passes": [one_pass(tree, part, n) for part in args.parts.split(",") for n in range(1, args.passes + 1)],
    }
    harness.write_result("suite_time", result, args.json, figures(result))
    for row in result["passes"]:
        print(f"\n{row['part']} pass {row['pass']}, slowest files:")
        for line in harness.markdown_table(["file", "s"], row.get("slowest_files", []), right=("s",)):
            print(line)


if __name__ == "__main__":
    main()
