"""The online gateway: HTTP in front of the pull queue.

A request is checked (auth, size, shape, limits), becomes an online item on its
model's queue, and waits for a worker's answer. The gateway reaches the queue
through a backend (link.GatewayBackend): in the scheduler's process
(`shoal serve`) it calls the queue directly, with no message and no thread
hop; in a process of its own (`shoal gateway`) it sends requests to the
scheduler and receives answers in batches, so HTTP parsing, auth and encoding
leave the scheduler's one event loop and several gateways serve one cluster.
aiohttp serves it (its C parser is faster than tornado's).

Routes: Shoal's own ``POST /v1/encode/{model}`` and ``/v1/rerank/{model}``
(MessagePack first, JSON when asked), OpenAI's ``POST /v1/embeddings``,
Cohere's ``POST /v1/rerank``, ``/v2/rerank`` and ``/v2/embed`` (texts, or an image model's images), the other kinds' routes
(kind_routes: ``/v1/sparse/{model}``, ``/v1/multivector/{model}``, ...), ``GET /v1/models``,
``/healthz``, ``/readyz``, ``/metrics``. A request of more inputs than a
model's online batch is queued as parts (request_parts). The protocol is in
docs/PROTOCOL.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Coroutine
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import ClientPayloadError, hdrs, web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import (
    BadHttpMessage,
    BadHttpMethod,
    BadStatusLine,
    ContentEncodingError,
    ContentLengthError,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
    TransferEncodingError,
)
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler, RequestPayloadError, _ErrInfo
from prometheus_client import CONTENT_TYPE_LATEST, Counter

from ...configs import GatewaySettings, ModelSpec, kinds
from ...configs.adapters import unknown_model
from ..protocol import OnlinePayload, OnlineResult, ServedModel
from . import api_formats as api
from . import body_limits, kind_routes, request_parts, token_arrays
from .auth import BearerAuth
from .kind_routes import TextsCall, texts_call
from .metrics import GatewayMetrics
from .rate_limits import RateLimits
from .wire import JSON, MSGPACK, RequestError, clip, decode, encode, media_type, response_type, shown

if TYPE_CHECKING:
    from .link import GatewayBackend

logger = logging.getLogger("shoal.gateway")


class _ClientFramingErrors(logging.Filter):
    """aiohttp answers a malformed request (bad chunk size, Content-Length, header) with 400 by itself,
    then logs it at ERROR with a traceback; a body it cannot decode (bad gzip) that no handler read
    raises while aiohttp drains it after the answer, logged as "Unhandled exception". Either way any
    client could fill the log: such a record is the client's fault and becomes one debug line; every
    other aiohttp error passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            logger.debug("malformed request answered %s: %s", error.code, clip(error.message))
            return False
        if isinstance(error, RequestPayloadError):
            logger.debug("a request body that could not be read, after its answer: %s", clip(str(error)))
            return False
        return True


HTTP_LOGGER = logging.getLogger("shoal.gateway.http")  # aiohttp's server logger for the gateway
HTTP_LOGGER.addFilter(_ClientFramingErrors())

TIMEOUT_HEADER = "X-Shoal-Timeout"  # a client's own deadline in seconds, at most the configured one
UNKNOWN_MODEL = "_unknown"  # metrics label for names not in the catalog (keeps label sets bounded)
# Connections waiting to be accepted. aiohttp's default overflows in bursts of new connections:
# the kernel then drops the SYN and the client stalls until its retry, a second later.
LISTEN_BACKLOG = 2048
CLIENT_CLOSED = 499  # metrics status of a request whose client went away before its body arrived (nginx's code)
# The answer to a connection over `max_connections`, written before it is closed.
TOO_MANY_CONNECTIONS = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
)
ERROR_TYPES = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    408: "body_timeout",
    413: "too_large",
    415: "unsupported_media_type",
    417: "expectation_failed",
    422: "unprocessable",
    429: "overloaded",
    500: "internal",
    501: "not_implemented",
    502: "worker_error",
    503: "unavailable",
    504: "timeout",
}
MODEL = web.RequestKey("shoal_model", str)  # metrics label, set once the route knows it
REPLY = web.RequestKey("shoal_reply", str)  # media type of the answer, errors included
TIMING = web.RequestKey("shoal_timing", dict)  # stage timings from the worker's ack
EMBED, RERANK = "embed", "rerank"  # the API formats' families of routes (api_formats): the kinds' `api`
# The Content-Encodings aiohttp decodes (brotli and zstd when their libraries are installed), and none.
CONTENT_CODINGS = {"", "identity", "gzip", "deflate", *(["br"] if HAS_BROTLI else []), *(["zstd"] if HAS_ZSTD else [])}
MAX_MESSAGE = 1000  # characters of an error message, a worker's included: what it quotes is cut to 200 first


