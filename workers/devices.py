"""Device selection and the memory budget a worker's model pool may fill.

``plan_device`` is a pure function of what the worker was told (its profile
and Dask resources) and what the hardware reports, so the GPU paths are
tested on CPU machines; ``detect_device`` asks the hardware.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..configs import Profile


@dataclass(frozen=True)
class DevicePlan:
    device: str  # "cpu" or "cuda:N"
    kind: str  # "cpu" or "cuda": selects the per-model token budget
    dtype: str  # "float32", "float16" or "bfloat16"
    memory_budget: int  # bytes of model weights this worker's pool may hold
    threads: int = 1  # torch intra-op threads: the cores this worker owns


def plan_device(
    profile: Profile,
    resources: dict[str, float],
    cuda_devices: int,
    cuda_memory: int | None,
    host_memory: int,
    bf16_supported: bool = False,
    cores: int = 1,
) -> DevicePlan:
    """Where this worker runs its models, in which precision, with how much room.

    A ``VRAM`` resource tag (bytes) overrides what the device reports, so an
    operator can share one GPU between worker processes by tagging each with
    its slice. On CPU the budget is a fraction of host memory.
    """
    wants_cuda = profile.device == "cuda" or (profile.device == "auto" and cuda_devices > 0)
    if wants_cuda and cuda_devices == 0:
        raise RuntimeError("profile asks for device 'cuda' but this worker sees no CUDA device")
    if wants_cuda:
        index = _local_gpu_index(cuda_devices)
        dtype = profile.dtype
        if dtype == "auto":
            dtype = "bfloat16" if bf16_supported else "float16"
        memory = resources.get("VRAM") or cuda_memory or 0
        return DevicePlan(
            f"cuda:{index}", "cuda", dtype, int(memory * profile.memory_fraction), profile.torch_threads(cores)
        )
    dtype = "float32" if profile.dtype == "auto" else profile.dtype
    memory = resources.get("MEMORY") or host_memory
    return DevicePlan("cpu", "cpu", dtype, int(memory * profile.memory_fraction), profile.torch_threads(cores))


def _local_gpu_index(cuda_devices: int) -> int:
    """One device per worker process: CUDA_VISIBLE_DEVICES narrows it to index 0."""
    requested = os.environ.get("SHOAL_GPU_INDEX")
    index = int(requested) if requested else 0
    if index >= cuda_devices:
        raise RuntimeError(f"SHOAL_GPU_INDEX={index} but only {cuda_devices} CUDA devices are visible")
    return index


def detect_device(profile: Profile, resources: dict[str, float]) -> DevicePlan:
    """plan_device with what this process's hardware reports.

    A CPU profile never imports torch here: simulated workers stay light.
    """
    import psutil

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    cuda_devices, cuda_memory, bf16 = 0, None, False
    if profile.device != "cpu":
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if cuda_devices:
            index = _local_gpu_index(cuda_devices)
            cuda_memory = torch.cuda.get_device_properties(index).total_memory
            bf16 = torch.cuda.is_bf16_supported()
    return plan_device(profile, resources, cuda_devices, cuda_memory, psutil.virtual_memory().total, bf16, cores)


def apply_torch_threads(plan: DevicePlan) -> None:
    """Threads multiply with worker processes: each uses only the cores it owns."""
    import torch

    if torch.get_num_threads() != plan.threads:
        torch.set_num_threads(plan.threads)
