#!/usr/bin/env python
"""A worker's CPU per row outside the model's forward, stage by stage.

On a GPU the forward of a small encoder takes microseconds per row, so what
the worker does around it (read, tokenize, pad, convert, write) sets the
rate. This measures that work on the real code path of an `embed` item, with
the forward replaced by zeros: a benchmark-only runtime (here, never on a
user's path) that keeps everything else, tokenizing included.

Each stage's CPU is the thread CPU time (``time.thread_time``) spent inside
the functions that make it up, wrapped for the run:

* read: ``embed_operation.read`` (Parquet slice, text column);
* tokenize: every call into the tokenizer (count_tokens, the batches' own tokenizing);
* batching and padding: ``plan_batches`` and padding a batch into tensors;
* forward overhead: the device turn, moving features to the device, the skipped forward's call;
* compute's own Python: the rest of ``compute`` (prompts, chunking when asked, normalizing and
  converting vectors, copying rows into place);
* write: ``embed_operation.write`` (vectors to Arrow, Parquet part);
* the whole item: process CPU of read + compute + write, what any stage list may miss.

Pull loop and events are per item, not per row (a pull, a start, an ack per
item of ``rows_per_item`` rows; benchmarks/scheduler_scale.py measures them).
Run it on the tree before a change and after, side by side:

    .venv/bin/python benchmarks/worker_stages.py --texts 3000 --runtimes torch,onnx --rounds 3
    .venv/bin/python benchmarks/worker_stages.py --code-before /tmp/before   # the same, an older tree beside

Beside the stages: the tokenizer alone (one core; its plain call against the worker's TokenEncoder, on
these texts and on 800-word ones), and with ``--near-free`` ``shoal embed`` on a near-free model, with
each tree: its steady rows/s (from the times its output parts were written, the first quarter and the
last part left out) and its marginal rows/s (a run of 2N rows less one of N), against the tokenizer
alone on every core. ``--near-free-layers 2,0``: the issue's 2-layer model, and one with no layers
(embeddings and pooling: the forward nearly free on a CPU too), whose forward CPU per row the stages
show with the forward kept (``--keep-forward``).

Prints Markdown and writes JSON to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from harness import ROOT, markdown_table

DEFAULT_JSON = str(harness.result_path("worker_stages"))
MAX_WORDS = 800
REST = "compute's own Python"  # compute minus the stages inside it: prompts, chunking, vectors, copies
STAGES = ("read", "tokenize", "batching/padding", "forward overhead", REST, "write")


def texts(count: int) -> list[str]:
    """About `count` paragraphs: every pydoc section (cut to MAX_WORDS words), then demo paragraphs."""
    sections = pq.read_table(ROOT / "datasets" / "pydoc-sections" / "corpus.parquet", columns=["text"])
    long = [" ".join(t.split()[:MAX_WORDS]) for t in sections.column("text").to_pylist() if t]
    demo = [
        t
        for shard in sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
        for t in pq.read_table(shard, columns=["text"]).column("text").to_pylist()
        if t
    ]
    picked = (long + demo)[:count]
    return list(np.random.default_rng(0).permutation(np.array(picked, dtype=object)))


def long_texts(count: int, words: int = MAX_WORDS) -> list[str]:
    """`count` texts of `words` words each, demo paragraphs joined (the shape of a long document, unchunked)."""
    demo = texts(3000)
    rng = np.random.default_rng(1)
    out = []
    for _ in range(count):
        picked: list[str] = []
        while sum(len(p.split()) for p in picked) < words:
            picked.append(demo[int(rng.integers(len(demo)))])
        out.append(" ".join(" ".join(picked).split(" ")[:words]))
    return out


class Clock:
    """Thread CPU seconds per stage, in any thread; a stage entered inside another is charged to the inner one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._local = threading.local()  # each thread's stack of open stages

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        stack: list[tuple[str, float]] = self._local.__dict__.setdefault("stack", [])
        now = time.thread_time()
        if stack:  # pause the outer stage
            outer, began = stack[-1]
            self._add(outer, now - began)
        stack.append((name, now))
        try:
            yield
        finally:
            now = time.thread_time()
            _, began = stack.pop()
            self._add(name, now - began)
            if stack:
                stack[-1] = (stack[-1][0], now)

    def _add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.seconds[name] += seconds

    def wrap(self, owner: Any, attribute: str, name: str) -> None:
        original: Callable[..., Any] = getattr(owner, attribute)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.stage(name):
                return original(*args, **kwargs)

        setattr(owner, attribute, timed)


