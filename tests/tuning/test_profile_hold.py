"""Shipped profiles hold on the machine they run on: a pin this machine lacks the features for is not used.

The machine is forced (a `Machine`, or SHOAL_CPU_FEATURES), so every case runs on any host.
"""

from __future__ import annotations

import json

import pytest

from shoal.configs import RuntimeChoice, hold, load_catalog, load_profile
from shoal.configs.machine import FEATURES_ENV, Gpu, Machine, probe
from shoal.pipeline.tuning import auto_runtime
from shoal.pipeline.tuning.auto_runtime import MEASURE_ENV, listed_choice, resolve, verdict_path, write_record

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


def _verdicts(tmp_path, monkeypatch, machine: Machine, threads: int) -> None:
    """A cached measurement in which ONNX fp32 passed at 1.4x fp32 torch."""
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("shoal.pipeline.jobs.fingerprints.model_fingerprint", lambda spec: "f" * 64)
    row = {"verdict": "pass", "figures": {"cosine_mean": 1.0}, "failures": []}
    write_record(
        verdict_path("f" * 64, machine, threads),
        {
            "measurement": auto_runtime.MEASUREMENT,
            "model": "minilm",
            "machine": machine.signature(),
            "described": machine.describe(),
            "device": "cpu",
            "threads": threads,
            "texts": 64,
            "candidates": [
                {"runtime": "torch", "dtype": "float32", **row, "speed_vs_fp32": 1.0},  # type: ignore[typeddict-item]
                {"runtime": "onnx", "dtype": "float32", **row, "speed_vs_fp32": 1.4},  # type: ignore[typeddict-item]
            ],
            "seconds": 1.0,
            "steps": {},
            "checked": "2026-12-05 00:00 UTC",
        },
    )


def test_a_held_pin_runs_auto_s_choice_for_that_model_and_says_both(tmp_path, monkeypatch, no_gpu_probe):
    monkeypatch.setenv(FEATURES_ENV, "avx2")
    profile = load_profile("cpu-2core")
    profile._machine = AVX2
    _verdicts(tmp_path, monkeypatch, AVX2, profile.torch_threads(AVX2.cores))
    resolve(profile, load_catalog().get("minilm"))
    choice = profile.runtimes["minilm"]
    assert (choice.runtime, choice.dtype) == ("onnx", "float32")
    why = profile.reasons["minilm"]
    assert why.startswith("profile cpu-2core pins torch bfloat16, which needs bf16") and "auto's choice: onnx" in why
    listed = listed_choice(load_profile("cpu-2core"), load_catalog().get("minilm"), AVX2)
    assert listed == "onnx float32 (1.40x fp32); cpu-2core's torch bfloat16 pin needs what this machine lacks"


def test_a_first_use_runs_fp32_at_once_and_measures_in_the_background_once(tmp_path, monkeypatch, no_gpu_probe):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(MEASURE_ENV, raising=False)
    monkeypatch.setattr("shoal.pipeline.jobs.fingerprints.model_fingerprint", lambda spec: "f" * 64)
    started = []

    class Child:
        pid = 4242

        def __init__(self, command, **kwargs):
            started.append(command)
            self.stdin = self

        def write(self, text):
            assert json.loads(text)["name"] == "minilm"

        def close(self):
            pass

    monkeypatch.setattr(auto_runtime.subprocess, "Popen", Child)
    alive = {4242}
    monkeypatch.setattr(
        auto_runtime.os, "kill", lambda pid, sig: None if pid in alive else (_ for _ in ()).throw(OSError())
    )
    spec = load_catalog().get("minilm")
    for _ in range(2):  # two commands while the first measurement runs
        profile = load_profile("cpu-local")
        profile._machine = AVX2
        resolve(profile, spec)
        assert (profile.runtimes["minilm"].runtime, profile.runtimes["minilm"].dtype) == ("torch", "float32")
        assert "measurement runs in the background" in profile.reasons["minilm"]
    assert len(started) == 1  # the lock named a live child: not started twice
    alive.clear()  # the child died without writing: the next command starts another
    resolve(load_profile("cpu-local"), spec)
    assert len(started) == 2
