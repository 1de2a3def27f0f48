"""The quality gate on the real MiniLM and through `shoal check-precision`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from shoal.configs import RuntimeChoice, load_catalog, load_profile
from shoal.pipeline.retrieval.beir import load_beir
from shoal.pipeline.tuning.quality_gate import GATE_SAMPLE, PrecisionGate, judge_retrieval, judge_scores, judge_vectors
from shoal.workers.devices import DevicePlan
from tests.support.processes import run

SHOAL = str(Path(sys.executable).parent / "shoal")
PLAN = DevicePlan("cpu", "cpu", "float32", 10**9, 2)


def check_precision(model: str, profile, texts, dtype: str, *options: str) -> subprocess.CompletedProcess:
    """`shoal check-precision` of `model` on `texts` against onnx `dtype`, its verdict written into `profile`."""
    args = ["check-precision", "--model", model, "--profile", str(profile), "--texts", str(texts)]
    args += ["--runtime", "onnx", "--dtype", dtype, *options]
    return run([SHOAL, *args], timeout=300)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "shoal-cache"))


def test_judges_name_each_failing_figure():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(50, 8)).astype(np.float32)
    assert judge_vectors(reference * 3, reference)[1] == []  # cosine ignores scale
    noisy = reference + rng.normal(scale=0.5, size=reference.shape).astype(np.float32)
    figures, failures = judge_vectors(noisy, reference)
    assert failures == [
        f"cosine mean {figures['cosine_mean']:.4f} < 0.999",
        f"cosine min {figures['cosine_min']:.4f} < 0.99",
    ]
    assert judge_retrieval(0.636, 0.640)[1] == []
    assert "0.0100 below fp32's 0.6400" in judge_retrieval(0.630, 0.640)[1][0]
    scores = rng.normal(size=200)
    assert judge_scores(scores * 2 + 1, scores)[1] == []  # monotone: same order
    assert judge_scores(-scores, scores)[1] == ["Kendall tau -1.0000 < 0.99"]


class CountingEmbedder:
    """A runtime stand-in: a fixed vector per text (plus `noise`), counting the texts it embeds."""

    def __init__(self, noise: float = 0.0) -> None:
        self.noise, self.texts = noise, 0

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        self.texts += len(texts)
        vectors = [np.random.default_rng(abs(hash(t)) % 2**32).normal(size=16) for t in texts]
        rng = np.random.default_rng(len(texts))
        return np.array(vectors) + rng.normal(scale=self.noise, size=(len(texts), 16)), 0

    def close(self) -> None:
        pass


def test_retrieval_is_judged_only_for_a_candidate_the_sample_passed_and_fp32_s_only_once():
    judged = load_beir(str(GATE_SAMPLE))
    judged_texts = judged.corpus.num_rows + judged.queries.num_rows
    sample = [f"text {i}" for i in range(64)]
    reference = CountingEmbedder()
    gate = PrecisionGate(load_catalog().get("minilm"), PLAN, sample, str(GATE_SAMPLE), reference=reference)
    noisy, exact, again = CountingEmbedder(noise=1.0), CountingEmbedder(), CountingEmbedder()
    refused = gate.check(RuntimeChoice(runtime="onnx", dtype="int8"), noisy)
    assert not refused.passed and set(refused.figures) == {"cosine_mean", "cosine_min"}
    assert noisy.texts == 64 and reference.texts == 64  # neither ran over the judged set
    for runtime in (exact, again):
        verdict = gate.check(RuntimeChoice(runtime="onnx", dtype="float32"), runtime)
        assert verdict.passed and verdict.figures["ndcg@10"] == verdict.figures["ndcg@10_fp32"]
        assert runtime.texts == 64 + judged_texts
    assert reference.texts == 64 + judged_texts  # fp32's nDCG computed once, for the first that needed it


@pytest.mark.slow
def test_minilm_bf16_and_onnx_within_the_gate(demo_texts):
    spec = load_catalog().get("minilm")
    # Cosine figures only: retrieval on the judged set is covered by the gate's fakes above and auto's first use.
    gate = PrecisionGate(spec, PLAN, demo_texts[::8][:160], judged_set=None)
    for choice in (RuntimeChoice(runtime="torch", dtype="bfloat16"), RuntimeChoice(runtime="onnx", dtype="float32")):
        verdict = gate.check(choice)
        assert verdict.passed, verdict.summary()
        assert set(verdict.figures) == {"cosine_mean", "cosine_min"}


def test_check_precision_writes_the_verdict_into_the_profile(tmp_path, tiny_catalog, demo_texts):
    texts = tmp_path / "mine.txt"
    texts.write_text("\n".join(demo_texts[:80]))
    profile = tmp_path / "gated.yaml"
    profile.write_text("# TUNED by a test.\nname: gated\ndevice: cpu\nthreads_per_worker: 2\n")
    done = check_precision("tiny", profile, texts, "float32", "--catalog", str(tiny_catalog))
    assert done.returncode == 0, done.stdout + done.stderr
    assert profile.read_text().startswith("# TUNED by a test.\n")  # provenance kept
    choice = load_profile(str(profile)).runtimes["tiny"]
    assert (choice.runtime, choice.dtype, choice.gate["verdict"], choice.gate["texts"]) == (
        "onnx",
        "float32",
        "pass",
        80,
    )
    assert choice.gate["cosine_min"] > 0.9999
    tuned = load_profile(str(profile)).tuned(load_catalog(str(tiny_catalog)).get("tiny"))
    assert tuned.runtimes["cpu"].runtime == "onnx"  # what a job's items carry to the workers


@pytest.mark.slow
def test_check_precision_refuses_int8_minilm_and_keeps_fp32(tmp_path, demo_texts):
    texts = tmp_path / "mine.txt"
    texts.write_text("\n".join(demo_texts[:64]))
    profile = tmp_path / "gated.yaml"
    profile.write_text(yaml.safe_dump({"name": "gated", "device": "cpu", "threads_per_worker": 2}))
    done = check_precision("minilm", profile, texts, "int8")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "onnx int8 refused: cosine mean" in done.stdout and "< 0.999" in done.stdout  # names the figure
    assert "below fp32's" not in done.stdout  # refused on cosine: not run over the judged set
    choice = load_profile(str(profile)).runtimes["minilm"]
    assert (choice.runtime, choice.dtype, choice.gate["verdict"]) == ("torch", "float32", "refused")
    assert choice.gate["refused_candidate"] == "onnx int8" and choice.gate["failed"]


@pytest.mark.integration  # runs the CLI as a process
def test_bad_sample_file_is_a_clear_error(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    done = run([SHOAL, "check-precision", "--model", "minilm", "--texts", str(empty)], timeout=120)
    assert done.returncode == 2 and f"{empty}: 0 non-empty texts" in done.stderr
