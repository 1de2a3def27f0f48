"""The suite is hermetic (tests/conftest.py): the session has its own caches and home, so what the user's
~/.cache/shoal holds (a bf16 verdict for every model the suite uses, say) changes nothing a test compares, and
running the tests writes nothing there."""

from __future__ import annotations

import os
from pathlib import Path

from shoal.configs import cache_dir, load_catalog, load_profile
from shoal.configs.machine import Machine
from shoal.configs.verdicts import MEASUREMENT, Measurement, verdict_path, write_record
from shoal.workers import runtime_choice
from shoal.workers.devices import DevicePlan
from shoal.workers.runtime_choice import MEASURE_ENV, RuntimeChooser
from tests.conftest import CALLERS_HOME, SESSION_CACHES
from tests.support.files import write_profile

CACHES = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "SHOAL_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE")
BF16_HOST = Machine(
    cores=2,
    memory_bytes=2**34,
    cpu_model="Xeon",
    features=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
    versions=(("torch", "2.13.0"), ("onnxruntime", "1.22.0")),
)
CPU = DevicePlan("cpu", "cpu", "float32", 2**30, threads=1)
FINGERPRINT = "b" * 64


def test_every_cache_a_test_or_the_processes_it_starts_reads_is_the_sessions_own():
    import huggingface_hub.constants

    for variable in CACHES:
        assert Path(os.environ[variable]).is_relative_to(SESSION_CACHES), variable
    assert Path.home().is_relative_to(SESSION_CACHES)
    assert cache_dir().is_relative_to(SESSION_CACHES) and cache_dir().is_dir()
    assert Path(huggingface_hub.constants.HF_HUB_CACHE).is_relative_to(SESSION_CACHES)
    user_cache = CALLERS_HOME / ".cache" / "shoal"  # not resolved: the test itself touches nothing there
    assert not cache_dir().is_relative_to(user_cache) and not user_cache.is_relative_to(cache_dir())
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def bf16_passes(fingerprint: str) -> Measurement:
    """What a bf16 host's worker caches after measuring: bf16 passed the gate and is the fastest."""
    rows = [("torch", "float32", 1.0), ("torch", "bfloat16", 3.3)]
    return {
        "measurement": MEASUREMENT,
        "model": "minilm",
        "machine": BF16_HOST.signature("cpu"),
        "described": BF16_HOST.describe(),
        "device": "cpu",
        "threads": CPU.threads,
        "texts": 64,
        "candidates": [
            {
                "runtime": r,
                "dtype": d,
                "verdict": "pass",
                "figures": {"cosine_mean": 0.999},
                "failures": [],
                "speed_vs_fp32": s,
            }
            for r, d, s in rows
        ],  # fmt: skip
        "seconds": 1.0,
        "steps": {},
        "checked": "2026-12-06 00:00 UTC",
        "fingerprint": fingerprint,
        "device_class": BF16_HOST.device_class("cpu"),
        "versions": dict(BF16_HOST.versions),
    }


def test_a_cached_bf16_verdict_changes_nothing_a_test_compares_with_fp32(tmp_path, monkeypatch):
    """A bf16 verdict in the cache the workers read: the suite's workers still run fp32 torch (auto's choice off,
    and the test profile pins the tiny models); a user's worker, measuring as it does by default, would run bf16."""
    monkeypatch.setattr(runtime_choice, "model_fingerprint", lambda spec: FINGERPRINT)
    monkeypatch.setattr(runtime_choice, "measure_in_background", lambda *args: "never")
    path = verdict_path(FINGERPRINT, BF16_HOST, CPU.threads, "cpu")
    assert path.is_relative_to(cache_dir())
    write_record(path, bf16_passes(FINGERPRINT))
    spec = load_catalog().get("minilm")
    try:
        assert os.environ[MEASURE_ENV] == "off"  # set by the conftest, whatever the caller's environment said
        suite = RuntimeChooser(load_profile("cpu-local"), CPU, BF16_HOST)
        suite.choose(spec)
        assert (suite.ran["minilm"].runtime, suite.ran["minilm"].dtype) == ("torch", "float32")

        monkeypatch.setenv(MEASURE_ENV, "background")  # a user's CPU worker: the same cache makes it run bf16
        user = RuntimeChooser(load_profile("cpu-local"), CPU, BF16_HOST)
        user.choose(spec)
        assert (user.ran["minilm"].runtime, user.ran["minilm"].dtype) == ("torch", "bfloat16")

        pinned = load_profile(str(write_profile(tmp_path))).runtimes  # tests/support/files.write_profile
        for model in ("tiny", "tiny-reranker"):  # whatever auto would choose: fp32 torch
            assert (pinned[model].runtime, pinned[model].dtype) == ("torch", "float32")
    finally:
        path.unlink()
