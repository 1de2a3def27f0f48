"""A worker chooses each model's runtime for its own device: its pin where it holds, else the gate's verdict
measured here, else a shipped one, else fp32 torch while it measures (workers/runtime_choice.py).

The machine and device are forced (a `Machine`, a `DevicePlan`), so the GPU paths run on any host; the
measuring child is a stand-in (a unit test starts no process).
"""

from __future__ import annotations

import json

import pytest

from shoal.configs import ModelSpec, RuntimeChoice, hold, load_catalog, load_profile
from shoal.configs import verdicts as verdict_records
from shoal.configs.fingerprints import model_fingerprint
from shoal.configs.machine import Gpu, Machine
from shoal.configs.verdicts import (
    MEASUREMENT,
    Measurement,
    choose,
    failure,
    shipped_verdict,
    verdict_path,
    write_record,
)
from shoal.pipeline.tuning import auto_runtime
from shoal.pipeline.tuning.auto_runtime import listed_choice
from shoal.workers import runtime_choice
from shoal.workers.devices import DevicePlan
from shoal.workers.runtime_choice import MEASURE_ENV, RuntimeChooser, measure_mode

VERSIONS = (("torch", "2.13.0"), ("onnxruntime", "1.22.0"))
AVX2 = Machine(cores=2, memory_bytes=2**34, cpu_model="AMD EPYC", features=frozenset({"avx2"}), versions=VERSIONS)
AMX = Machine(
    cores=2,
    memory_bytes=2**34,
    cpu_model="Xeon",
    features=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
    versions=VERSIONS,
)
A100 = Machine(
    cores=16, memory_bytes=2**37, cpu_model="EPYC", features=frozenset({"avx2"}), versions=VERSIONS,
    gpus=(Gpu("NVIDIA A100-SXM4-80GB", 80 * 2**30, (8, 0)),),
)  # fmt: skip
CPU = DevicePlan("cpu", "cpu", "float32", 2**30, threads=2)
CUDA = DevicePlan("cuda:0", "cuda", "bfloat16", 2**34, threads=1)
FINGERPRINT = "f" * 64


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """A fresh cache, a fixed fingerprint, and the measuring child replaced: what each start was asked."""
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime_choice, "model_fingerprint", lambda spec: FINGERPRINT)
    monkeypatch.setattr(auto_runtime, "model_fingerprint", lambda spec: FINGERPRINT)  # `shoal models`' column
    monkeypatch.setattr("shoal.configs.machine._gpus", lambda: ())
    started: list[str] = []

    def in_background(profile, spec, path):
        started.append(spec.name)
        return "pid 4242"

    monkeypatch.setattr(runtime_choice, "measure_in_background", in_background)
    return started


def record(machine: Machine, device: str, threads: int, *rows: tuple[str, str, str, float]) -> Measurement:
    return {
        "measurement": MEASUREMENT,
        "model": "minilm",
        "machine": machine.signature(device),
        "described": machine.describe(),
        "device": device,
        "threads": threads,
        "texts": 64,
        "candidates": [
            {
                "runtime": r,
                "dtype": d,
                "verdict": v,  # type: ignore[typeddict-item]
                "figures": {"cosine_mean": 1.0},
                "failures": [],
                "speed_vs_fp32": s,
            }
            for r, d, v, s in (("torch", "float32", "pass", 1.0), *rows)
        ],
        "seconds": 1.0,
        "steps": {},
        "checked": "2026-12-06 00:00 UTC",
        "fingerprint": FINGERPRINT,
        "device_class": machine.device_class(device),
        "versions": dict(machine.versions),
    }


def minilm() -> ModelSpec:
    return load_catalog().get("minilm")


def ran(chooser: RuntimeChooser, spec: ModelSpec) -> tuple[str, str, str]:
    """What `chooser` chose for `spec`: (runtime, dtype, its report line), checked against the spec it loads."""
    choice = chooser.choose(spec).runtimes.get(chooser.plan.kind) or RuntimeChoice()
    done = chooser.ran[spec.name]
    assert (choice.runtime, choice.dtype) in ((done.runtime, done.dtype), (done.runtime, "auto"))
    return done.runtime, done.dtype, chooser.report()[spec.name]


