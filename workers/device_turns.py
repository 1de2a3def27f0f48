"""One forward batch on the device at a time; online batches go first.

A batch work item is many token-budget batches. Online requests must not wait
for the whole item, only for the forward batch running when they arrive
(the issue's "never more than the batch already running"). So the device is
taken per forward batch, by whichever thread runs it: the compute thread
(batch items) or the online thread (online groups). A batch turn waits while
an online turn is waiting; nothing is preempted mid-batch.

Runtimes call ``with turns.turn():`` around each forward batch. Whether that
turn is online is a property of the calling thread (``with turns.online():``),
so the same runtime code serves both paths. A thread that holds the device
may take turns inside its turn: the online thread holds it for a whole round
of groups, whose forward batches then run without waiting.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class DeviceTurns:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._holder: int | None = None  # the thread holding the device
        self._online_waiting = 0
        self._thread = threading.local()

    @contextmanager
    def online(self) -> Iterator[None]:
        """Turns taken by this thread inside the block go before batch turns."""
        self._thread.online = True
        try:
            yield
        finally:
            self._thread.online = False

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the device for one forward batch, or a round of them taken inside."""
        me = threading.get_ident()
        if self._holder == me:
            yield
            return
        online = getattr(self._thread, "online", False)
        with self._changed:
            if online:
                self._online_waiting += 1
            try:
                while self._holder is not None or (not online and self._online_waiting):
                    self._changed.wait()
            finally:
                if online:
                    self._online_waiting -= 1
            self._holder = me
        try:
            yield
        finally:
            with self._changed:
                self._holder = None
                self._changed.notify_all()
