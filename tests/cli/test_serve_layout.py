"""`shoal serve` with no --profile: on a CPU, auto's online layout, one worker with every core in the server's
process (a lone query gets every core and no process hop); it says so, and what each worker runs."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import numpy as np
import pytest

from shoal.configs import load_profile
from shoal.configs.auto import LAYOUT, auto_profile, serving_layout
from shoal.configs.machine import Gpu, Machine
from shoal.pipeline.client import OnlineClient
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import started

AVX2 = Machine(cores=4, memory_bytes=2**35, cpu_model="EPYC", features=frozenset({"avx2"}))
AMX = Machine(cores=2, memory_bytes=2**35, cpu_model="Xeon", features=frozenset({"avx512_bf16", "amx_bf16"}))
H100 = Machine(cores=16, memory_bytes=2**38, gpus=(Gpu("NVIDIA H100 80GB HBM3", 80 * 2**30, (9, 0)),))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr("shoal.configs.machine._gpus", lambda: ())


def test_serve_s_auto_layout_on_a_cpu_is_one_worker_with_every_core_in_the_server_s_process(cache):
    for machine in (AVX2, AMX):  # 1 x 4 for jobs on the one, 2 x 1 on the other: online, one worker either way
        served = serving_layout(auto_profile(machine))
        assert (served.workers, served.threads_per_worker, served.in_process_workers) == (1, machine.cores, True)
        assert served.reasons[LAYOUT].startswith(f"1 worker x {machine.cores} threads in the server's process")
        assert load_profile(served.path).in_process_workers  # what the in-process worker loads
    gpu = auto_profile(H100)
    assert serving_layout(gpu) is gpu  # its workers each own a device
    named = load_profile("cpu-local")
    assert serving_layout(named) is named  # a profile given is the user's layout


@pytest.mark.integration
def test_serve_with_no_profile_answers_from_its_worker_in_the_server_s_process_and_says_what_it_runs(
    tiny_catalog, tiny_model, tmp_path
):
    command = [SHOAL, "serve", "--catalog", str(tiny_catalog), "--port", "0", "--models", "tiny"]
    env = {"SHOAL_PROFILE": "", "SHOAL_CACHE_DIR": str(tmp_path), "COLUMNS": "400"}
    with started(command, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                 stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        lines: list[str] = []
        assert proc.stderr is not None
        threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
        deadline = time.monotonic() + 240
        while not any("runtime of tiny on" in line for line in lines):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        text = "".join(lines)
        assert "profile auto: 1 worker x" in text and "threads in the server's process" in text
        (ran,) = [line for line in lines if "runtime of tiny on" in line]
        assert "on inproc://" in ran and "torch float32" in ran  # the in-process worker, its choice named
        url = next(line for line in lines if "serving" in line).split(" on ")[1].split()[0]
        from sentence_transformers import SentenceTransformer

        with OnlineClient(url) as online:
            vectors = online.encode("tiny", ["a lone query"])
        expected = SentenceTransformer(str(tiny_model), device="cpu").encode(["a lone query"])
        np.testing.assert_allclose(vectors, expected, atol=1e-5)