def test_a_verdict_measured_on_this_device_is_what_runs_and_the_report_says_why(measured, monkeypatch):
    monkeypatch.setenv(MEASURE_ENV, "background")
    write_record(verdict_path(FINGERPRINT, AVX2, 2, "cpu"), record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4)))
    runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), CPU, AVX2), minilm())
    assert (runtime, dtype) == ("onnx", "float32")
    assert why.startswith("onnx float32: gate pass") and "1.40x fp32 at 2 threads per worker" in why
    assert measured == []


def test_verdicts_are_kept_per_device_threads_and_machine():
    """A CPU worker on a GPU machine is measured as a CPU; a GPU worker with its GPU; threads and machines apart."""
    paths = {
        verdict_path(FINGERPRINT, A100, 1, "cpu"),
        verdict_path(FINGERPRINT, A100, 1, "cuda"),
        verdict_path(FINGERPRINT, A100, 2, "cpu"),
        verdict_path(FINGERPRINT, AVX2, 1, "cpu"),
    }
    assert len(paths) == 4
    assert A100.signature("cpu").startswith("cpu-") and A100.signature("cuda").startswith("cuda-")
    assert A100.device_class("cuda") == "cuda:NVIDIA A100-SXM4-80GB cc8.0" and A100.device_class("cpu") == "cpu:avx2"
    bigger = Machine(cores=64, memory_bytes=2**40, cpu_model="other", features=AVX2.features, versions=VERSIONS)
    assert bigger.device_class("cpu") == AVX2.device_class("cpu") and bigger.signature() != AVX2.signature()


def test_a_first_use_runs_fp32_at_once_and_measures_in_the_background(measured, monkeypatch):
    monkeypatch.delenv(MEASURE_ENV, raising=False)
    assert measure_mode("cpu") == "background"
    runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), CPU, AMX), minilm())
    assert (runtime, dtype) == ("torch", "float32") and "measured in the background (pid 4242)" in why
    assert measured == ["minilm"]


def test_one_background_measurement_per_machine_a_stale_lock_replaced(tmp_path, monkeypatch):
    """Workers of one machine share the cache: the lock file names a live child, so the second does not start one."""
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    starts = []

    class Child:
        pid = 4242

        def __init__(self, command, **kwargs):
            starts.append(command)
            self.stdin = self

        def write(self, text):
            assert json.loads(text)["name"] == "minilm"

        def close(self):
            pass

    monkeypatch.setattr(runtime_choice.subprocess, "Popen", Child)
    alive = {4242}
    monkeypatch.setattr(
        runtime_choice.os, "kill", lambda pid, sig: None if pid in alive else (_ for _ in ()).throw(OSError())
    )
    path = verdict_path(FINGERPRINT, AVX2, 2, "cpu")
    profile = load_profile("cpu-local")
    assert runtime_choice.measure_in_background(profile, minilm(), path) == "pid 4242"
    assert runtime_choice.measure_in_background(profile, minilm(), path) == "already started, pid 4242"
    assert starts[0][-3:] == [runtime_choice.MEASURING, profile.path, str(path)]
    alive.clear()  # the child died without writing: the next load starts another
    runtime_choice.measure_in_background(profile, minilm(), path)
    assert len(starts) == 2


def test_a_shipped_verdict_runs_at_once_on_its_class_and_is_measured_here_once_the_worker_is_idle(
    measured, monkeypatch, tmp_path
):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_record(shipped / "minilm-avx2.json", record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 2.19)))
    monkeypatch.setattr(verdict_records, "SHIPPED", shipped)
    verdict_records._shipped.cache_clear()
    monkeypatch.setenv(MEASURE_ENV, "background")
    elsewhere = Machine(cores=8, memory_bytes=2**35, cpu_model="EPYC 9", features=AVX2.features, versions=VERSIONS)
    try:
        chooser = RuntimeChooser(load_profile("cpu-local"), CPU, elsewhere)
        runtime, dtype, why = ran(chooser, minilm())
        assert (runtime, dtype) == ("onnx", "float32")
        assert "2.19x fp32" in why and "shipped verdict, measured on 2 cores (AMD EPYC" in why
        assert measured == [] and list(chooser.unconfirmed.values()) == [minilm()]  # not beside the first job
        assert chooser.confirm() == ["minilm: pid 4242"] and measured == ["minilm"]
        assert chooser.confirm() == []  # once
        # Another class (bf16 hardware), or other runtime versions: not this record.
        assert shipped_verdict(FINGERPRINT, AMX, "cpu") is None
        newer = Machine(cores=2, memory_bytes=2**34, features=AVX2.features, versions=(("torch", "2.14.0"),))
        assert shipped_verdict(FINGERPRINT, newer, "cpu") is None
        # Measured here since: the local verdict wins.
        local = record(elsewhere, "cpu", 2, ("onnx", "float32", "pass", 0.8))
        write_record(verdict_path(FINGERPRINT, elsewhere, 2, "cpu"), local)
        assert ran(RuntimeChooser(load_profile("cpu-local"), CPU, elsewhere), minilm())[:2] == ("torch", "float32")
        # `shoal models` lists the shipped choice where nothing was measured yet.
        listed = listed_choice(load_profile("cpu-local"), minilm(), AVX2)
        assert listed == "onnx float32 (2.19x fp32; shipped verdict, measured here on first use)"
    finally:
        verdict_records._shipped.cache_clear()


