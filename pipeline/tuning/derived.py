"""Profiles for GPUs we could not measure, derived from their published figures.

`shoal tune` measures; where no such GPU was at hand, these profiles are
arithmetic instead, and say so in the file: every knob comes from the
device's memory, dense FP16 tensor throughput and memory bandwidth, the
model's shape (its config.json), a host-side rate measured on a CPU core, and
a few stated assumptions. Re-run `shoal tune` on the real device to replace
them with measurements.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...configs import LEASE_SECONDS, MAX_ATTEMPTS, Catalog, ModelSpec
from .profile import ProfileFields

# Assumptions, stated once; each one appears in the derivation it feeds.
EFFICIENCY = 0.30  # achieved share of dense FP16 peak: skinny (d <= 1024) GEMMs, eager PyTorch
BATCH_OVERHEAD_S = 0.0015  # per forward pass: ~100 kernel launches plus Python, for a small encoder
OVERHEAD_SHARE = 0.10  # a batch should cost >= 10x its fixed overhead
SHORT_TEXT_TOKENS = 32  # batch cap: a budget's worth of short texts still fits one batch
MEAN_TEXT_TOKENS = 64  # a typical English passage, in tokens (DESIGN.md)
HOST_TOKENS_PER_S = (
    369_000 // 2
)  # per worker: a fast tokenizer's rate on one CPU core, halved: each text is tokenized twice
ITEM_COMPUTE_S = 0.25  # an item's compute: amortizes per-item I/O, and bounds online waits under batch load
IO_SECONDS_PER_ITEM = 0.05 + 0.05  # object-store GET + PUT latency, before bytes
IO_BYTES_PER_S = 100e6  # one stream to an object store
CUDA_CONTEXT_BYTES = 500e6  # per worker process
ALLOCATOR_SLACK = 0.9  # keep 10 % of a worker's share for fragmentation
MAX_WORKERS_PER_GPU = 8  # beyond this, CUDA contexts time-slice more than they overlap


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gb: float
    fp16_tflops: float  # dense, tensor cores (the sparse figure halved)
    bandwidth_gbs: float
    vcpus: int  # host vCPUs per GPU on a typical instance
    source: str


GPUS = {
    "l4": Gpu("NVIDIA L4", 24, 121, 300, 8, "NVIDIA L4 datasheet (242 TFLOPS FP16 sparse); GCP g2-standard-8"),
    "a100-80gb": Gpu(
        "NVIDIA A100 80GB SXM", 80, 312, 2039, 12, "NVIDIA A100 datasheet (624 TFLOPS FP16 sparse); GCP a2-ultragpu-1g"
    ),
    "h100": Gpu(
        "NVIDIA H100 SXM 80GB",
        80,
        989,
        3350,
        26,
        "NVIDIA H100 datasheet (1,979 TFLOPS FP16 sparse); GCP a3-highgpu-8g (208 vCPU / 8)",
    ),
    "h200": Gpu(
        "NVIDIA H200 SXM 141GB",
        141,
        989,
        4800,
        24,
        "NVIDIA H200 datasheet (1,979 TFLOPS FP16 sparse); AWS p5e.48xlarge (192 vCPU / 8)",
    ),
}


@dataclass(frozen=True)
class Shape:
    """What the arithmetic needs of a model: from its config.json."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    params: int  # all parameters, embeddings included: its weights' size

    @classmethod
    def of(cls, spec: ModelSpec) -> Shape:
        config = json.loads((Path(spec.resolve_path()) / "config.json").read_text())
        layers, hidden = config["num_hidden_layers"], config["hidden_size"]
        ffn, heads = config["intermediate_size"], config["num_attention_heads"]
        per_layer = 4 * hidden * hidden + 2 * hidden * ffn
        embeddings = (config["vocab_size"] + config.get("max_position_embeddings", 512)) * hidden
        return cls(layers, hidden, ffn, heads, layers * per_layer + embeddings)

    def flops_per_token(self, tokens: int) -> float:
        """Dense matmuls (embedding lookups cost none) plus attention at `tokens` long."""
        return self.layers * (2 * (4 * self.hidden**2 + 2 * self.hidden * self.ffn) + 4 * tokens * self.hidden)

    def activation_bytes_per_token(self, tokens: int) -> float:
        """Peak of one layer in fp16, eager attention (scores and softmax kept), the worst case."""
        return 2 * (2 * self.heads * tokens + self.ffn + 4 * self.hidden)


