"""The HTTP gateway behind ``vsqs serve``: the app, its configuration, auth,
metrics and the one place vsqs errors become HTTP answers.

The gateway keeps no state of its own. Every request turns into calls of the
public Python API on the spool, so any number of gateways on any hosts can
serve one spool beside library and CLI users, and killing one loses nothing.
What it does keep is a cache: one open :class:`vsqs.Queue` handle per queue
(for the handle's listing cache), checked against the disk every few seconds.

Two faces share one port: the native JSON/raw API under ``/queues`` (see
``_rest``) and the Amazon SQS JSON 1.0 protocol on ``POST /`` (see ``_sqs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.exceptions import HTTPException as StarletteHTTPException

from vsqs._core.errors import (
    IncompatibleFormat,
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    QueueSuspended,
    StaleReceipt,
    StorageError,
    VsqsError,
)
from vsqs._core.message import Message
from vsqs._core.queue import Queue
from vsqs._core.spool import Spool
from vsqs._version import __version__

log = logging.getLogger("vsqs.gateway")
disable_created_metrics()  # the _created series only double what a scrape stores

T = TypeVar("T")

CONFIG_ENV = "VSQS_GATEWAY_CONFIG"  # how `vsqs serve --workers N` hands its config to each worker
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024  # SQS's own limit since 2025
_CAP_MESSAGES = 10  # the native request cap holds this many full-size bodies (a batch of small ones may hold 100)
_HANDLE_CHECK_SECONDS = 2.0
_POLL_FIRST, _POLL_MAX = 0.01, 0.5
_MIN_REPOLL = 0.1  # seconds between receive attempts of the idle long polls of one queue
MAX_WAIT = 20.0  # seconds a receive may long-poll, as SQS: a longer wait belongs in a loop


@dataclass(frozen=True)
class GatewayConfig:
    """Everything a gateway process needs; plain data, so it travels as JSON to workers."""

    spool: str
    api_key: str | None = None
    aws_credentials: dict[str, str] = field(default_factory=dict)  # access key id -> secret
    region: str = "us-east-1"
    account_id: str = "000000000000"
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    file_mode: str | None = None  # given to the queues the gateway creates (e.g. "0660")

    @property
    def max_request_bytes(self) -> int:
        """The native API's cap: _CAP_MESSAGES full-size bodies in base64, plus the JSON around them."""
        return (_CAP_MESSAGES * self.max_message_bytes * 4) // 3 + 256 * 1024

    @property
    def max_sqs_request_bytes(self) -> int:
        """The SQS face's cap: SQS takes at most one message's worth per request (a batch
        included); JSON escapes may triple non-ASCII text."""
        return 3 * self.max_message_bytes + 64 * 1024

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> GatewayConfig:
        return cls(**json.loads(text))


