#!/usr/bin/env python
"""Fast by default: whole commands with no flags, against a direct fp32 encode, with their stage timings.

Side by side in one run, each side going first in turn (a shared machine
drifts within minutes, so only ratios measured in alternation count):

* ``shoal embed IN OUT --model minilm --verbose`` with no ``--profile`` (the
  ``auto`` profile; its verdicts already cached, as after a first use), and
  its stage timings (imports, cluster start, plan, first item, last ack,
  manifest, stop): the fixed part is everything but computing;
* ``shoal embed --profile P`` for every shipped CPU profile (cpu-local, the default before ``auto``;
  cpu-2core, tuned on bf16 hardware; cpu-online), each run once first so its verdicts are cached;
* a direct script, ``SentenceTransformer(path).encode(texts)`` in fp32;
* fastembed, when benchmarks/runtimes.py's venv for it is already in
  --fastembed-scratch (nothing is installed here);
* ``make demo``'s command on datasets/demo (5,000 rows), rows/s from its job
  summary, no flags against ``--profile cpu-local`` (today's demo);
* ``first-use`` (first when asked for): ``auto``'s first measurement of
  MiniLM (the child process a command starts), from an empty cache (the ONNX
  export included), its steps from the record, this tree against
  ``--code-before`` in turn when given; the parts after it use this tree's
  cache;
* ``stages``: a no-flag ``shoal embed --verbose`` of --stage-texts texts, this
  tree against ``--code-before`` in turn (four per round), each stage's median;
* ``online``: ``shoal serve --models minilm`` with no profile against infinity
  (``--infinity-venv``, installed apart: pip ``torch==2.13.0`` first, then
  ``infinity-emb[server,torch]``), 32 concurrent single-text clients, the same
  client (online_latency.closed_loop), each server alone, in turn;
* ``first-job``: the first no-flag ``shoal embed`` on an empty cache, auto measuring in the background (the
  default) against waiting for it (``SHOAL_AUTO_MEASURE=wait``), in turn;
* ``onnx-load``: what a worker's ONNX model load costs, a fresh process from
  interpreter start to the first vectors, this tree against ``--code-before``
  (an older tree, e.g. ``git archive COMMIT | tar -x -C DIR``), in turn.

    .venv/bin/python benchmarks/defaults.py                       # 3,000 texts, 1 round, demo row
    .venv/bin/python benchmarks/defaults.py --limit 3000 --rounds 2
    .venv/bin/python benchmarks/defaults.py --parts first-use,onnx-load --code-before /tmp/before --rounds 3
    .venv/bin/python benchmarks/defaults.py --parts first-use,stages --code-before /tmp/before   # side by side

Prints Markdown and writes JSON to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from harness import ROOT, Meter, markdown_table
from runtimes import DIRECT_SCRIPT, FASTEMBED_SCRIPT, read_ours, sample_texts

from shoal.configs import load_catalog
from shoal.pipeline.jobs.stages import STAGE_PREFIX
from shoal.pipeline.tuning.quality_gate import judge_vectors

DEFAULT_JSON = str(harness.result_path("defaults"))
NO_FLAGS = "shoal embed (no --profile: auto)"
CPU_PROFILES = ("cpu-local", "cpu-2core", "cpu-online")  # every shipped CPU profile, against no flags
DIRECT = "direct fp32 encode"
COMPUTE_STAGES = ("first item", "last ack")  # the rest of a command is its fixed part


def run(command: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    """Wall seconds and stderr of a whole process."""
    with Meter() as meter:
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "SHOAL_PROFILE": "", **(env or {})}
        )
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed:\n{done.stderr[-3000:]}")
    return meter.seconds, done.stderr


def stages(stderr: str) -> dict[str, float]:
    """The `--verbose` stage lines: name -> seconds."""
    found = {}
    for line in stderr.splitlines():
        if line.startswith(STAGE_PREFIX):
            name, _, value = line.removeprefix(STAGE_PREFIX).partition(":")
            found[name] = float(value.split()[0])
    return found


def fixed_part(timings: dict[str, float]) -> float:
    return round(sum(s for name, s in timings.items() if name not in (*COMPUTE_STAGES, "total")), 2)


def summary_rate(stderr: str) -> float:
    """rows/s from a job summary's table."""
    match = re.search(r"rows/s\s*│\s*([\d,.]+)", stderr)
    if not match:
        raise RuntimeError(f"no rows/s in:\n{stderr[-2000:]}")
    return float(match.group(1).replace(",", ""))


