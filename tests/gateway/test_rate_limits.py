"""The optional per-client rate limit: a token bucket per bearer token (or address), on a clock the test drives."""

from __future__ import annotations

from shoal.configs import GatewaySettings
from shoal.scheduler_plugins.gateway import rate_limits
from shoal.scheduler_plugins.gateway.auth import BearerAuth
from shoal.scheduler_plugins.gateway.rate_limits import RateLimits


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_client_gets_its_burst_then_one_request_per_interval_and_waits_whole_seconds():
    clock = Clock()
    limits = RateLimits(rate=0.5, burst=2, clock=clock)
    assert [limits.wait("a"), limits.wait("a")] == [None, None]
    assert limits.wait("a") == 2  # 1 request at 0.5 a second: 2 s
    assert limits.wait("b") is None  # another client, another bucket
    clock.now = 1.5
    assert limits.wait("a") == 1  # three quarters of a request held: half a second more, rounded up
    clock.now = 2.0
    assert limits.wait("a") is None
    clock.now = 100.0
    assert [limits.wait("a"), limits.wait("a"), limits.wait("a")] == [None, None, 2]  # refilled to the burst only


def test_the_buckets_are_capped_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(rate_limits, "MAX_CLIENTS", 3)
    limits = RateLimits(rate=0.001, burst=1, clock=Clock())
    assert all(limits.wait(c) is None for c in "abcd")  # "a" forgotten: 4 clients, 3 kept
    assert limits.wait("a") is None and limits.wait("d") == 1000


def test_a_token_file_may_hold_a_token_per_client(tmp_path):
    path = tmp_path / "tokens"
    path.write_text("# one per client\nfirst-t0ken\n\n  second-t0ken  \n")
    auth = BearerAuth.from_settings(GatewaySettings(token_file=str(path)))
    assert auth.client("Bearer first-t0ken") == "token 1" and auth.client("Bearer second-t0ken") == "token 2"
    assert auth.client("Bearer # one per client") is None and auth.client(None) is None
    assert BearerAuth(None).client("anything") == ""
