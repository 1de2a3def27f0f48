"""Runtime verdicts shared by a cluster's workers through the scheduler: measured once per kind of device.

A worker that measured a model's runtimes publishes the record in the scheduler's metadata (Dask's own
``set_metadata``/``get_metadata``, keyed like the verdict file: model fingerprint, device signature,
threads), and a worker of the same kind of device that lacks it locally takes it from there instead of
measuring again: a hundred identical pods measure once, not a hundred times. A worker about to measure
first marks the key as being measured, so others of its kind run fp32 torch meanwhile and take the verdict
once it is published (two that look at once may both measure: the mark is a courtesy, not a lock). A mark
lapses after `CLAIM_SECONDS`: a worker killed while measuring (or a measurement that failed, which is not
published) holds nobody back for longer; the next worker to look measures itself.

Calls go from the loader thread to the worker's event loop; a scheduler that does not answer in
`TIMEOUT` seconds leaves the worker to its own cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from ..configs.verdicts import MEASUREMENT, VerdictsRecord

logger = logging.getLogger("shoal.worker.runtimes")

ROOT = "shoal-verdicts"  # the scheduler metadata's branch: ROOT / key -> record; ROOT-measuring / key -> worker
TIMEOUT = 5.0
CLAIM_SECONDS = 1800.0  # longer than a measurement takes on a busy CPU; wall-clock seconds (workers' clocks differ)


class SharedVerdicts:
    """The scheduler's verdicts, reached from the worker's loader thread."""

    def __init__(
        self, scheduler: Any, loop: asyncio.AbstractEventLoop, address: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.scheduler, self.loop, self.address, self.clock = scheduler, loop, address, clock

    def fetch(self, key: str) -> VerdictsRecord | None:
        """A record another worker of this kind of device published, or None."""
        record = self._call(self.scheduler.get_metadata(keys=[ROOT, key], default=None))
        if not isinstance(record, dict) or record.get("measurement") != MEASUREMENT:
            return None
        return cast(VerdictsRecord, json.loads(json.dumps(record)))  # as read from a file: Dask's comms give tuples

    def publish(self, key: str, record: VerdictsRecord) -> None:
        self._call(self.scheduler.set_metadata(keys=[ROOT, key], value=dict(record)))

    def claim(self, key: str) -> str | None:
        """Mark `key` as measured here; the worker measuring it already, if another one is (its mark not lapsed)."""
        mark = self._call(self.scheduler.get_metadata(keys=[f"{ROOT}-measuring", key], default=None))
        now = self.clock()
        if isinstance(mark, dict) and mark.get("by") != self.address and now < mark.get("until", 0):
            return str(mark["by"])
        mark = {"by": self.address, "until": now + CLAIM_SECONDS}
        self._call(self.scheduler.set_metadata(keys=[f"{ROOT}-measuring", key], value=mark))
        return None

    def _call(self, coroutine) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result(TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - the scheduler gone or slow: this worker's own cache serves
            future.cancel()
            logger.info("the scheduler's shared verdicts did not answer (%s: %s)", type(exc).__name__, exc)
            return None