def part_batch(texts: list[str], rounds: int, scratch: Path, fastembed_scratch: Path) -> dict[str, Any]:
    model_path = load_catalog().get("minilm").resolve_path()
    ids = [f"t{i}" for i in range(len(texts))]
    inputs = scratch / "input"
    inputs.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}), inputs / "part-0.parquet", row_group_size=1024)
    (scratch / "direct_encode.py").write_text(DIRECT_SCRIPT)
    shoal = harness.venv_command("shoal")
    commands = {
        DIRECT: [sys.executable, str(scratch / "direct_encode.py"), model_path, str(inputs / "part-0.parquet")]
        + [str(scratch / "direct.npy")],
        NO_FLAGS: [shoal, "embed", str(inputs), str(scratch / "auto"), "--model", "minilm", "--verbose"],
    }
    written = {NO_FLAGS: scratch / "auto"}
    for profile in CPU_PROFILES:
        name = f"shoal embed --profile {profile}"
        written[name] = scratch / profile
        commands[name] = [shoal, "embed", str(inputs), str(written[name]), "--model", "minilm", "--profile", profile]
        commands[name].append("--verbose")
    fe_python = fastembed_scratch / "fastembed-venv" / "bin" / "python"
    if fe_python.exists() and (fastembed_scratch / "fastembed-minilm" / "model.onnx").exists():
        (scratch / "texts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))
        (scratch / "fastembed_encode.py").write_text(FASTEMBED_SCRIPT)
        commands["fastembed"] = [str(fe_python), str(scratch / "fastembed_encode.py")] + [
            str(fastembed_scratch / "fastembed-minilm"),
            str(scratch / "texts.jsonl"),
            str(scratch / "fastembed.npy"),
            str(os.cpu_count() or 1),
        ]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    names = list(commands)
    for name in written:  # each profile's verdicts measured first (at its threads), as after a first use
        shutil.rmtree(written[name], ignore_errors=True)
        run(commands[name], {"SHOAL_AUTO_MEASURE": "wait"})
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name in written:
                shutil.rmtree(written[name], ignore_errors=True)  # a fresh output, never a resumed run
            seconds, stderr = run(commands[name])
            timings = stages(stderr)
            load = harness.load_average()  # others share this machine: the load beside each figure
            runs[name].append(
                {"seconds": round(seconds, 2), "stages": timings, "fixed_s": fixed_part(timings), "load_average": load}
            )
            print(f"  round {r + 1} {name}: {seconds:.1f} s (load {load}), stages {timings}", flush=True)
    reference = np.load(scratch / "direct.npy")
    outputs = {name: read_ours(folder, ids) for name, folder in written.items()}
    if "fastembed" in commands:
        outputs["fastembed"] = np.load(scratch / "fastembed.npy")
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    rows = []
    for name in names:
        figures = judge_vectors(outputs[name], reference)[0] if name in outputs else {}
        rows.append(
            {
                "command": name,
                "best_s": best[name],
                "texts_per_s": round(len(texts) / best[name], 1),
                "vs_direct": round(best[DIRECT] / best[name], 2),
                "vs_no_flags": round(best[NO_FLAGS] / best[name], 2),
                "fixed_s": min((r["fixed_s"] for r in runs[name] if r["stages"]), default=None),
                **{k: round(v, 4) for k, v in figures.items()},
                "runs": runs[name],
            }
        )
    return {"texts": len(texts), "rounds": rounds, "rows": rows}


def part_demo(rounds: int, scratch: Path) -> dict[str, Any]:
    """`make demo`'s command, no flags, against the same command on cpu-local (the demo before `auto`)."""
    shoal = harness.venv_command("shoal")
    demo = str(ROOT / "datasets" / "demo")
    commands = {
        "make demo (no flags: auto)": [shoal, "embed", demo, str(scratch / "demo"), "--model", "minilm"],
        "make demo before (cpu-local)": [shoal, "embed", demo, str(scratch / "demo"), "--model", "minilm"]
        + ["--profile", "cpu-local"],
    }
    rates: dict[str, list[float]] = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names[r % 2 :] + names[: r % 2]:
            shutil.rmtree(scratch / "demo", ignore_errors=True)
            seconds, stderr = run(commands[name])
            rates[name].append(summary_rate(stderr))
            print(f"  round {r + 1} {name}: {rates[name][-1]} rows/s ({seconds:.1f} s whole)", flush=True)
    before = max(rates[names[1]])
    return {name: {"rows_per_s": rates[name], "vs_before": round(max(rates[name]) / before, 2)} for name in names}


ONNX_LOAD_SCRIPT = """
import sys, time
began = time.perf_counter()
from shoal.configs import RuntimeChoice, load_catalog
from shoal.workers.devices import DevicePlan
from shoal.workers.runtimes import load_runtime
spec = load_catalog().get("minilm")
spec = spec.model_copy(update={"runtimes": {"cpu": RuntimeChoice(runtime="onnx", dtype="float32")}})
runtime = load_runtime(spec, DevicePlan("cpu", "cpu", "float32", 10**10, 2))
loaded = time.perf_counter()
runtime.embed(["How do I read a Parquet file in chunks?"])
print(loaded - began, time.perf_counter() - began, "torch" in sys.modules, "transformers" in sys.modules)
"""


def part_onnx_load(rounds: int, code_before: str | None) -> dict[str, Any]:
    """A worker's ONNX load, a fresh interpreter each time (the export cached): this tree against an older one."""
    trees = {"this tree": str(ROOT), **({"before": code_before} if code_before else {})}
    for tree in trees.values():  # each tree's export (its own format) made once, outside the timing
        subprocess.run([sys.executable, "-c", ONNX_LOAD_SCRIPT], cwd=tree, env=_tree_env(tree), check=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    names = list(trees)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            out = subprocess.run(  # in the tree's folder: `-c` puts the working folder first on sys.path
                [sys.executable, "-c", ONNX_LOAD_SCRIPT],
                cwd=trees[name],
                env=_tree_env(trees[name]),
                check=True,
                capture_output=True,
                text=True,
            )
            load, first, torch, transformers = out.stdout.split()
            runs[name].append(
                {"load_s": round(float(load), 2), "first_vectors_s": round(float(first), 2), "torch": torch == "True"}
                | {"transformers": transformers == "True"}
            )
            print(f"  round {r + 1} onnx load, {name}: {runs[name][-1]}", flush=True)
    return {name: {"best_load_s": min(x["load_s"] for x in rs), "runs": rs} for name, rs in runs.items()}


SHOAL_SCRIPT = "import sys\nfrom shoal.pipeline.cli import main\nif __name__ == '__main__':\n    sys.exit(main())\n"


def part_stages(texts: list[str], rounds: int, scratch: Path, code_before: str, before_cache: str) -> dict[str, Any]:
    """A no-flag `shoal embed --verbose` of `texts`, this tree against an older one in turn: each stage's seconds.

    Both run as the `shoal` script does (a file importing shoal.pipeline.cli: worker processes spawned from it
    import it again unless told not to). The older tree reads its own verdicts and export from
    `before_cache` (its formats), this one from SHOAL_CACHE_DIR.
    """
    inputs = scratch / "stages-input"
    inputs.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(texts))], "text": texts}), inputs / "part-0.parquet")
    script = scratch / "shoal_script.py"
    script.write_text(SHOAL_SCRIPT)
    trees = {"this tree": (str(ROOT), os.environ.get("SHOAL_CACHE_DIR", "")), "before": (code_before, before_cache)}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(rounds):
        for name in list(trees)[r % 2 :] + list(trees)[: r % 2]:
            tree, cache = trees[name]
            shutil.rmtree(scratch / "stages-out", ignore_errors=True)
            command = [sys.executable, str(script), "embed", str(inputs), str(scratch / "stages-out")]
            env = {**_tree_env(tree), "SHOAL_PROFILE": "", **({"SHOAL_CACHE_DIR": cache} if cache else {})}
            done = subprocess.run(
                [*command, "--model", "minilm", "--verbose"], cwd=tree, env=env, capture_output=True, text=True
            )
            if done.returncode != 0 or "measuring" in done.stderr:
                raise RuntimeError(
                    f"{name}: exit {done.returncode}, or measured (no cached verdicts):\n{done.stderr[-3000:]}"
                )
            runs[name].append(stages(done.stderr))
            print(f"  round {r + 1} stages, {name}: {runs[name][-1]}", flush=True)
    return {
        name: {"median": {k: round(float(np.median([x[k] for x in rs if k in x])), 2) for k in rs[0]}, "runs": rs}
        for name, rs in runs.items()
    }


