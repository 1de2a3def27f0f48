"""Shipped profiles hold on the machine they run on: a pin this machine lacks the features for is not used.

The machine is forced (a `Machine`, or SHOAL_CPU_FEATURES), so every case runs on any host.
"""

from __future__ import annotations

import pytest

from shoal.configs import RuntimeChoice, hold, load_profile
from shoal.configs.machine import FEATURES_ENV, Gpu, Machine, probe

AVX2 = Machine(cores=2, memory_bytes=2**34, cpu_model="AMD EPYC", features=frozenset({"avx2"}))
BF16 = Machine(cores=2, memory_bytes=2**34, cpu_model="Xeon", features=frozenset({"avx2", "avx512f", "avx512_bf16"}))


@pytest.fixture
def no_gpu_probe(monkeypatch):
    """probe() without nvidia-smi: a unit test starts no process."""
    monkeypatch.setattr("shoal.configs.machine._gpus", lambda: ())


def test_cpu_2core_s_bf16_pin_records_its_need_and_is_dropped_without_bf16_hardware(monkeypatch, no_gpu_probe):
    monkeypatch.setenv(FEATURES_ENV, "avx2,avx512f,avx512_bf16")
    shipped = load_profile("cpu-2core")
    assert shipped.runtimes["minilm"].needs == ["bf16"]
    assert shipped.runtimes["minilm"].dtype == "bfloat16" and not shipped._held
    held = hold(shipped, AVX2)
    assert "minilm" not in held.runtimes
    assert "needs bf16 (AVX-512 BF16 or AMX" in held.reasons["minilm"] and held._held["minilm"]


def test_the_forced_features_make_another_machine_and_load_profile_holds_on_it(monkeypatch, no_gpu_probe):
    monkeypatch.setenv(FEATURES_ENV, "avx2")
    avx2 = probe()
    assert avx2.features == {"avx2"} and not avx2.bf16
    assert "minilm" not in load_profile("cpu-2core").runtimes
    monkeypatch.setenv(FEATURES_ENV, "avx2,avx512_bf16")
    assert probe().signature() != avx2.signature()  # verdicts of one are never reused on the other
    assert load_profile("cpu-2core").runtimes["minilm"].dtype == "bfloat16"


def test_a_bf16_pin_that_records_no_needs_is_held_all_the_same(no_gpu_probe):
    profile = load_profile("cpu-local").model_copy(
        update={"runtimes": {"minilm": RuntimeChoice(runtime="torch", dtype="bfloat16")}}
    )
    assert "minilm" not in hold(profile, AVX2).runtimes


def test_a_gpu_profile_s_fp16_needs_tensor_cores_and_compute_capability_needs_are_read(no_gpu_probe):
    pascal = Machine(cores=8, memory_bytes=2**35, gpus=(Gpu("Tesla P100", 16 * 2**30, (6, 0)),))
    ampere = Machine(cores=8, memory_bytes=2**35, gpus=(Gpu("NVIDIA A100", 80 * 2**30, (8, 0)),))
    assert hold(load_profile("h100"), ampere).dtype == "float16"
    held = hold(load_profile("h100"), pascal)
    assert held.dtype == "auto" and "compute capability 7.0" in held.reasons["dtype"]
    assert ampere.has("cc>=8.0") and not ampere.has("cc>=9.0") and not pascal.has("bf16")
    assert ampere.lacks(["cc>=9.0"]) and not ampere.lacks(["bf16", "fp16"])
    cpu_only = hold(load_profile("h100"), AVX2)  # a client joining a GPU cluster: the workers judge it
    assert cpu_only.dtype == "float16" and "dtype" not in cpu_only.reasons


def test_an_unknown_need_is_a_profile_error():
    with pytest.raises(ValueError, match="unknown needs"):
        RuntimeChoice.model_validate({"runtime": "torch", "dtype": "bfloat16", "needs": ["bf17"]})
