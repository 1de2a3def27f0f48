"""The gateway of a `dask scheduler` started with Shoal's preload and `--shoal-gateway-port`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from shoal.pipeline.client import OnlineClient, OnlineError
from tests.support.dask_cli import dask_cli_cluster
from tests.support.gateway import SIM
from tests.support.processes import free_port

pytestmark = pytest.mark.integration  # every test here starts a cluster or processes (conftest.py, "Two tiers")


@pytest.fixture(scope="module")
def sim_catalog(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("sim") / "catalog.yaml"
    models = {"simzero": SIM}
    path.write_text(yaml.safe_dump({"models": models}))
    return path


def test_dask_scheduler_preload_starts_the_gateway(sim_catalog, tmp_path, test_profile):
    port = free_port()
    env = {"SHOAL_CATALOG": str(sim_catalog)}
    with dask_cli_cluster(tmp_path, test_profile, scheduler_args=("--shoal-gateway-port", str(port)), env=env):
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                with OnlineClient(url) as online:
                    vectors = online.encode("simzero", ["from a dask scheduler"])
                break
            except (ConnectionError, OnlineError):  # not listening yet, or no worker yet (503)
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert vectors.shape == (1, 8)
