#!/usr/bin/env python
"""Runtimes and precision: what the tuned profile buys, against a direct fp32 encode and fastembed.

Three parts, each side by side in one run (a shared machine drifts within
minutes, so only ratios measured in alternation count):

* ``runtimes``: per runtime/dtype candidate, in this process on the worker's
  own runtimes, speed against fp32 torch (median of back-to-back pairs, as
  ``shoal tune`` times it) and the quality gate's figures
  (pipeline/tuning/quality_gate.py) on the same sample;
* ``batch``: whole processes over the same texts, in alternating order each
  round: ``shoal embed --profile PROFILE``; a direct script
  (``SentenceTransformer(path).encode(texts)``, fp32, as a user writes it);
  and ``fastembed`` (ONNX Runtime) in its own venv under the scratch folder,
  loading a local ONNX export of the same model (nothing downloaded). Each
  side's vectors are judged by the gate against the direct script's;
* ``online``: ``shoal serve --profile PROFILE`` against the same profile with
  the model on fp32 torch (the path before runtimes), each with 32
  concurrent clients sending one text per request, requests/s over a window.

    .venv/bin/python benchmarks/runtimes.py                  # all parts, 2,000 texts, 2 rounds
    .venv/bin/python benchmarks/runtimes.py --parts batch --limit 5000 --rounds 3

Prints Markdown and writes JSON to --json. The fastembed venv is kept in
--scratch between runs (its install needs the package registry once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from harness import ROOT, Meter, markdown_table
from online_latency import Connection, Server, post_message, short_queries

from shoal.configs import RuntimeChoice, load_catalog, load_profile
from shoal.pipeline.tuning.quality_gate import REFERENCE, PrecisionGate, candidates, judge_vectors
from shoal.pipeline.tuning.runtimes import paired_speedup
from shoal.workers.runtimes import load_runtime

DEFAULT_JSON = str(harness.result_path("runtimes"))
DEMO = ROOT / "datasets" / "demo"

DIRECT_SCRIPT = """
import sys, numpy as np, pyarrow.parquet as pq
from sentence_transformers import SentenceTransformer
texts = pq.read_table(sys.argv[2], columns=["text"]).column("text").to_pylist()
model = SentenceTransformer(sys.argv[1], device="cpu", local_files_only=True)
np.save(sys.argv[3], model.encode(texts, normalize_embeddings=True))
"""

FASTEMBED_SCRIPT = """
import json, sys, numpy as np
from fastembed import TextEmbedding
texts = [json.loads(line) for line in open(sys.argv[2])]
model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", specific_model_path=sys.argv[1],
                      threads=int(sys.argv[4]), local_files_only=True)
