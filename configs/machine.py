"""What this machine is, as the `auto` profile needs it: cores, memory, CPU features, GPUs.

Read without importing torch (``/proc/cpuinfo`` and ``nvidia-smi``), so every
command can afford it. The signature names the kind of machine a measured
runtime verdict holds for: the same CPU model, core count, features, GPUs and
runtime versions give the same speeds, so a verdict is reused; anything else
is measured again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from importlib import metadata

# CPU features that change which number format is fast: bf16 dot products (AVX-512 BF16, AMX)
# and int8 ones (VNNI). Read from the flags line of /proc/cpuinfo.
FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile")
NO_BF16_ENV = "SHOAL_NO_BF16"  # set (to anything but "" or "0"): bf16 is treated as absent here
RUNTIME_PACKAGES = ("torch", "onnxruntime")  # their versions change which runtime is fastest


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    compute_capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        """Ampere (8.0) and later compute bf16 on tensor cores."""
        return self.compute_capability >= (8, 0)


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_bytes: int
    cpu_model: str = ""
    features: frozenset[str] = frozenset()
    gpus: tuple[Gpu, ...] = ()
    no_bf16: bool = False  # the NO_BF16_ENV switch
    versions: tuple[tuple[str, str], ...] = field(default=())

    @property
    def bf16(self) -> bool:
        """Whether bf16 candidates are offered: hardware that computes it, unless switched off.

        Without AVX-512 BF16 or AMX, torch emulates bf16 on the CPU: on an AVX2 EPYC a bf16 matmul
        took 23x its fp32 one, so the candidate is not worth its measuring (docs/BENCHMARKS.md).
        """
        if self.no_bf16:
            return False
        if self.gpus:
            return self.gpus[0].bf16
        return bool({"avx512_bf16", "amx_bf16"} & self.features)

    @property
    def kind(self) -> str:
        return "cuda" if self.gpus else "cpu"

    def describe(self) -> str:
        """One line for summaries: what the choice was made from."""
        memory = f"{self.memory_bytes / 2**30:.0f} GiB"
        features = ", ".join(sorted(self.features & set(FEATURES) - {"avx2", "avx512f"})) or "no bf16/VNNI/AMX"
        line = f"{self.cores} cores ({self.cpu_model or 'unknown CPU'}; {features}), {memory}"
        if self.gpus:
            gpu = self.gpus[0]
            cc = ".".join(map(str, gpu.compute_capability))
            line += f", {len(self.gpus)}x {gpu.name} ({gpu.memory_bytes / 2**30:.0f} GiB, compute {cc})"
        if self.no_bf16:
            line += f", bf16 off ({NO_BF16_ENV})"
        return line

    def signature(self) -> str:
        """`cpu-` or `cuda-` and a short hash of everything that changes a runtime's speed or output."""
        parts = [
            self.kind,
            self.cpu_model,
            str(self.cores),
            ",".join(sorted(self.features)),
            *(f"{g.name}/{g.memory_bytes}/{g.compute_capability}" for g in self.gpus),
            f"no_bf16={self.no_bf16}",
            *(f"{name}={version}" for name, version in self.versions),
        ]
        return f"{self.kind}-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:12]}"


def switched_off(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def probe() -> Machine:
    """This machine, as the process sees it (its CPU affinity, the GPUs it may use)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    model, flags = _cpuinfo()
    return Machine(
        cores=cores,
        memory_bytes=_memory_bytes(),
        cpu_model=model,
        features=frozenset(flags & set(FEATURES)),
        gpus=_gpus(),
        no_bf16=switched_off(NO_BF16_ENV),
        versions=tuple((name, _version(name)) for name in RUNTIME_PACKAGES),
    )


def _cpuinfo() -> tuple[str, set[str]]:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:  # not Linux: no features known, none offered
        return "", set()
    model, flags = "", set[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        import psutil

        return int(psutil.virtual_memory().total)


def _gpus() -> tuple[Gpu, ...]:
    """CUDA devices from nvidia-smi (respecting CUDA_VISIBLE_DEVICES); none when it is absent or fails."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1") or not shutil.which("nvidia-smi"):
        return ()
    query = ["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted = [v.strip() for v in visible.split(",")] if visible else None
    gpus = []
    for line in out.strip().splitlines():
        index, name, memory_mib, cc = (part.strip() for part in line.split(","))
        if wanted is not None and index not in wanted:
            continue
        major, _, minor = cc.partition(".")
        gpus.append(Gpu(name, int(float(memory_mib)) * 2**20, (int(major), int(minor or 0))))
    return tuple(gpus)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "absent"
