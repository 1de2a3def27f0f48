"""`shoal gateway` processes in front of one `dask scheduler`: each request answered once, a
gateway's death costs only its own requests, and a gateway started first waits for the scheduler."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from shoal.pipeline.client import OnlineClient, OnlineError
from tests.support.dask_cli import dask_cli_cluster
from tests.support.gateway import SIM, requests_in_flight
from tests.support.paths import ROOT, SHOAL
from tests.support.processes import free_port, started, wait_for_line
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


@dataclass
class Remote:
    address: str
    catalog: Path
    early: str  # the gateway started before the scheduler
    before: list[int]  # its answers then: /readyz and an encode


@contextmanager
def gateway_process(address: str, catalog: Path, *options: str) -> Iterator[tuple[subprocess.Popen, str]]:
    """A `shoal gateway` process for `address` and its URL once it listens; stopped when the block exits."""
    command = [SHOAL, "gateway", "--scheduler", address, "--catalog", str(catalog), "--port", "0", *options]
    with started(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        line = wait_for_line(proc.stderr, "gateway on")
        yield proc, line.split("gateway on ")[1].split()[0]


def status_of(url: str, path: str = "/readyz") -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url + path, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def encode_status(url: str) -> int:
    try:
        with OnlineClient(url, timeout=30) as online:
            online.encode("simzero", ["x"])
        return 200
    except OnlineError as exc:
        return exc.status


def wait_ready(url: str, timeout: float = 120) -> None:
    wait_for(lambda: status_of(url) == 200, timeout, what=f"{url} ready", step=0.2)


@pytest.fixture(scope="module")
def remote(tmp_path_factory, test_profile):
    folder = tmp_path_factory.mktemp("gateways")
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"simzero": SIM, "slow": {**SIM, "batch_fixed_seconds": 1.0}}}))
    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    with gateway_process(address, catalog) as (_, early_url):  # stopped after the cluster, started before it
        before = [status_of(early_url), encode_status(early_url)]
        env = {"SHOAL_CATALOG": str(catalog)}
        with dask_cli_cluster(folder, test_profile, port=port, worker_args=("--host", "127.0.0.1"), env=env):
            wait_ready(early_url)
            yield Remote(address, catalog, early_url, before)


def test_a_gateway_started_before_its_scheduler_answers_503_then_serves(remote):
    assert remote.before == [503, 503]
    with OnlineClient(remote.early, timeout=60) as online:
        assert online.encode("simzero", ["now it serves"]).shape == (1, 8)


def test_two_gateways_answer_every_request_once_with_its_own_answer(remote):
    with gateway_process(remote.address, remote.catalog) as (_, url):
        wait_ready(url)
        urls = [remote.early, url]
        texts = [f"request {i}" for i in range(120)]
        with OnlineClient(remote.early, timeout=60) as online:
            expected = {t: online.encode("simzero", [t])[0] for t in texts[:3]}

        def ask(i: int):
            with OnlineClient(urls[i % 2], timeout=60) as online:
                return online.encode("simzero", [texts[i]])[0]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(len(texts))))
        for text, vector in zip(texts, answers):
            assert vector.shape == (8,) and abs(np.linalg.norm(vector) - 1) < 1e-5
            if text in expected:
                np.testing.assert_allclose(vector, expected[text], atol=1e-6)
        assert len({v.tobytes() for v in answers}) == len(texts)  # each its own, none answered twice
        counts = [answered_200(u) for u in urls]
        assert all(c > 0 for c in counts) and sum(counts) >= len(texts)


def answered_200(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("shoal_online_requests_total{") and 'status="200"' in line
        )
    )


def test_killing_a_gateway_loses_only_its_own_requests(remote):
    with gateway_process(remote.address, remote.catalog) as (doomed, doomed_url):
        wait_ready(doomed_url)
        survivor = remote.early

        def ask(url: str, model: str, text: str):
            try:
                with OnlineClient(url, timeout=60) as online:
                    return online.encode(model, [text])[0]
            except (OnlineError, ConnectionError, OSError) as exc:
                return exc

        with ThreadPoolExecutor(16) as pool:
            on_doomed = [pool.submit(ask, doomed_url, "slow", f"doomed {i}") for i in range(4)]
            on_survivor = [pool.submit(ask, survivor, "slow", f"kept {i}") for i in range(8)]
            wait_for(
                lambda: requests_in_flight(doomed_url) == 4,
                timeout=60,
                what="the doomed gateway answering its 4 requests",
            )
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(30)
            kept = [f.result() for f in on_survivor]
            lost = [f.result() for f in on_doomed]
        assert all(isinstance(v, np.ndarray) and v.shape == (8,) for v in kept), kept
        assert all(isinstance(v, Exception) for v in lost)
        with OnlineClient(survivor, timeout=60) as online:  # the cluster serves on
            assert online.encode("simzero", ["after the kill"]).shape == (1, 8)


def test_a_gateway_process_keeps_auth_backpressure_and_deadlines(remote, tmp_path):
    from tests.support.files import write_profile

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    profile = write_profile(
        tmp_path,
        name="gw-limits",
        gateway={
            "max_queue_depth": 2,
            "token_file": str(token),
            "retry_after_seconds": 3,
            "request_timeout_seconds": 5,
        },
    )
    with gateway_process(remote.address, remote.catalog, "--profile", str(profile)) as (_, url):
        wait_ready(url)
        with OnlineClient(url, timeout=60) as anonymous:
            with pytest.raises(OnlineError) as refused:
                anonymous.encode("simzero", ["no token"])
            assert refused.value.status == 401

        def ask(_):
            try:
                with OnlineClient(url, token="s3cret", timeout=60) as online:
                    online.encode("slow", ["queued behind a slow model"])
                return 200, None
            except OnlineError as exc:
                return exc.status, exc.retry_after

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(ask, range(8)))
        assert (200, None) in answers
        assert all(status in (200, 429) for status, _ in answers), answers
        assert any(status == 429 and retry == 3 for status, retry in answers), answers
