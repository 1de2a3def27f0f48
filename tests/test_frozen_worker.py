"""A frozen worker (SIGSTOP: a hung driver or a stop-the-world pause looks the same) keeps no online request:
its short lease lapses and another worker answers, long before the freeze ends."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import yaml
from distributed import Client

from configs import load_profile
from pipeline.client import OnlineClient
from pipeline.cluster import pull_queue, start_local_cluster
from tests.support.files import write_profile
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration  # it starts a cluster (conftest.py, "Two tiers")

MODEL = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 10**6, "batch_fixed_seconds": 1.0}
FREEZE_SECONDS = 20.0


def test_a_request_on_a_frozen_worker_is_answered_by_another_long_before_the_freeze_ends(tmp_path):
    profile = load_profile(str(write_profile(tmp_path, name="freeze", lease_seconds=60)))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"models": {"steady": MODEL}}))
    pin = ["--shoal-pin", "steady"]  # both workers hold the model: the request's lease is the short one
    with start_local_cluster(profile, str(catalog), preload_argv=pin) as cluster, Client(cluster) as client:
        client.wait_for_workers(2)
        plugin = cluster.scheduler.extensions["shoal-pull-queue"]
        url = client.sync(
            pull_queue(client).gateway_start,
            settings={"port": 0, "request_timeout_seconds": 60},
            models={"steady": {"name": "steady", **MODEL}},
        )["url"]
        with OnlineClient(url, timeout=60) as online:
            online.encode("steady", ["warm"])
        answered: dict[str, float] = {}

        def ask() -> None:
            with OnlineClient(url, timeout=60) as online:
                assert online.encode("steady", ["a question"]).shape == (1, 8)
            answered["at"] = time.monotonic()

        caller = threading.Thread(target=ask)
        caller.start()
        victim = wait_for(
            lambda: next(
                (w for w, items in plugin.leased_by_worker.items() for i in items if i.startswith("online-")), None
            ),
            timeout=60,
            what="the request leased to a worker",
            step=0.005,
        )
        pids = client.run(os.getpid)
        os.kill(pids[victim], signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            caller.join(FREEZE_SECONDS)
        finally:
            os.kill(pids[victim], signal.SIGCONT)
        caller.join(60)
        client.sync(pull_queue(client).gateway_stop)
    assert plugin.events["expired"] >= 1
    # Without the move it would wait for the thaw (20 s); with it: a short lease, then a 1 s computation.
    assert answered["at"] - frozen_at < FREEZE_SECONDS / 2, answered["at"] - frozen_at
