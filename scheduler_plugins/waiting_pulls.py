"""Pulls waiting for work, indexed by what they may take, so new work wakes only its takers.

A pull that finds nothing waits (a bounded long poll). Waking every waiting
pull for each new item costs O(workers) per item, and O(workers²) per
online request once each woken pull looks at the others. Instead each
waiting pull is filed under the models its worker holds: k new batch items
of a model wake at most k pulls, holders first; an online request wakes the
one pull placement ranks best for it.

The groups are OrderedDicts: pulls come and go at both ends all the time, and
a plain dict's iteration from the front walks over every slot deleted since
its last resize, a scan of thousands of entries per wake-up at cluster scale.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from .clock import Clock, Deadlines
from .worker_views import WorkerView

RANKS = 4  # placement.online_rank's range

Reply = TypeVar("Reply")


class WaitingPull:
    """One waiting pull: its worker's view, and the future that wakes it."""

    __slots__ = ("view", "busy", "future", "models", "claim")

    def __init__(self, view: WorkerView, busy: bool = False) -> None:
        self.view = view
        self.busy = busy
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.models: list[tuple[str, int]] = []  # (model, rank) it is filed under
        self.claim: str | None = None  # an online pull woken for this model's requests

    def wake(self, claim: str | None = None) -> bool:
        """False when it was woken already (its timeout fired): it runs once, whatever wakes it again."""
        if self.future.done():
            return False
        self.claim = claim
        self.future.set_result(None)
        return True


class LongPolls:
    """The loop of every pull (`long_poll`), and the deadlines of those waiting: one heap and one timer
    (clock.Deadlines); a pull woken early leaves its entry to be dropped when it is due."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._deadlines: Deadlines[WaitingPull] = Deadlines(clock, lambda _, pull: pull.wake())

    async def long_poll(
        self,
        take: Callable[[], Reply | None],
        park: Callable[[], WaitingPull],
        unpark: Callable[[WaitingPull], None],
        timeout: float,
    ) -> Reply | None:
        """What `take` finds, waiting up to `timeout` seconds for it; None at the timeout.

        Look; if nothing, `park` a waiting pull in the index that new work
        wakes, wait until it is woken or the deadline, `unpark` it and look again.
        """
        deadline = self.clock.now() + max(0.0, timeout)
        while (reply := take()) is None:
            if deadline <= self.clock.now():
                return None
            pull = park()
            try:
                self._deadlines.push(deadline, pull)
                await pull.future
            finally:
                unpark(pull)
        return reply

    def close(self) -> None:
        for pull in self._deadlines.close():
            pull.wake()


class WaitingPulls:
    """Pulls waiting (a route's): filed per held model by `rank` (best first), and as idle or busy for all.

    Batch pulls rank every held model alike (0) and are never busy; online pulls by `online_rank`.
    """

    def __init__(self, rank: Callable[[WorkerView, str, bool], int] | None = None) -> None:
        self._rank = rank
        self._ranks = RANKS if rank is not None else 1
        self.by_model: dict[str, list[OrderedDict[str, WaitingPull]]] = {}
        self.idle: OrderedDict[str, WaitingPull] = OrderedDict()
        self.busy: OrderedDict[str, WaitingPull] = OrderedDict()

    def add(self, pull: WaitingPull) -> None:
        address = pull.view.address
        (self.busy if pull.busy else self.idle)[address] = pull
        rank, view = self._rank, pull.view
        pull.models = [(model, rank(view, model, pull.busy) if rank else 0) for model in view.held]
        for model, at in pull.models:
            buckets = self.by_model.get(model)
            if buckets is None:
                buckets = self.by_model[model] = [OrderedDict() for _ in range(self._ranks)]
            buckets[at][address] = pull

    def discard(self, pull: WaitingPull) -> None:
        address = pull.view.address
        group = self.busy if pull.busy else self.idle
        if group.get(address) is not pull:
            return
        del group[address]
        for model, rank in pull.models:
            buckets = self.by_model.get(model)
            if buckets is not None:
                buckets[rank].pop(address, None)
                if not any(buckets):
                    del self.by_model[model]

    def refile(self, address: str) -> WaitingPull | None:
        """The worker's view changed while its pull waits: file it under what it holds now."""
        pull = self.idle.get(address) or self.busy.get(address)
        if pull is not None:
            self.discard(pull)
            self.add(pull)
        return pull

    def best_rank(self, model: str, held: bool) -> int | None:
        """The best rank among waiting pulls that may take `model`'s requests; None if there is none."""
        if held:
            buckets = self.by_model.get(model, ())
            return next((rank for rank, bucket in enumerate(buckets) if bucket), None)
        return 2 if self.idle else 3 if self.busy else None

    def take(self, model: str, count: int, may: Callable[[WorkerView], bool], holders_only: bool) -> list[WaitingPull]:
        """Up to `count` pulls that may take `model`'s work, out of the index: its holders' first, best rank
        first, then (unless `holders_only`) idle ones before busy ones, each group in the order they came."""
        groups: list[dict[str, WaitingPull]] = [*self.by_model.get(model, ())]
        groups += [] if holders_only else [self.idle, self.busy]
        taken: list[WaitingPull] = []
        for group in groups:
            for pull in _first(group, lambda p: may(p.view), count - len(taken)):
                self.discard(pull)
                taken.append(pull)
        return taken

    def __len__(self) -> int:
        return len(self.idle) + len(self.busy)


def _first(group: dict[str, WaitingPull], keep: Callable[[WaitingPull], bool], count: int) -> list[WaitingPull]:
    """Up to `count` pulls of `group` that `keep` accepts, in filing order, without copying the group."""
    chosen: list[WaitingPull] = []
    if count > 0:
        for pull in group.values():
            if keep(pull):
                chosen.append(pull)
                if len(chosen) >= count:
                    break
    return chosen