def test_wait_measures_before_the_load_and_a_failure_is_cached_with_its_reason(measured, monkeypatch):
    monkeypatch.setenv(MEASURE_ENV, "wait")
    tries = []

    def killed(profile, spec, path):  # a measuring process that died before writing anything
        tries.append(spec.name)
        record = failure(spec.name, "the measuring process exited with -9")
        write_record(path, record)
        return record

    monkeypatch.setattr(runtime_choice, "measure_in_child", killed)
    for _ in range(2):  # two workers, or two loads
        runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), CPU, AVX2), minilm())
        assert (runtime, dtype) == ("torch", "float32")
        assert why.startswith("torch float32: measuring failed (the measuring process exited with -9")
        assert "to measure again" in why
    assert tries == ["minilm"]  # cached with its reason: not measured again
    assert listed_choice(load_profile("cpu-local"), minilm(), AVX2).startswith("torch float32 (measuring failed")


def test_a_pin_for_this_device_runs_and_a_pin_this_machine_lacks_gives_way_to_the_verdict(measured, monkeypatch):
    monkeypatch.setenv(MEASURE_ENV, "background")
    write_record(verdict_path(FINGERPRINT, AVX2, 1, "cpu"), record(AVX2, "cpu", 1, ("onnx", "float32", "pass", 1.4)))
    plan = DevicePlan("cpu", "cpu", "float32", 2**30, threads=1)
    bf16 = RuntimeChoice(runtime="torch", dtype="bfloat16", needs=["bf16"])
    pinned = minilm().model_copy(update={"runtimes": {"cpu": bf16}})
    assert ran(RuntimeChooser(load_profile("cpu-local"), plan, AMX), pinned)[:2] == ("torch", "bfloat16")
    runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), plan, AVX2), pinned)
    assert (runtime, dtype) == ("onnx", "float32")
    assert why.startswith("onnx float32: the pinned torch bfloat16 needs bf16 (AVX-512 BF16 or AMX")
    # The worker's own profile: cpu-2core's bf16 pin is held on an AVX2 machine, and the worker says so.
    profile = hold(load_profile("cpu-2core"), AVX2)
    runtime, dtype, why = ran(RuntimeChooser(profile, plan, AVX2), profile.tuned(minilm()))
    assert (runtime, dtype) == ("onnx", "float32") and why.startswith("onnx float32: profile cpu-2core pins torch")
    onnx = RuntimeChoice(runtime="onnx", dtype="float32")
    kept = ran(
        RuntimeChooser(load_profile("cpu-local"), plan, AVX2), minilm().model_copy(update={"runtimes": {"cpu": onnx}})
    )
    assert kept == (
        "onnx",
        "float32",
        "onnx float32: pinned by the model's spec (a catalog entry, or the submitting client's profile)",
    )
    assert measured == []


def test_the_kinds_auto_does_not_measure_run_torch_in_the_worker_s_dtype(measured):
    sparse = ModelSpec(name="splade", kind="sparse", source="/nowhere", dim=30522, max_seq_length=512)
    assert ran(RuntimeChooser(load_profile("cpu-local"), CUDA, A100), sparse) == (
        "torch",
        "bfloat16",
        "torch bfloat16: torch in the worker's dtype (sparse models are not measured)",
    )
    assert measured == []


