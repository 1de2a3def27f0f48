#!/usr/bin/env python
"""Batch throughput: `shoal embed` against a direct sentence-transformers loop.

Same corpus, same model, same cores, one run. Measures side by side:

* direct: ``SentenceTransformer(path, device="cpu").encode(texts, batch_size=B)``
  for each B (model loaded once before timing, a warm-up encode first);
* ours: ``shoal embed INPUT OUT --model MODEL`` as a subprocess (embedded
  cluster), once per profile (the default profile, plus every ``--profile``),
  each repeated ``--ours-runs`` times; the best run counts;
* extra ours variants: ``--ours-budget N`` (the default profile with this
  token budget) and ``--malloc-trim-ab`` (each variant also with the
  MALLOC_TRIM_THRESHOLD_=65536 that Dask's nanny gives workers by default,
  which the embedded cluster removes);
* optionally (``--sweep-budgets``) our worker's compute alone, in this process:
  ``shoal.workers.runtimes.embedder.SentenceEmbedder`` item by item, for several token budgets,
  paired with a direct encode of the same item.

Runs are interleaved (direct B0, ours round 1, direct B1.., ours round 2, ...)
so neither side always goes first. For every run the script records how much
of the machine other processes used meanwhile, because timings on a shared
machine are noisy.

    .venv/bin/python benchmarks/batch_throughput.py            # `make bench`
    .venv/bin/python benchmarks/batch_throughput.py --limit 1000 --ours-runs 1
    .venv/bin/python benchmarks/batch_throughput.py --profile my-tuned.yaml --sweep-budgets

Prints Markdown tables and writes everything as JSON to --json.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from harness import ROOT, Meter, wait_for_idle

from shoal.configs import load_catalog, load_profile
from shoal.pipeline.jobs.embed import EmbedRequest, plan_embed
from shoal.workers.batching.token_batching import padding_fraction, plan_batches
from shoal.workers.data.parquet_slices import read_slice, text_column

DEFAULT_INPUT = str(ROOT / "datasets" / "demo" / "*.parquet")
DEFAULT_JSON = str(harness.result_path("batch_throughput"))
TARGET_RATIO = 1.10
WARMUP_TEXTS = 64


# -- the corpus ----------------------------------------------------------------


def expand_input(value: str) -> str:
    """Relative local paths are taken from the current directory, made absolute."""
    if "://" in value:
        return value
    return str(Path(value).expanduser().resolve()) if not glob.has_magic(value) else os.path.abspath(value)


def read_items(input_url: str, text_col: str, profile) -> tuple[list, list[dict]]:
    """The plan `shoal embed` would make, and each item's texts, read as a worker reads them."""
    request = EmbedRequest(input=input_url, output="/unused", model="-", text_column=text_col, id_column=None)
    plan = plan_embed(request, profile)
    bad = [s for s in plan.shards if s.error]
    if bad:
        raise SystemExit(f"unreadable input shard {bad[0].url}: {bad[0].error}")
    items = []
    for item in plan.items:
        payload = item["payload"]
        table = read_slice(payload, [text_col])
        texts = text_column(table, text_col, payload["input"])
        items.append({"input": payload["input"], "row_range": payload["row_range"], "texts": texts})
    return plan.shards, items


def write_limited(items: list[dict], text_col: str, limit: int, folder: Path) -> str:
    """The first `limit` rows as Parquet files of 1,000 rows (row groups of 500), like the demo."""
    texts = [t for item in items for t in item["texts"]][:limit]
    folder.mkdir(parents=True, exist_ok=True)
    for index, start in enumerate(range(0, len(texts), 1000)):
        chunk = texts[start : start + 1000]
        ids = [f"row-{start + i + 1:07d}" for i in range(len(chunk))]
        table = pa.table({"id": pa.array(ids), text_col: pa.array(chunk, pa.string())})
        pq.write_table(table, folder / f"part-{index:04d}.parquet", row_group_size=500)
    return str(folder / "*.parquet")


def has_column(shards, name: str) -> bool:
    from shoal.workers.data.storage import open_fs

    fs, path = open_fs(shards[0].url, None)
    with fs.open(path, "rb") as f:
        return name in pq.ParquetFile(f).schema_arrow.names


# -- padding -------------------------------------------------------------------


