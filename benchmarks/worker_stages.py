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


def skip_forward(runtime: Any, clock: Clock) -> None:
    """The runtime's forward replaced by zeros of the right shape; everything around it kept (benchmark only)."""
    dim = runtime.spec.dim
    if hasattr(runtime, "session"):  # ONNX

        class Session:
            def run(self, outputs: Any, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
                with clock.stage("forward overhead"):
                    return [np.zeros((len(next(iter(inputs.values()))), dim), dtype=np.float32)]

        runtime.session = Session()
        return
    import torch

    model = runtime.model

    class Model:
        """The model's modules, its call skipped: preprocess and attributes pass through."""

        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
            with clock.stage("forward overhead"):
                rows = len(features["input_ids"])
                return {"sentence_embedding": torch.zeros((rows, dim), dtype=torch.float32)}

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
    runtime_name: str, count: int, rounds: int, scratch: Path, catalog: str | None, model: str, profile_name: str
) -> dict[str, Any]:
    """Per-row µs of each stage and of the whole item, best round, on this tree's code."""
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
    torch.set_num_threads(1)  # the forward is skipped: one thread, so thread CPU is the work's
    spec = load_catalog(catalog).get(model)
    choice = RuntimeChoice.model_validate({"runtime": runtime_name, "dtype": "float32"})
    runtime = cast(Embedder, load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan))
    best: dict[str, float] | None = None
    for r in range(rounds + 1):  # the first round warms caches, and is not counted
        clock = Clock()
        skip_forward(runtime, clock)
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
        per_row["whole item (process CPU)"] = (time.process_time() - cpu) * 1e6 / len(rows)
        per_row["whole item (wall)"] = (time.perf_counter() - wall) * 1e6 / len(rows)
        print(f"  {runtime_name} round {r}: " + ", ".join(f"{k} {v:.1f}" for k, v in per_row.items()), flush=True)
        if r and (best is None or per_row["whole item (process CPU)"] < best["whole item (process CPU)"]):
            best = per_row
        runtime = cast(Embedder, load_runtime(spec.model_copy(update={"runtimes": {plan.kind: choice}}), plan))
    assert best is not None
    tokens = runtime.token_lengths(rows)[0]
    return {
        "runtime": runtime_name,
        "texts": len(rows),
        "mean_tokens": round(float(tokens.mean()), 1),
        "us_per_row": {k: round(v, 1) for k, v in best.items()},
    }


def tokenizer_alone(count: int, rounds: int) -> float:
    """µs of CPU per row of MiniLM's tokenizer alone (truncated to the window), one call over all texts."""
    from tokenizers import Tokenizer

    from shoal.configs import load_catalog

    spec = load_catalog().get("minilm")
    backend = Tokenizer.from_file(str(Path(spec.resolve_path()) / "tokenizer.json"))
    backend.enable_truncation(spec.max_seq_length)
    rows = texts(count)
    best = float("inf")
    for _ in range(rounds):
        began = time.process_time()
        backend.encode_batch(rows)
        best = min(best, time.process_time() - began)
    return round(best * 1e6 / len(rows), 1)