def test_a_gpu_worker_measures_before_its_first_load_and_runs_what_passed_on_its_gpu(measured, monkeypatch):
    monkeypatch.delenv(MEASURE_ENV, raising=False)
    assert measure_mode("cuda") == "wait"  # seconds on a GPU: no fp32 first job
    asked = []

    def on_the_gpu(profile, spec, path):
        asked.append(path.name)
        result = record(A100, "cuda", 1, ("torch", "float16", "pass", 3.1), ("torch", "bfloat16", "refused", 3.2))
        write_record(path, result)
        return result

    monkeypatch.setattr(runtime_choice, "measure_in_child", on_the_gpu)
    runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), CUDA, A100), minilm())
    assert (runtime, dtype) == ("torch", "float16") and "refused: torch bfloat16" in why
    assert asked == [verdict_path(FINGERPRINT, A100, 1, "cuda").name] and measured == []
    # A CPU worker of the same machine has its own choice: nothing measured on the CPU yet, so fp32 meanwhile.
    monkeypatch.setenv(MEASURE_ENV, "background")
    assert ran(RuntimeChooser(load_profile("cpu-local"), CPU, A100), minilm())[:2] == ("torch", "float32")
    assert measured == ["minilm"]


def test_the_gpu_candidates_are_those_its_compute_capability_makes_fast(monkeypatch):
    monkeypatch.setattr("shoal.workers.runtimes.require_installed", lambda runtime: None)
    turing = Machine(cores=8, memory_bytes=2**35, gpus=(Gpu("Tesla T4", 16 * 2**30, (7, 5)),))
    pascal = Machine(cores=8, memory_bytes=2**35, gpus=(Gpu("Tesla P100", 16 * 2**30, (6, 0)),))
    dtypes = {
        name: [c.dtype for c in auto_runtime.offered("cuda", m)]
        for name, m in [("a100", A100), ("t4", turing), ("p100", pascal)]
    }
    assert dtypes == {"a100": ["float16", "bfloat16"], "t4": ["float16"], "p100": []}
    assert [(c.runtime, c.dtype) for c in auto_runtime.offered("cpu", AVX2)] == [("onnx", "float32"), ("onnx", "int8")]


def test_an_unknown_measuring_mode_is_refused(monkeypatch):
    monkeypatch.setenv(MEASURE_ENV, "sometimes")
    with pytest.raises(ValueError, match="SHOAL_AUTO_MEASURE='sometimes'"):
        measure_mode("cpu")


def test_off_runs_fp32_torch_whatever_was_measured_and_measures_nothing(measured, monkeypatch):
    monkeypatch.setenv(MEASURE_ENV, "off")
    write_record(verdict_path(FINGERPRINT, AVX2, 2, "cpu"), record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4)))
    runtime, dtype, why = ran(RuntimeChooser(load_profile("cpu-local"), CPU, AVX2), minilm())
    assert (runtime, dtype, why) == (
        "torch",
        "float32",
        "torch float32: auto's runtime choice is off (SHOAL_AUTO_MEASURE=off)",
    )
    assert measured == []


def test_every_shipped_verdict_is_of_a_shipped_model_as_it_is_now_and_passed_its_choice():
    """A shipped record goes stale when the model's files or settings change: its fingerprint must still match."""
    catalog = load_catalog()
    fingerprints = {model_fingerprint(spec): name for name, spec in catalog.models.items() if spec.kind != "sim"}
    shipped = verdict_records._shipped()
    assert shipped, "no shipped verdict: a fresh machine's first use would run fp32 torch"
    for (fingerprint, device_class), record in shipped.items():
        assert fingerprints.get(fingerprint) == record["model"], f"{record['model']} on {device_class}: stale"
        choice, _ = choose(record)
        row = next(r for r in record["candidates"] if (r["runtime"], r["dtype"]) == (choice.runtime, choice.dtype))
        assert row["verdict"] == "pass" and set(record["versions"]) == {"torch", "onnxruntime"}


def test_a_model_loaded_before_its_verdict_is_named_for_reloading_once_the_verdict_names_another_runtime(
    measured, monkeypatch
):
    monkeypatch.setenv(MEASURE_ENV, "background")
    chooser = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2)
    assert ran(chooser, minilm())[:2] == ("torch", "float32") and measured == ["minilm"]
    assert chooser.superseded() == []  # measuring still
    write_record(verdict_path(FINGERPRINT, AVX2, 2, "cpu"), record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4)))
    assert chooser.superseded() == [minilm()] and chooser.superseded() == []  # once
    assert ran(chooser, minilm())[:2] == ("onnx", "float32")  # what the reload gets
    # A verdict that names what already runs: nothing to reload.
    other = RuntimeChooser(load_profile("cpu-local"), CPU, AMX)
    assert ran(other, minilm())[:2] == ("torch", "float32")
    write_record(verdict_path(FINGERPRINT, AMX, 2, "cpu"), record(AMX, "cpu", 2, ("torch", "bfloat16", "refused", 3.0)))
    assert other.superseded() == []