def st_batches(model, texts: list[str], batch_size: int) -> list[np.ndarray]:
    """The batches SentenceTransformer.encode forms: longest characters first (its own sort)."""
    order = (
        np.argsort([-model._input_length(t) for t in texts])
        if hasattr(model, "_input_length")
        else np.argsort([-len(t) for t in texts])
    )
    can_flatten = getattr(model, "_can_flatten_inputs", lambda: False)()
    if can_flatten:  # flattened (padding-free) attention: ST interleaves long and short
        order = model._interleave_sorted_indices(order)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def computed_tokens(lengths: np.ndarray, batches: list[np.ndarray]) -> int:
    return int(sum(len(b) * int(lengths[b].max()) for b in batches if len(b)))


def ours_padding(items: list[dict], item_lengths: list[np.ndarray], budget: int, max_batch: int) -> tuple[float, int]:
    """Padding of our worker's batches: plan_batches per work item, as SentenceEmbedder.embed does."""
    computed = 0
    real = 0
    for lengths in item_lengths:
        batches = plan_batches(lengths, budget, max_batch)
        computed += computed_tokens(lengths, batches)
        real += int(lengths.sum())
    return (computed - real) / computed if computed else 0.0, computed


# -- the runs ------------------------------------------------------------------


# The CLI with the embedded cluster started as plain Dask would: the nanny's default
# MALLOC_TRIM_THRESHOLD_ left in place.
DASK_MALLOC_TRIM_LAUNCHER = (
    "import sys; import shoal.pipeline.cluster as c; "
    "c.start_local_cluster = lambda p, cat=None, n=None, **k: c._local_cluster(p, cat, n, **k); "
    "from shoal.pipeline.cli import main; sys.argv[0] = 'shoal'; main()"
)


def check_output(out_dir: Path, keys: list[tuple[str, int]], reference: np.ndarray | None) -> dict[str, Any]:
    """Row counts from the manifest and from the parts themselves; vectors against the direct run."""
    manifest = json.loads((out_dir / "_manifest.json").read_text())
    rows_in_parts = 0
    position = {key: i for i, key in enumerate(keys)}
    min_cos = None
    max_abs = None
    for part in manifest["parts"]:
        table = pq.read_table(out_dir / part["name"], columns=["embedding"])
        rows_in_parts += table.num_rows
        if reference is None:
            continue
        column = table.column("embedding").combine_chunks()
        vectors = column.values.to_numpy(zero_copy_only=False).reshape(table.num_rows, -1)
        valid = ~np.asarray(column.is_null().to_numpy(zero_copy_only=False))
        start = part["row_range"][0]
        idx = [position.get((part["input"], start + i)) for i in range(table.num_rows)]
        pairs = [(i, j) for i, j in enumerate(idx) if j is not None and valid[i]]
        if not pairs:
            continue
        ours = vectors[[i for i, _ in pairs]]
        ref = reference[[j for _, j in pairs]]
        cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1) + 1e-12)
        min_cos = float(cos.min()) if min_cos is None else min(min_cos, float(cos.min()))
        diff = float(np.abs(ours - ref).max())
        max_abs = diff if max_abs is None else max(max_abs, diff)
    return {
        "manifest_rows": manifest["rows"],
        "manifest_complete": manifest["complete"],
        "part_rows": rows_in_parts,
        "min_cosine_vs_direct": None if min_cos is None else round(min_cos, 6),
        "max_abs_diff_vs_direct": max_abs,
    }