# What a request aiohttp's parser refused is told, by the parser's error: never its message, which
# quotes the offending bytes (a bearer token's header line, a whole over-long header).
PARSER_ERRORS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, "a request line or header is longer than the server's limit"),
    (BadHttpMethod, "not an HTTP method (or not HTTP: TLS sent to a plain HTTP port?)"),
    (BadStatusLine, "malformed request line"),
    (InvalidURLError, "malformed request target"),
    (InvalidHeader, "malformed header"),
)


def error_body(status: int, message: str) -> api.ResponseBody:
    """The shape of every error answer (docs/PROTOCOL.md)."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "error"), "code": status}}


def parser_error(exc: HttpProcessingError) -> str:
    """What to tell a client whose request the parser refused.

    llhttp's own messages are "<reason>:\n\n  <the bytes>\n  <a caret>": the
    reason alone is passed on (Invalid header value char, Transfer-Encoding
    can't be present with Content-Length, ...), never the bytes. aiohttp's
    own checks raise a plain `BadHttpMessage` whose message quotes nothing
    the client sent ("Too many headers received", "Missing 'Host' header in
    request."): passed on as it is.
    """
    for kind, text in PARSER_ERRORS:
        if isinstance(exc, kind):
            return f"malformed HTTP request: {text}"
    reason, layout, _ = exc.message.partition(":\n\n")
    if not layout and type(exc) is BadHttpMessage:
        reason, layout = exc.message, "its own"
    known = layout and reason.isprintable() and len(reason) <= 80
    return f"malformed HTTP request: {reason}" if known else "malformed HTTP request"


def body_error(exc: RequestPayloadError, encoding: str) -> str:
    """What to tell a client whose body could not be read: its framing or its encoding, and why."""
    cause = exc.__cause__
    if isinstance(cause, ContentEncodingError):
        return f"the body is not valid for its Content-Encoding {clip(encoding)}: {clip(cause.message)}"
    if isinstance(cause, TransferEncodingError):
        return f"malformed chunked body: {clip(cause.message)}"
    if isinstance(cause, ContentLengthError):
        return "the body ended before its Content-Length"
    return f"the body could not be read: {clip(str(exc))}"


class _JsonErrors(RequestHandler):
    """A connection whose own errors (a request the parser refused, aiohttp's 500 or 504) are answered in
    the JSON error shape, like every other error, instead of aiohttp's text/plain echo of the request."""

    __slots__ = ()

    def data_received(self, data: bytes) -> None:
        """A body the parser finds malformed (a bad chunk) ends with that error, for its reader to answer at once.

        aiohttp queues the parser's error as the next request and leaves the
        body unfinished: its handler would wait for the body timeout (408).
        """
        queued = len(self._messages)
        super().data_received(data)
        error = self._messages[-1][0] if len(self._messages) == queued + 1 else None
        if not isinstance(error, _ErrInfo):
            return
        payload = self._body_being_read(queued)
        if payload is None:  # the error is in a new request's head: aiohttp's answer to it stands
            return
        self._messages.pop()
        failure = RequestPayloadError(error.message)
        failure.__cause__ = error.exc
        payload.set_exception(failure)
        payload.feed_eof()  # nothing more to read: answered, the connection closes (no lingering)
        self.close()  # the parser cannot go on: read no more of this connection

    def _body_being_read(self, queued: int) -> StreamReader | None:
        """The body the parser was in, if a request's body is unfinished: queued, or its handler's."""
        if queued:
            payload = self._messages[queued - 1][1]
        elif self._current_request is not None:
            payload = self._current_request.content
        else:
            return None
        return None if payload.is_eof() else payload

    def handle_error(
        self, request, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # aiohttp's logging, and its check that no answer began
        text = parser_error(exc) if isinstance(exc, HttpProcessingError) else "internal error"
        response = web.Response(status=status, body=encode(error_body(status, text), JSON), content_type=JSON)
        response.force_close()
        return response


class _GatewayServer(web.Server):
    """aiohttp's server, making `_JsonErrors` connections and capping them at `cap` (aiohttp has neither hook).

    Each open connection holds a file descriptor and a parser; without a cap,
    clients that open many and send nothing exhaust the process's descriptors,
    the scheduler's comms included. A connection over it is answered 503 and
    closed, counted in `refused`.
    """

    cap: int
    refused: Counter

    def __call__(self) -> RequestHandler:
        # The connection's class from the start: uvloop keeps the protocol's data_received from then on.
        return _JsonErrors(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self.connections) > self.cap:
            logger.debug("connection refused: %d open, the cap is %d", len(self.connections) - 1, self.cap)
            self.refused.inc()
            transport.write(TOO_MANY_CONNECTIONS)
            handler.close()  # parse nothing it sends
            # Closed once the handler's task has started: closed now, the task would start on a
            # connection already lost and fail aiohttp's assertions, a traceback in the log each time.
            asyncio.get_running_loop().call_soon(transport.close)


class Gateway:
    def __init__(self, backend: GatewayBackend, settings: GatewaySettings) -> None:
        """`backend`: the queue in this process (online_route.LocalBackend) or a link to a scheduler's."""
        self.backend = backend
        self.settings = settings
        self.auth = BearerAuth.from_settings(settings)
        rate = settings.requests_per_second
        self.rate_limits = RateLimits(rate, settings.request_burst or max(1, math.ceil(rate))) if rate else None
        self.metrics = GatewayMetrics(backend.queue_depths)
        self.bounds = body_limits.decode_bounds(settings)
        self.accepting = False
        self.url = ""
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[self._answer])
        # POST routes read MessagePack by default (Shoal's own) or JSON (OpenAI's and Cohere's shapes).
        native = partial(web.post, expect_handler=partial(self._expect, MSGPACK))
        compat = partial(web.post, expect_handler=partial(self._expect, JSON))
        app.add_routes(
            [
                # A model name may hold slashes: a Hugging Face id (org/name) served without a catalog entry.
                native("/v1/encode/{model:.+}", self.encode),
                native("/v1/rerank/{model:.+}", self.rerank),
                *(native(f"/v1/{op}/{{model:.+}}", partial(self.kind_route, op)) for op in kinds.routes()),
                compat("/v1/embeddings", self.openai_embeddings),
                compat("/v{version:[12]}/rerank", self.cohere_rerank),  # the same shape in Cohere's v1 and v2
                compat("/v2/embed", self.cohere_embed),
                web.get("/v1/models", self.models),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.prometheus),
            ]
        )
        # aiohttp's keep-alive timer runs from a connection's opening and from each answer until the
        # next request head is complete: it is the header timeout (and the idle keep-alive one).
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=settings.header_timeout_seconds,
            logger=HTTP_LOGGER,
        )

    async def start(self) -> str:
        await self._runner.setup()
        self._serve_with_guards()
        site = web.TCPSite(
            self._runner, self.settings.host, self.settings.port, reuse_address=True, backlog=LISTEN_BACKLOG
        )
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        self.accepting = True
        logger.info("online gateway on %s (auth %s)", self.url, "on" if self.auth.enabled else "off")
        return self.url

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (within their deadline), close."""
        self.accepting = False
        for site in list(self._runner.sites):
            await site.stop()
        try:
            await asyncio.wait_for(self._idle.wait(), self.settings.longest_deadline + 1)
        except TimeoutError:
            logger.warning("gateway closing with %d requests still in flight", self._in_flight)
        await self._runner.cleanup()
        logger.info("online gateway on %s stopped", self.url)

    def _serve_with_guards(self) -> None:
        """aiohttp's server made a `_GatewayServer` (it builds its server itself): JSON errors from the parser,
        the cap on connections, and the JSON shape for what aiohttp answers before any route runs."""
        server = self._runner.server
        if server is None:
            raise RuntimeError("the gateway's server is not set up")
        server.__class__ = _GatewayServer
        assert isinstance(server, _GatewayServer)
        server.cap = self.settings.max_connections
        server.refused = self.metrics.connections_refused
        handle = server.request_handler

        async def request_handler(request: web.BaseRequest) -> web.StreamResponse:
            try:
                return await handle(request)
            except web.HTTPException as exc:  # aiohttp's Expect handler, on a path with no route
                message = exc.reason
                if exc.status == 417:
                    expect = request.headers.get(hdrs.EXPECT, "")
                    message = f"Expect {shown(expect)} is not supported; only 100-continue is"
                response = self._error(request, exc.status, message)
                await self._send_and_close(request, response)  # no body follows a refused Expect
                return response

        server.request_handler = request_handler

    async def _expect(self, default: str, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue` is answered once the body would be accepted (auth, media type, size), so a
        client refused then never sends it; any other expectation is a 417. On POST routes only."""
        expect = request.headers.get(hdrs.EXPECT, "")
        if request.version != HttpVersion11:
            return None  # HTTP/1.0 has no Expect
        try:
            if expect.lower() != "100-continue":
                raise RequestError(417, f"Expect {shown(expect)} is not supported; only 100-continue is")
            self._admit(request, default)
        except RequestError as exc:
            response = self._error(request, exc.status, exc.message, exc.headers)
            await self._send_and_close(request, response)  # the client waits, sending no body
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is no part of the real one (as aiohttp's own handler)
        return None

    # -- every request ------------------------------------------------------------

    @web.middleware
    async def _answer(self, request: web.Request, handler) -> web.StreamResponse:
        """Counts in-flight work, turns every failure into a status and a message, never a traceback."""
        started = time.perf_counter()
        self._in_flight += 1
        self._idle.clear()
        self.metrics.in_flight.inc()
        try:
            response = await handler(request)
        except RequestError as exc:
            response = self._error(request, exc.status, exc.message, exc.headers)
        except ClientGone as exc:  # nobody to answer: counted, not logged as a failure
            logger.debug("online request %s %s: %s", request.method, request.path, exc)
            response = web.Response(status=CLIENT_CLOSED, reason="Client Closed Request")
        except web.HTTPException as exc:  # no such route or method, body over the limit
            message = "request body too large" if exc.status == 413 else exc.reason
            if exc.status == 413:
                message += f"; the limit is {self.settings.max_body_bytes} bytes"
            response = self._error(request, exc.status, message)
        except Exception:
            logger.exception("online request %s %s failed", request.method, request.path)
            response = self._error(request, 500, "internal error")
        finally:
            self._in_flight -= 1
            self.metrics.in_flight.dec()
            if not self._in_flight:
                self._idle.set()
        if response.headers.get(hdrs.CONNECTION, "").lower() == "close":
            await self._send_and_close(request, response)
        model = request.get(MODEL)
        if model is not None:
            self.metrics.answered(model, response.status, time.perf_counter() - started, request.get(TIMING))
        return response

    @staticmethod
    async def _send_and_close(request: web.BaseRequest, response: web.StreamResponse) -> None:
        """Write an answer that ends its connection (a 408), then close: aiohttp would keep the connection
        up to its lingering time, reading a body that is not coming."""
        with contextlib.suppress(ConnectionError):  # the client left first: nothing to write, still closed
            await response.prepare(request)
            await response.write_eof()
        request.protocol.force_close()

    def _error(
        self, request: web.BaseRequest, status: int, message: str, headers: dict[str, str] | None = None
    ) -> web.Response:
        # A message may echo what the client sent (a header's undecodable bytes are lone surrogates).
        body = error_body(status, clip(message, MAX_MESSAGE).encode("utf-8", "backslashreplace").decode())
        kind = request.get(REPLY) or response_type(request.headers.get("Accept"), JSON)
        if status in (429, 503):
            headers = {"Retry-After": str(self.settings.retry_after_seconds), **(headers or {})}
        if status == 401:
            headers = {"WWW-Authenticate": 'Bearer realm="shoal"', **(headers or {})}
        return web.Response(status=status, body=encode(body, kind), content_type=kind, headers=headers)

    def _admit(self, request: web.BaseRequest, default: str) -> str:
        """Auth, media type and size, from the head alone: the body's media type (MSGPACK or JSON)."""
        sent = media_type(request.headers.get("Content-Type"), default)
        request[REPLY] = response_type(request.headers.get("Accept"), sent or default)
        client = self.auth.client(request.headers.get("Authorization"))
        if client is None:
            raise RequestError(401, "missing or wrong bearer token")
        if not self.accepting:
            raise RequestError(503, "the gateway is shutting down")
        if self.rate_limits is not None:
            self._quota(self.rate_limits, client or f"address {request.remote}")
        if sent is None:
            raise RequestError(415, f"send {MSGPACK} or {JSON}, not {shown(request.headers.get('Content-Type'))}")
        coding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
        if coding not in CONTENT_CODINGS:  # aiohttp would pass the body on as it came
            supported = ", ".join(sorted(CONTENT_CODINGS - {"", "identity"}))
            raise RequestError(415, f"Content-Encoding {shown(coding)} is not supported: send {supported}, or none")
        limit = self.settings.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise RequestError(413, f"request body too large; the limit is {limit} bytes")
        return sent

    @staticmethod
    def _quota(limits: RateLimits, client: str) -> None:
        waited = limits.wait(client)
        if waited is not None:
            raise RequestError(
                429,
                f"over this client's rate limit of {limits.rate:g} requests a second (bursts of {limits.burst}); "
                f"retry in {waited} s",
                {"Retry-After": str(waited)},
            )

    async def _body(self, request: web.Request, default: str) -> Any:
        """Auth, media type, size and decoding under the values bound: what every POST route needs first."""
        sent = self._admit(request, default)
        body = await self._read_body(request)
        try:
            return decode(body, sent, self.bounds)
        except RequestError as exc:
            encoding = request.headers.get(hdrs.CONTENT_ENCODING)
            if encoding and exc.status == 400:  # a gzip body cut short decodes to a truncated one, unnoticed
                exc.message += f" (as it came out of its Content-Encoding {clip(encoding)})"
            raise

    async def _read_body(self, request: web.Request) -> bytes:
        """The body, within `body_timeout_seconds` of its head; a client gone mid-body is `ClientGone`; one
        that cannot be read (bad framing, a Content-Encoding it does not match) a 400 saying why."""
        try:
            if request.content.is_eof():  # the usual small body came with its head: no timer needed
                return await request.read()
            async with asyncio.timeout(self.settings.body_timeout_seconds):
                return await request.read()
        except TimeoutError:
            raise RequestError(
                408,
                f"the body did not arrive within {self.settings.body_timeout_seconds:g} s",
                {"Connection": "close"},
            ) from None
        except RequestPayloadError as exc:
            encoding = request.headers.get(hdrs.CONTENT_ENCODING, "")
            raise RequestError(400, body_error(exc, encoding), {"Connection": "close"}) from None
        except (ConnectionError, ClientPayloadError) as exc:
            raise ClientGone(f"the client closed the connection before its body arrived ({exc})") from None

    def _label(self, request: web.Request, model: str) -> None:
        request[MODEL] = model if model in self.backend.specs() else UNKNOWN_MODEL

    def _spec(self, request: web.Request, model: str, served: tuple[kinds.Kind, ...], action: str) -> ModelSpec:
        """The model's spec, refused (400) unless its kind is one the route serves; `action`: what it cannot do."""
        self._label(request, model)
        specs = self.backend.specs()
        spec = specs.get(model)
        if spec is None:
            # The name cut first: a client's, quoted in the message (200 characters at most).
            raise RequestError(404, unknown_model(clip(model), list(specs)))
        if kinds.kind_of(spec) not in served:
            raise RequestError(400, f"model {model!r} is of kind {spec.kind!r}; it cannot {action}")
        return spec

    async def _run(
        self, request: web.Request, op: str, call: api.EncodeCall | api.ScoreCall | TextsCall
    ) -> OnlineResult:
        """Queue the call as online items, one per part of at most `max_part_inputs` inputs (and the model's
        online batch), and wait for the workers' answers."""
        loop = asyncio.get_running_loop()
        timeout = self._timeout(request, call.inputs)
        deadline = loop.time() + timeout  # the request's, whenever a part is asked

        def answer(part: OnlinePayload, inputs: int, flow: str | None) -> Coroutine[Any, Any, OnlineResult]:
            return self.backend.answer(call.model, op, part, inputs, deadline - loop.time(), self.settings, flow)

        size = min(self.backend.specs()[call.model].online_batch, self.settings.max_part_inputs)
        in_flight = self.settings.max_inputs_in_flight
        result = await request_parts.answer_in_parts(answer, call.payload(), size, in_flight)
        if "error" in result:
            status = int(result.get("status", 422))
            if status == 504:  # a part's answer counts its own time left; the client asked for the request's
                raise RequestError(504, f"no answer within {timeout:g} s")
            raise RequestError(status, result["error"])
        request[TIMING] = result.get("timing") or {}
        return result

    def _timeout(self, request: web.Request, inputs: int) -> float:
        limit = self.settings.deadline(inputs)
        asked = request.headers.get(TIMEOUT_HEADER)
        if asked is None:
            return limit
        try:
            seconds = float(asked)
        except ValueError:
            raise RequestError(400, f"{TIMEOUT_HEADER} must be a number of seconds, not {shown(asked)}") from None
        if not seconds > 0:
            raise RequestError(400, f"{TIMEOUT_HEADER} must be positive")
        return min(seconds, limit)

    def _reply(self, request: web.Request, body: api.ResponseBody) -> web.Response:
        kind = request[REPLY]
        return web.Response(body=encode(body, kind), content_type=kind)

    # -- routes -----------------------------------------------------------------------

    async def encode(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        self._label(request, model)
        body = await self._body(request, MSGPACK)
        spec = self._spec(request, model, kinds.for_api(EMBED), "encode")
        call = api.encode_call(model, body, self.settings, _takes_images(spec))
        call.check_dim(spec)
        result = await self._run(request, kinds.kind_of(spec).operation, call)
        return self._reply(request, api.encode_response(call, result, request[REPLY]))

    async def rerank(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        self._label(request, model)
        body = await self._body(request, MSGPACK)
        spec = self._spec(request, model, kinds.for_api(RERANK), "rerank")
        call = api.score_call(model, body, self.settings)
        result = await self._run(request, kinds.kind_of(spec).operation, call)
        return self._reply(request, api.rerank_response(call, result))

    async def kind_route(self, op: str, request: web.Request) -> web.Response:
        """A kind's own route (kind_routes): sparse and multi-vector encodes, classification, extraction."""
        model = request.match_info["model"]
        self._label(request, model)
        body = await self._body(request, MSGPACK)
        spec = self._spec(request, model, kinds.for_operation(op), kinds.routes()[op])
        call = texts_call(model, body, spec, self.settings)
        result = await self._run(request, op, call)
        return self._reply(request, kind_routes.answer(spec, call, result, request[REPLY]))

    async def openai_embeddings(self, request: web.Request) -> web.Response:
        request[MODEL] = UNKNOWN_MODEL
        body = api.openai_request(await self._body(request, JSON), self.settings)
        spec = self._spec(request, body.model, kinds.for_api(EMBED), "embed")
        arrays = body.token_arrays()
        texts = body.texts() if arrays is None else await asyncio.to_thread(token_arrays.decode, arrays)
        call = api.openai_call(body, texts, self.settings, _takes_images(spec))
        call.check_dim(spec)
        result = await self._run(request, kinds.kind_of(spec).operation, call)
        return self._reply(request, api.openai_response(call, body, result))

    async def cohere_embed(self, request: web.Request) -> web.Response:
        request[MODEL] = UNKNOWN_MODEL
        body = api.cohere_embed_request(await self._body(request, JSON), self.settings)
        spec = self._spec(request, body.model, kinds.for_api(EMBED), "embed")
        call = api.cohere_embed_call(body, self.settings, _takes_images(spec))
        call.check_dim(spec)
        result = await self._run(request, kinds.kind_of(spec).operation, call)
        return self._reply(request, api.cohere_embed_response(call, result))

    async def cohere_rerank(self, request: web.Request) -> web.Response:
        request[MODEL] = UNKNOWN_MODEL
        call, body = api.cohere_call(await self._body(request, JSON), self.settings)
        spec = self._spec(request, call.model, kinds.for_api(RERANK), "rerank")
        result = await self._run(request, kinds.kind_of(spec).operation, call)
        return self._reply(request, api.cohere_response(call, body, result, request.match_info["version"]))

    async def models(self, request: web.Request) -> web.Response:
        request[REPLY] = response_type(request.headers.get("Accept"), JSON)
        if not self.auth.allows(request.headers.get("Authorization")):
            raise RequestError(401, "missing or wrong bearer token")
        loaded = self.backend.loaded_counts()
        data: list[ServedModel] = []
        for name, spec in sorted(self.backend.specs().items()):
            served: ServedModel = {
                "id": name,
                "object": "model",
                "owned_by": "shoal",
                "kind": spec.kind,
                "dim": spec.dim,
                "max_seq_length": spec.max_seq_length,
                "loaded_workers": loaded.get(name, 0),
            }
            if spec.adapter is not None:
                served["parent"] = spec.adapter.base
            data.append(served)
        return self._reply(request, {"object": "list", "data": data})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """Ready: accepting, and at least one Shoal worker is pulling or an autoscaler may start one."""
        workers = self.backend.workers()
        ready = self.accepting and (workers > 0 or self.backend.workers_coming())
        body = {"ready": ready, "accepting": self.accepting, "workers": workers}
        return web.json_response(body, status=200 if ready else 503)

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def _takes_images(spec: ModelSpec) -> bool:
    """An image model's encode requests may carry images (its kind's operation answers images and texts)."""
    return "images" in kinds.kind_of(spec).inputs


class ClientGone(Exception):
    """The client disconnected before its request could be read: no one to answer."""
