"""Work items: the small descriptors that travel through the pull queue.

An item names its input slice, model, operation and output; bulk data never
passes through the scheduler. The scheduler only tracks each item's state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import msgpack

from .protocol import ItemMessage, Lane, Payload

ResultT = TypeVar("ResultT", contravariant=True)  # what an ack of the owner's items carries


class ItemOwner(Protocol[ResultT]):
    """What an item belongs to: a batch job (jobs.Job, its items acked with an ItemResult), or its
    model's online requests (OnlineJob, with an OnlineResult).

    It holds the settings of its items' leases and takes their outcome.
    """

    lease_seconds: float
    max_attempts: int
    unplaceable_seconds: float

    def record_done(self, item: WorkItem, worker: str, result: ResultT) -> None: ...

    def record_dead(self, item: WorkItem) -> None: ...

    def moved(self, item: WorkItem, old: ItemState) -> None:
        """`item` went from `old` to its present state."""


class ItemState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    DONE = "done"
    DEAD = "dead"


@dataclass
class WorkItem:
    id: str
    job: str
    model: str
    op: str
    payload: Payload
    lane: Lane = Lane.BATCH
    rows: int = 0
    state: ItemState = ItemState.QUEUED
    attempts: int = 0
    worker: str | None = None
    deadline: float = 0.0
    leased_at: float = 0.0  # monotonic, of its present lease
    started: bool = False
    expected_seconds: float = 0.0  # its compute as expected when it started (placement's take-back)
    errors: list[str] = field(default_factory=list)
    enqueued_at: float = field(default_factory=time.monotonic)
    owner: ItemOwner[Any] | None = field(default=None, repr=False, compare=False)

    @property
    def settings(self) -> ItemOwner[Any]:
        """Its owner, which every queued item has (set when it is created)."""
        assert self.owner is not None
        return self.owner

    def move(self, state: ItemState) -> None:
        """Every change of state goes through here, so its owner's counts stay true without a scan."""
        old, self.state = self.state, state
        if self.owner is not None:
            self.owner.moved(self, old)

    def lease(self, worker: str, seconds: float, counts_as_attempt: bool = True) -> None:
        self.move(ItemState.LEASED)
        self.worker = worker
        self.started = False
        self.attempts += counts_as_attempt
        self.leased_at = time.monotonic()
        self.deadline = self.leased_at + seconds

    def requeue(self) -> None:
        self.move(ItemState.QUEUED)
        self.worker = None
        self.started = False
        self.enqueued_at = time.monotonic()

    def to_message(self, lease_seconds: float) -> ItemMessage:
        """What a worker receives when it pulls this item."""
        return {
            "id": self.id,
            "job": self.job,
            "model": self.model,
            "op": self.op,
            "lane": self.lane,
            "payload": self.payload,
            "attempt": self.attempts,
            "lease_seconds": lease_seconds,
        }


def unsendable(payload: Any) -> str | None:
    """Why `payload` cannot travel to a worker in a Dask message (MessagePack), or None.

    Checked once as a request enters, so one that cannot be sent is refused
    alone instead of failing the whole pull reply (or gateway batch) it would
    have travelled in, and every request beside it.
    """
    try:
        msgpack.packb(payload)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        return f"{type(exc).__name__}: {exc}"
    return None