def part_online(seconds: float, rounds: int, infinity_venv: Path) -> dict[str, Any]:
    """`shoal serve --models minilm` with no profile against infinity (torch engine, CPU), 32 concurrent clients.

    The same client for both (online_latency.closed_loop: kept-alive HTTP/1.1, each client sending its next
    single-text request when the last is answered), the same 6-10-word queries, each server alone on the
    machine while it is measured, in turn, `rounds` windows of `seconds` each.
    """
    import asyncio
    import json as json_

    from online_latency import closed_loop, encode_message, short_queries

    model_path = load_catalog().get("minilm").resolve_path()
    queries = short_queries(512)
    results: dict[str, list[dict[str, Any]]] = {"shoal serve (no flags: auto)": [], "infinity": []}
    for r in range(rounds):
        for name in list(results)[r % 2 :] + list(results)[: r % 2]:
            if name == "infinity":
                server = _start_infinity(infinity_venv, model_path)
                host = "127.0.0.1:7997"
                body = [json_.dumps({"model": "minilm", "input": [q]}).encode() for q in queries]
                messages = [
                    f"POST /embeddings HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(b)}\r\n\r\n".encode()
                    + b
                    for b in body
                ]
                url = f"http://{host}"
            else:
                server, url = _start_shoal_serve()
                messages = [encode_message(url, "minilm", [q]) for q in queries]
            try:
                asyncio.run(closed_loop(url, messages[:64], 32, 5))  # warm: batches of every size seen once
                result = asyncio.run(closed_loop(url, messages, 32, seconds))
            finally:
                server.send_signal(signal.SIGTERM)
                server.wait(120)
            results[name].append(result)
            print(f"  round {r + 1} online, {name}: {result}", flush=True)
    return {name: {"best_rps": max(x["achieved_rps"] for x in rs), "runs": rs} for name, rs in results.items()}


