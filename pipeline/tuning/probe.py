"""Online latency under batch load: the p99 a tuned profile must keep.

An open-loop load (requests sent at a fixed rate whether or not earlier ones
have answered, as real users do) of one-text encode requests goes to the
gateway while a trial's batch job runs. A closed loop would send fewer
requests exactly when latency is bad and so hide it.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np

from ..client import AsyncOnlineClient
from .search import Figures


class OnlineProbe:
    def __init__(self, url: str, model: str, texts: list[str], rate: float) -> None:
        self.url = url
        self.model = model
        self.texts = texts
        self.rate = rate
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> OnlineProbe:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._load()), name="shoal-tune-probe", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    async def _load(self) -> None:
        async with AsyncOnlineClient(self.url, timeout=60.0) as client:
            sent: list[asyncio.Task] = []
            interval = 1.0 / self.rate
            next_at = time.perf_counter()
            index = 0
            while not self._stop.is_set():
                text = self.texts[index % len(self.texts)]
                sent.append(asyncio.create_task(self._one(client, text)))
                index += 1
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await asyncio.gather(*sent)

    async def _one(self, client: AsyncOnlineClient, text: str) -> None:
        began = time.perf_counter()
        try:
            await client.encode(self.model, [text])
        except Exception:  # any refusal, timeout or lost connection is a failed request
            self.failures += 1
            return
        self.latencies.append(time.perf_counter() - began)

    def figures(self) -> Figures:
        """p50/p99 in milliseconds over the requests answered, and how many failed."""
        if not self.latencies:
            return {"requests": self.failures, "failures": self.failures, "p50_ms": None, "p99_ms": None}
        values = np.asarray(self.latencies) * 1000
        return {
            "requests": len(values) + self.failures,
            "failures": self.failures,
            "p50_ms": round(float(np.percentile(values, 50)), 1),
            "p99_ms": round(float(np.percentile(values, 99)), 1),
        }
