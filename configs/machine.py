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
# Set to a comma-separated list of FEATURES: this machine is taken to have exactly those CPU features (and its
# signature follows), so a profile's needs and auto's verdicts can be tried on hardware that is not here.
FEATURES_ENV = "SHOAL_CPU_FEATURES"
RUNTIME_PACKAGES = ("torch", "onnxruntime")  # their versions change which runtime is fastest

# What a profile's runtime choice may need, by name, and the CPU features that meet it (any one of them).
# "bf16" also holds on a GPU of compute capability 8.0 or later, "fp16" on 7.0 or later; "cc>=X.Y" is a GPU's
# compute capability. A name not here is a profile error (configs/__init__.py checks them).
NEEDS = {
    "bf16": frozenset({"avx512_bf16", "amx_bf16"}),
    "vnni": frozenset({"avx512_vnni", "avx_vnni"}),
    "amx": frozenset({"amx_tile", "amx_bf16", "amx_int8"}),
    "avx512": frozenset({"avx512f"}),
    "fp16": frozenset(),
}
NEED_WORDS = {
    "bf16": "AVX-512 BF16 or AMX on the CPU, compute capability 8.0 on a GPU",
    "vnni": "AVX-512 VNNI or AVX-VNNI",
    "amx": "AMX",
    "avx512": "AVX-512",
    "fp16": "a GPU of compute capability 7.0 or later",
}


def valid_need(need: str) -> bool:
    if need in NEEDS:
        return True
    major, _, minor = need.removeprefix("cc>=").partition(".")
    return need.startswith("cc>=") and major.isdigit() and (minor.isdigit() or not minor)


def implied_needs(dtype: str, device: str) -> list[str]:
    """What a dtype needs whether or not the profile says so: bf16 hardware, or fp16 tensor cores on a GPU."""
    if dtype == "bfloat16":
        return ["bf16"]
    if dtype == "float16" and device == "cuda":
        return ["fp16"]
    return []


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

    def has(self, need: str) -> bool:
        """Whether this machine has one of the NEEDS a profile's choice may record."""
        if need == "bf16":
            return self.bf16
        if need == "fp16":  # tensor cores: Volta (7.0) and later
            return bool(self.gpus) and self.gpus[0].compute_capability >= (7, 0)
        if need.startswith("cc>="):
            major, _, minor = need.removeprefix("cc>=").partition(".")
            return bool(self.gpus) and self.gpus[0].compute_capability >= (int(major), int(minor or 0))
        return bool(NEEDS[need] & self.features)

    def lacks(self, needs: list[str]) -> list[str]:
        """The needs this machine does not meet, described: empty where a choice holds here."""
        return [
            f"{need} ({NEED_WORDS.get(need, 'a GPU of compute capability ' + need[4:] + ' or later')})"
            for need in needs
            if not self.has(need)
        ]

    def signature(self, device: str | None = None) -> str:
        """`cpu-` or `cuda-` and a short hash of everything that changes a runtime's speed or output on `device`.

        `device` ("cpu" or "cuda"; this machine's kind unless given): a CPU worker on a GPU machine is measured
        as a CPU, so its verdicts are keyed without the GPUs, and a GPU worker's with them.
        """
        kind = device or self.kind
        parts = [
            kind,
            self.cpu_model,
            str(self.cores),
            ",".join(sorted(self.features)),
            *(f"{g.name}/{g.memory_bytes}/{g.compute_capability}" for g in (self.gpus if kind == "cuda" else ())),
            f"no_bf16={self.no_bf16}",
            *(f"{name}={version}" for name, version in self.versions),
        ]
        return f"{kind}-{hashlib.sha256('|'.join(parts).encode()).hexdigest()[:12]}"

    def device_class(self, device: str | None = None) -> str:
        """What a shipped verdict is keyed by: the CPU's features that change which number format is fast
        (never its model or cores), or the GPU's name and compute capability; bf16 switched off counts."""
        kind = device or self.kind
        if kind == "cuda" and self.gpus:
            gpu = self.gpus[0]
            named = f"{gpu.name} cc{'.'.join(map(str, gpu.compute_capability))}"
        else:  # the NEEDS a CPU meets (not its exact flags: AVX-VNNI beside AVX-512 VNNI changes no choice)
            met = [need for need in ("amx", "avx512", "bf16", "vnni") if NEEDS[need] & self.features]
            named = ",".join(sorted([*met, *(["avx2"] if "avx2" in self.features else [])])) or "none"
        return f"{kind}:{named}" + (" no_bf16" if self.no_bf16 else "")


def switched_off(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def probe() -> Machine:
    """This machine, as the process sees it (its CPU affinity, the GPUs it may use)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    model, flags = _cpuinfo()
    if os.environ.get(FEATURES_ENV):  # forced: tests and benchmarks of a machine that is not this one
        flags = {f.strip() for f in os.environ[FEATURES_ENV].split(",")} - {"", "none"}
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