def _start_shoal_serve() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [harness.venv_command("shoal"), "serve", "--models", "minilm", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "SHOAL_PROFILE": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    stderr = proc.stderr
    assert stderr is not None
    threading.Thread(target=lambda: lines.extend(iter(stderr.readline, "")), daemon=True).start()
    deadline = time.monotonic() + 600
    while not any("serving" in line for line in lines):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("shoal serve did not start:\n" + "".join(lines))
        time.sleep(0.1)
    found = re.search(r"on (http://\S+)", next(line for line in lines if "serving" in line))
    assert found
    return proc, found.group(1)


def _start_infinity(venv: Path, model_path: str) -> subprocess.Popen:
    command = [str(venv / "bin" / "infinity_emb"), "v2", "--model-id", model_path, "--served-model-name", "minilm"]
    command += ["--port", "7997", "--engine", "torch", "--device", "cpu", "--batch-size", "32"]
    proc = subprocess.Popen(
        command, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen("http://127.0.0.1:7997/health", timeout=5):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"infinity did not start (exit {proc.poll()})") from None
            time.sleep(0.5)


def _tree_env(tree: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def part_first_use(scratch: Path, rounds: int, code_before: str | None) -> dict[str, Any]:
    """auto's first measurement of MiniLM, as a command starts it, from an empty cache (the ONNX export included).

    With `code_before`, that tree's measurement too, the two in turn (each first in every other round),
    each from its own empty cache. This tree's last cache stays SHOAL_CACHE_DIR for the parts after it:
    their no-flag commands find the verdicts.
    """
    from shoal.configs import load_catalog, load_profile
    from shoal.configs.fingerprints import model_fingerprint
    from shoal.configs.machine import probe
    from shoal.configs.verdicts import verdict_path

    spec, profile, machine = load_catalog().get("minilm"), load_profile("auto"), probe()
    trees = {"this tree": str(ROOT), **({"before": code_before} if code_before else {})}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for r in range(rounds):
        for name in list(trees)[r % len(trees) :] + list(trees)[: r % len(trees)]:
            cache = scratch / f"first-use-cache-{'before' if name == 'before' else 'this'}"
            shutil.rmtree(cache, ignore_errors=True)
            os.environ["SHOAL_CACHE_DIR"] = str(cache)
            path = verdict_path(model_fingerprint(spec), machine, profile.torch_threads(machine.cores))
            path.parent.mkdir(parents=True)
            load = harness.load_average()
            with Meter() as meter:  # the child a command starts, run from the tree's own folder and code
                done = subprocess.run(
                    [sys.executable, "-m", "shoal.pipeline.tuning.auto_runtime", profile.path or "auto", str(path)],
                    input=spec.model_dump_json(),
                    cwd=trees[name],
                    env={**_tree_env(trees[name]), "SHOAL_CACHE_DIR": str(cache)},
                    capture_output=True,
                    text=True,
                )
            if done.returncode or "failed" in (record := json.loads(path.read_text())):
                raise RuntimeError(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
            runs[name].append(
                {
                    "seconds": round(meter.seconds, 1),
                    "load_average": [load, harness.load_average()],
                    "steps": record.get("steps"),
                    "rows": [
                        (r["runtime"], r["dtype"], r["verdict"], r["speed_vs_fp32"]) for r in record["candidates"]
                    ],
                }
            )
            print(f"  round {r + 1} first use, {name}: {runs[name][-1]}", flush=True)
    os.environ["SHOAL_CACHE_DIR"] = str(scratch / "first-use-cache-this")
    return {name: {"best_s": min(x["seconds"] for x in rs), "runs": rs} for name, rs in runs.items()}


def part_first_job(texts: list[str], rounds: int, scratch: Path) -> dict[str, Any]:
    """The first no-flag `shoal embed` of MiniLM on an empty cache: measuring in the background (the default)
    against waiting for the measurement (``SHOAL_AUTO_MEASURE=wait``, the first use before issue 36), in turn.

    After a background run its child is waited for (its lock gone) before the next command starts, and its
    own seconds are read from the record it wrote.
    """
    inputs = scratch / "first-job-input"
    inputs.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(texts))], "text": texts}), inputs / "part-0.parquet")
    shoal = harness.venv_command("shoal")
    modes = {"background (default)": {}, "wait": {"SHOAL_AUTO_MEASURE": "wait"}}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    for r in range(rounds):
        for name in list(modes)[r % 2 :] + list(modes)[: r % 2]:
            cache = scratch / "first-job-cache"
            shutil.rmtree(cache, ignore_errors=True)
            shutil.rmtree(scratch / "first-job-out", ignore_errors=True)
            command = [shoal, "embed", str(inputs), str(scratch / "first-job-out"), "--model", "minilm"]
            seconds, stderr = run(command, {"SHOAL_CACHE_DIR": str(cache), **modes[name]})
            while list((cache / "verdicts").glob("*.measuring")):  # the background child, still measuring
                time.sleep(1)
            (record,) = (cache / "verdicts").glob("*.json")
            runs[name].append(
                {"seconds": round(seconds, 1), "measured_s": json.loads(record.read_text()).get("seconds")}
            )
            print(f"  round {r + 1} first job, {name}: {runs[name][-1]}", flush=True)
    return {name: {"best_s": min(x["seconds"] for x in rs), "runs": rs} for name, rs in runs.items()}


