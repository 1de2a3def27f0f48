"""Reading a running online gateway from outside, over HTTP."""

from __future__ import annotations

import urllib.request

# A simulated model: no weights, answers at once; what a gateway test serves when it is not about a model.
SIM = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 1000}


def requests_in_flight(url: str) -> int:
    """Requests the gateway at `url` is answering (shoal_online_in_flight), less the /metrics request that asks."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("shoal_online_in_flight "))
    return int(float(line.rsplit(" ", 1)[1])) - 1
