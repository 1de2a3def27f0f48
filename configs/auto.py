"""The `auto` profile: the layout a tuned profile would pick, read off this machine.

A user who never passes ``--profile`` gets this. Its layout comes from the
shipped tuned (or derived) profile for the kind of machine, scaled to what
the machine has:

- CPU with bf16 hardware (AVX-512 BF16 or AMX): ``cpu-2core``'s tuned
  per-worker settings (token budgets, batch caps, rows per item, prefetch)
  with one worker process per core, one thread each, as its tuning chose on
  such a machine (2 x 1 was 1.25x 1 x 2: single-threaded bf16 kernels, and a
  process tokenizes on its own core while the other computes);
- CPU without: ``cpu-local``'s, one worker process with the cores (up to
  ``FP32_THREADS`` per process): fp32 torch's threads scale, and one process
  starts sooner (on an AVX2 2-core VM, 1 x 2 was 1.06-1.14x 2 x 1 over
  whole commands, docs/BENCHMARKS.md);
- either capped at ``MAX_CPU_WORKERS`` processes and one per ``WORKER_MEMORY`` of RAM;
- GPU: the shipped profile of that GPU (by name, else the one nearest in
  memory), with at most one worker per two host cores.

Each model's runtime x dtype is chosen later, when a command knows its
models (pipeline/tuning/auto_runtime.py): the fastest candidate whose quality
gate verdict on this kind of machine is ``pass``. The resolved profile is
written under the Shoal cache so worker processes load the same one.
"""

from __future__ import annotations

import hashlib
import os

import yaml

from . import CONFIG_DIR, Profile, cache_dir, read_yaml
from .machine import Machine, probe

NAME = "auto"
CPU_BASE = "cpu-2core"  # tuned where bf16 ran: one single-threaded worker process per core
FP32_BASE = "cpu-local"  # without bf16, fp32 torch's threads scale: one process with the cores, started once
FP32_THREADS = 4  # assumed: beyond this a small encoder's fp32 threads scale worse than another process
GPU_PROFILES = {"L4": "l4", "A100": "a100-80gb", "H100": "h100", "H200": "h200"}
GPU_MEMORY = {"l4": 24e9, "a100-80gb": 80e9, "h100": 80e9, "h200": 141e9}  # bytes, from their datasheets
MAX_CPU_WORKERS = 8  # beyond this, more processes cost start-up and memory more than they add
WORKER_MEMORY = 2**30  # a CPU worker process with torch and a small model loaded
LAYOUT = "layout"  # the key of the layout's reason in Profile.reasons


def auto_profile(machine: Machine | None = None) -> Profile:
    """This machine's `auto` profile, its layout chosen and the reason recorded; no runtimes yet."""
    machine = machine or probe()
    layout, why = gpu_layout(machine) if machine.gpus else cpu_layout(machine)
    profile = layout.model_copy(
        update={"name": NAME, "runtimes": {}, "reasons": {LAYOUT: f"{why}; machine: {machine.describe()}"}}
    )
    profile._machine = machine
    return save(profile)


def _base(name: str) -> Profile:
    """A shipped profile, without its runtimes: they are measured per machine, never inherited."""
    fields = read_yaml(CONFIG_DIR / f"{name}.yaml")
    fields.pop("runtimes", None)
    return Profile.model_validate(fields)


def cpu_layout(machine: Machine) -> tuple[Profile, str]:
    """With bf16 hardware, cpu-2core's one process per core; without, cpu-local's one process per FP32_THREADS cores."""
    if machine.bf16:
        base, per = CPU_BASE, "one worker process per core, one thread each"
        workers = machine.cores
    else:
        base, per = FP32_BASE, f"one worker process for up to {FP32_THREADS} cores"
        workers = -(-machine.cores // FP32_THREADS)
    workers = max(1, min(workers, MAX_CPU_WORKERS, machine.memory_bytes // WORKER_MEMORY))
    threads = max(1, machine.cores // workers)
    layout = {"device": "cpu", "workers": workers, "threads_per_worker": threads, "in_process_workers": False}
    bf16 = "bf16 hardware" if machine.bf16 else "no bf16 hardware" + (" (switched off)" if machine.no_bf16 else "")
    why = (
        f"{workers} worker{'s' * (workers > 1)} x {threads} thread{'s' * (threads > 1)}: {base}'s layout "
        f"({per}) on {machine.cores} cores, {bf16}"
    )
    return _base(base).model_copy(update=layout), why


def gpu_layout(machine: Machine) -> tuple[Profile, str]:
    """That GPU's shipped profile (else the nearest in memory), with at most its workers and one per two host cores."""
    gpu = machine.gpus[0]
    named = [key for tag, key in GPU_PROFILES.items() if tag in gpu.name.upper()]
    if named:
        key, how = named[0], f"the shipped profile for {gpu.name}"
    else:
        key = min(GPU_MEMORY, key=lambda k: abs(GPU_MEMORY[k] - gpu.memory_bytes))
        how = f"{key}'s profile, the shipped GPU nearest in memory to {gpu.name}"
    base = _base(key)
    workers = max(1, min(base.workers, machine.cores // 2))
    layout = base.model_copy(update={"device": "cuda", "workers": workers})
    return layout, f"{workers} workers x 1 thread on cuda:0: {how} ({machine.cores} host cores)"


def serving_layout(profile: Profile) -> Profile:
    """`auto` for `shoal serve` on an embedded CPU cluster: one worker, in the server's process, with every core.

    Online, a lone query is the common case: with one worker per core it would get one core, and cross two
    process hops each way. In the server's process (Dask's inproc comms) it skips those and computes on
    every core (1.03-1.07x a direct in-process encode, against 1.2x for a worker process of its own, and
    more requests per second at 32 clients too: docs/BENCHMARKS.md, online latency). The price is isolation:
    a worker that crashes takes the gateway with it, where a worker process would be restarted by its nanny
    (`--profile cpu-local` keeps it apart). A GPU's layout is kept: its workers each own a device.
    """
    if profile.name != NAME or profile.device == "cuda":
        return profile
    machine = profile._machine or probe()
    why = (
        f"1 worker x {machine.cores} threads in the server's process: online, a lone query gets every core and "
        f"no process hop (shoal serve's layout on a CPU; machine: {machine.describe()})"
    )
    layout = {"workers": 1, "threads_per_worker": machine.cores, "in_process_workers": True}
    served = profile.model_copy(update={**layout, "reasons": {**profile.reasons, LAYOUT: why}})
    served._machine = machine
    return save(served)


def save(profile: Profile) -> Profile:
    """Write `profile` under the cache (named by its content: concurrent commands never clash); set its path.

    Where the cache cannot be written the profile keeps no path, and workers load `auto` by name.
    """
    text = yaml.safe_dump(profile.model_dump(), sort_keys=False, width=120)
    folder = cache_dir() / "profiles"
    path = folder / f"{NAME}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            staged = path.with_name(f".{path.name}.{os.getpid()}")
            staged.write_text(text)
            os.replace(staged, path)
    except OSError:  # a read-only cache: workers derive the same layout themselves, runtimes from the job's specs
        return profile
    profile._path = str(path)
    return profile
