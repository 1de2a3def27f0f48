"""benchmarks/: every benchmark writes its result through the harness with its headline figures, and
docs/BENCHMARKS.md opens with those figures as the result files give them (benchmarks/figures.py).

A result landed without its table row, or a table row left from a result since rerun, fails here; so does a
benchmark that writes its own JSON beside the harness, or a result with no figures to quote.
"""

from __future__ import annotations

import ast
import importlib.util
import json

from tests.support.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"
# Scripts in benchmarks/ that are not benchmarks: the harness and the table, the dashboard's screenshot for the
# docs, and the first GPU run's prepared check (it writes its figures to the device run's $OUT).
NOT_BENCHMARKS = {"harness.py", "figures.py", "dashboard_screenshot.py", "gpu_check.py"}


def _figures_script():
    spec = importlib.util.spec_from_file_location("benchmark_figures", BENCHMARKS / "figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_opens_with_the_figures_the_results_give():
    figures = _figures_script()
    page = (ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert page.index(figures.BEGIN) < page.index("\n## ", page.index("## Current figures") + 1)  # before history
    assert figures.main(["--check"]) == 0, "run .venv/bin/python benchmarks/figures.py and commit the table"


def test_every_result_has_headline_figures_from_a_benchmark_in_main():
    for path in sorted((BENCHMARKS / "results").glob("*.json")):
        result = json.loads(path.read_text())
        script = BENCHMARKS / f"{result.get('benchmark', path.stem)}.py"
        assert script.exists(), f"{path.name}: no {script.name} measures it now; a retired result leaves main"
        figures = result.get("figures")
        assert figures, f"{path.name} has no figures: write it with harness.write_result(..., figures(result))"
        assert all(figure["name"] and figure["value"] not in (None, "") for figure in figures), path.name


def test_every_benchmark_writes_its_result_through_the_harness_with_figures():
    scripts = sorted(p for p in BENCHMARKS.glob("*.py") if p.name not in NOT_BENCHMARKS)
    assert {"chaos.py", "scheduler_scale.py", "online_latency.py"} <= {p.name for p in scripts}
    for script in scripts:
        tree = ast.parse(script.read_text())
        writes = [
            call
            for call in ast.walk(tree)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "write_result"
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "harness"
        ]
        assert writes, f"{script.name} writes no result through harness.write_result"
        for call in writes:
            assert len(call.args) == 4 or any(k.arg == "figures" for k in call.keywords), (
                f"{script.name}:{call.lineno}: harness.write_result without its figures"
            )