async def test_the_pool_swaps_a_reloaded_runtime_in_only_while_nothing_uses_the_old_one():
    from concurrent.futures import ThreadPoolExecutor

    from shoal.workers.model_pool import ModelPool

    class Loaded:
        def __init__(self, name: str) -> None:
            self.name, self.closed = name, False

        def memory_bytes(self) -> int:
            return 1000

        def close(self) -> None:
            self.closed = True

    first, second = Loaded("fp32"), Loaded("onnx")
    with ThreadPoolExecutor(1) as loader:
        pool = ModelPool(10**6, lambda spec: first, loader)
        spec = ModelSpec(name="m", kind="embedder", source="/m", dim=4, max_seq_length=8, memory_bytes=1000)
        async with pool.use(spec) as runtime:
            assert runtime is first and not pool.replace_idle("m", second, 900)  # in use: later
        assert pool.replace_idle("m", second, 900) and first.closed and not second.closed
        async with pool.use(spec) as runtime:
            assert runtime is second and pool.size_of(spec) == 900
        assert not pool.replace_idle("gone", Loaded("x"), 1)


@pytest.mark.parametrize(
    ("features", "dtype"),
    [
        ({"avx2"}, "float32"),  # ONNX fp32, measured on this project's AVX2 EPYC
        ({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}, "bfloat16"),  # an AVX-512 BF16 EPYC
        ({"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_bf16", "amx_int8", "amx_tile"}, "bfloat16"),
    ],
)
def test_a_fresh_machine_of_a_shipped_class_runs_minilm_s_shipped_verdict_at_once(
    tmp_path, monkeypatch, features, dtype
):
    """The first `make demo` on such a machine: no measurement before or beside the job, the gate's verdict."""
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(MEASURE_ENV, "background")
    versions = tuple(next(iter(verdict_records._shipped().values()))["versions"].items())
    machine = Machine(cores=2, memory_bytes=2**34, cpu_model="any", features=frozenset(features), versions=versions)
    threads = 2 if dtype == "float32" else 1  # auto's layout there: 1 x 2 without bf16, 2 x 1 with it
    chooser = RuntimeChooser(load_profile("cpu-local"), DevicePlan("cpu", "cpu", "float32", 2**30, threads), machine)
    runtime, chosen, why = ran(chooser, minilm())
    assert chosen == dtype and "shipped verdict, measured on" in why and chooser.unconfirmed
    assert runtime == ("onnx" if dtype == "float32" else "torch")


class Cluster:
    """The scheduler's shared verdicts, as workers/shared_verdicts.SharedVerdicts offers them, in a dict."""

    def __init__(self, address: str, store: dict | None = None) -> None:
        self.address, self.store = address, {} if store is None else store

    def fetch(self, key):
        return self.store.get(("verdict", key))

    def publish(self, key, record):
        self.store[("verdict", key)] = record

    def claim(self, key):  # a mark set to None stands for one that lapsed
        measuring = self.store.get(("measuring", key))
        if measuring and measuring != self.address:
            return measuring
        self.store[("measuring", key)] = self.address
        return None


def test_workers_of_one_kind_of_device_measure_once_and_share_the_verdict_through_the_scheduler(
    measured, monkeypatch, tmp_path
):
    monkeypatch.setenv(MEASURE_ENV, "background")
    store: dict = {}
    first = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2, Cluster("tcp://a", store))
    assert ran(first, minilm())[:2] == ("torch", "float32") and measured == ["minilm"]
    # A second worker of the same kind (its own cache) while the first measures: fp32, nothing started.
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "second"))
    second = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2, Cluster("tcp://b", store))
    runtime, dtype, why = ran(second, minilm())
    assert (runtime, dtype) == ("torch", "float32") and "measured in the background (by tcp://a)" in why
    assert measured == ["minilm"]
    # The first's child writes its record: the first publishes it, the second takes it, both move to it.
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    write_record(verdict_path(FINGERPRINT, AVX2, 2, "cpu"), record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4)))
    assert first.superseded() == [minilm()]
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "second"))
    assert second.superseded() == [minilm()]
    assert verdict_path(FINGERPRINT, AVX2, 2, "cpu").is_file()  # cached in the second's own cache
    # A third, started later: the verdict at once, nothing measured.
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path / "third"))
    third = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2, Cluster("tcp://c", store))
    assert ran(third, minilm())[:2] == ("onnx", "float32") and measured == ["minilm"]


