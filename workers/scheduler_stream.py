"""What a worker tells the pull queue one way: starts, acks, failures, lease renewals.

A message costs the scheduler far more than the queue's own work on an item,
so nothing here waits for a reply, and one message carries many items' events.
They gather here and leave together as one ``EVENTS`` message
(protocol.WorkerEvents) on Dask's worker stream: at most `flush_seconds`
after the first of them (longer as the cluster grows, as Dask's heartbeats
do), or on the next loop pass for what a client waits on (failures, online
acks that cannot ride on an online pull, the last ack before the worker runs
out of work). When the worker pulls before then, they ride on the pull
instead (`take`): one message fewer. A busy worker thus costs the scheduler a
few messages a second, however many items it finishes.

Leases of everything the worker holds are renewed from here, each at a quarter
of its own lease, and sent within an eighth of it: an online request's lease
of half a second and a batch item's minute both hold while the worker's loop
runs, and lapse when the process freezes. What the worker no longer holds
comes back as a ``REVOKE`` message (see pull_loop).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..scheduler_plugins.clock import Clock, Timer
from ..scheduler_plugins.protocol import EVENTS, ItemResult, OnlineAck, WorkerEvents

logger = logging.getLogger("shoal.worker")

MIN_FLUSH_SECONDS = 0.25  # a batch item's events wait at least this long for others to share their message
# A lease is renewed this many times over its length, each renewal sent within half of that interval:
# a short online lease survives a loop that lags by half of it.
RENEWALS_PER_LEASE = 4
RENEW_TICK_SECONDS = 0.05  # how often leases due for renewal are looked for


def flush_interval(heartbeat_seconds: float) -> float:
    """How long events gather: half the worker's heartbeat interval, never under `MIN_FLUSH_SECONDS`.

    Dask stretches the heartbeat with the cluster's size (0.5 s up to 10
    workers, 2 s up to 200, then one more second per 200 workers), so the
    scheduler gets at most two events messages per heartbeat from each
    worker, however many workers there are: a few workers report within a
    quarter second, a thousand every 3 s.
    """
    return max(MIN_FLUSH_SECONDS, heartbeat_seconds / 2)


class SchedulerStream:
    def __init__(self, dask_worker: Any, flush_seconds: float | None = None, clock: Clock | None = None) -> None:
        """`dask_worker`: the Dask worker, whose ``batched_stream`` reaches the scheduler; `flush_seconds`: how
        long events gather, or None for `flush_interval` of the worker's present heartbeat interval; `clock`:
        the time renewals and flushes keep (tests drive their own)."""
        self.dask_worker = dask_worker
        self.clock = clock or Clock()
        self._flush_seconds = flush_seconds
        self._events: WorkerEvents = {}
        self._starts: dict[str, None] = {}  # in order; an ack before the flush drops its start
        self._flush: Timer | asyncio.Handle | None = None
        self._flush_at = float("inf")  # when the armed flush is due (on the clock); now for an urgent one
        self._renewals: dict[str, tuple[float, float]] = {}  # item id -> (lease seconds, when to renew)
        self._renewer: Timer | None = None

    @property
    def flush_seconds(self) -> float:
        if self._flush_seconds is not None:
            return self._flush_seconds
        heartbeat = self.dask_worker.periodic_callbacks["heartbeat"]  # its interval is the scheduler's answer
        return flush_interval(heartbeat.callback_time / 1000)

    def start(self) -> None:
        self._renewer = self.clock.call_later(RENEW_TICK_SECONDS, self._renew)

    def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        if self._flush is not None:
            self._flush.cancel()
        self.flush()

    # -- leases held -----------------------------------------------------------------

    def hold(self, item_id: str, lease_seconds: float) -> None:
        """`item_id` is leased here: renew it until it is acked, failed or released."""
        self._renewals[item_id] = (lease_seconds, self.clock.now() + lease_seconds / RENEWALS_PER_LEASE)

    def release(self, item_id: str) -> None:
        self._renewals.pop(item_id, None)

    def holds(self, item_id: str) -> bool:
        return item_id in self._renewals

    # -- events ----------------------------------------------------------------------

    def started(self, item_id: str) -> None:
        self._starts[item_id] = None
        self._arm()

    def ack(self, item_id: str, result: ItemResult) -> None:
        """An ack (or a failure) implies its start: a start not sent yet is dropped, one event less."""
        self.release(item_id)
        self._starts.pop(item_id, None)
        self._add("acks", (item_id, result))

    def ack_online(self, acks: list[OnlineAck]) -> None:
        """Online acks that cannot wait for the next online pull: out on the next loop pass."""
        for item_id, _, _ in acks:
            self.release(item_id)
        for ack in acks:
            self._add("online_acks", ack, urgent=True)

    def flush_soon(self) -> None:
        """Send what has gathered on the next loop pass (nothing else to wait for)."""
        if (self._events or self._starts) and self._flush_at > float("-inf"):
            if self._flush is not None:
                self._flush.cancel()
            self._flush, self._flush_at = asyncio.get_running_loop().call_soon(self.flush), float("-inf")

    def fail(self, item_id: str, error: str, permanent: bool) -> None:
        self.release(item_id)
        self._starts.pop(item_id, None)
        self._add("failed", (item_id, error, permanent), urgent=True)

    def _add(self, kind: str, entry: Any, urgent: bool = False, within: float | None = None) -> None:
        self._events.setdefault(kind, []).append(entry)  # type: ignore[misc]
        if urgent:
            self.flush_soon()
        else:
            self._arm(within)

    def _arm(self, within: float | None = None) -> None:
        """Send within `flush_seconds`, or sooner (`within`: a short lease's renewal cannot wait that long)."""
        flush_seconds = self.flush_seconds
        at = self.clock.now() + min(flush_seconds, flush_seconds if within is None else within)
        if at < self._flush_at:
            if self._flush is not None:
                self._flush.cancel()
            self._flush, self._flush_at = self.clock.call_at(at, self.flush), at

    def take(self) -> WorkerEvents:
        """What has gathered, taken out to ride on another message (a pull); nothing is sent from here."""
        if self._flush is not None:
            self._flush.cancel()
        self._flush, self._flush_at = None, float("inf")
        events, self._events = self._events, {}
        if self._starts:
            events["started"], self._starts = list(self._starts), {}
        return events

    def send(self, events: WorkerEvents) -> None:
        """`events` (taken for a message that could not leave) go on the stream now."""
        if not events:
            return
        try:
            self.dask_worker.batched_stream.send({"op": EVENTS, **events})
        except Exception as exc:  # noqa: BLE001 - the stream closed: Dask closes this worker, leases lapse
            logger.warning("could not send %d kinds of events to the scheduler: %s", len(events), exc)

    def flush(self) -> None:
        """Send what has gathered, in one message."""
        self.send(self.take())

    def _renew(self) -> None:
        """Every RENEW_TICK_SECONDS: the leases due for renewal join the next message, soon enough."""
        self._renewer = self.clock.call_later(RENEW_TICK_SECONDS, self._renew)
        now = self.clock.now()
        due = [item_id for item_id, (_, at) in self._renewals.items() if at <= now]
        for item_id in due:
            lease_seconds, _ = self._renewals[item_id]
            self._renewals[item_id] = (lease_seconds, now + lease_seconds / RENEWALS_PER_LEASE)
            self._add("extend", item_id, within=lease_seconds / (2 * RENEWALS_PER_LEASE))
