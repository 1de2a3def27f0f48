"""Online rounds sized by time on a real cluster (issue 45): each worker measures its rounds and its online pulls
ask for what it computes in `online_round_seconds`, so a one-text request sent while a large request computes is
answered between the large request's rounds, not after it."""

from __future__ import annotations

import threading
import time

import pytest

from shoal.pipeline.client import OnlineClient
from tests.support.waiting import wait_for
from tests.support.worker_loss import serving_pinned

pytestmark = pytest.mark.integration  # it starts a cluster (conftest.py, "Two tiers")

PER_TOKEN = 0.001  # seconds; a text below is 2 + 24 // 4 = 8 tokens: 8 ms an input
MODEL = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 10**6, "per_token_seconds": PER_TOKEN}
TEXT = "x" * 24


def test_a_one_text_request_is_answered_between_the_rounds_of_a_large_one(tmp_path):
    with serving_pinned(tmp_path, MODEL, request_timeout=120, name="rounds") as (_, _, plugin, url):
        with OnlineClient(url, timeout=120) as online:
            online.encode("steady", [TEXT] * 64)  # the workers measure a few rounds
        answered: dict[str, float] = {}

        def ask(name: str, texts: list[str]) -> None:
            with OnlineClient(url, timeout=120) as client:
                assert client.encode("steady", texts).shape == (len(texts), 8)
            answered[name] = time.monotonic()

        large = threading.Thread(target=ask, args=("large", [TEXT] * 600))  # ~2.4 s on the two workers
        large.start()
        wait_for(lambda: plugin.online.pending("steady") > 0, what="the large request queued", step=0.005)
        time.sleep(0.3)
        ask("small", [TEXT])
        parts_left = plugin.online.pending("steady")  # of the large request, unanswered when the small was
        large.join()

        def measured() -> list[int] | None:
            rows = [view.online_rows.get("steady", 0) for view in plugin.state.views.values()]
            return rows if len(rows) == 2 and all(rows) else None

        rows = wait_for(measured, what="both workers' round sizes, said by their online pulls")
    # Before, it waited for a round of 256 inputs on each worker and came back with the large request's last part.
    assert answered["small"] < answered["large"] and parts_left >= 8
    # 0.25 s at 8 ms an input (and each call's own cost): about 30 inputs a round, not the online batch (256).
    assert all(10 <= r <= 32 for r in rows), rows