np.save(sys.argv[3], np.stack(list(model.embed(texts))))
"""


def sample_texts(limit: int) -> list[str]:
    shards = sorted(DEMO.glob("part-*.parquet"))
    texts = [t for s in shards for t in pq.read_table(s, columns=["text"]).column("text").to_pylist() if t]
    return list(np.random.default_rng(0).permutation(np.array(texts, dtype=object))[:limit])


# -- part: runtimes -----------------------------------------------------------------


def part_runtimes(texts: list[str], profile_name: str) -> list[dict[str, Any]]:
    from shoal.workers.devices import apply_torch_threads, detect_device

    profile = load_profile(profile_name)
    plan = detect_device(profile, {})
    apply_torch_threads(plan)
    spec = profile.tuned(load_catalog().get("minilm"))
    gate = PrecisionGate(spec, plan, texts)

    def load(choice: RuntimeChoice):
        return load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan)

    reference = load(REFERENCE)
    rows = []
    for choice in candidates(plan.kind):
        verdict = gate.check(choice)
        candidate = load(choice)
        try:
            speedup = paired_speedup(candidate, reference, texts)
        finally:
            candidate.close()
        rows.append(
            {
                "runtime": choice.runtime,
                "dtype": choice.dtype,
                "load_s": round(verdict.load_seconds, 2),
                "vs_fp32": round(speedup, 2),
                **{k: round(v, 4) for k, v in verdict.figures.items()},
                "verdict": "pass" if verdict.passed else "refused: " + "; ".join(verdict.failures),
            }
        )
        print(f"  {rows[-1]}", flush=True)
    reference.close()
    return rows


# -- part: batch (whole commands) ------------------------------------------------------


def fastembed_setup(scratch: Path, model_path: str) -> tuple[str, Path]:
    """fastembed's own venv (its pins may clash with sentence-transformers), and a local export it loads."""
    venv = scratch / "fastembed-venv"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "fastembed"], check=True)
    folder = scratch / "fastembed-minilm"
    if not (folder / "model.onnx").exists():
        folder.mkdir(parents=True, exist_ok=True)
        export_token_graph(model_path, folder)
    version = subprocess.run(
        [str(python), "-c", "import fastembed; print(fastembed.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return version, folder


def export_token_graph(model_path: str, folder: Path) -> None:
    """The transformer alone (fastembed pools and normalizes itself), with the tokenizer cut at 256 as ST does."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_path, device="cpu", local_files_only=True)
    transformer: Any = model[0]  # torch types a module's attributes as Tensor | Module
    bert = transformer.model.eval()
    encoded = model.tokenizer(["a short text", "and a somewhat longer one here"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]

    class TokenGraph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    with torch.no_grad():
        torch.onnx.export(
            TokenGraph().eval(),
            tuple(encoded[n] for n in names),
            str(folder / "model.onnx"),
            input_names=names,
            output_names=["last_hidden_state"],
            opset_version=17,
            dynamo=False,
            external_data=False,
            dynamic_axes={
                **{n: {0: "batch", 1: "tokens"} for n in names},
                "last_hidden_state": {0: "batch", 1: "tokens"},
            },
        )
    model.tokenizer.save_pretrained(str(folder))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = config["max_length"] = model.max_seq_length  # fastembed takes the stricter of the two
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    bert.config.to_json_file(str(folder / "config.json"))


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float | None]:
    with Meter() as meter:
        done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{command[:3]} failed:\n{done.stderr[-3000:]}")
    return meter.seconds, meter.other_share


def read_ours(out_dir: Path, ids: list[str]) -> np.ndarray:
    table = pa.concat_tables(pq.read_table(p) for p in sorted(out_dir.rglob("*.parquet")))
    rows = {i: v for i, v in zip(table.column("id").to_pylist(), table.column("embedding").to_pylist())}
    return np.array([rows[i] for i in ids], dtype=np.float32)


def part_batch(texts: list[str], profile: str, rounds: int, scratch: Path, threads: int) -> dict[str, Any]:
    model_path = load_catalog().get("minilm").resolve_path()
    ids = [f"t{i}" for i in range(len(texts))]
    inputs = scratch / "input"
    inputs.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "text": texts}), inputs / "part-0.parquet", row_group_size=1024)
    (scratch / "texts.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))
    (scratch / "direct_encode.py").write_text(DIRECT_SCRIPT)
    (scratch / "fastembed_encode.py").write_text(FASTEMBED_SCRIPT)
    version, fe_model = fastembed_setup(scratch, model_path)
    fe_python = str(scratch / "fastembed-venv" / "bin" / "python")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    commands = {
        "direct fp32 encode": [
            sys.executable,
            str(scratch / "direct_encode.py"),
            model_path,
            str(inputs / "part-0.parquet"),
            str(scratch / "direct.npy"),
        ],
        f"fastembed {version}": [
            fe_python,
            str(scratch / "fastembed_encode.py"),
            str(fe_model),
            str(scratch / "texts.jsonl"),
            str(scratch / "fastembed.npy"),
            str(threads),
        ],
        f"shoal embed --profile {profile}": [
            harness.venv_command("shoal"),
            "embed",
            str(inputs),
            str(scratch / "ours"),
            "--model",
            "minilm",
            "--profile",
            profile,
            "--id-column",
            "id",
        ],
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in commands}
    names = list(commands)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # each side goes first in turn
            if name.startswith("shoal"):
                shutil.rmtree(scratch / "ours", ignore_errors=True)  # a fresh output, not a resumed one
            seconds, other = timed(commands[name], env)
            runs[name].append({"seconds": round(seconds, 2), "other_cpu": None if other is None else round(other, 3)})
            print(f"  round {r + 1} {name}: {seconds:.1f} s ({len(texts) / seconds:.1f} texts/s)", flush=True)
    reference = np.load(scratch / "direct.npy")
    outputs = {names[1]: np.load(scratch / "fastembed.npy"), names[2]: read_ours(scratch / "ours", ids)}
    best = {name: min(r["seconds"] for r in rs) for name, rs in runs.items()}
    rows = []
    for name in names:
        figures = (
            judge_vectors(outputs[name], reference)[0] if name in outputs else {"cosine_mean": 1.0, "cosine_min": 1.0}
        )
        rows.append(
            {
                "command": name,
                "best_s": best[name],
                "texts_per_s": round(len(texts) / best[name], 1),
                "vs_direct": round(best[names[0]] / best[name], 2),
                "vs_fastembed": round(best[names[1]] / best[name], 2),
                **{k: round(v, 4) for k, v in figures.items()},
                "runs": runs[name],
            }
        )
    return {"texts": len(texts), "rounds": rounds, "rows": rows}


# -- part: online (32 concurrent single-text clients) -------------------------------------


async def closed_loop(url: str, texts: list[str], clients: int, seconds: float) -> dict[str, Any]:
    messages = [post_message(url, "/v1/encode/minilm", msgpack.packb({"texts": [t]})) for t in texts]
    done, errors = 0, 0
    stop = time.monotonic() + seconds

    async def client(k: int) -> None:
        nonlocal done, errors
        connection = await Connection.open(url)
        i = k
        try:
            while time.monotonic() < stop:
                status = await connection.request(messages[i % len(messages)])
                done, errors = done + (status == 200), errors + (status != 200)
                i += clients
        finally:
            connection.close()

    began = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(clients)))
    elapsed = time.monotonic() - began
    return {"requests_per_s": round(done / elapsed, 1), "ok": done, "errors": errors, "seconds": round(elapsed, 1)}


def part_online(profile: str, rounds: int, scratch: Path, clients: int, seconds: float) -> dict[str, Any]:
    tuned = load_profile(profile)
    fields = yaml.safe_load(Path(tuned.path).read_text())
    fields["runtimes"] = {**(fields.get("runtimes") or {}), "minilm": {"runtime": "torch", "dtype": "float32"}}
    fields["name"] = f"{tuned.name}-fp32"
    fp32_path = scratch / f"{tuned.name}-fp32.yaml"
    fp32_path.write_text(yaml.safe_dump(fields))
    profiles = {f"shoal serve --profile {profile}": Path(tuned.path), "same profile, minilm on fp32 torch": fp32_path}
    texts = short_queries(2000)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in profiles}
    names = list(profiles)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            server = Server(ROOT / "configs" / "catalog.yaml", profiles[name], ["minilm"])
            try:
                asyncio.run(closed_loop(server.url, texts, clients, 3.0))  # warm: model loaded, kernels picked
                result = asyncio.run(closed_loop(server.url, texts, clients, seconds))
            finally:
                server.stop()
            runs[name].append(result)
            print(f"  round {r + 1} {name}: {result}", flush=True)
    best = {name: max(x["requests_per_s"] for x in rs) for name, rs in runs.items()}
    return {
        "clients": clients,
        "window_s": seconds,
        "rounds": rounds,
        "rows": [
            {
                "server": n,
                "best_requests_per_s": best[n],
                "vs_fp32": round(best[n] / best[names[1]], 2),
                "runs": runs[n],
            }
            for n in names
        ],
    }


# -- report ----------------------------------------------------------------------------


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    m = c["machine"]
    out = [
        f"runtimes benchmark, {c['when']}, {m['cores']} cores, {m['cpu_model']}; "
        "other processes' CPU share per run in the JSON",
        "",
    ]
    if "runtimes" in results:
        out += [
            "In process, 512 texts; vs fp32: median of 3 back-to-back pairs with fp32 torch:",
            "",
            *markdown_table(
                ["runtime", "dtype", "load s", "vs fp32", "cosine mean", "cosine min", "nDCG@10 (fp32)", "gate"],
                [
                    [r["runtime"], r["dtype"], r["load_s"], f"{r['vs_fp32']}x", r["cosine_mean"], r["cosine_min"]]
                    + [f"{r['ndcg@10']} ({r['ndcg@10_fp32']})", r["verdict"]]
                    for r in results["runtimes"]
                ],
                right=("load s", "vs fp32", "cosine mean", "cosine min", "nDCG@10 (fp32)"),
            ),
            "",
        ]
    if "batch" in results:
        b = results["batch"]
        columns = ["command", "best s", "texts/s", "vs direct fp32", "vs fastembed", "cosine mean", "cosine min"]
        out += [
            f"Whole commands, {b['texts']} texts, best of {b['rounds']} alternating rounds:",
            "",
            *markdown_table(
                columns,
                [
                    [r["command"], r["best_s"], r["texts_per_s"], f"{r['vs_direct']}x", f"{r['vs_fastembed']}x"]
                    + [r["cosine_mean"], r["cosine_min"]]
                    for r in b["rows"]
                ],
                right=tuple(columns[1:]),
            ),
            "",
        ]
    if "online" in results:
        o = results["online"]
        out += [
            f"Online, {o['clients']} concurrent single-text clients, {o['window_s']:g} s windows, best of {o['rounds']}:",
            "",
            *markdown_table(
                ["server", "requests/s", "vs fp32"],
                [[r["server"], r["best_requests_per_s"], f"{r['vs_fp32']}x"] for r in o["rows"]],
                right=("requests/s", "vs fp32"),
            ),
        ]
    return "\n".join(out)


def figures(results: dict) -> list[harness.Figure]:
    """Whole `shoal embed` against a direct fp32 encode and fastembed, and `shoal serve` against fp32 torch."""
    found = []
    for row in results.get("batch", {}).get("rows", []):
        if row["command"].startswith("shoal"):
            found.append(harness.Figure(f"{row['command']} / direct fp32 encode", row["vs_direct"], "x"))
            found.append(harness.Figure(f"{row['command']} / fastembed", row["vs_fastembed"], "x"))
            found.append(harness.Figure(f"{row['command']}: cosine to fp32, min", row["cosine_min"]))
    for row in results.get("online", {}).get("rows", []):
        if row["vs_fp32"] != 1.0:
            found.append(harness.Figure(f"{row['server']}: requests/s / fp32 torch", row["vs_fp32"], "x"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="runtimes,batch,online")
    parser.add_argument("--profile", default="cpu-2core")
    parser.add_argument("--limit", type=int, default=2000, help="texts for the batch part (runtimes part: 512)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each online measurement")
    parser.add_argument("--threads", type=int, default=2, help="cores fastembed and the direct script may use")
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-runtimes"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    scratch = Path(args.scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    texts = sample_texts(args.limit)
    results: dict[str, Any] = {"conditions": harness.conditions(profile=args.profile)}
    runs = {
        "runtimes": lambda: part_runtimes(texts[:512], args.profile),
        "batch": lambda: part_batch(texts, args.profile, args.rounds, scratch, args.threads),
        "online": lambda: part_online(args.profile, args.rounds, scratch, args.clients, args.window),
    }
    for part, run in runs.items():
        if part in parts:
            print(f"{part}:", flush=True)
            results[part] = run()
            harness.write_result(
                "runtimes", results, args.json, figures(results)
            )  # each part kept as soon as it is measured
    print(markdown(results))


if __name__ == "__main__":
    main()
