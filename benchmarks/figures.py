"""The table that opens docs/BENCHMARKS.md: each benchmark's latest headline figures, with the command that ran it.

Reads every result in benchmarks/results/ (the latest run of each benchmark, written by
``harness.write_result`` with its ``figures``) and lays the figures out between the page's
``<!-- figures -->`` and ``<!-- /figures -->`` lines. A result written elsewhere (``--json PATH``) is not
current and is not read.

    .venv/bin/python benchmarks/figures.py           # after a run: the page's table rewritten from the results
    .venv/bin/python benchmarks/figures.py --check   # exit 1 if the page's table is not what the results give

tests/test_benchmarks.py runs the check, so a result and the table land together.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "BENCHMARKS.md"
BEGIN, END = "<!-- figures -->", "<!-- /figures -->"


def results() -> dict[str, dict[str, Any]]:
    """Every result in benchmarks/results/ by file name (`elastic`, `elastic_cold`: a benchmark may keep two)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}


def _conditions(result: dict[str, Any]) -> dict[str, Any]:
    """The run's conditions; a result from before the harness recorded them keeps its own fields, read here."""
    conditions = result.get("conditions")
    if isinstance(conditions, dict) and "when" in conditions:
        return conditions
    when = next((str(v) for k in ("when", "date", "started") if (v := result.get(k) or (conditions or {}).get(k))), "")
    return {"when": when.replace(" ", "T"), "command": str(result.get("command", "")).removeprefix("benchmarks/")}


def _measured(conditions: dict[str, Any]) -> str:
    when = conditions.get("when", "")
    load = ((conditions.get("machine") or {}).get("loadavg") or ["?"])[0]
    commit = (conditions.get("git") or {}).get("commit") or "?"
    date = f"{when[:10]} {when[11:16]}" if when else "?"
    return f"{date}, load {load}, {commit}"


def _command(name: str, result: dict[str, Any], conditions: dict[str, Any]) -> str:
    """The command as it reruns into benchmarks/results/NAME.json: a `--json` elsewhere (a scratch copy) left
    out, one added where NAME is not the benchmark's own (`elastic_cold`)."""
    words = conditions.get("command", "").removeprefix("python ").removeprefix("benchmarks/").split()
    kept: list[str] = []
    for word in words:
        if kept and kept[-1] == "--json" and not word.startswith("benchmarks/results/"):
            kept.pop()
        else:
            kept.append(word)
    if kept and "--json" not in kept and name != result.get("benchmark", name):
        kept += ["--json", f"benchmarks/results/{name}.json"]
    return f"`.venv/bin/python benchmarks/{' '.join(kept)}`" if kept else ""


def _goal(figure: dict[str, Any]) -> str:
    if not figure.get("goal"):
        return ""
    met = figure.get("met")
    verdict = " (met)" if met is True else " (**missed**)" if met is False else ""
    return f"{figure['goal']}{verdict}"


def table(found: dict[str, dict[str, Any]]) -> list[str]:
    """The opening table's lines: one row per figure, the benchmark's measured-when and command on its first."""
    lines = [
        "| benchmark | figure | value | goal | measured (UTC, load average, commit) | command |",
        "| --- | --- | ---: | --- | --- | --- |",
    ]
    for name, result in found.items():
        figures = result.get("figures") or [{"name": "no figures recorded (harness.Figure)", "value": ""}]
        conditions = _conditions(result)
        for i, figure in enumerate(figures):
            value = f"{figure['value']} {figure.get('unit', '')}".strip()
            first = i == 0
            cells = [
                f"`{name}`" if first else "",
                figure["name"],
                value,
                _goal(figure),
                _measured(conditions) if first else "",
                _command(name, result, conditions) if first else "",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def page_with(lines: list[str], page: str) -> str:
    """The page with its table between BEGIN and END replaced by `lines`."""
    head, found, rest = page.partition(BEGIN + "\n")
    if not found or END not in rest:
        raise SystemExit(f"{PAGE} has no {BEGIN} ... {END} lines to hold the table")
    return head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is stale; write nothing")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    updated = page_with(table(results()), page)
    if args.check:
        if updated != page:
            print(f"{PAGE}'s table is not what benchmarks/results/ gives: run benchmarks/figures.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