def run_ours(
    variant: dict[str, Any],
    input_url: str,
    model: str,
    text_col: str,
    id_col: str,
    expected_rows: int,
    keys: list[tuple[str, int]],
    reference: np.ndarray | None,
    scratch: Path,
    run_index: int,
    timeout: float,
) -> dict[str, Any]:
    out_dir = scratch / f"ours-{variant['slug']}-{run_index}"
    shutil.rmtree(out_dir, ignore_errors=True)
    launcher = [harness.venv_command("shoal")]
    if variant.get("dask_malloc_trim"):
        # Dask's nanny gives workers MALLOC_TRIM_THRESHOLD_=65536 (distributed.nanny.pre-spawn-environ);
        # the embedded cluster removes it, this twin keeps it, to measure what it costs.
        launcher = [sys.executable, "-c", DASK_MALLOC_TRIM_LAUNCHER]
    cmd = [
        *launcher,
        "embed",
        input_url,
        f"{out_dir}/",
        "--model",
        model,
        "--text-column",
        text_col,
        "--id-column",
        id_col,
    ]
    if variant["profile"]:
        cmd += ["--profile", variant["profile"]]
    env = harness.subprocess_env(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    with Meter() as meter:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    summary = harness.job_figures(proc.stderr)
    record: dict[str, Any] = {
        "kind": "ours",
        "variant": variant["name"],
        "run": run_index,
        "command": " ".join(cmd),
        "exit_code": proc.returncode,
        **meter.record(expected_rows),
        "job_seconds": summary.get("seconds"),
        "job_rows_per_s": summary.get("rows/s"),
        "job_rows": summary.get("rows"),
    }
    record["end_to_end_rows_per_s"] = round(expected_rows / meter.seconds, 2)
    if record["job_seconds"] is not None:
        record["outside_job_s"] = round(meter.seconds - record["job_seconds"], 2)
    if proc.returncode != 0 or record["job_rows_per_s"] is None:
        record["stderr_tail"] = proc.stderr[-3000:]
        record["ok"] = False
        return record
    try:
        record["check"] = check_output(out_dir, keys, reference)
    except Exception as exc:  # a broken output is a result to report, not a crash
        record["check"] = {"error": f"{type(exc).__name__}: {exc}"}
    check = record["check"]
    record["ok"] = (
        check.get("manifest_rows") == expected_rows
        and check.get("part_rows") == expected_rows
        and (check.get("min_cosine_vs_direct") is None or check["min_cosine_vs_direct"] > 0.999)
    )
    return record


def run_direct(model, texts: list[str], batch_size: int, normalize: bool) -> tuple[dict[str, Any], np.ndarray]:
    with Meter() as meter:
        vectors = model.encode(texts, batch_size=batch_size, normalize_embeddings=normalize, show_progress_bar=False)
    record = {
        "kind": "direct",
        "variant": f"direct B={batch_size}",
        "batch_size": batch_size,
        **meter.record(len(texts)),
        "rows_per_s": round(len(texts) / meter.seconds, 2),
        "ok": vectors.shape[0] == len(texts),
    }
    return record, np.asarray(vectors, dtype=np.float32)


def sweep_budgets(
    spec,
    model,
    items: list[dict],
    item_lengths: list[np.ndarray],
    budgets: list[int],
    max_batches: list[int],
    direct_batch: int,
    rounds: int,
    wait_idle: float = 0.0,
) -> list[dict[str, Any]]:
    """Our worker's compute alone, in this process: SentenceEmbedder.embed, item by item.

    One row per (token_budget, max_batch_size), plus a direct encode at
    `direct_batch` as the baseline. Paired and interleaved so a shared
    machine's bursts hit every config alike: for each round and each work
    item, every config embeds that item's texts, in an order rotated per item
    and round. A config's rows/s uses its best time per item; its ratio vs
    direct is the median of the paired (same item, same round) time ratios.
    """
    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes.embedder import SentenceEmbedder

    plan = DevicePlan("cpu", "cpu", "float32", 10**10)
    texts_by_item = [[t for t in item["texts"] if t is not None] for item in items]
    n = sum(len(texts) for texts in texts_by_item)
    tuned_configs = [(b, m) for m in max_batches for b in budgets]
    configs: list[tuple[int, int] | None] = [None, *tuned_configs]
    embedders: dict[tuple[int, int], Any] = {}
    for pair in tuned_configs:
        budget, max_batch = pair
        tuned = spec.model_copy(
            update={"token_budget": {**spec.token_budget, "cpu": budget}, "max_batch_size": max_batch}
        )
        embedders[pair] = SentenceEmbedder(tuned, plan)
        embedders[pair].embed(texts_by_item[0][:WARMUP_TEXTS])
    times: dict[Any, dict[tuple[int, int], float]] = {c: {} for c in configs}
    others: dict[Any, list[float]] = {c: [] for c in configs}
    cpu: dict[Any, float] = {c: 0.0 for c in configs}
    for r in range(rounds):
        for i, texts in enumerate(texts_by_item):
            wait_for_idle(wait_idle)
            shift = (r * len(texts_by_item) + i) % len(configs)
            for config in configs[shift:] + configs[:shift]:
                with Meter() as meter:
                    if config is None:
                        model.encode(texts, batch_size=direct_batch, show_progress_bar=False)
                    else:
                        embedders[config].embed(texts)
                times[config][(r, i)] = meter.seconds
                cpu[config] += meter.own_cpu
                if meter.other_share is not None:
                    others[config].append(meter.other_share)
        print(f"  sweep round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    for embedder in embedders.values():
        embedder.close()

    rows = []
    for config in configs:
        best_total = sum(min(times[config][(r, i)] for r in range(rounds)) for i in range(len(texts_by_item)))
        ratios = [times[None][key] / times[config][key] for key in times[config]]
        if config is None:
            lengths = [lengths for lengths in item_lengths]
            batches = [st_batches(model, texts, direct_batch) for texts in texts_by_item]
            computed = sum(computed_tokens(ls, bs) for ls, bs in zip(lengths, batches))
            real = int(sum(ls.sum() for ls in lengths))
            padding = (computed - real) / computed if computed else 0.0
            n_batches = sum(len(bs) for bs in batches)
            row: dict[str, Any] = {
                "config": f"direct encode B={direct_batch} (per item)",
                "token_budget": None,
                "max_batch_size": direct_batch,
            }
        else:
            budget, max_batch = config
            padding, computed = ours_padding(items, item_lengths, budget, max_batch)
            n_batches = sum(len(plan_batches(lengths, budget, max_batch)) for lengths in item_lengths)
            row = {
                "config": f"SentenceEmbedder budget={budget} max_batch={max_batch}",
                "token_budget": budget,
                "max_batch_size": max_batch,
            }
        row.update(
            {
                "rows_per_s": round(n / best_total, 2),
                "ratio_vs_direct_median": round(float(np.median(ratios)), 3),
                "ratio_vs_direct_range": [round(float(min(ratios)), 3), round(float(max(ratios)), 3)],
                "rounds_total_s": [
                    round(sum(times[config][(r, i)] for i in range(len(texts_by_item))), 2) for r in range(rounds)
                ],
                "padding": round(padding, 4),
                "computed_tokens": computed,
                "batches": n_batches,
                "rows_per_cpu_s": round(n * rounds / cpu[config], 2) if cpu[config] else None,
                "other_cpu_share": round(float(np.mean(others[config])), 3) if others[config] else None,
                "other_cpu_share_max": round(float(np.max(others[config])), 3) if others[config] else None,
            }
        )
        rows.append(row)
        print(
            f"  sweep {row['config']}: {row['rows_per_s']:.1f} rows/s, x{row['ratio_vs_direct_median']:.2f} vs direct "
            f"(median), padding {padding:.1%}",
            file=sys.stderr,
            flush=True,
        )
    return rows


# -- reporting -----------------------------------------------------------------


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def markdown(results: dict[str, Any]) -> str:
    c = results["conditions"]
    m = c["machine"]
    lines = []
    lines.append(
        f"Corpus: {c['corpus_rows']:,} rows ({c['input']}), tokens/text mean {c['tokens_mean']:.1f}, "
        f"p95 {c['tokens_p95']:.0f}, max {c['tokens_max']} (max_seq_length {c['max_seq_length']}, "
        f"{c['truncated']} truncated). Model {c['model']} ({c['model_name']}). "
        f"{m['cores']} CPUs ({m['cpu_model']}), torch {c['torch']} with {c['torch_threads']} threads, "
        f"sentence-transformers {c['sentence_transformers']}, dask.distributed {c['distributed']}. {c['when']}, "
        f"code {harness.describe_code(c['git'])}{'; ' + c['note'] if c.get('note') else ''}."
    )
    lines.append("")
    lines.append("| variant | rows/s | padding % | ratio vs best direct | wall s | notes |")
    lines.append("|---|---:|---:|---:|---:|---|")
    for row in results["table"]:
        lines.append(
            f"| {row['variant']} | {row['rows_per_s']:.1f} | {pct(row['padding'])} | "
            f"{row['ratio']:.2f} | {row['wall_s']:.1f} | {row['notes']} |"
        )
    lines.append("")
    lines.append(results["verdict"])
    lines.append("")
    lines.append("Every run, in the order it ran (other CPU: share of all cores busy with other processes meanwhile):")
    lines.append("")
    lines.append(
        "| # | run | wall s | rows/s | rows per CPU-s | own cores used | other CPU | load 1m before→after | ok |"
    )
    lines.append("|---:|---|---:|---:|---:|---:|---:|---|---|")
    for i, r in enumerate(results["runs"], 1):
        rate = r.get("rows_per_s") or r.get("job_rows_per_s")
        label = r["variant"] if r["kind"] == "direct" else f"{r['variant']} #{r['run']} (in-job)"
        lines.append(
            f"| {i} | {label} | {r['wall_s']:.1f} | {rate if rate is not None else '-'} | "
            f"{r.get('rows_per_cpu_s', '-')} | {r['own_cores_used']} | {pct(r['other_cpu_share'])} | "
            f"{r['loadavg_1m_before']}→{r['loadavg_1m_after']} | {'yes' if r['ok'] else 'NO'} |"
        )
    if results.get("sweep"):
        lines.append("")
        lines.append(
            "Token-budget sweep: our worker's SentenceEmbedder.embed in this process, item by item (no Dask, "
            "model loaded), paired with a direct encode of the same item's texts; configs interleaved per item, "
            "order rotated. rows/s from each config's best time per item; ratio = median of paired time ratios:"
        )
        lines.append("")
        lines.append(
            "| config | rows/s | ratio vs direct (median) | ratio range | padding % | computed tokens | batches | "
            "rows per CPU-s | other CPU mean / max |"
        )
        lines.append("|---|---:|---:|---|---:|---:|---:|---:|---|")
        for s in results["sweep"]:
            lo, hi = s["ratio_vs_direct_range"]
            lines.append(
                f"| {s['config']} | {s['rows_per_s']:.1f} | {s['ratio_vs_direct_median']:.2f} | {lo:.2f}–{hi:.2f} | "
                f"{pct(s['padding'])} | {s['computed_tokens']:,} | {s['batches']} | {s.get('rows_per_cpu_s', '-')} | "
                f"{pct(s['other_cpu_share'])} / {pct(s['other_cpu_share_max'])} |"
            )
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=DEFAULT_INPUT, help="Parquet file, directory or glob (default: the demo corpus)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--limit", type=int, default=None, help="only the first N rows (copied to a scratch folder)")
    p.add_argument("--model", default="minilm", help="catalog name (default: minilm)")
    p.add_argument("--batch-sizes", default="16,32,64", help="direct encode batch sizes (default: 16,32,64)")
    p.add_argument(
        "--profile", action="append", default=[], help="extra profile (name or YAML path) to run ours with; repeatable"
    )
    p.add_argument(
        "--ours-budget",
        type=int,
        action="append",
        default=[],
        help="extra ours variant: the default profile with this token budget for the model; repeatable",
    )
    p.add_argument(
        "--malloc-trim-ab",
        action="store_true",
        help="run every ours variant twice per round: as is, and with Dask's default MALLOC_TRIM_THRESHOLD_=65536",
    )
    p.add_argument("--ours-runs", type=int, default=2, help="runs of each ours variant; the best counts (default: 2)")
    p.add_argument(
        "--sweep-budgets", action="store_true", help="also time SentenceEmbedder in-process per token budget"
    )
    p.add_argument("--budgets", default="1024,2048,4096,8192,16384", help="token budgets for --sweep-budgets")
    p.add_argument(
        "--sweep-max-batch", default="", help="max_batch_size values for --sweep-budgets (default: the catalog's)"
    )
    p.add_argument("--sweep-runs", type=int, default=2, help="rounds of the sweep, order alternated; best counts")
    p.add_argument("--sweep-only", action="store_true", help="skip the direct and `shoal embed` runs; sweep only")
    p.add_argument("--json", default=DEFAULT_JSON, help=f"where to write the results (default: {DEFAULT_JSON})")
    p.add_argument("--markdown", default=None, help="also write the Markdown tables to this file")
    p.add_argument(
        "--wait-idle",
        type=float,
        default=60,
        help="before each timed run, wait up to this many seconds for the machine to be idle (0: don't)",
    )
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per `shoal embed` run")
    p.add_argument("--note", default="", help="free text recorded with the conditions (e.g. which commit was exported)")
    p.add_argument("--keep-output", action="store_true", help="keep ours' output folders (printed at the end)")
    return p.parse_args(argv)


def figures(results: dict) -> list[harness.Figure]:
    """Each Shoal variant's rows/s over the best direct encode: in-job (held to the target) and whole command."""
    found = []
    for row in results["table"]:
        if row["variant"].startswith("ours"):
            in_job = row["variant"].endswith("in-job")
            goal = f">= {results['target_ratio']}x" if in_job else ""
            met = row["ratio"] >= results["target_ratio"] if in_job else None
            found.append(
                harness.Figure(f"{row['variant']} / best direct encode", round(row["ratio"], 2), "x", goal, met)
            )
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import distributed
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(harness.usable_cores())
    batch_sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    budgets = [int(x) for x in args.budgets.split(",") if x.strip()]
    scratch = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    catalog = load_catalog()
    spec = catalog.get(args.model)
    path = spec.resolve_path()
    default_profile = load_profile(None)

    # The corpus, exactly as `shoal embed` plans and reads it.
    input_url = expand_input(args.input)
    shards, items = read_items(input_url, args.text_column, default_profile)
    if args.limit is not None:
        input_url = write_limited(items, args.text_column, args.limit, scratch / "corpus")
        shards, items = read_items(input_url, args.text_column, default_profile)
    id_col = "id" if has_column(shards, "id") else ""
    keys = [(it["input"], it["row_range"][0] + i) for it in items for i, t in enumerate(it["texts"]) if t is not None]
    texts = [t for it in items for t in it["texts"] if t is not None]
    rows = sum(len(it["texts"]) for it in items)
    log(f"corpus: {rows:,} rows ({len(texts):,} non-null) from {len(shards)} file(s), {len(items)} work item(s)")

    # The model, loaded once; token lengths as both sides' tokenizer sees them.
    t = time.perf_counter()
    model = SentenceTransformer(path, device="cpu", local_files_only=True)
    warm_load = time.perf_counter() - t
    model.max_seq_length = spec.max_seq_length  # what the worker sets; equal to the model's own for minilm
    model.encode(texts[:WARMUP_TEXTS], batch_size=32, show_progress_bar=False)
    limit = spec.max_seq_length
    raw = np.fromiter(
        (len(x) for x in model.tokenizer(texts, truncation=True, max_length=limit + 1)["input_ids"]), dtype=np.int64
    )
    lengths = np.minimum(raw, limit)
    offsets = np.cumsum([0] + [sum(t is not None for t in it["texts"]) for it in items])
    item_lengths = [lengths[offsets[i] : offsets[i + 1]] for i in range(len(items))]

    conditions = harness.conditions(
        argv,
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        sentence_transformers=sentence_transformers.__version__,
        distributed=distributed.__version__,
        model=args.model,
        model_name=spec.source or Path(path).name,
        model_path=path,
        max_seq_length=limit,
        catalog_token_budget_cpu=spec.budget_for("cpu"),
        max_batch_size=spec.max_batch_size,
        input=args.input if args.limit is None else f"{args.input} (first {args.limit} rows)",
        corpus_rows=rows,
        corpus_texts=len(texts),
        work_items=len(items),
        tokens_total=int(lengths.sum()),
        tokens_mean=float(lengths.mean()),
        tokens_p95=float(np.percentile(lengths, 95)),
        tokens_max=int(lengths.max()),
        truncated=int((raw > limit).sum()),
        model_load_warm_s=round(warm_load, 2),
        wait_idle_s=args.wait_idle,
        note=args.note,
    )

    variants: list[dict[str, Any]] = [
        {"name": f"ours {default_profile.name} (default)", "slug": "default", "profile": None}
    ]
    for i, prof in enumerate(args.profile):
        loaded = load_profile(prof if not prof.endswith((".yaml", ".yml")) else str(Path(prof).resolve()))
        variants.append(
            {
                "name": f"ours {loaded.name} ({prof})",
                "slug": f"p{i + 1}",
                "profile": prof if not prof.endswith((".yaml", ".yml")) else str(Path(prof).resolve()),
            }
        )
    for budget in args.ours_budget:
        # the default profile with one change: this model's token budget
        data = default_profile.model_dump()
        data["name"] = f"{default_profile.name}-budget{budget}"
        data["token_budgets"] = {**data.get("token_budgets", {}), args.model: budget}
        path_b = scratch / f"{data['name']}.yaml"
        path_b.write_text(yaml.safe_dump(data, sort_keys=False))
        variants.append({"name": f"ours {data['name']}", "slug": f"b{budget}", "profile": str(path_b)})
    if args.malloc_trim_ab:
        for v in list(variants):
            variants.append(
                {**v, "name": v["name"] + " dask-malloc-trim", "slug": v["slug"] + "-mt", "dask_malloc_trim": True}
            )
    for v in variants:
        prof = load_profile(v["profile"])
        tuned = prof.tuned(spec) if hasattr(prof, "tuned") else spec
        v["token_budget"] = tuned.budget_for("cpu")
        v["max_batch_size"] = tuned.max_batch_size
        v["rows_per_item"] = prof.rows_per_item
        if prof.rows_per_item == default_profile.rows_per_item:
            v["padding"], v["computed_tokens"] = ours_padding(
                items, item_lengths, v["token_budget"], v["max_batch_size"]
            )
        else:  # another item size: the plan, hence the batches, differ
            _, p_items = read_items(input_url, args.text_column, prof)
            p_offsets = np.cumsum([0] + [sum(t is not None for t in it["texts"]) for it in p_items])
            p_lengths = [lengths[p_offsets[i] : p_offsets[i + 1]] for i in range(len(p_items))]
            v["padding"], v["computed_tokens"] = ours_padding(
                p_items, p_lengths, v["token_budget"], v["max_batch_size"]
            )

    direct_padding = {}
    flattened = bool(getattr(model, "_can_flatten_inputs", lambda: False)())
    conditions["st_padding_free_attention"] = flattened
    for b in batch_sizes:
        batches = st_batches(model, texts, b)
        if flattened:  # ST packs sequences without padding: nothing is padded
            direct_padding[b] = (0.0, int(lengths.sum()))
        else:
            direct_padding[b] = (padding_fraction(lengths, batches), computed_tokens(lengths, batches))

    # Interleaved schedule: direct B0, ours round 1, the other directs, ours rounds 2..
    schedule: list[tuple[str, Any]] = [("direct", batch_sizes[0])]
    for round_ in range(0 if args.sweep_only else max(args.ours_runs, 1)):
        if round_ < args.ours_runs:  # variant order reversed every other round
            schedule += [("ours", (v, round_ + 1)) for v in (variants if round_ % 2 == 0 else variants[::-1])]
        if round_ == 0:
            schedule += [("direct", b) for b in batch_sizes[1:]]
    log("schedule: " + ", ".join(f"direct B={x}" if k == "direct" else f"{x[0]['slug']}#{x[1]}" for k, x in schedule))

    runs: list[dict[str, Any]] = []
    reference: np.ndarray | None = None
    for kind, what in schedule:
        waited = wait_for_idle(args.wait_idle)
        if kind == "direct":
            record, vectors = run_direct(model, texts, what, spec.normalize)
            record["padding"], record["computed_tokens"] = direct_padding[what]
            if reference is None:
                reference = vectors
            log(
                f"  direct B={what}: {record['rows_per_s']:.1f} rows/s in {record['wall_s']:.1f} s "
                f"(other CPU {pct(record['other_cpu_share'])})"
            )
        else:
            variant, run_index = what
            record = run_ours(
                variant,
                input_url,
                args.model,
                args.text_column,
                id_col,
                rows,
                keys,
                reference,
                scratch,
                run_index,
                args.timeout,
            )
            record["padding"] = variant["padding"]
            record["token_budget"] = variant["token_budget"]
            log(
                f"  {variant['name']} #{run_index}: in-job {record['job_rows_per_s']} rows/s, command "
                f"{record['wall_s']:.1f} s, ok={record['ok']} (other CPU {pct(record['other_cpu_share'])})"
            )
            if not record["ok"] and "stderr_tail" in record:
                log(record["stderr_tail"])
        record["waited_for_idle_s"] = waited
        runs.append(record)

    # The summary table: every direct batch size; for each ours variant its best run.
    directs = [r for r in runs if r["kind"] == "direct"]
    best_direct = max(r["rows_per_s"] for r in directs)
    best_direct_run = max(directs, key=lambda r: r["rows_per_s"])
    best_direct_name = best_direct_run["variant"]

    sweep = []
    if args.sweep_budgets or args.sweep_only:
        max_batches = [int(x) for x in args.sweep_max_batch.split(",") if x.strip()] or [spec.max_batch_size]
        sweep = sweep_budgets(
            spec,
            model,
            items,
            item_lengths,
            budgets,
            max_batches,
            best_direct_run["batch_size"],
            args.sweep_runs,
            args.wait_idle,
        )
    table = []
    for r in directs:
        table.append(
            {
                "variant": r["variant"],
                "rows_per_s": r["rows_per_s"],
                "padding": r["padding"],
                "ratio": r["rows_per_s"] / best_direct,
                "wall_s": r["wall_s"],
                "notes": "encode only; model already loaded",
            }
        )
    verdict_ratio = None
    for v in variants if not args.sweep_only else []:
        mine = [r for r in runs if r["kind"] == "ours" and r["variant"] == v["name"] and r["ok"]]
        if not mine:
            table.append(
                {
                    "variant": v["name"],
                    "rows_per_s": 0.0,
                    "padding": v["padding"],
                    "ratio": 0.0,
                    "wall_s": 0.0,
                    "notes": "FAILED: see runs",
                }
            )
            continue
        best = max(mine, key=lambda r: r["job_rows_per_s"])
        e2e = max(mine, key=lambda r: r["end_to_end_rows_per_s"])
        job_rate = best["job_rows_per_s"]
        if verdict_ratio is None:
            verdict_ratio = job_rate / best_direct
        table.append(
            {
                "variant": f"{v['name']}: in-job",
                "rows_per_s": job_rate,
                "padding": v["padding"],
                "ratio": job_rate / best_direct,
                "wall_s": best["job_seconds"],
                "notes": f"best of {len(mine)}; job clock, from submit (the worker loaded the model "
                f"while the cluster started); token_budget {v['token_budget']}, max_batch {v['max_batch_size']}, rows/item {v['rows_per_item']}",
            }
        )
        table.append(
            {
                "variant": f"{v['name']}: whole command",
                "rows_per_s": e2e["end_to_end_rows_per_s"],
                "padding": v["padding"],
                "ratio": e2e["end_to_end_rows_per_s"] / best_direct,
                "wall_s": e2e["wall_s"],
                "notes": f"best of {len(mine)}; incl. {e2e.get('outside_job_s', '?')} s outside the job "
                "(imports, cluster start with the model load, stop)",
            }
        )
    if args.sweep_only:
        verdict = "Sweep only: no `shoal embed` runs."
    elif verdict_ratio is None:
        verdict = "Verdict: ours failed; no ratio."
    else:
        verdict = (
            f"Verdict: ours (default profile, in-job) / best direct ({best_direct_name}) = {verdict_ratio:.2f}; "
            f"target >= {TARGET_RATIO:.2f}: {'MET' if verdict_ratio >= TARGET_RATIO else 'NOT MET'}."
        )
    if sweep:
        base = next(r for r in sweep if r["token_budget"] is None)
        top = max((r for r in sweep if r["token_budget"] is not None), key=lambda r: r["ratio_vs_direct_median"])
        verdict += (
            f" Sweep: fastest worker config {top['config']}, {top['ratio_vs_direct_median']:.2f}x the paired direct "
            f"baseline ({base['config']}) by median, {top['rows_per_s']:.1f} vs {base['rows_per_s']:.1f} rows/s."
        )
    others = [r["other_cpu_share"] for r in runs + sweep if r.get("other_cpu_share") is not None]
    if others and max(others) > 0.10:
        verdict += (
            f" Note: other processes used up to {max(others):.0%} of the machine during some runs "
            "(shared machine); compare runs with low 'other CPU'."
        )

    results = {
        "conditions": conditions,
        "schedule": f"direct B={batch_sizes[0]}, each ours variant (run 1), "
        f"direct {', '.join(str(b) for b in batch_sizes[1:]) or '-'}, "
        f"each ours variant (runs 2..{args.ours_runs}, order reversed every other round); best ours run counts",
        "variants": variants,
        "runs": runs,
        "sweep": sweep,
        "table": table,
        "best_direct_rows_per_s": best_direct,
        "ratio_ours_in_job_vs_best_direct": verdict_ratio,
        "target_ratio": TARGET_RATIO,
        "verdict": verdict,
    }
    text = markdown(results)
    results["markdown"] = text
    json_path = harness.write_result("batch_throughput", results, args.json, figures(results))
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    print(text)
    log(f"results: {json_path}")
    if args.keep_output:
        log(f"outputs kept under {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    ok = all(r["ok"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
