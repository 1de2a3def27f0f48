"""How a gateway reaches the online queue: the interface, and the link from a process of its own.

`GatewayBackend` is all the gateway knows of the queue. In the scheduler's
process it is `online_route.LocalBackend`: direct calls. In a `shoal gateway`
process it is `SchedulerLink`, the client wrapper of the queue's remote
routes: requests gathered during one loop pass travel to the scheduler in one
``shoal_online_submit`` message, and one long poll (``shoal_online_answers``)
brings back every answer ready. The gateway holds no state a restart would
lose beyond its own requests in flight, so any number of them can stand
behind a load balancer. A link that loses the scheduler answers 503 (with
Retry-After) to what it had in flight and to new requests, and reconnects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from distributed.core import rpc

from ...configs import GatewaySettings, ModelSpec
from ..model_specs import ModelSpecs
from ..protocol import OnlinePayload, OnlineResult, PullQueueClient, RemoteRequest, RemoteSettings, SpecFields
from ..work_items import unsendable

logger = logging.getLogger("shoal.gateway")

RECONNECT_SECONDS = 1.0
ANSWER_POLL_SECONDS = 2.0
MODELS_REFRESH_SECONDS = 5.0
LATE_ANSWER_SECONDS = 5.0  # past its deadline, a request whose answer never came is answered 504 here


class GatewayBackend(Protocol):
    def specs(self) -> Mapping[str, ModelSpec]:
        """The models served, by name."""

    def workers(self) -> int:
        """Workers connected (0: requests get 503, unless workers are coming)."""

    def workers_coming(self) -> bool:
        """An autoscaler may add workers: a request that finds none waits for one, and the gateway is ready."""

    def loaded_counts(self) -> dict[str, int]:
        """Workers with each model loaded, for /v1/models."""

    def queue_depths(self) -> dict[tuple[str, str], int]:
        """Waiting items by (model, "online"|"batch"), for the gateway's /metrics; may be empty."""

    async def answer(
        self,
        model: str,
        op: str,
        payload: OnlinePayload,
        rows: int,
        timeout: float,
        settings: GatewaySettings,
        flow: str | None = None,
    ) -> OnlineResult:
        """The worker's result, or {"status", "error"} for a request that cannot be answered; `flow`: the
        request a part belongs to (request_parts), whose parts share a fair share of the queue."""

    async def close(self) -> None:
        """Let go of connections and answer what is in flight."""


