"""GPU code paths, exercised on CPU with what the hardware would report."""

import pytest

from shoal.configs import Profile
from shoal.workers.devices import plan_device

GB = 10**9


def test_cpu_worker_uses_a_fraction_of_host_memory():
    plan = plan_device(Profile(name="p", memory_fraction=0.5), {}, 0, None, 16 * GB)
    assert (plan.device, plan.kind, plan.dtype, plan.memory_budget) == ("cpu", "cpu", "float32", 8 * GB)


def test_auto_picks_cuda_with_half_precision():
    plan = plan_device(Profile(name="p", memory_fraction=0.9), {}, 1, 80 * GB, 64 * GB)
    assert (plan.device, plan.kind, plan.dtype) == ("cuda:0", "cuda", "float16")
    assert plan.memory_budget == 72 * GB
    assert plan_device(Profile(name="p"), {}, 1, 80 * GB, 64 * GB, bf16_supported=True).dtype == "bfloat16"


def test_vram_resource_tag_overrides_reported_memory():
    plan = plan_device(Profile(name="p", memory_fraction=1.0), {"GPU": 1, "VRAM": 20e9}, 1, 80 * GB, 64 * GB)
    assert plan.memory_budget == 20 * GB


def test_explicit_dtype_and_cpu_on_a_gpu_machine():
    assert plan_device(Profile(name="p", dtype="float32"), {}, 1, 80 * GB, 64 * GB).dtype == "float32"
    assert plan_device(Profile(name="p", device="cpu"), {}, 1, 80 * GB, 64 * GB).device == "cpu"


def test_cuda_profile_without_a_gpu_fails_clearly():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        plan_device(Profile(name="p", device="cuda"), {}, 0, None, 64 * GB)


def test_gpu_index_from_environment(monkeypatch):
    monkeypatch.setenv("SHOAL_GPU_INDEX", "1")
    assert plan_device(Profile(name="p"), {}, 2, 80 * GB, 64 * GB).device == "cuda:1"
    monkeypatch.setenv("SHOAL_GPU_INDEX", "3")
    with pytest.raises(RuntimeError, match="only 2 CUDA devices"):
        plan_device(Profile(name="p"), {}, 2, 80 * GB, 64 * GB)
