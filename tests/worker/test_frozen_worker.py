"""A frozen worker (SIGSTOP: a hung driver or a stop-the-world pause looks the same) keeps no online request:
its short lease lapses and another worker answers, long before the freeze ends."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from shoal.pipeline.client import OnlineClient
from tests.support.worker_loss import holder_of_an_online_request, serving_pinned

pytestmark = pytest.mark.integration  # it starts a cluster (conftest.py, "Two tiers")

MODEL = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 10**6, "batch_fixed_seconds": 1.0}
FREEZE_SECONDS = 20.0


def test_a_request_on_a_frozen_worker_is_answered_by_another_long_before_the_freeze_ends(tmp_path):
    with serving_pinned(tmp_path, MODEL, request_timeout=60, name="freeze", lease_seconds=60) as (
        _,
        client,
        plugin,
        url,
    ):
        answered: dict[str, float] = {}

        def ask() -> None:
            with OnlineClient(url, timeout=60) as online:
                assert online.encode("steady", ["a question"]).shape == (1, 8)
            answered["at"] = time.monotonic()

        caller = threading.Thread(target=ask)
        caller.start()
        victim = holder_of_an_online_request(plugin)  # the model is pinned: its lease is the short one
        pids = client.run(os.getpid)
        os.kill(pids[victim], signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            caller.join(FREEZE_SECONDS)
        finally:
            os.kill(pids[victim], signal.SIGCONT)
        caller.join(60)
    assert plugin.state.counts["expired"] >= 1
    # Without the move it would wait for the thaw (20 s); with it: a short lease, then a 1 s computation.
    assert answered["at"] - frozen_at < FREEZE_SECONDS / 2, answered["at"] - frozen_at
