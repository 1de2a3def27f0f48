"""An optional per-client rate limit: a token bucket per bearer token (per client address when auth is off).

A client may send `rate` requests a second on average and `burst` at once;
one more is answered 429 with a Retry-After of the seconds until its bucket
holds a request again. The buckets are kept in least-recently-used order and
capped at `MAX_CLIENTS` (a client forgotten comes back with a full bucket,
which it would have had after `burst / rate` seconds anyway): each request
costs O(1), whatever the number of clients.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

MAX_CLIENTS = 65_536  # buckets kept; without auth a client is an address, of which there may be many


class RateLimits:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # client: (requests held, when)

    def wait(self, client: str) -> int | None:
        """Take one request from `client`'s bucket: None if it held one, else the whole seconds until it does."""
        now = self.clock()
        held, then = self._buckets.pop(client, (float(self.burst), now))
        held = min(float(self.burst), held + (now - then) * self.rate)
        if held >= 1:
            held -= 1
            waited = None
        else:
            waited = max(1, math.ceil((1 - held) / self.rate))
        self._buckets[client] = (held, now)
        if len(self._buckets) > MAX_CLIENTS:
            self._buckets.popitem(last=False)
        return waited