def derive(key: str, catalog: Catalog, models: list[str]) -> tuple[ProfileFields, list[str]]:
    """Profile fields for GPU `key`, sized for `models` (the first sets the layout), and the working."""
    gpu = GPUS[key]
    peak = gpu.fp16_tflops * 1e12
    today = dt.date.today().isoformat()
    lines = [
        f"Written {today} by `shoal tune --profile {key} --derive {key} --models {','.join(models)}`.",
        f"DERIVED, not measured: no {gpu.name} was available when this was written. Replace it with",
        f"`shoal tune --profile {key}` on the device. Published figures: {gpu.memory_gb:g} GB, "
        f"{gpu.fp16_tflops:g} TFLOPS dense FP16/BF16, {gpu.bandwidth_gbs:,.0f} GB/s; {gpu.vcpus} host vCPUs per GPU",
        f"({gpu.source}).",
        f"Assumptions: {EFFICIENCY:.0%} of peak achieved; {BATCH_OVERHEAD_S * 1e3:g} ms fixed cost per forward pass;",
        f"{HOST_TOKENS_PER_S:,} tokens/s of host work per worker process (tokenizer measured on one CPU core,",
        f"run twice per text); {MEAN_TEXT_TOKENS} tokens per typical text; {IO_SECONDS_PER_ITEM * 1e3:.0f} ms + bytes at",
        f"{IO_BYTES_PER_S / 1e6:.0f} MB/s of object-store I/O per item.",
        "",
        "dtype float16: same tensor throughput as bfloat16 on this GPU, 3 more mantissa bits, so vectors stay",
        "closer to the fp32 reference; small encoders' activations stay far inside fp16's range.",
    ]
    budgets: dict[str, int] = {}
    caps: dict[str, int] = {}
    rates: dict[str, float] = {}
    shapes: dict[str, Shape] = {}
    for name in models:
        spec = catalog.get(name)
        shape = shapes[name] = Shape.of(spec)
        flops = shape.flops_per_token(spec.max_seq_length // 2)
        batch_seconds = BATCH_OVERHEAD_S / OVERHEAD_SHARE
        exact = batch_seconds * EFFICIENCY * peak / flops
        budgets[name] = _power_of_two(exact)
        caps[name] = _power_of_two(budgets[name] / SHORT_TEXT_TOKENS)
        rates[name] = EFFICIENCY * peak / flops
        intensity = budgets[name] * flops / (shape.params * 2)
        ridge = peak / (gpu.bandwidth_gbs * 1e9)
        lines += [
            "",
            f"{name}: {shape.layers} layers, hidden {shape.hidden}, ffn {shape.ffn}: "
            f"{flops / 1e6:.1f} MFLOP/token at {spec.max_seq_length // 2} tokens.",
            f"  token budget = {batch_seconds * 1e3:g} ms x {EFFICIENCY} x {gpu.fp16_tflops:g}e12 / {flops / 1e6:.1f}e6 "
            f"= {exact:,.0f} -> {budgets[name]:,} (power of two)",
            f"  max batch = {budgets[name]:,} / {SHORT_TEXT_TOKENS} tokens = {caps[name]:,}",
            f"  compute bound: {intensity:,.0f} FLOP per weight byte per batch >> ridge {peak:.3g} / "
            f"{gpu.bandwidth_gbs:g}e9 = {ridge:.0f}, so bandwidth does not limit the budget",
            f"  GPU rate = {EFFICIENCY} x {gpu.fp16_tflops:g}e12 / {flops / 1e6:.1f}e6 = {rates[name] / 1e6:.2f}M tokens/s",
        ]
    first = models[0]
    wanted = math.ceil(rates[first] / HOST_TOKENS_PER_S)
    workers = max(1, min(wanted, gpu.vcpus // 2, MAX_WORKERS_PER_GPU))
    lines += [
        "",
        f"workers per GPU = min(GPU rate / host rate = {rates[first] / 1e6:.2f}M / {HOST_TOKENS_PER_S / 1e6:.3f}M "
        f"-> {wanted}, vCPUs / 2 = {gpu.vcpus // 2}, {MAX_WORKERS_PER_GPU}) = {workers}",
        "  (processes overlap one another's tokenizing with the GPU; `workers` is processes per GPU: on a",
        "  multi-GPU host start that many `dask worker` per CUDA_VISIBLE_DEVICES value)",
    ]
    worker_tokens = min(rates[first] / workers, HOST_TOKENS_PER_S)
    worker_rows = worker_tokens / MEAN_TEXT_TOKENS
    rows_per_item = _power_of_two(worker_rows * ITEM_COMPUTE_S)
    compute_s = rows_per_item / worker_rows
    dim = catalog.get(first).dim
    io_s = IO_SECONDS_PER_ITEM + rows_per_item * (MEAN_TEXT_TOKENS * 4 + dim * 4) / IO_BYTES_PER_S
    prefetch = min(4, 1 + math.ceil(io_s / compute_s))
    lines += [
        f"per worker: min({rates[first] / 1e6:.2f}M / {workers}, {HOST_TOKENS_PER_S / 1e6:.3f}M) tokens/s "
        f"/ {MEAN_TEXT_TOKENS} = {worker_rows:,.0f} rows/s",
        f"rows_per_item = {worker_rows:,.0f} x {ITEM_COMPUTE_S} s = {worker_rows * ITEM_COMPUTE_S:,.0f} -> "
        f"{rows_per_item:,} ({compute_s:.2f} s of compute: also about the longest an online request waits",
        "  behind a batch item)",
        f"prefetch = 1 + ceil(I/O {io_s:.2f} s / compute {compute_s:.2f} s) = {1 + math.ceil(io_s / compute_s)}, "
        f"at most 4 = {prefetch}",
    ]
    share = gpu.memory_gb * 1e9 / workers
    activations = max(budgets[n] * shapes[n].activation_bytes_per_token(catalog.get(n).max_seq_length) for n in models)
    model_bytes = (share - CUDA_CONTEXT_BYTES - activations) * ALLOCATOR_SLACK
    fraction = math.floor(model_bytes / (gpu.memory_gb * 1e9) * 1000) / 1000
    held = {n: int(fraction * gpu.memory_gb * 1e9 // (shapes[n].params * 2)) for n in models}
    lines += [
        f"memory_fraction (per worker, of {gpu.memory_gb:g} GB) = (share {share / 1e9:.1f} GB - CUDA context "
        f"{CUDA_CONTEXT_BYTES / 1e9:g} GB - activations {activations / 1e9:.2f} GB) x {ALLOCATOR_SLACK} / "
        f"{gpu.memory_gb:g} GB = {fraction}",
        "  models per device (fp16 weights): "
        + ", ".join(f"{n} {held[n] * workers:,} ({held[n]:,} per worker)" for n in models)
        + f"; a 110M-parameter base model {int(fraction * gpu.memory_gb * 1e9 // 220e6) * workers:,}, "
        f"a 335M large one {int(fraction * gpu.memory_gb * 1e9 // 670e6) * workers:,}",
        "",
    ]
    fields = {
        "name": key,
        "device": "cuda",
        "dtype": "float16",
        "workers": workers,
        "threads_per_worker": 1,
        "prefetch": prefetch,
        "rows_per_item": rows_per_item,
        "lease_seconds": LEASE_SECONDS,
        "max_attempts": MAX_ATTEMPTS,
        "pull_timeout_seconds": 2.0,
        "memory_fraction": fraction,
        "token_budgets": budgets,
        "max_batch_sizes": caps,
    }
    return fields, lines


def _power_of_two(value: float) -> int:
    """The nearest power of two, on a log scale."""
    return 2 ** max(0, round(math.log2(max(value, 1))))