def near_free(scratch: Path, count: int) -> dict[str, Any]:
    """`shoal embed`'s marginal rows/s on a random 2-layer BERT of width 32 with MiniLM's tokenizer, no flags,
    against that tokenizer alone on all cores (its own thread pool), over the same texts.

    Marginal: the rows of a run of 2N rows less a run of N, over the seconds between them, so the
    command's start and stop cancel out.
    """
    import shutil as files

    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Pooling, Transformer
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertModel

    from shoal.configs import load_catalog

    minilm = Path(load_catalog().get("minilm").resolve_path())
    scratch = scratch.resolve()  # the catalog names the model's folder: absolute, not relative to the catalog
    scratch.mkdir(parents=True, exist_ok=True)
    backbone, folder = scratch / "backbone", scratch / "tiny"
    if not folder.is_dir():
        torch.manual_seed(0)
        backbone.mkdir(exist_ok=True)
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            files.copy(minilm / name, backbone / name)
        shape: dict[str, Any] = {
            "num_hidden_layers": 2,
            "hidden_size": 32,
            "intermediate_size": 37,
            "num_attention_heads": 2,
        }
        BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, **shape)).save_pretrained(backbone)
        transformer = Transformer(str(backbone), max_seq_length=256)
        SentenceTransformer(modules=[transformer, Pooling(32, pooling_mode="mean")]).save(str(folder))
    catalog = scratch / "catalog.yaml"
    entry = {"kind": "embedder", "source": str(folder), "dim": 32, "max_seq_length": 256}
    catalog.write_text(json.dumps({"models": {"near-free": entry}}))
    rows = texts(count)
    seconds = {}
    for n in (count, 2 * count):
        shard = scratch / f"in-{n}" / "part-0.parquet"
        shard.parent.mkdir(exist_ok=True)
        picked = (rows * (n // len(rows) + 1))[:n]
        pq.write_table(pa.table({"id": [f"t{i}" for i in range(n)], "text": picked}), shard)
        out = scratch / f"out-{n}"
        files.rmtree(out, ignore_errors=True)
        command = [harness.venv_command("shoal"), "embed", str(shard.parent), str(out), "--model", "near-free"]
        env = {**os.environ, "SHOAL_PROFILE": "", "SHOAL_AUTO_MEASURE": "wait"}
        subprocess.run([*command, "--catalog", str(catalog)], check=True, capture_output=True, env=env)  # verdicts
        files.rmtree(out, ignore_errors=True)
        began = time.perf_counter()
        subprocess.run([*command, "--catalog", str(catalog)], check=True, capture_output=True, env=env)
        seconds[n] = time.perf_counter() - began
    marginal = count / max(seconds[2 * count] - seconds[count], 1e-9)
    backend = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    backend.enable_truncation(256)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"  # all cores: the tokenizer's own pool
    began = time.perf_counter()
    backend.encode_batch(rows)
    alone = len(rows) / (time.perf_counter() - began)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    return {
        "seconds": {str(n): round(s, 2) for n, s in seconds.items()},
        "marginal_rows_per_s": round(marginal, 1),
        "tokenizer_alone_rows_per_s": round(alone, 1),
        "ratio": round(marginal / alone, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runtimes", default="torch,onnx")
    parser.add_argument("--code-before", default=None, help="an older tree, measured beside this one in turn")
    parser.add_argument("--scratch", default=str(ROOT / "out" / "bench-worker-stages"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    parser.add_argument("--catalog", default=None, help="a catalog file naming --model (benchmarks/gpu_check.py's)")
    parser.add_argument("--model", default="minilm")
    parser.add_argument(
        "--profile", default="cpu-local", help="the device plan's profile (auto: a GPU where there is one)"
    )
    parser.add_argument(
        "--near-free", action="store_true", help="also: shoal embed's marginal rows/s on a near-free model"
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's runtime: print its JSON
    args = parser.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if args.one:
        scratch = Path(args.scratch) / args.one
        print(json.dumps(measure(args.one, args.texts, args.rounds, scratch, args.catalog, args.model, args.profile)))
        return
    trees = {"after": str(ROOT), **({"before": args.code_before} if args.code_before else {})}
    results: dict[str, Any] = {"texts": args.texts, "rounds": args.rounds, "trees": trees, "rows": []}
    for runtime_name in args.runtimes.split(","):
        for label in sorted(trees, key=lambda t: t != "before"):  # before, then after, per runtime
            tree = trees[label]
            command = [sys.executable, str(Path(tree) / "benchmarks" / "worker_stages.py"), "--one", runtime_name]
            command += ["--texts", str(args.texts), "--rounds", str(args.rounds), "--model", args.model]
            command += ["--profile", args.profile, *(["--catalog", args.catalog] if args.catalog else [])]
            command += ["--scratch", str(Path(args.scratch) / label)]
            env = {**os.environ, "PYTHONPATH": tree}
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree)
            if done.returncode:
                raise SystemExit(f"{label} {runtime_name} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            results["rows"].append({"tree": label, **row})
    results["tokenizer_alone_us_per_row"] = tokenizer_alone(args.texts, args.rounds)
    if args.near_free:
        results["near_free"] = near_free(Path(args.scratch) / "near-free", args.texts)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    names = [*STAGES, "whole item (process CPU)", "whole item (wall)"]
    print(f"\nCPU µs per row outside the forward, {args.texts} texts, best of {args.rounds} rounds:\n")
    for line in markdown_table(
        ["stage", *(f"{r['runtime']} {r['tree']}" for r in results["rows"])],
        [[name, *(r["us_per_row"][name] for r in results["rows"])] for name in names],
    ):
        print(line)
    print(f"\nMiniLM's tokenizer alone (Rust, one call, truncated): {results['tokenizer_alone_us_per_row']} µs/row")
    if "near_free" in results:
        print(f"\nNear-free model: {json.dumps(results['near_free'])}")


if __name__ == "__main__":
    main()
