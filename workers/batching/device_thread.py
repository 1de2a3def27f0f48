"""The worker's device thread: every model call runs on it, online work first.

One thread, because torch runs its CPU kernels on an OpenMP team of threads
per calling thread. Once a second thread has made model calls (batch items in
one, online groups in another), libgomp counts more threads than cores and
its idle team threads stop spinning between parallel regions: each small
forward pass then pays a wake-up per region, which makes short online
queries measurably slower on a worker that has run batch work.

Turns, because a batch work item is many token-budget forward batches, and an
online request must not wait for the whole item, only for the forward batch
running when it arrives. Runtimes take a turn around each forward batch (see
``BatchedRuntime.in_batches`` in token_batching); online work waiting then
runs first, on this same thread. Nothing is preempted mid-batch.

A runtime used on another thread (a standalone runtime in tuning or tests)
takes its turns there, and they serve nothing.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any


class DeviceThread:
    def __init__(self) -> None:
        # Started on the first call: a standalone runtime's device never starts one.
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="shoal-device", initializer=self._started)
        self._ident: int | None = None
        self._online: deque[tuple[Callable[[], Any], Future]] = deque()
        self._guard = threading.Lock()  # the event loop adds online work, the device thread takes it
        self._serving = False  # in the device thread: online work is running (its own turns serve nothing)

    def run(self, fn: Callable[..., Any], *args: Any) -> Future:
        """Batch work, after the work submitted before it."""
        return self._executor.submit(fn, *args)

    def run_online(self, fn: Callable[[], Any]) -> Future:
        """Online work: at the next turn of the batch work computing, or at once when there is none."""
        future: Future = Future()
        with self._guard:
            self._online.append((fn, future))
        self._executor.submit(self._serve_online)
        return future

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Around one forward batch: the online work waiting goes first."""
        if threading.get_ident() == self._ident:
            self._serve_online()
        yield

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _started(self) -> None:
        self._ident = threading.get_ident()

    def _serve_online(self) -> None:
        if self._serving:
            return
        self._serving = True
        try:
            while True:
                with self._guard:
                    if not self._online:
                        return
                    fn, future = self._online.popleft()
                if not future.set_running_or_notify_cancel():
                    continue  # its waiter is gone
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - the waiter re-raises it
                    future.set_exception(exc)
        finally:
            self._serving = False