class ApiError(Exception):
    """An HTTP answer raised from a handler: status, a short code and a message
    (naming the parameter at fault when there is one)."""

    def __init__(self, status: int, code: str, message: str, parameter: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.parameter = status, code, message, parameter
        self.headers = headers or {}


def api_error_of(exc: VsqsError) -> ApiError:
    """The one translation of vsqs errors to HTTP statuses (the native face)."""
    text = str(exc)
    if isinstance(exc, QueueNotFound):
        return ApiError(404, "queue_not_found", text, "queue")
    if isinstance(exc, InvalidReceipt):
        return ApiError(400, "invalid_receipt", text, "receipt")
    if isinstance(exc, StaleReceipt):
        return ApiError(409, "stale_receipt", text, "receipt")
    if isinstance(exc, MessageTooLarge):
        return ApiError(413, "message_too_large", text, "body")
    if isinstance(exc, QueueFull):
        return ApiError(429, "queue_full", text, headers={"Retry-After": "1"})
    if isinstance(exc, QueueSuspended):
        return ApiError(503, "queue_suspended", text, headers={"Retry-After": "5"})
    if isinstance(exc, InvalidArgument):
        return ApiError(422, "invalid_argument", text, _named_parameter(text))
    if isinstance(exc, IncompatibleFormat):
        return ApiError(409, "incompatible_format", text)
    if isinstance(exc, StorageError):
        if exc.errno == 28:  # ENOSPC
            return ApiError(507, "storage_full", text)
        return ApiError(503, "storage_error", text, headers={"Retry-After": "5"})
    return ApiError(500, "error", text)


def without_paths(text: str, spool_root: str) -> str:
    """An error message fit for a client: paths in the spool become queue names,
    and the spool's own path goes (a client has no business knowing it)."""
    root = spool_root.rstrip(os.sep)
    return text.replace(root + os.sep, "").replace(f" in {root}", "").replace(root, "the spool")


def _named_parameter(text: str) -> str | None:
    """vsqs's InvalidArgument messages start with the argument's name ("visibility_timeout must ...")."""
    head = text.split(" ", 1)[0].rstrip(":")
    return head if head.isidentifier() else None


def error_response(error: ApiError) -> JSONResponse:
    doc: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.parameter:
        doc["parameter"] = error.parameter
    return JSONResponse({"error": doc}, status_code=error.status, headers=error.headers)


class Gateway:
    """What the handlers share: the spool, the queue handles, the metrics, the waiters."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.spool = Spool(config.spool)
        self._handles: dict[str, tuple[Queue, float]] = {}
        self._handles_lock = threading.Lock()
        self._waiters: dict[str, _Waiters] = {}
        self.metrics = _Metrics(self)

    # -- queue handles ------------------------------------------------------

    def queue(self, name: str) -> Queue:
        """An open handle on queue ``name`` (QueueNotFound, or InvalidArgument for a bad name).

        Handles are cached; every few seconds a cached one is compared with the
        queue on disk, so a queue deleted and made again elsewhere is noticed.
        """
        now = time.monotonic()
        with self._handles_lock:
            cached = self._handles.get(name)
        if cached is not None and now - cached[1] < _HANDLE_CHECK_SECONDS:
            return cached[0]
        fresh = self.spool.queue(name)
        if cached is not None and cached[0].id == fresh.id:
            fresh = cached[0]
        with self._handles_lock:
            self._handles[name] = (fresh, now)
        return fresh

    async def on(self, name: str, fn: Callable[[Queue], T]) -> T:
        """``fn(queue)`` on the thread pool, the queue opened there too: one hop per request."""
        return await anyio.to_thread.run_sync(lambda: fn(self.queue(name)))

    async def handle(self, name: str) -> Queue:
        """:meth:`queue` from the event loop (opening a queue reads its metadata)."""
        return await self.call(self.queue, name)

    def create_queue(self, name: str, **settings: Any) -> Queue:
        """Create (or open) queue ``name`` with ``settings``; a queue the gateway makes
        gets the operator's ``--file-mode`` (HTTP clients cannot choose modes)."""
        if self.config.file_mode is not None:
            settings = {"file_mode": self.config.file_mode, **settings}
        return self.spool.create_queue(name, **settings)

    def forget(self, name: str) -> None:
        with self._handles_lock:
            self._handles.pop(name, None)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a blocking vsqs call on the thread pool (file I/O never blocks the event loop)."""
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    # -- long polling ---------------------------------------------------------

    def published(self, name: str, count: int = 1) -> None:
        """Wake up to ``count`` of this process's long polls on queue ``name``, one
        per message published (others, and other processes, find it by polling)."""
        waiters = self._waiters.get(name)
        if waiters is None:
            return
        waiters.attempted_at = -math.inf  # the next poll of any waiter goes ahead
        while count > 0 and waiters.sleeping:
            woken = waiters.sleeping.popleft()
            if not woken.done():
                woken.set_result(None)
                count -= 1

    async def receive(
        self, name: str, max_messages: int, visibility_timeout: float | None, wait: float | None,
        disconnected: Callable[[], Awaitable[bool]] | None = None,
    ) -> list[Message]:
        """Receive with a long poll that holds no thread while it waits.

        Each attempt is one non-blocking ``receive_batch`` on the thread pool;
        between attempts the request sleeps on the event loop. A publish
        through this process wakes one sleeper per message. Otherwise a
        sleeper wakes after its pause (10 ms doubling to 0.5 s) and tries again
        only if no waiter on the queue tried in the last 0.1 s, so idle long
        polls cost a few listings a second per queue, however many there are.
        A client that went away stops its poll before the next attempt, so
        no message is hidden for nobody.
        """
        queue = await self.handle(name)
        if wait is None:
            wait = float(await self.call(lambda: queue.settings["receive_wait"]))
        if not 0 <= wait <= MAX_WAIT:
            raise InvalidArgument(f"wait must be 0..{MAX_WAIT:g} seconds, not {wait!r}")
        deadline = time.monotonic() + wait
        waiters = self._waiters.setdefault(name, _Waiters())
        loop = asyncio.get_running_loop()
        pause = _POLL_FIRST
        self.metrics.long_polls.inc()
        try:
            while True:
                waiters.attempted_at = time.monotonic()
                got = await self.call(
                    queue.receive_batch, max_messages, visibility_timeout=visibility_timeout, wait=0
                )
                if got or deadline - time.monotonic() <= 0:
                    return got
                while True:  # sleep until woken, or until it is our turn to poll
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return []
                    woken: asyncio.Future[None] = loop.create_future()
                    waiters.sleeping.append(woken)
                    try:
                        await asyncio.wait_for(asyncio.shield(woken), min(pause, left))
                    except TimeoutError:
                        pause = min(pause * 2, _POLL_MAX)
                    finally:
                        if not woken.done():
                            woken.cancel()
                            with contextlib.suppress(ValueError):
                                waiters.sleeping.remove(woken)
                    if disconnected is not None and await disconnected():
                        return []
                    if woken.done() and not woken.cancelled():
                        pause = _POLL_FIRST
                        break
                    if time.monotonic() - waiters.attempted_at >= _MIN_REPOLL:
                        break
        finally:
            self.metrics.long_polls.dec()


class _Waiters:
    """This process's long polls on one queue."""

    __slots__ = ("attempted_at", "sleeping")

    def __init__(self) -> None:
        self.sleeping: deque[asyncio.Future[None]] = deque()
        self.attempted_at = -math.inf  # monotonic time of the last receive attempt by any of them


class _Metrics:
    """Request counters and latency histograms per operation and outcome, gauges of
    saturation, and the queues' own gauges read from the spool at each scrape.

    With ``--workers N`` every worker writes its counters to a shared directory
    (prometheus_client's multiprocess mode) and a scrape of any worker sums them.
    """

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "vsqs_gateway_requests", "Requests answered, by operation and outcome.",
            ["operation", "outcome"], registry=self.registry,
        )
        self.latency = Histogram(
            "vsqs_gateway_request_seconds", "Seconds to answer a request, by operation and outcome.",
            ["operation", "outcome"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25),
        )
        self.in_progress = Gauge(
            "vsqs_gateway_requests_in_progress", "Requests being answered now (saturation).",
            registry=self.registry, multiprocess_mode="livesum",
        )
        self.long_polls = Gauge(
            "vsqs_gateway_long_polls_waiting", "Receives waiting in a long poll now.",
            registry=self.registry, multiprocess_mode="livesum",
        )

    def observe(self, operation: str, outcome: str, seconds: float) -> None:
        self.requests.labels(operation, outcome).inc()
        self.latency.labels(operation, outcome).observe(seconds)

    def exposition(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
        else:
            registry = self.registry
        queues = _QueueCollector(self._gateway.spool)
        return generate_latest(registry) + generate_latest(_Single(queues))


class _Single:
    """A registry-like wrapper so one collector can be rendered on its own."""

    def __init__(self, collector: Any) -> None:
        self._collector = collector

    def collect(self) -> Iterable[Any]:
        return self._collector.collect()


class _QueueCollector:
    """The queue gauges, with the names and labels of ``vsqs stats --prometheus``."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool

    def collect(self) -> Iterable[GaugeMetricFamily]:
        messages = GaugeMetricFamily("vsqs_messages", "Messages in the queue, by state.",
                                     labels=["queue", "path", "state"])
        dead = GaugeMetricFamily("vsqs_dead_lettered_messages",
                                 "Messages of this queue now in its dead-letter queue.", labels=["queue", "path"])
        age = GaugeMetricFamily("vsqs_oldest_message_age_seconds",
                                "Seconds since the oldest visible message was sent.", labels=["queue", "path"])
        for name in self._spool.queues():
            try:
                queue = self._spool.queue(name)
                stats = queue.stats()
            except VsqsError:
                continue  # deleted between the listing and the stats
            for state in ("ready", "in_flight", "delayed"):
                messages.add_metric([name, queue.path, state], getattr(stats, state))
            dead.add_metric([name, queue.path], stats.dead_lettered)
            age.add_metric([name, queue.path], stats.oldest_ready_age)
        return [messages, dead, age]


# -- ASGI middleware ---------------------------------------------------------

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def is_sqs_request(scope: Scope) -> bool:
    """The SQS face answers POST / carrying an X-Amz-Target header."""
    return scope["path"] == "/" and any(key == b"x-amz-target" for key, _ in scope["headers"])


def _refusal_response(scope: Scope, error: ApiError, gateway: Gateway) -> Response:
    """The answer to a refused request, in the shape of the face it was meant for."""
    if error.status == 413 and is_sqs_request(scope):
        from vsqs._gateway import sqs as _sqs

        return _sqs.request_too_large(gateway.config.max_sqs_request_bytes)
    return error_response(error)


class GatewayMiddleware:
    """Outermost layer: request size cap, API key, metrics. Pure ASGI, so a
    refused request costs no parsing and no body is read past the cap."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        key = gateway.config.api_key
        self._key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        metrics = self.gateway.metrics

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        metrics.in_progress.inc()
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await _refusal_response(scope, refusal, self.gateway)(scope, receive, sending)
            else:
                await self.app(scope, self._capped(scope, receive), sending)
        finally:
            metrics.in_progress.dec()
            operation = scope.get("vsqs.operation") or _route_name(scope)
            metrics.observe(operation, scope.get("vsqs.outcome") or _outcome(status),
                            time.perf_counter() - started)

    def _limit(self, scope: Scope) -> int:
        config = self.gateway.config
        return config.max_sqs_request_bytes if is_sqs_request(scope) else config.max_request_bytes

    def _refusal(self, scope: Scope) -> ApiError | None:
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return ApiError(400, "bad_request", "Content-Length is not a number")
            if int(length) > self._limit(scope):
                return self._too_large(scope)
        if self._key is None or scope["path"] in _OPEN_PATHS or is_sqs_request(scope):
            return None  # the SQS face checks its own signatures
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        if given is None or not hmac.compare_digest(given, self._key):
            return ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)",
                            headers={"WWW-Authenticate": 'Bearer realm="vsqs"'})
        return None

    def _too_large(self, scope: Scope) -> ApiError:
        return ApiError(413, "request_too_large", f"the request body is over {self._limit(scope)} bytes", "body")

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        limit = self._limit(scope)
        seen = 0

        async def capped() -> MutableMapping[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # an HTTPException: the app's handler answers it (413)
                    raise StarletteHTTPException(413, f"the request body is over {limit} bytes")
            return message

        return capped


def _route_name(scope: Scope) -> str:
    route = scope.get("route")
    return getattr(route, "name", None) or "unrouted"


def _outcome(status: int) -> str:
    return "ok" if status < 400 else str(status)


# -- the app -------------------------------------------------------------------


def create_app(config: GatewayConfig) -> GatewayMiddleware:
    """The ASGI app of one gateway process (native API, SQS face, health, metrics);
    ``.app`` is the FastAPI app inside, ``.gateway`` the shared state."""
    from vsqs._gateway import rest as _rest
    from vsqs._gateway import sqs as _sqs

    gateway = Gateway(config)
    app = FastAPI(
        title="vsqs gateway",
        version=__version__,
        summary="A vsqs spool over HTTP: the native API under /queues; the Amazon SQS JSON protocol on POST /.",
    )
    app.state.gateway = gateway

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(VsqsError)
    async def _vsqs_error(request: Request, exc: VsqsError) -> Response:
        error = api_error_of(exc)
        if isinstance(exc, QueueNotFound) and "queue" in request.path_params:
            gateway.forget(request.path_params["queue"])
            error.message = f"no queue {request.path_params['queue']!r}"
        error.message = without_paths(error.message, config.spool)
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code, "http_error")
        error = ApiError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
        return _refusal_response(request.scope, error, gateway)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = list(first.get("loc", ()))
        if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
            loc = loc[1:]
        if "[key]" in loc:  # a bad mapping key: name the mapping
            loc = loc[: loc.index("[key]") - 1]
        where = [str(part) for part in loc if part not in ("text", "binary")]  # without union tags
        parameter = ".".join(where) or None
        if first.get("type") == "json_invalid":
            return error_response(ApiError(400, "malformed_json", f"the body is not valid JSON: {first.get('msg')}"))
        text = f"{parameter or 'request'}: {first.get('msg', 'invalid')}"
        return error_response(ApiError(422, "invalid_parameter", text, parameter))

    @app.get("/healthz", name="healthz", tags=["operations"])
    async def healthz() -> JSONResponse:
        """Liveness and readiness: the version, and whether the spool answers."""
        try:
            reachable = await gateway.call(os.path.isdir, config.spool)
        except OSError:
            reachable = False
        return JSONResponse({"status": "ok" if reachable else "unavailable", "version": __version__,
                             "spool_reachable": reachable}, status_code=200 if reachable else 503)

    @app.get("/metrics", name="metrics", tags=["operations"], response_class=Response)
    async def metrics() -> Response:
        """Prometheus exposition: request counters and latencies, saturation, queue gauges."""
        body = await gateway.call(gateway.metrics.exposition)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    app.include_router(_rest.router())
    app.include_router(_sqs.router())
    return GatewayMiddleware(app, gateway)


