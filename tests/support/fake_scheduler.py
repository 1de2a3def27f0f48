"""The scheduler plugin driven in-process for unit tests: a fake of what it uses of a Dask scheduler,
`running_queue`, the one way a test starts a `PullQueue` on it (and always closes it), and `spec`, a valid
model spec for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

from shoal.configs import ModelSpec
from shoal.scheduler_plugins.clock import Clock
from shoal.scheduler_plugins.pull_queue import PullQueue


class RecordingStream:
    """A scheduler's stream to one worker, keeping what was sent."""

    def __init__(self) -> None:
        self.sent: list[dict] = []

    def send(self, *msgs: dict) -> None:
        self.sent.extend(msgs)


class WorkerTable(dict):
    """The scheduler's workers by address, counting membership checks: a waiting pull asks once per pass
    of its loop, so the count after an event is the number of pulls that woke for it."""

    checks = 0

    def __contains__(self, address: object) -> bool:
        self.checks += 1
        return super().__contains__(address)


class FakeScheduler:
    """What the scheduler plugin uses of a Dask scheduler, for unit tests: its workers by address, handlers,
    stream handlers, streams to workers, extensions, plugins, periodic callbacks and Dask tasks (none), and
    Dask's own scaling methods, which the plugin replaces: `dask_retired` lists the workers Dask's own
    `retire_workers` removed."""

    def __init__(self, workers: Iterable[str] | Mapping[str, object] = ("w1", "w2")) -> None:
        """`workers`: addresses, or the scheduler's state of each by address (`worker_state`)."""
        states: Mapping[str, Any] = workers if isinstance(workers, Mapping) else {w: worker_state() for w in workers}
        for address, state in states.items():
            state.address = state.name = address
        self.workers = WorkerTable(states)
        self.handlers: dict = {}
        self.stream_handlers: dict = {}
        self.stream_comms: dict[str, RecordingStream] = {w: RecordingStream() for w in self.workers}
        self.extensions: dict = {}
        self.plugins: dict = {}
        self.periodic_callbacks: dict = {}
        self.tasks: dict = {}
        self.dask_retired: list[str] = []

    def adaptive_target(self, target_duration: float | None = None) -> int:
        return 0

    def workers_to_close(self, **kwargs: Any) -> list[str]:
        return []

    async def retire_workers(self, workers: list[str], **kwargs: Any) -> dict[str, dict]:
        self.dask_retired += workers
        for address in workers:
            self.workers.pop(address, None)
        return {address: {} for address in workers}

    def revoked(self, worker: str) -> list[str]:
        """Item ids the plugin revoked on `worker`."""
        return [i for msg in self.stream_comms[worker].sent if msg["op"] == "shoal-revoke" for i in msg["items"]]


def worker_state(**resources: float) -> SimpleNamespace:
    """The scheduler's state of a worker with Dask `resources` (`GPU=1`): all the plugin reads of it
    (its address and name are set by FakeScheduler)."""
    return SimpleNamespace(resources=resources, long_running=False, processing={})


def spec(name: str, **fields: Any) -> ModelSpec:
    """A simulated model's spec with the catalog's defaults (memory_bytes 500 MB among them), `fields` laid over.

    `.model_dump()` is the spec as a job or gateway sends it.
    """
    return ModelSpec(**{"name": name, "kind": "sim", "dim": 8, "max_seq_length": 128, **fields})


@asynccontextmanager
async def running_queue(
    workers: Iterable[str] | Mapping[str, object] = ("w1", "w2"),
    models: Mapping[str, ModelSpec] | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[PullQueue]:
    """A `PullQueue` serving `models`, started on a `FakeScheduler` of `workers`, its time kept by `clock` (a
    `tests.support.clock.ManualClock` for leases and timeouts a test drives); closed on exit, failed or not."""
    plugin = PullQueue(models=models, clock=clock)
    await plugin.start(FakeScheduler(workers))
    try:
        yield plugin
    finally:
        await plugin.close()