def wrap_forward(runtime: Any, clock: Clock, keep: bool) -> None:
    """The model's forward kept and timed as "forward" (`keep`; one torch thread: all of its CPU), or replaced
    by zeros of the right shape, its call timed as "forward overhead" (a benchmark-only runtime: everything
    around it kept, tokenizing included)."""
    dim = runtime.spec.dim

    def forward(compute: Callable[[], Any], rows: int, zeros: Callable[[int], Any]) -> Any:
        if keep:
            with clock.stage("forward"):
                return compute()
        with clock.stage("forward overhead"):
            return zeros(rows)

    if hasattr(runtime, "session"):  # ONNX
        session = runtime.session

        class Session:
            def run(self, outputs: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
                rows = len(next(iter(inputs.values())))
                return forward(
                    lambda: session.run(outputs, inputs), rows, lambda n: [np.zeros((n, dim), dtype=np.float32)]
                )

        runtime.session = Session()
        return
    import torch

    model = runtime.model

    class Model:
        """The model's modules, its call timed or skipped: preprocess and attributes pass through."""

        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
            rows = len(features["input_ids"])
            return forward(
                lambda: model(features),
                rows,
                lambda n: {"sentence_embedding": torch.zeros((n, dim), dtype=torch.float32)},
            )

    runtime.model = Model()


def instrument(runtime: Any, clock: Clock) -> None:
    """Wrap the functions each stage is made of, in this tree's modules (absent ones are skipped)."""
    import shoal.workers.batching.token_batching as batching
    import shoal.workers.operations.embed_operation as embed
    import shoal.workers.runtimes.embedder as embedder
    import shoal.workers.runtimes.onnx_runtime as onnx_runtime

    clock.wrap(batching, "plan_batches", "batching/padding")
    for module in (embedder, onnx_runtime):
        for name in ("count_tokens", "tokenize_once"):
            if hasattr(module, name):
                clock.wrap(module, name, "tokenize")
        for name in ("pad_batch",):
            if hasattr(module, name):
                clock.wrap(module, name, "batching/padding")
    encoder = getattr(runtime, "encoder", None)  # tokenized once (token_counts.TokenEncoder), in its thread
    if encoder is not None:
        clock.wrap(encoder, "encode", "tokenize")
        if hasattr(encoder, "_encodings"):  # a share of a long list, in each tokenizing thread
            clock.wrap(encoder, "_encodings", "tokenize")
        clock.wrap(encoder, "pad", "batching/padding")
    tokenizer = runtime.tokenizer
    backend = getattr(tokenizer, "backend", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None:
        for name in ("encode_batch", "encode_batch_fast"):
            if hasattr(type(backend), name):
                try:
                    clock.wrap(backend, name, "tokenize")
                except (AttributeError, TypeError):
                    pass  # a Rust object that refuses attributes: counted through its callers
    if hasattr(runtime, "model"):
        clock.wrap(runtime.model, "preprocess", "tokenize")  # tokenizes and pads: charged to tokenize
    if hasattr(embedder, "batch_to_device"):
        clock.wrap(embedder, "batch_to_device", "forward overhead")
    clock.wrap(runtime.device_thread, "turn", "forward overhead")
    clock.wrap(embed, "read", "read")
    clock.wrap(embed, "write", "write")


def measure(
    runtime_name: str,
    count: int,
    rounds: int,
    scratch: Path,
    catalog: str | None,
    model: str,
    profile_name: str,
    keep_forward: bool = False,
) -> dict[str, Any]:
    """Per-row µs of each stage and of the whole item, best round, on this tree's code; `keep_forward`:
    the model's forward runs (its CPU is then the rest of "compute's own Python", shown as "forward")."""
    import torch

    from shoal.configs import RuntimeChoice, load_catalog, load_profile
    from shoal.workers.devices import apply_torch_threads, detect_device
    from shoal.workers.operations import embed_operation
    from shoal.workers.runtimes import Embedder, load_runtime

    rows = texts(count)
    scratch.mkdir(parents=True, exist_ok=True)
    shard = scratch / "input.parquet"
    pq.write_table(pa.table({"id": [f"t{i}" for i in range(len(rows))], "text": rows}), shard)
    profile = load_profile(profile_name)
    plan = detect_device(profile, {})
    apply_torch_threads(plan)
    spec = load_catalog(catalog).get(model)
    choice = RuntimeChoice.model_validate({"runtime": runtime_name, "dtype": "float32"})

    def load() -> Embedder:
        """The runtime, then one torch thread (the load sets the plan's): thread CPU is then the work's."""
        loaded = cast(Embedder, load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan))
        torch.set_num_threads(1)
        return loaded

    runtime = load()
    best: dict[str, float] | None = None
    for r in range(rounds + 1):  # the first round warms caches, and is not counted
        clock = Clock()
        wrap_forward(runtime, clock, keep_forward)
        instrument(runtime, clock)
        payload: dict[str, Any] = {
            "input": str(shard),
            "output": str(scratch / f"part-{r}.parquet"),
            "part": f"part-{r}",
            "row_groups": None,
            "rows": None,
            "text_column": "text",
            "id_column": "id",
            "keep_columns": [],
        }
        cpu, wall = time.process_time(), time.perf_counter()
        data = embed_operation.read(payload)  # type: ignore[arg-type]
        with clock.stage(REST):
            computed = embed_operation.compute(runtime, data)
        embed_operation.write(payload, data, computed, spec)  # type: ignore[arg-type]
        per_row = {name: clock.seconds.get(name, 0.0) * 1e6 / len(rows) for name in STAGES}
        if keep_forward:
            per_row["forward"] = clock.seconds.get("forward", 0.0) * 1e6 / len(rows)
        per_row["whole item (process CPU)"] = (time.process_time() - cpu) * 1e6 / len(rows)
        per_row["whole item (wall)"] = (time.perf_counter() - wall) * 1e6 / len(rows)
        print(f"  {runtime_name} round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in per_row.items()), flush=True)
        if r and (best is None or per_row["whole item (process CPU)"] < best["whole item (process CPU)"]):
            best = per_row
        runtime = load()
    assert best is not None
    tokens = runtime.token_lengths(rows)[0]
    return {
        "runtime": runtime_name,
        "texts": len(rows),
        "mean_tokens": round(float(tokens.mean()), 1),
        "us_per_row": {k: round(v, 1) for k, v in best.items()},
    }


def minilm_tokenizer() -> Any:
    """MiniLM's tokenizer as its file sets it up, less its padding: the plain call, truncated at 256."""
    from tokenizers import Tokenizer

    from shoal.configs import load_catalog

    backend = Tokenizer.from_file(str(Path(load_catalog().get("minilm").resolve_path()) / "tokenizer.json"))
    backend.no_padding()
    backend.enable_truncation(256)
    return backend


def tokenizer_alone(count: int, rounds: int) -> dict[str, float]:
    """µs of CPU per row on one core: MiniLM's tokenizer alone (its plain call, truncated) and the worker's
    TokenEncoder (this tree's), over these texts and over 800-word texts."""
    backend = minilm_tokenizer()
    try:
        from shoal.workers.runtimes.token_counts import TokenEncoder

        encoder: Any = TokenEncoder(backend, 256, 0, 0, "right")
    except (ImportError, TypeError):  # an older tree: no TokenEncoder (or another signature)
        encoder = None
    per_row = {}
    for label, rows in (("texts", texts(count)), ("800-word texts", long_texts(max(count // 5, 100)))):
        calls = {"tokenizer alone": lambda rows=rows: backend.encode_batch(rows)}
        if encoder is not None:
            calls["TokenEncoder"] = lambda rows=rows: encoder.encode(rows)
        for name, call in calls.items():
            best = float("inf")
            for _ in range(rounds):
                began = time.process_time()
                call()
                best = min(best, time.process_time() - began)
            per_row[f"{name}, {label}"] = round(best * 1e6 / len(rows), 1)
    return per_row


def tokenizer_on_all_cores(rows: list[str], rounds: int) -> float:
    """Rows/s of MiniLM's tokenizer alone on every core (its own thread pool), best of `rounds`."""
    backend = minilm_tokenizer()
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        best = float("inf")
        for _ in range(rounds):
            began = time.perf_counter()
            backend.encode_batch(rows)
            best = min(best, time.perf_counter() - began)
    finally:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return round(len(rows) / best, 1)


def near_free_model(scratch: Path, layers: int) -> Path:
    """A catalog naming "near-free": a random BERT of width 32 and `layers` layers with MiniLM's tokenizer."""
    import shutil as files

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel

    from shoal.configs import load_catalog

    minilm = Path(load_catalog().get("minilm").resolve_path())
    root = scratch.resolve() / f"layers-{layers}"  # the catalog names the model's folder: absolute
    backbone, folder = root / "backbone", root / "tiny"
    if not folder.is_dir():
        torch.manual_seed(0)
        backbone.mkdir(parents=True, exist_ok=True)
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            files.copy(minilm / name, backbone / name)
        shape: dict[str, Any] = {
            "num_hidden_layers": layers,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_attention_heads": 2,
        }
        BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, **shape)).save_pretrained(backbone)
        transformer = Transformer(str(backbone), max_seq_length=256)
        SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="mean")]).save(str(folder))
    catalog = root / "catalog.yaml"
    entry = {"kind": "embedder", "source": str(folder), "dim": 32, "max_seq_length": 256}
    catalog.write_text(json.dumps({"models": {"near-free": entry}}))
    return catalog


def steady_rows_per_s(out: Path) -> float:
    """Rows/s while every worker computes: from the times the output parts were written, the first quarter
    (model loads, the first items) and the last part (one worker left) left out."""
    parts = sorted((p.stat().st_mtime, pq.read_metadata(p).num_rows) for p in out.glob("part-*.parquet"))
    first = max(1, len(parts) // 4)
    kept = parts[first:-1]
    if len(kept) < 2:
        return 0.0
    return sum(rows for _, rows in kept[1:]) / max(kept[-1][0] - kept[0][0], 1e-9)


# Machines a near-free run may stand for: this one, or this one with bf16 treated as absent (the issue's
# AVX2 machine: auto's layout is then one worker process on every core, not one per core).
MACHINES = {"this": {}, "no-bf16": {"SHOAL_NO_BF16": "1"}}


def near_free(
    scratch: Path, count: int, rows: int, rounds: int, layers: list[int], trees: dict[str, str], machines: list[str]
) -> list[dict[str, Any]]:
    """`shoal embed` with no flags on the near-free models, the trees in turn within each round: steady and
    marginal rows/s (best of `rounds`), against MiniLM's tokenizer alone on every core over the same texts,
    measured right after each model and machine's runs (the load drifts)."""
    picked = texts(count)
    for n in (rows, 2 * rows):
        shard = scratch / f"in-{n}" / "part-0.parquet"
        shard.parent.mkdir(parents=True, exist_ok=True)
        repeated = (picked * (n // len(picked) + 1))[:n]
        pq.write_table(pa.table({"id": [f"t{i}" for i in range(n)], "text": repeated}), shard)
    results: list[dict[str, Any]] = []
    for depth in layers:
        catalog = near_free_model(scratch, depth)
        for machine in machines:
            seconds: dict[str, dict[int, float]] = {label: {} for label in trees}
            steady = dict.fromkeys(trees, 0.0)
            loads: list[float] = []
            for r in range(rounds + 1):  # round 0 caches auto's verdicts (as after a first use), untimed
                labels = list(trees)
                for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
                    for n in (rows, 2 * rows) if r else (rows,):
                        began = time.perf_counter()
                        out = embed_near_free(scratch, n, catalog, trees[label], label, MACHINES[machine])
                        if r:
                            took = time.perf_counter() - began
                            seconds[label][n] = min(seconds[label].get(n, float("inf")), took)
                            if n == 2 * rows:
                                steady[label] = max(steady[label], steady_rows_per_s(out))
                            loads.append(harness.load_average())
            alone = tokenizer_on_all_cores(picked, 3)
            for label in trees:
                marginal = rows / max(seconds[label][2 * rows] - seconds[label][rows], 1e-9)
                results.append(
                    {
                        "layers": depth,
                        "machine": machine,
                        "tree": label,
                        "seconds": {str(n): round(v, 2) for n, v in seconds[label].items()},
                        "steady_rows_per_s": round(steady[label], 1),
                        "marginal_rows_per_s": round(marginal, 1),
                        "tokenizer_alone_all_cores_rows_per_s": alone,
                        "steady_vs_tokenizer": round(steady[label] / alone, 2),
                        "marginal_vs_tokenizer": round(marginal / alone, 2),
                        "load_average": [min(loads), max(loads)],
                    }
                )
                print(f"  near-free: {results[-1]}", flush=True)
    return results


def embed_near_free(scratch: Path, n: int, catalog: Path, tree: str, label: str, machine: dict[str, str]) -> Path:
    """One `shoal embed` of `n` rows on the near-free model, no flags, with `tree`'s code; its output folder."""
    import shutil as files

    out = scratch / f"out-{label.replace(' ', '-')}-{n}"
    files.rmtree(out, ignore_errors=True)
    command = [harness.venv_command("shoal"), "embed", str(scratch / f"in-{n}"), str(out)]
    command += ["--model", "near-free", "--catalog", str(catalog)]
    env = {**os.environ, "SHOAL_PROFILE": "", "SHOAL_AUTO_MEASURE": "wait", "PYTHONPATH": tree, **machine}
    subprocess.run(command, check=True, capture_output=True, env=env, cwd=tree)
    return out


def near_free_stages(scratch: Path, count: int, rounds: int, layers: list[int]) -> dict[str, Any]:
    """The stages with the near-free models' forward kept, this tree, torch: what the forward costs per row."""
    by_depth = {}
    for depth in layers:
        catalog = near_free_model(scratch, depth)
        command = [sys.executable, str(Path(__file__)), "--one", "torch", "--texts", str(count), "--keep-forward"]
        command += ["--rounds", str(rounds), "--catalog", str(catalog), "--model", "near-free"]
        command += ["--scratch", str(scratch / f"stages-{depth}")]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode:
            raise SystemExit(f"near-free stages failed:\n{done.stderr[-3000:]}")
        by_depth[f"{depth} layers"] = json.loads(done.stdout.strip().splitlines()[-1])["us_per_row"]
    return by_depth


def figures(results: dict[str, Any]) -> list[harness.Figure]:
    """A worker's CPU per row outside the forward (the whole item), per runtime and tree; the tokenizer alone."""
    found = [
        harness.Figure(
            f"{row['runtime']} {row['tree']}: CPU per row outside the forward",
            row["us_per_row"].get("whole item (process CPU)", "-"),
            "us",
        )
        for row in results["rows"]
    ]
    found += [
        harness.Figure(f"tokenizer alone, {call}", value, "us per row")
        for call, value in results["tokenizer_us_per_row"].items()
    ]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtimes", default="torch,onnx")
    parser.add_argument(
        "--code-before", action="append", default=[], help="an older tree, measured beside this one (repeatable)"
    )
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-worker-stages"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    parser.add_argument("--catalog", default=None, help="a catalog file naming --model (benchmarks/gpu_check.py's)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--profile", default="cpu-local", help="the device plan's profile (auto: a GPU where there is one)"
    )
    parser.add_argument("--skip-stages", action="store_true", help="only the tokenizer and --near-free figures")
    parser.add_argument(
        "--near-free", action="store_true", help="also: shoal embed's steady and marginal rows/s on a near-free model"
    )
    parser.add_argument("--near-free-rows", type=int, default=24000, help="N: runs of N and 2N rows")
    parser.add_argument("--near-free-rounds", type=int, default=2)
    parser.add_argument("--near-free-layers", default="2,0")
    parser.add_argument("--near-free-machines", default="this,no-bf16", help=f"of {', '.join(MACHINES)}")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's runtime: print its JSON
    parser.add_argument("--keep-forward", action="store_true", help=argparse.SUPPRESS)  # with --one
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if args.one:
        scratch = Path(args.scratch) / args.one
        measured = measure(
            args.one, args.texts, args.rounds, scratch, args.catalog, args.model, args.profile, args.keep_forward
        )
        print(json.dumps(measured))
        return
    before = {f"before {Path(tree).name}": str(Path(tree).resolve()) for tree in args.code_before}
    trees = {**before, "after": str(ROOT)}
    results: dict[str, Any] = {"texts": args.texts, "rounds": args.rounds, "trees": trees, "rows": []}
    results["load_average_at_start"] = harness.load_average()
    for runtime_name in [] if args.skip_stages else args.runtimes.split(","):
        for label, tree in trees.items():  # the older trees first, then this one, per runtime
            command = [sys.executable, str(Path(tree) / "benchmarks" / "worker_stages.py"), "--one", runtime_name]
            command += ["--texts", str(args.texts), "--rounds", str(args.rounds), "--model", args.model]
            command += ["--profile", args.profile, *(["--catalog", args.catalog] if args.catalog else [])]
            command += ["--scratch", str(Path(args.scratch) / label.replace(" ", "-"))]
            env = {**os.environ, "PYTHONPATH": tree}
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
            if done.returncode:
                raise SystemExit(f"{label} {runtime_name} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results["rows"].append({"tree": label, **row})
    results["tokenizer_us_per_row"] = tokenizer_alone(args.texts, args.rounds)
    if args.near_free:
        layers = [int(x) for x in args.near_free_layers.split(",")]
        scratch = Path(args.scratch) / "near-free"
        results["near_free_stages_us_per_row"] = near_free_stages(scratch, args.texts, args.rounds, layers)
        machines = args.near_free_machines.split(",")
        results["near_free_rows"] = args.near_free_rows
        results["near_free"] = near_free(
            scratch, args.texts, args.near_free_rows, args.near_free_rounds, layers, trees, machines
        )
    results["load_average_at_end"] = harness.load_average()
    harness.write_result("worker_stages", results, args.json, figures(results))
    report(results)


def report(results: dict[str, Any]) -> None:
    """The figures as Markdown tables."""
    names = [*STAGES, "whole item (process CPU)", "whole item (wall)"]
    if results["rows"]:
        print(f"\nCPU µs per row outside the forward, {results['texts']} texts, best of {results['rounds']} rounds:\n")
        for line in markdown_table(
            ["stage", *(f"{r['runtime']} {r['tree']}" for r in results["rows"])],
            [[name, *(r["us_per_row"].get(name, "-") for r in results["rows"])] for name in names],
        ):
            print(line)
    print("\nTokenizer, CPU µs per row on one core:\n")
    for line in markdown_table(["call, texts", "µs/row"], list(results["tokenizer_us_per_row"].items())):
        print(line)
    if "near_free" in results:
        stages = results["near_free_stages_us_per_row"]
        print("\nNear-free models, torch, forward kept, CPU µs per row:\n")
        for line in markdown_table(
            ["stage", *stages], [[name, *(s.get(name, "-") for s in stages.values())] for name in [*names, "forward"]]
        ):
            print(line)
        print(f"\nshoal embed, near-free models, N = {results['near_free_rows']} and 2N rows:\n")
        columns = ["layers", "machine", "tree", "steady rows/s", "marginal rows/s", "tokenizer alone, all cores"]
        columns += ["steady vs tokenizer", "marginal vs tokenizer", "load"]
        keys = ["layers", "machine", "tree", "steady_rows_per_s", "marginal_rows_per_s"]
        keys += ["tokenizer_alone_all_cores_rows_per_s", "steady_vs_tokenizer", "marginal_vs_tokenizer", "load_average"]
        rows = [[r[k] for k in keys] for r in results["near_free"]]
        for line in markdown_table(columns, rows):
            print(line)
    print(f"\nload average: {results['load_average_at_start']} at start, {results['load_average_at_end']} at end")


if __name__ == "__main__":
    main()