class SchedulerLink:
    """A gateway process's link to the scheduler's online queue."""

    def __init__(
        self,
        address: str,
        connection_args: dict[str, Any] | None = None,
        models: dict[str, SpecFields] | None = None,
    ) -> None:
        """`models`: specs to register with the scheduler on each connection (the gateway's catalog);
        `connection_args`: Dask's, for its comms (security)."""
        self.address = address
        self._offered = dict(models or {})
        self.name = f"gateway-{uuid.uuid4().hex[:12]}"
        self.connected = False
        self._rpc = rpc(address, connection_args=connection_args or {})
        self._queue = PullQueueClient(self._rpc)
        self._specs = ModelSpecs()  # the scheduler's, from its replies
        self._specs.add(self._offered, "the gateway's models")  # until the scheduler's arrive
        self._specs_version: int | None = None
        self._workers = 0
        self._workers_coming = False  # the scheduler's autoscaler may add workers: requests wait for one
        self._loaded: dict[str, int] = {}
        self._ids = itertools.count()
        self._waiting: dict[int, asyncio.Future[OnlineResult]] = {}
        self._outgoing: list[RemoteRequest] = []
        self._cancelled: list[int] = []
        self._settings: RemoteSettings | None = None
        self._flush_due = False
        self._task: asyncio.Task | None = None
        self._sends: set[asyncio.Task] = set()
        self.connected_once = asyncio.Event()

    async def start(self) -> None:
        """Start connecting in the background: a gateway may start before its scheduler."""
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._answer_all({"status": 503, "error": "the gateway is shutting down"})
        await self._rpc.close_rpc()

    # -- GatewayBackend --------------------------------------------------------------

    def specs(self) -> Mapping[str, ModelSpec]:
        return self._specs

    def workers(self) -> int:
        return self._workers if self.connected else 0

    def workers_coming(self) -> bool:
        return self.connected and self._workers_coming

    def loaded_counts(self) -> dict[str, int]:
        return self._loaded

    def queue_depths(self) -> dict[tuple[str, str], int]:
        return {}  # the scheduler's /metrics has them; a gateway would only repeat them late

    async def answer(
        self,
        model: str,
        op: str,
        payload: OnlinePayload,
        rows: int,
        timeout: float,
        settings: GatewaySettings,
        flow: str | None = None,
    ) -> OnlineResult:
        if not self.connected:
            return {"status": 503, "error": f"the scheduler at {self.address} is not reachable; retry shortly"}
        if not self._workers and not self._workers_coming:
            return {"status": 503, "error": "no workers are connected"}
        reason = unsendable(payload)  # checked alone: in the batch it would fail every request beside it
        if reason is not None:
            return {"status": 400, "error": f"the request cannot be sent to the scheduler: {reason}"}
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        future = self._waiting[request_id] = loop.create_future()
        self._settings = {
            "request_timeout_seconds": settings.request_timeout_seconds,
            "max_attempts": settings.max_attempts,
            "max_queue_depth": settings.max_queue_depth,
            "max_inputs": settings.max_inputs,
            "max_documents": settings.max_documents,
        }
        request: RemoteRequest = (request_id, model, op, payload, rows, timeout)
        self._outgoing.append((*request, flow) if flow is not None else request)
        self._flush_soon()
        # The scheduler answers 504 at the deadline; this only covers an answer lost on the way.
        lost: OnlineResult = {"status": 504, "error": f"no answer within {timeout:.3g} s"}
        late = loop.call_later(timeout + LATE_ANSWER_SECONDS, self._resolve, request_id, lost)
        try:
            return await future
        except asyncio.CancelledError:  # the client went away: the scheduler drops the request
            if self._waiting.pop(request_id, None) is not None:
                self._cancelled.append(request_id)
                self._flush_soon()
            raise
        finally:
            late.cancel()

    # -- batching ------------------------------------------------------------------------

    def _flush_soon(self) -> None:
        """One message per loop pass, whatever the number of requests that arrived in it."""
        if not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        requests, self._outgoing = self._outgoing, []
        cancel, self._cancelled = self._cancelled, []
        if requests or cancel:
            task = asyncio.create_task(self._send(requests, cancel))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)

    async def _send(self, requests: list[RemoteRequest], cancel: list[int]) -> None:
        try:
            await self._queue.online_submit(self.name, requests, self._settings, cancel)
        except Exception as exc:  # the scheduler is gone: these requests were never queued
            logger.warning(
                "could not send %d requests to %s (%s: %s)", len(requests), self.address, type(exc).__name__, exc
            )
            for request in requests:
                self._resolve(request[0], {"status": 503, "error": "the scheduler is not reachable; retry shortly"})

    # -- answers --------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._refresh_models(self._offered)
                if not self.connected:
                    logger.info("gateway %s connected to %s", self.name, self.address)
                self.connected = True
                self.connected_once.set()
                refreshed = asyncio.get_running_loop().time()
                while True:
                    reply = await self._queue.online_answers(self.name, ANSWER_POLL_SECONDS)
                    for request_id, outcome in reply["answers"]:
                        self._resolve(request_id, outcome)
                    self._workers = reply["workers"]
                    now = asyncio.get_running_loop().time()
                    if reply["specs"] != self._specs_version or now - refreshed > MODELS_REFRESH_SECONDS:
                        await self._refresh_models()
                        refreshed = now
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self.connected:
                    logger.warning(
                        "gateway lost the scheduler at %s (%s: %s); reconnecting", self.address, type(exc).__name__, exc
                    )
                self.connected = False
                self._answer_all({"status": 503, "error": "the scheduler connection was lost; retry shortly"})
                await asyncio.sleep(RECONNECT_SECONDS)

    async def _refresh_models(self, offered: dict[str, SpecFields] | None = None) -> None:
        reply = await self._queue.online_models(offered)
        self._specs.add(reply["models"], f"the scheduler at {self.address}")
        self._specs_version = reply["specs"]
        self._workers = reply["workers"]
        self._workers_coming = reply.get("workers_coming", False)
        self._loaded = reply["loaded"]

    def _resolve(self, request_id: int, outcome: OnlineResult) -> None:
        future = self._waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def _answer_all(self, outcome: OnlineResult) -> None:
        for request_id in list(self._waiting):
            self._resolve(request_id, outcome)
