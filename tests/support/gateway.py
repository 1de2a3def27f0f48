"""Reading a running online gateway from outside, over HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

# A simulated model: no weights, answers at once; what a gateway test serves when it is not about a model.
SIM = {"kind": "sim", "dim": 8, "max_seq_length": 64, "memory_bytes": 1000}


def requests_in_flight(url: str) -> int:
    """Requests the gateway at `url` is answering (shoal_online_in_flight), less the /metrics request that asks."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("shoal_online_in_flight "))
    return int(float(line.rsplit(" ", 1)[1])) - 1


def post(url: str, path: str, body: Any, media: str = "application/msgpack") -> tuple[int, Any]:
    """(status, decoded reply) of a POST of `body` in `media` (MessagePack or JSON); an error's reply too."""
    import msgpack

    data = msgpack.packb(body) if media.endswith("msgpack") else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": media}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
        media = error.headers.get("Content-Type", media)
    return status, msgpack.unpackb(raw) if media.endswith("msgpack") else json.loads(raw)
