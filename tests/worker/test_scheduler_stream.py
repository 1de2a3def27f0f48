"""A worker's one-way events to the scheduler: gathered into few messages, nothing the scheduler can infer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from shoal.scheduler_plugins.protocol import EVENTS
from shoal.workers.scheduler_stream import SchedulerStream, flush_interval
from tests.support.clock import ManualClock

CLOCK = ManualClock()  # the stream's renewals and flushes: time moves only when a test advances it


@contextmanager
def recorded(flush_seconds: float) -> Iterator[tuple[SchedulerStream, list[dict]]]:
    """A stream whose messages to the scheduler are kept in a list, on CLOCK; closed on exit, passed or failed."""
    sent: list[dict] = []
    stream = SchedulerStream(SimpleNamespace(batched_stream=SimpleNamespace(send=sent.append)), flush_seconds, CLOCK)
    try:
        yield stream, sent
    finally:
        stream.close()


async def test_events_of_many_items_leave_in_one_message_and_an_ack_drops_its_unsent_start():
    with recorded(0.05) as (stream, sent):
        for item in ("a", "b", "c"):
            stream.hold(item, 60.0)
            stream.started(item)
        stream.ack("a", {"rows": 1})
        stream.ack("b", {"rows": 2})
        CLOCK.advance(0.04)
        assert sent == []
        CLOCK.advance(0.02)
        stream.ack("c", {"rows": 3})  # its start went out already: only the ack is left
        CLOCK.advance(0.2)
    first, second = sent
    assert first == {"op": EVENTS, "started": ["c"], "acks": [("a", {"rows": 1}), ("b", {"rows": 2})]}
    assert second == {"op": EVENTS, "acks": [("c", {"rows": 3})]}


async def test_a_failure_goes_out_on_the_next_loop_pass_with_what_has_gathered_and_implies_its_start():
    with recorded(30.0) as (stream, sent):
        stream.started("a")
        stream.started("b")
        stream.fail("b", "OSError: reset", False)
        await asyncio.sleep(0)  # the next loop pass
        assert sent == [{"op": EVENTS, "started": ["a"], "failed": [("b", "OSError: reset", False)]}]


async def test_a_short_lease_is_renewed_before_it_lapses_however_long_the_flush_waits():
    with recorded(30.0) as (stream, sent):
        stream.start()
        stream.hold("a", 0.6)
        CLOCK.advance(0.14)
        assert sent == []  # due after a quarter of its lease
        CLOCK.advance(0.15)  # due after 0.15 s (seen within a 0.05 s tick), sent within 0.075 s, not after 30 s
        assert sent == [{"op": EVENTS, "extend": ["a"]}]
        CLOCK.advance(0.3)
        renewed = list(sent)
    assert len(renewed) >= 2 and all(message == {"op": EVENTS, "extend": ["a"]} for message in renewed)


async def test_events_taken_for_a_pull_leave_with_it_and_their_flush_is_cancelled():
    with recorded(0.05) as (stream, sent):
        stream.hold("a", 60.0)
        stream.started("a")
        stream.started("b")
        stream.ack("a", {"rows": 1})
        riding = stream.take()
        CLOCK.advance(0.2)  # past the flush: nothing left to send
        assert sent == []
        assert riding == {"started": ["b"], "acks": [("a", {"rows": 1})]}
        stream.send(riding)  # the pull could not leave: they go on the stream
        assert sent == [{"op": EVENTS, **riding}]
        stream.send(stream.take())  # nothing gathered: no message
        assert len(sent) == 1


async def test_events_gather_for_half_the_heartbeat_dask_stretches_with_the_cluster():
    assert [flush_interval(dask_heartbeat) for dask_heartbeat in (0.5, 1, 2, 6)] == [0.25, 0.5, 1.0, 3.0]
    heartbeat = SimpleNamespace(callback_time=500)  # ms: Dask's for up to 10 workers
    sent: list[dict] = []
    worker = SimpleNamespace(
        batched_stream=SimpleNamespace(send=sent.append), periodic_callbacks={"heartbeat": heartbeat}
    )
    stream = SchedulerStream(worker, clock=CLOCK)
    try:
        assert stream.flush_seconds == 0.25
        heartbeat.callback_time = 2000  # the scheduler's heartbeat reply for 50 to 199 workers
        stream.ack("a", {"rows": 1})
        CLOCK.advance(0.99)
        assert sent == []  # gathers for a second now
        CLOCK.advance(0.02)
        assert sent == [{"op": EVENTS, "acks": [("a", {"rows": 1})]}]
    finally:
        stream.close()