def app_from_env() -> GatewayMiddleware:
    """The ASGI app for a uvicorn worker; its config comes in the environment."""
    return create_app(GatewayConfig.from_json(os.environ[CONFIG_ENV]))


def gateway_of(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


def serve(config: GatewayConfig, *, host: str, port: int, workers: int, log_level: str,
          limit_concurrency: int | None = None) -> None:
    """Run the gateway under uvicorn until interrupted; past ``limit_concurrency``
    open connections and requests per worker, uvicorn answers 503."""
    import tempfile

    import uvicorn

    if not config.aws_credentials and not config.api_key:
        log.warning(
            "NO AWS CREDENTIALS CONFIGURED: the SQS face (POST /) accepts ANY signature. "
            "Set VSQS_AWS_ACCESS_KEY_ID and VSQS_AWS_SECRET_ACCESS_KEY, or --aws-credentials-file."
        )
    elif not config.aws_credentials:
        log.warning("no AWS key pairs configured: the SQS face takes requests signed with the API key "
                    "as the secret access key (any access key id)")
    if config.api_key is None:
        log.warning("no API key configured: the native API (/queues) is open to anyone who can connect")
    if host not in ("127.0.0.1", "::1", "localhost"):
        log.warning("listening on %s beyond loopback; put TLS in front (a reverse proxy)", host)
    if workers == 1:
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level,
                    limit_concurrency=limit_concurrency)
        return
    os.environ[CONFIG_ENV] = config.to_json()
    with tempfile.TemporaryDirectory(prefix="vsqs-gateway-metrics-") as metrics_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        uvicorn.run("vsqs._gateway.app:app_from_env", factory=True, host=host, port=port,
                    workers=workers, log_level=log_level, limit_concurrency=limit_concurrency)
