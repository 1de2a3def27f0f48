"""The `auto` profile: a layout read off the machine, and per model the fastest runtime the gate passes here."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shoal.configs import load_catalog, load_profile
from shoal.configs.auto import cpu_layout, gpu_layout
from shoal.configs.machine import NO_BF16_ENV, Gpu, Machine, probe
from shoal.configs.verdicts import MEASUREMENT, choose
from shoal.pipeline.tuning import REPO_ROOT
from shoal.pipeline.tuning.auto_runtime import gate_texts, judge
from shoal.pipeline.tuning.quality_gate import GATE_SAMPLE
from tests.support.cli import embed_args, run_shoal
from tests.support.files import write_shards
from tests.support.processes import run

GIB = 2**30


def test_a_small_cpu_with_bf16_gets_cpu_2core_s_tuned_layout_one_worker_per_core(monkeypatch, no_gpu_probe):
    monkeypatch.setenv("SHOAL_CPU_FEATURES", "avx512_bf16")  # where cpu-2core's bf16 pin holds
    layout, why = cpu_layout(Machine(cores=2, memory_bytes=24 * GIB, features=frozenset({"avx512_bf16"})))
    assert (layout.workers, layout.threads_per_worker, layout.device) == (2, 1, "cpu")
    assert layout.token_budgets == load_profile("cpu-2core").token_budgets  # tuned on 1-thread workers
    assert load_profile("cpu-2core").runtimes and layout.runtimes == {}  # measured per machine, never inherited
    assert "cpu-2core" in why and "2 cores, bf16 hardware" in why


def test_without_bf16_one_worker_process_takes_the_cores():
    layout, why = cpu_layout(Machine(cores=2, memory_bytes=24 * GIB, features=frozenset({"avx2"})))
    assert (layout.workers, layout.threads_per_worker) == (1, 2)
    assert layout.token_budgets == {}  # cpu-local's: the catalog's budgets
    assert "cpu-local" in why and "no bf16 hardware" in why
    switched = cpu_layout(Machine(cores=2, memory_bytes=24 * GIB, features=frozenset({"amx_bf16"}), no_bf16=True))
    assert switched[0].workers == 1 and "(switched off)" in switched[1]


def test_a_large_cpu_caps_the_processes_and_gives_each_the_cores_left():
    bf16 = frozenset({"amx_bf16"})
    large = cpu_layout(Machine(cores=32, memory_bytes=128 * GIB, features=bf16))[0]
    assert (large.workers, large.threads_per_worker) == (8, 4)
    short_of_memory = cpu_layout(Machine(cores=8, memory_bytes=3 * GIB, features=bf16))[0]
    assert (short_of_memory.workers, short_of_memory.threads_per_worker) == (3, 2)
    fp32 = cpu_layout(Machine(cores=16, memory_bytes=64 * GIB))[0]
    assert (fp32.workers, fp32.threads_per_worker) == (4, 4)


def test_a_gpu_gets_its_shipped_profile_else_the_nearest_in_memory_with_at_most_a_worker_per_two_cores():
    h100 = Machine(cores=26, memory_bytes=200 * GIB, gpus=(Gpu("NVIDIA H100 80GB HBM3", 80 * GIB, (9, 0)),))
    layout, why = gpu_layout(h100)
    assert (layout.device, layout.workers, layout.memory_fraction) == ("cuda", 8, 0.052)
    assert "shipped profile for NVIDIA H100" in why
    t4 = Machine(cores=4, memory_bytes=16 * GIB, gpus=(Gpu("Tesla T4", 15 * GIB, (7, 5)),))
    layout, why = gpu_layout(t4)
    assert layout.workers == 2 and layout.token_budgets == load_profile("l4").token_budgets
    assert "l4's profile" in why


def test_bf16_is_offered_where_the_hardware_computes_it_unless_switched_off():
    assert not Machine(cores=2, memory_bytes=GIB, features=frozenset({"avx2"})).bf16
    assert Machine(cores=2, memory_bytes=GIB, features=frozenset({"avx512_bf16"})).bf16
    assert not Machine(cores=2, memory_bytes=GIB, features=frozenset({"amx_bf16"}), no_bf16=True).bf16
    assert not Machine(cores=4, memory_bytes=GIB, gpus=(Gpu("Tesla T4", GIB, (7, 5)),)).bf16
    assert Machine(cores=4, memory_bytes=GIB, gpus=(Gpu("NVIDIA L4", GIB, (8, 9)),)).bf16


@pytest.fixture
def no_gpu_probe(monkeypatch):
    """probe() without nvidia-smi: a unit test starts no process."""
    monkeypatch.setattr("shoal.configs.machine._gpus", lambda: ())


def test_the_no_bf16_switch_is_read_and_makes_another_kind_of_machine(monkeypatch, no_gpu_probe):
    monkeypatch.delenv(NO_BF16_ENV, raising=False)
    usual = probe()
    monkeypatch.setenv(NO_BF16_ENV, "1")
    switched = probe()
    assert switched.no_bf16 and not switched.bf16
    assert switched.signature() != usual.signature()  # verdicts measured with bf16 are not reused
    assert f"bf16 off ({NO_BF16_ENV})" in switched.describe()


def record(*rows: tuple[str, str, str, float | None]) -> dict:
    return {
        "threads": 1,
        "checked": "2026-12-04 06:00 UTC",
        "candidates": [
            {"runtime": r, "dtype": d, "verdict": v, "figures": {"cosine_mean": 0.9999}, "speed_vs_fp32": s}
            for r, d, v, s in rows
        ],
    }


def test_the_fastest_candidate_that_passed_is_chosen_with_its_evidence():
    choice, why = choose(
        record(
            ("torch", "float32", "pass", 1.0),
            ("torch", "bfloat16", "pass", 2.9),
            ("onnx", "float32", "pass", 1.2),
            ("onnx", "int8", "refused", None),
        )
    )
    assert (choice.runtime, choice.dtype, choice.gate["speed_vs_fp32"]) == ("torch", "bfloat16", 2.9)
    assert "2.90x fp32" in why and "refused: onnx int8" in why


def test_fp32_runs_where_nothing_passes_or_nothing_is_faster_and_says_why():
    choice, why = choose(record(("torch", "float32", "pass", 1.0), ("onnx", "int8", "refused", None)))
    assert (choice.runtime, choice.dtype) == ("torch", "float32")
    assert why.startswith("no candidate passed the gate (onnx int8 refused)")
    choice, why = choose(record(("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 0.93)))
    assert (choice.runtime, choice.dtype) == ("torch", "float32") and "beat fp32 by 5%" in why


def test_a_full_precision_that_starts_without_torch_wins_a_tie():
    """The timing runs on loaded models; an ONNX worker also skips torch's import and load (seconds per start)."""
    choice, why = choose(record(("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 0.97)))
    assert (choice.runtime, choice.dtype) == ("onnx", "float32")
    assert "0.97x fp32 (within 5% of fp32 torch, and its workers start without importing torch)" in why
    # a reduced precision still needs 25 % over what would run otherwise, here ONNX fp32's 0.97x
    lossy = record(("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 0.97), ("onnx", "int8", "pass", 1.2))
    assert choose(lossy)[0].dtype == "float32"
    checked = []
    rows = judge({("onnx", "float32"): 0.97}, lambda c: (checked.append(c.runtime) or {}, []))
    assert checked == ["onnx"] and rows[1]["verdict"] == "pass"  # gated: it could be chosen


def test_reduced_precision_must_beat_the_fastest_full_precision_by_a_quarter():
    near = record(("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 1.5), ("onnx", "int8", "pass", 1.7))
    assert (choose(near)[0].runtime, choose(near)[0].dtype) == ("onnx", "float32")  # 1.7 < 1.5 x 1.25
    clear = record(
        ("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 1.1), ("torch", "bfloat16", "pass", 2.9)
    )
    assert choose(clear)[0].dtype == "bfloat16"
    alone = record(("torch", "float32", "pass", 1.0), ("onnx", "int8", "pass", 1.08))
    assert choose(alone)[0].dtype == "float32"
    # A full precision that would not run (short of its entry bar): bf16 is measured against fp32 torch.
    marginal = record(
        ("torch", "float32", "pass", 1.0), ("onnx", "float32", "pass", 0.9), ("torch", "bfloat16", "pass", 1.25)
    )
    assert choose(marginal)[0].dtype == "bfloat16"


def test_the_auto_profile_is_written_where_worker_processes_load_it(tmp_path, monkeypatch, no_gpu_probe):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    profile = load_profile("auto")
    assert profile.path.startswith(str(tmp_path / "profiles"))
    again = load_profile(profile.path)  # what SHOAL_PROFILE gives a worker
    assert again.model_dump() == profile.model_dump()
    assert "machine:" in profile.reasons["layout"]


def test_a_cache_that_cannot_be_written_leaves_auto_by_name(tmp_path, monkeypatch, no_gpu_probe):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "file"))  # a file where the folder should be
    profile = load_profile("auto")
    assert profile.path == "" and profile.workers >= 1  # workers load `auto` by name and derive the same layout


def test_the_measuring_process_caches_why_it_failed(tmp_path, monkeypatch, no_gpu_probe):
    from shoal.pipeline.tuning import auto_runtime

    def fails(spec, profile, machine):
        raise FileNotFoundError("no folder datasets/demo")

    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(auto_runtime, "measure", fails)
    monkeypatch.setattr(sys, "argv", ["auto_runtime", "auto", str(tmp_path / "verdicts.json")])
    monkeypatch.setattr(sys, "stdin", io.StringIO(load_catalog().get("minilm").model_dump_json()))
    auto_runtime.main()
    record = json.loads((tmp_path / "verdicts.json").read_text())
    assert record["failed"] == "FileNotFoundError: no folder datasets/demo" and "Traceback" in record["details"]
    assert record["measurement"] == MEASUREMENT
    assert choose(record)[1].startswith("measuring failed (FileNotFoundError: no folder datasets/demo;")


CANDIDATES = [("torch", "bfloat16"), ("onnx", "float32"), ("onnx", "int8")]


@given(
    speeds=st.lists(st.integers(50, 400), min_size=3, max_size=3, unique=True),
    passes=st.lists(st.booleans(), min_size=3, max_size=3),
)
def test_a_candidate_left_ungated_could_not_have_been_chosen(speeds, passes):
    """Gating only what could win chooses what gating every candidate would."""
    timed = {c: s / 100 for c, s in zip(CANDIDATES, speeds)}
    outcome = dict(zip(CANDIDATES, passes))
    checked = []

    def check(choice):
        checked.append((choice.runtime, choice.dtype))
        return {"cosine_mean": 1.0}, [] if outcome[choice.runtime, choice.dtype] else ["cosine mean 0.9 < 0.999"]

    rows = judge(timed, check)
    everything = (
        [rows[0]]
        + [  # what the record would say had every candidate been gated, in the same order
            {"runtime": r, "dtype": d, "speed_vs_fp32": timed[r, d], "figures": {"cosine_mean": 1.0}}
            | {"verdict": "pass" if outcome[r, d] else "refused"}
            for r, d in [(row["runtime"], row["dtype"]) for row in rows[1:]]
        ]
    )
    pruned, full = choose(record_of(rows)), choose(record_of(everything))
    assert (pruned[0].runtime, pruned[0].dtype) == (full[0].runtime, full[0].dtype)
    assert {(r["runtime"], r["dtype"]) for r in rows if r["verdict"] == "too slow"}.isdisjoint(checked)
    assert len(rows) == 4 and rows[0]["figures"] == {}  # fp32 torch is the reference, never checked against itself


def test_a_reduced_precision_that_would_win_outright_is_gated_first_and_ends_the_gating_when_it_passes():
    """int8 at 2.5x beats onnx fp32's 1.5x by more than a quarter: gated first; fp32 only if int8 is refused."""
    timed = {("onnx", "float32"): 1.5, ("onnx", "int8"): 2.5, ("torch", "bfloat16"): 1.2}
    for int8_passes, gated in ((True, [("onnx", "int8")]), (False, [("onnx", "int8"), ("onnx", "float32")])):
        checked: list[tuple[str, str]] = []

        def check(choice, int8_passes=int8_passes, checked=checked):
            checked.append((choice.runtime, choice.dtype))
            return {}, [] if int8_passes or choice.dtype != "int8" else ["cosine mean 0.96 < 0.999"]

        rows = judge(timed, check)
        assert checked == gated
        assert choose(record_of(rows))[0].dtype == ("int8" if int8_passes else "float32")
        assert {r["dtype"]: r["verdict"] for r in rows[1:]}["bfloat16"] == "too slow"


def record_of(rows: list[dict]) -> dict:
    return {"threads": 2, "checked": "2026-12-04 09:00 UTC", "candidates": rows}


def test_the_gate_sample_ships_in_the_package_and_its_judged_set_is_the_repository_s():
    sample = pq.read_table(GATE_SAMPLE / "sample.parquet")
    assert sample.num_rows == 64 and len(gate_texts()) == 64 and all(gate_texts())
    for name in ("corpus.parquet", "queries.parquet", "qrels.parquet"):
        assert (GATE_SAMPLE / name).read_bytes() == (REPO_ROOT / "datasets" / "pydoc-sections" / name).read_bytes()
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    assert "gate_sample/*" in pyproject["tool"]["setuptools"]["package-data"]["shoal.pipeline.tuning"]


@pytest.fixture(scope="module")
def installed_shoal(tmp_path_factory) -> Path:
    """As in the image: the package pip-installed from its sources alone (a site folder for PYTHONPATH)."""
    source = tmp_path_factory.mktemp("src")  # what the Containerfile's src stage holds
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in ("shoal", "configs", "pipeline", "scheduler_plugins", "workers"):
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    site = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile"]
    built = subprocess.run([*pip, "--target", str(site), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert (site / "shoal" / "pipeline" / "tuning" / "gate_sample").is_dir()
    return site


def run_installed(site: Path, folder: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    """`args` run by the installed copy (`-m MODULE ...`) in `folder`, where no datasets/ is."""
    env = {**os.environ, "PYTHONPATH": str(site), "SHOAL_CACHE_DIR": str(folder / "cache"), "SHOAL_PROFILE": ""}
    done = run([sys.executable, *args], input=stdin, cwd=folder, env=env, timeout=300)
    assert not (folder / "datasets").exists()
    return done


@pytest.mark.integration
def test_an_installed_shoal_without_datasets_measures_from_its_package_data(tmp_path, tiny_catalog, installed_shoal):
    spec = load_catalog(str(tiny_catalog)).get("tiny")
    verdicts = tmp_path / "verdicts.json"
    module = ["-m", "shoal.pipeline.tuning.auto_runtime", "auto", str(verdicts)]
    done = run_installed(installed_shoal, tmp_path, *module, stdin=spec.model_dump_json())
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(verdicts.read_text())
    assert "failed" not in record, record.get("details")
    assert record["texts"] == 64 and record["candidates"][0]["speed_vs_fp32"] == 1.0
    assert f"auto: measured tiny in {record['seconds']:.1f} s" in done.stderr


CLI = ["-c", "import sys; from shoal.pipeline.cli import main; sys.exit(main())"]


@pytest.mark.integration
def test_an_installed_shoal_checks_precision_on_its_gate_sample_and_tune_asks_for_input(
    tmp_path, tiny_catalog, installed_shoal
):
    check = ["check-precision", "--model", "tiny", "--catalog", str(tiny_catalog), "--runtime", "onnx"]
    done = run_installed(installed_shoal, tmp_path, *CLI, *check, "--dtype", "float32")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "on 64 texts" in " ".join(done.stdout.split())  # the packaged gate sample, not datasets/demo's 512
    tune = ["tune", "--profile", str(tmp_path / "mine.yaml"), "--models", "tiny", "--catalog", str(tiny_catalog)]
    done = run_installed(installed_shoal, tmp_path, *CLI, *tune)
    assert done.returncode == 2 and "pass --input PATH" in done.stderr and "no datasets/" in done.stderr
    assert not (tmp_path / "mine.yaml").exists()


@pytest.mark.integration
def test_without_bf16_a_job_on_the_default_profile_runs_a_runtime_that_passed_the_gate(
    tmp_path, tiny_catalog, demo_texts
):
    """SHOAL_NO_BF16 set, no --profile: the tiny model is measured once, bf16 never offered, the choice says why."""
    write_shards(tmp_path / "in", demo_texts[:64], 1, 32)
    env = {
        "SHOAL_CACHE_DIR": str(tmp_path / "cache"),
        NO_BF16_ENV: "1",
        "SHOAL_PROFILE": "",
        "SHOAL_AUTO_MEASURE": "wait",
        "COLUMNS": "400",  # the summary's rows on one line each
    }
    done = run_shoal(*embed_args(tmp_path / "in", tmp_path / "out", tiny_catalog, "--verbose"), env=env)
    assert done.returncode == 0, done.stderr
    (verdicts,) = (tmp_path / "cache" / "verdicts").glob("*.json")
    measured = json.loads(verdicts.read_text())
    assert "bfloat16" not in {row["dtype"] for row in measured["candidates"]}
    assert "bf16 off (SHOAL_NO_BF16)" in measured["described"]
    choice, why = choose(measured)
    chosen = next(r for r in measured["candidates"] if (r["runtime"], r["dtype"]) == (choice.runtime, choice.dtype))
    assert chosen["verdict"] == "pass"
    gated = [r for r in measured["candidates"][1:] if r["verdict"] != "too slow"]  # fast enough to be chosen
    assert all(r["figures"] for r in gated) and measured["seconds"] > 0
    assert "profile auto" in done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "runtime of tiny on tcp://127.0.0.1:" in line]
    assert line.split("│")[2].strip() == why  # the worker's choice, in the gate's words
    measured_at = verdicts.stat().st_mtime_ns
    stages = [line.split(":")[0] for line in done.stderr.splitlines() if line.startswith("stage ")]
    assert stages[:2] == ["stage imports", "stage checks"] and stages[-2:] == ["stage stop", "stage total"]
    # Measured once: a second job reuses the verdicts.
    again = run_shoal(*embed_args(tmp_path / "in", tmp_path / "again", tiny_catalog), env=env)
    assert again.returncode == 0, again.stderr
    assert verdicts.stat().st_mtime_ns == measured_at and len(list(verdicts.parent.glob("*.json"))) == 1
    assert f"│ {why}" in again.stderr
    listed = run_shoal("models", "--catalog", str(tiny_catalog), "--catalog-only", "--json", env=env)
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["tiny"]["auto_runtime"].startswith(f"{choice.runtime} {choice.dtype}")  # `shoal models` shows it