def markdown(results: dict[str, Any]) -> str:
    out = []
    if "batch" in results:
        batch = results["batch"]
        out.append(f"Whole commands, {batch['texts']:,} texts, best of {batch['rounds']} round(s):\n")
        out.extend(
            markdown_table(
                [
                    "command",
                    "best s",
                    "texts/s",
                    "vs direct",
                    "vs no flags",
                    "fixed part s",
                    "cosine mean",
                    "cosine min",
                ],
                [
                    [
                        r["command"],
                        r["best_s"],
                        r["texts_per_s"],
                        f"{r['vs_direct']}×",
                        f"{r['vs_no_flags']}×",
                        r["fixed_s"] if r["fixed_s"] is not None else "-",
                        r.get("cosine_mean", "-"),
                        r.get("cosine_min", "-"),
                    ]
                    for r in batch["rows"]
                ],
            )
        )
        for r in batch["rows"]:
            for run_ in r["runs"]:
                if run_["stages"]:
                    out.append(f"\n{r['command']} stages: " + ", ".join(f"{k} {v}" for k, v in run_["stages"].items()))
    if "demo" in results:
        out.append("\n`make demo` (datasets/demo, 5,000 rows), rows/s from the job summary:\n")
        out.extend(
            markdown_table(
                ["command", "rows/s", "vs before"],
                [
                    [name, ", ".join(map(str, d["rows_per_s"])), f"{d['vs_before']}×"]
                    for name, d in results["demo"].items()
                ],
            )
        )
    if "onnx_load" in results:
        out.append("\nA worker's ONNX load (fresh process, export cached), seconds to the loaded runtime:\n")
        out.extend(
            markdown_table(
                ["code", "best load s", "loads s", "imports torch"],
                [
                    [name, d["best_load_s"], ", ".join(str(r["load_s"]) for r in d["runs"]), d["runs"][0]["torch"]]
                    for name, d in results["onnx_load"].items()
                ],
            )
        )
    if "stages" in results:
        out.append("\nNo-flag `shoal embed --verbose`, stage medians (s), this tree against --code-before:\n")
        names = list(results["stages"])
        keys = list(results["stages"][names[0]]["median"])
        out.extend(
            markdown_table(
                ["stage", *names], [[k, *(results["stages"][n]["median"].get(k, "-") for n in names)] for k in keys]
            )
        )
    if "online" in results:
        out.append("\n32 concurrent single-text clients, MiniLM, requests/s (each window):\n")
        out.extend(
            markdown_table(
                ["server", "best req/s", "req/s", "p50 ms", "p99 ms"],
                [
                    [name, d["best_rps"], ", ".join(str(x["achieved_rps"]) for x in d["runs"])]
                    + [", ".join(str(x["p50_ms"]) for x in d["runs"]), ", ".join(str(x["p99_ms"]) for x in d["runs"])]
                    for name, d in results["online"].items()
                ],
            )
        )
    if "first_use" in results:
        out.append("\n`auto`'s first measurement of minilm, in turn:\n")
        for name, d in results["first_use"].items():
            for run_ in d["runs"]:
                out.append(f"- {name}: {run_['seconds']} s (load {run_['load_average']}); steps {run_['steps']}")
                out.append(f"  rows {run_['rows']}")
    return "\n".join(out)