def test_a_worker_waiting_for_another_s_measurement_measures_itself_once_that_one_s_mark_lapses(
    measured, monkeypatch, tmp_path
):
    monkeypatch.setenv(MEASURE_ENV, "background")
    store: dict = {("measuring", verdict_path(FINGERPRINT, AVX2, 2, "cpu").stem): "tcp://killed"}
    waiting = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2, Cluster("tcp://b", store))
    assert ran(waiting, minilm())[:2] == ("torch", "float32") and measured == []
    assert waiting.superseded() == [] and measured == []  # still marked: waits
    store[("measuring", verdict_path(FINGERPRINT, AVX2, 2, "cpu").stem)] = None  # the mark lapsed
    assert waiting.superseded() == [] and measured == ["minilm"]  # measured here now, once
    assert waiting.superseded() == [] and measured == ["minilm"]
    write_record(verdict_path(FINGERPRINT, AVX2, 2, "cpu"), record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4)))
    assert waiting.superseded() == [minilm()] and store[("verdict", verdict_path(FINGERPRINT, AVX2, 2, "cpu").stem)]


def test_a_shipped_verdict_another_worker_is_confirming_is_left_to_it_unless_its_mark_lapses(
    measured, monkeypatch, tmp_path
):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    write_record(shipped / "minilm-avx2.json", record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 2.19)))
    monkeypatch.setattr(verdict_records, "SHIPPED", shipped)
    verdict_records._shipped.cache_clear()
    monkeypatch.setenv(MEASURE_ENV, "background")
    key = verdict_path(FINGERPRINT, AVX2, 2, "cpu").stem
    store: dict = {("measuring", key): "tcp://a"}
    try:
        chooser = RuntimeChooser(load_profile("cpu-local"), CPU, AVX2, Cluster("tcp://b", store))
        assert ran(chooser, minilm())[:2] == ("onnx", "float32")
        assert chooser.confirm() == ["minilm: by tcp://a"] and measured == []
        assert chooser.superseded() == [] and measured == []
        store[("measuring", key)] = None  # a's mark lapsed: b confirms it itself
        assert chooser.superseded() == [] and measured == ["minilm"]
    finally:
        verdict_records._shipped.cache_clear()


def test_shared_verdicts_ask_the_scheduler_from_the_loader_thread_and_survive_one_that_does_not_answer(monkeypatch):
    import asyncio
    import threading

    from shoal.workers import shared_verdicts
    from shoal.workers.shared_verdicts import SharedVerdicts

    class Scheduler:  # Dask's set_metadata/get_metadata handlers, over a nested dict
        def __init__(self) -> None:
            self.metadata: dict = {}

        async def set_metadata(self, keys, value):
            self.metadata.setdefault(keys[0], {})[keys[1]] = value

        async def get_metadata(self, keys, default):
            return self.metadata.get(keys[0], {}).get(keys[1], default)

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        scheduler, now = Scheduler(), [1000.0]
        mine = SharedVerdicts(scheduler, loop, "tcp://a", clock=lambda: now[0])
        theirs = SharedVerdicts(scheduler, loop, "tcp://b", clock=lambda: now[0])
        assert mine.fetch("k") is None and mine.claim("k") is None and theirs.claim("k") == "tcp://a"
        assert mine.claim("k") is None  # its own mark, renewed
        now[0] += shared_verdicts.CLAIM_SECONDS + 1  # a's mark lapses (a killed, or its measurement failed)
        assert theirs.claim("k") is None and mine.claim("k") == "tcp://b"
        result = record(AVX2, "cpu", 2, ("onnx", "float32", "pass", 1.4))
        mine.publish("k", result)
        assert theirs.fetch("k") == result
        scheduler.metadata[shared_verdicts.ROOT]["old"] = {"measurement": 1}  # another format: measured again
        assert theirs.fetch("old") is None

        class Gone:
            async def get_metadata(self, keys, default):
                await asyncio.sleep(60)

        monkeypatch.setattr(shared_verdicts, "TIMEOUT", 0.2)
        assert SharedVerdicts(Gone(), loop, "tcp://c").fetch("k") is None
    finally:

        async def cancelled() -> None:  # the unanswered call, cancelled by the timeout: let it end
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancelled(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
