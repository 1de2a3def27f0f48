"""`shoal tune` end to end on a tiny model, the shipped profiles, and the profile writer."""

from __future__ import annotations

import time

import pytest
import yaml

from shoal.configs import ConfigError, load_catalog, load_profile
from shoal.pipeline.tuning.derived import GPUS, derive
from shoal.pipeline.tuning.profile import write_profile
from tests.support.cli import invoke_shoal, run_shoal


def test_tune_refuses_the_kinds_it_does_not_sweep_before_any_work(tmp_path):
    catalog = tmp_path / "catalog.yaml"
    entries = {"splade": {"kind": "sparse", "dim": 30522}, "topics": {"kind": "classifier", "dim": 5}}
    catalog.write_text(
        yaml.safe_dump(
            {"models": {n: {**e, "max_seq_length": 64, "source": str(tmp_path)} for n, e in entries.items()}}
        )
    )
    result = invoke_shoal(
        "tune", "--profile", str(tmp_path / "x.yaml"), "--models", "splade,topics", "--catalog", str(catalog)
    )
    assert result.returncode == 2
    assert "not splade (sparse), topics (classifier)" in result.stderr
    assert not (tmp_path / "x.yaml").exists()


def test_tune_quick_mode_writes_a_valid_profile_with_its_evidence(tmp_path, tiny_catalog):
    """Quick mode: a short budget still measures both phases and writes a loadable, commented profile."""
    target = tmp_path / "tiny-tuned.yaml"
    began = time.monotonic()
    result = run_shoal(
        "tune",
        "--profile",
        str(target),
        "--models",
        "tiny",
        "--catalog",
        str(tiny_catalog),
        "--budget-minutes",
        "0.75",
        "--sample-rows",
        "512",
        "--online-rate",
        "2",
        timeout=400,
    )
    seconds = time.monotonic() - began
    assert result.returncode == 0, result.stderr[-3000:]
    profile = load_profile(str(target))
    assert profile.name == "tiny-tuned"
    assert profile.token_budgets["tiny"] in (1024, 2048, 4096, 8192, 16384, 32768)
    assert profile.max_batch_sizes["tiny"] > 0
    assert profile.workers * max(profile.threads_per_worker, 1) >= 1
    text = target.read_text()
    for marker in (
        "TUNED by `shoal tune",
        "Phase 0",
        "tiny torch bfloat16",
        "tiny onnx int8",
        "Phase 1",
        "Phase 2",
        "online load 2 req/s",
        "Every trial:",
        "<- chosen",
    ):
        assert marker in text
    assert profile.runtimes["tiny"].runtime in ("torch", "onnx")  # phase 0's choice, written beside the budgets
    assert "trials in" in result.stderr and "shoal tune:" in result.stderr  # the summary table
    assert seconds < 300


@pytest.mark.parametrize("key", sorted(GPUS))
def test_shipped_gpu_profiles_are_the_derivation_and_say_so(key):
    profile = load_profile(key)
    text = open(profile.path).read()
    assert "DERIVED, not measured" in text and "token budget =" in text and "workers per GPU =" in text
    fields, _ = derive(key, load_catalog(), ["minilm"])
    assert profile.device == "cuda" and profile.dtype in ("float16", "bfloat16")
    for name in ("workers", "prefetch", "rows_per_item", "memory_fraction", "token_budgets", "max_batch_sizes"):
        assert getattr(profile, name) == fields[name], name
    assert load_catalog().get("minilm").max_batch_size <= profile.tuned(load_catalog().get("minilm")).max_batch_size


def test_shipped_cpu_2core_profile_is_tuned_and_loads():
    profile = load_profile("cpu-2core")
    assert profile.device == "cpu" and "minilm" in profile.token_budgets
    assert "TUNED by `shoal tune --profile cpu-2core" in open(profile.path).read()


def test_bigger_gpus_get_bigger_budgets():
    budgets = {key: derive(key, load_catalog(), ["minilm"])[0]["token_budgets"]["minilm"] for key in GPUS}
    assert budgets["l4"] < budgets["a100-80gb"] < budgets["h100"] == budgets["h200"]


def test_write_profile_refuses_an_invalid_profile_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "p.yaml"
    write_profile(path, {"name": "p", "workers": 2}, ["first"])
    with pytest.raises(ConfigError):
        write_profile(path, {"name": "p", "workers": 0}, ["second"])
    assert yaml.safe_load(path.read_text())["workers"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


def test_profile_tuned_applies_budget_and_batch_cap():
    spec = load_catalog().get("minilm")
    profile = load_profile("h100")
    tuned = profile.tuned(spec)
    assert tuned.token_budget == {"cpu": profile.token_budgets["minilm"], "cuda": profile.token_budgets["minilm"]}
    assert tuned.max_batch_size == profile.max_batch_sizes["minilm"]


def test_every_command_takes_a_profile():
    from click.testing import CliRunner

    from shoal.pipeline.cli import main

    for name, command in main.commands.items():
        assert any("--profile" in param.opts for param in command.params), name
    result = CliRunner().invoke(main, ["status", "--profile", "no-such-profile", "--scheduler", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "unknown profile 'no-such-profile'" in result.output