def figures(results: dict) -> list[harness.Figure]:
    """Whole commands' speed against a direct fp32 encode, and `make demo` against the demo before `auto`."""
    found = [
        harness.Figure(f"{row['command']} / direct fp32 encode", row["vs_direct"], "x")
        for row in results.get("batch", {}).get("rows", [])
        if row["vs_direct"] != 1.0
    ]
    demo = results.get("demo", {}).get("make demo (no flags: auto)")
    if demo:
        found.append(harness.Figure("make demo rows/s / before auto (cpu-local)", demo["vs_before"], "x"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="batch,demo")
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-defaults"))
    parser.add_argument("--fastembed-scratch", default=str(ROOT / "out" / "bench-runtimes"))
    parser.add_argument("--code-before", default=None, help="an older tree for onnx-load's and stages' before column")
    parser.add_argument("--cache-before", default=str(Path("~/.cache/shoal").expanduser()), help="its Shoal cache")
    parser.add_argument("--stage-texts", type=int, default=500)
    parser.add_argument("--online-seconds", type=float, default=20)
    parser.add_argument("--infinity-venv", default=str(ROOT / "out" / "infinity" / "venv"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"conditions": harness.conditions()}
    parts = args.parts.split(",")
    if "first-use" in parts:
        results["first_use"] = part_first_use(scratch, args.rounds, args.code_before)
    if "first-job" in parts:
        results["first_job"] = part_first_job(sample_texts(args.limit), args.rounds, scratch)
    if "onnx-load" in parts:
        results["onnx_load"] = part_onnx_load(3 * args.rounds, args.code_before)  # a load is short: three per round
    if "stages" in parts:
        if not args.code_before:
            parser.error("stages needs --code-before")
        texts = sample_texts(args.stage_texts)
        results["stages"] = part_stages(texts, 4 * args.rounds, scratch, args.code_before, args.cache_before)
    if "online" in parts:
        results["online"] = part_online(args.online_seconds, 2 * args.rounds, Path(args.infinity_venv))
    if "batch" in parts:
        results["batch"] = part_batch(sample_texts(args.limit), args.rounds, scratch, Path(args.fastembed_scratch))
    if "demo" in parts:
        results["demo"] = part_demo(args.rounds, scratch)
    harness.write_result("defaults", results, args.json, figures(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
