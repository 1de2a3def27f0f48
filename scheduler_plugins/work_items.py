"""Work items: the small descriptors that travel through the pull queue.

An item names its input slice, model, operation and output; bulk data never
passes through the scheduler. The scheduler only tracks each item's state.
Its owner is a batch job (jobs.Job) or its model's online requests
(online_requests.OnlineRequests): what its lease lasts, how many attempts it
has, and who records its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import msgpack

from .protocol import ItemMessage, Lane, Payload

ResultT = TypeVar("ResultT", contravariant=True)  # what an ack of the owner's items carries


class ItemOwner(Protocol[ResultT]):
    """What an item belongs to: a batch job (its items acked with an ItemResult), or its model's online
    requests (an OnlineResult). Its lease, attempts and grace for items no worker can host; their outcome."""

    id: str
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


@dataclass(eq=False)
class WorkItem:
    id: str
    owner: ItemOwner[Any] = field(repr=False)
    model: str
    op: str
    payload: Payload
    lane: Lane = Lane.BATCH
    rows: int = 0
    flow: str = ""  # whose fair share it counts in (model_queues): its batch job, or its online request
    state: ItemState = ItemState.QUEUED
    attempts: int = 0
    worker: str | None = None
    deadline: float = 0.0
    leased_at: float = 0.0  # on the queue's clock, of its present lease
    started: bool = False
    expected_seconds: float = 0.0  # its compute as expected when it started (placement's take-back)
    errors: list[str] = field(default_factory=list)
    enqueued_at: float = 0.0  # on the queue's clock

    def move(self, state: ItemState) -> None:
        """Every change of state goes through here, so its owner's counts stay true without a scan."""
        old, self.state = self.state, state
        self.owner.moved(self, old)

    def to_message(self) -> ItemMessage:
        """What a worker receives when it pulls this item."""
        return {
            "id": self.id,
            "job": self.owner.id,
            "model": self.model,
            "op": self.op,
            "lane": self.lane,
            "payload": self.payload,
            "rows": self.rows,
            "attempt": self.attempts,
            "lease_seconds": self.owner.lease_seconds,
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
