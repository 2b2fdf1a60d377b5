"""The gateway's ASGI app, assembled: the FastAPI app with both faces, the
health check and the metrics route, the web console under ``/ui``
(:mod:`vsqs._gateway.console`), the one place errors become HTTP answers,
and the middleware around it; and :func:`serve`, which runs it
under uvicorn.

Two faces share one port: the native JSON/raw API under ``/queues``
(:mod:`vsqs._gateway.rest`) and the Amazon SQS JSON 1.0 protocol on
``POST /`` (:mod:`vsqs._gateway.sqs`). Around the app, outermost first:
:class:`~vsqs._gateway.timeouts.BodyDeadline`,
:class:`~vsqs._gateway.metrics.RequestMetrics`,
:class:`~vsqs._gateway.auth.BrowserGuard`,
:class:`~vsqs._gateway.size_cap.RequestSizeCap`,
:class:`~vsqs._gateway.auth.ApiKeyAuth` and
:class:`~vsqs._gateway.sqs.endpoint.SqsDispatch` (``POST /`` to the SQS face
past FastAPI's router: every check above applies to both faces) and
:class:`~vsqs._gateway.rest.hot.HotDispatch` (the native hot routes before
FastAPI's stack); under them
uvicorn's protocol runs inside :class:`~vsqs._gateway.timeouts.HeadDeadline`
(a deadline and a size bound for request heads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vsqs import QueueNotFound, VsqsError, __version__
from vsqs._gateway import console, housekeeping
from vsqs._gateway.asgi import ASGIApp
from vsqs._gateway.auth import ApiKeyAuth, BrowserGuard
from vsqs._gateway.config import CONFIG_FILE_ENV, SECRET_ENVS, GatewayConfig
from vsqs._gateway.errors import ApiError, api_error_of, error_response, without_paths
from vsqs._gateway.limits import KEEP_ALIVE_TIMEOUT, MAX_REQUEST_HEAD_BYTES
from vsqs._gateway.metrics import RequestMetrics
from vsqs._gateway.rest.hot import HotDispatch, hot_routes
from vsqs._gateway.rest.routes import router as rest_router
from vsqs._gateway.size_cap import RequestSizeCap, http_refusal
from vsqs._gateway.sqs.endpoint import SqsDispatch, SqsFace
from vsqs._gateway.sqs.endpoint import route as sqs_route
from vsqs._gateway.state import Gateway
from vsqs._gateway.timeouts import BodyDeadline, protocol_factory

log = logging.getLogger("vsqs.gateway")


def create_app(config: GatewayConfig) -> ASGIApp:
    """The ASGI app of one gateway process (native API, SQS face, health, metrics)."""
    gateway = Gateway(config)
    ui = console.Console(gateway)
    app = FastAPI(
        title="vsqs gateway",
        version=__version__,
        summary="A vsqs spool over HTTP: the native API under /queues; the Amazon SQS JSON protocol on POST /.",
        lifespan=_together(housekeeping.lifespan(gateway.spools(), gateway.metrics, config.gc_interval),
                           console.sampling(ui)),
    )
    app.state.gateway = gateway
    app.state.console = ui
    _add_error_handlers(app, gateway)
    _add_operations_routes(app, gateway)
    # the native routes (their paths already under /queues) straight into the app's router: the
    # same routes and schema as include_router, without its per-request layer of matching; the hot
    # ones first as plain starlette routes, from their FastAPI declarations (rest/hot.py)
    hot = hot_routes(rest_router.routes)
    app.router.routes[:0] = hot
    app.router.routes.extend(rest_router.routes)
    app.include_router(console.router(ui))
    sqs_face = SqsFace(gateway)
    app.router.routes.append(sqs_route(sqs_face))
    # POST /: straight to the SQS face; the hot native routes: before FastAPI's stack (rest/hot.py)
    routed = SqsDispatch(HotDispatch(app, hot), sqs_face)
    capped = RequestSizeCap(ApiKeyAuth(routed, config.api_key, gateway.key_guesses), config)
    guarded = BrowserGuard(capped, config)
    measured = RequestMetrics(console.SecurityHeaders(guarded), gateway.metrics)  # (the guard's refusals too)
    return BodyDeadline(measured, config.body_timeout)  # outermost: it tells the connection of every answer


def _together(*lifespans: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """One lifespan that enters each of ``lifespans`` in turn (and leaves them in reverse)."""

    @contextlib.asynccontextmanager
    async def _lifespan(app: Any) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for lifespan in lifespans:
                await stack.enter_async_context(lifespan(app))
            yield

    return _lifespan


def _add_error_handlers(app: FastAPI, gateway: Gateway) -> None:
    """The native face's answers to errors (the SQS face answers its own)."""
    config = gateway.config

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
        return http_refusal(request.scope, exc, config)

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


def _add_operations_routes(app: FastAPI, gateway: Gateway) -> None:
    """``/healthz`` and ``/metrics``."""
    config = gateway.config

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


def app_from_env() -> ASGIApp:
    """The ASGI app for a uvicorn worker: its config comes in a file only the
    owner reads, named in the environment (the secrets are not in it)."""
    return create_app(GatewayConfig.from_file(os.environ[CONFIG_FILE_ENV]))


def uvicorn_options(config: GatewayConfig, limit_concurrency: int | None = None) -> dict[str, Any]:
    """How uvicorn runs the gateway (beyond host, port, workers and logging): the
    protocol with a deadline for request heads, bounded heads, the keep-alive."""
    return {"http": protocol_factory(config.header_timeout), "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
            "timeout_keep_alive": KEEP_ALIVE_TIMEOUT, "limit_concurrency": limit_concurrency}


def raise_descriptor_limit() -> None:
    """Raise this process's limit of open descriptors (inherited by the workers) to
    the most it may have: each queue a worker serves holds its directory and its
    shards' open, on top of the connections (a soft limit of 1024 is common)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def serve(config: GatewayConfig, *, host: str, port: int, workers: int, log_level: str,
          limit_concurrency: int | None = None, access_log: bool = False) -> None:
    """Run the gateway under uvicorn until interrupted; past ``limit_concurrency``
    open connections and requests per worker, uvicorn answers 503. The access
    log (a line per request) only when asked for: it costs more CPU than many
    requests' own work."""
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
    options = {**uvicorn_options(config, limit_concurrency), "access_log": access_log}
    raise_descriptor_limit()
    # the console's sessions are signed with a secret all workers share, drawn anew at each start
    config = replace(config, console_secret=config.console_secret or secrets.token_hex(32))
    if workers == 1:
        uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, **options)
        return
    # The workers are new processes that inherit the environment, which /proc
    # shows: the config (keys included) goes in a file of a private directory
    # (0700, the file 0600), removed at exit, and the secrets read from the
    # environment at start are taken out of it.
    for name in SECRET_ENVS:
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="vsqs-gateway-") as private:
        os.environ[CONFIG_FILE_ENV] = config.write_private(private)
        metrics_dir = os.path.join(private, "metrics")
        os.mkdir(metrics_dir, 0o700)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        uvicorn.run("vsqs._gateway.app:app_from_env", factory=True, host=host, port=port,
                    workers=workers, log_level=log_level, **options)
