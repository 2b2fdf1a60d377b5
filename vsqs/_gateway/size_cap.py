"""The request size cap: a pure-ASGI middleware that refuses a request whose
Content-Length is over the cap of the face it is meant for, before any
parsing, and stops reading a body that grows past it; the refusal's answer,
in that face's shape; and the two helpers with which routes and actions
apply tighter caps of their own (:mod:`vsqs._gateway.rest.bodies`, the SQS
endpoint)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.errors import ApiError, error_response
from vsqs._gateway.sqs.wire import is_sqs_request, request_timeout, request_too_large


def refusal_response(scope: Scope, error: ApiError, config: GatewayConfig) -> Response:
    """The answer to a refused request, in the shape of the face it was meant for."""
    if is_sqs_request(scope) and error.status == 413:
        return request_too_large(scope, config.max_sqs_request_bytes)
    if is_sqs_request(scope) and error.status == 408:
        return request_timeout(scope, error.message)
    return error_response(error)


def http_refusal(scope: Scope, exc: StarletteHTTPException, config: GatewayConfig) -> Response:
    """The answer to an HTTP exception raised while a request was read (the size
    cap past the cap, the body deadline), in the shape of the face it was meant for."""
    code = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout",
            413: "request_too_large"}.get(exc.status_code, "http_error")
    error = ApiError(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}))
    return refusal_response(scope, error, config)


class RequestSizeCap:
    """Refuses a malformed Content-Length (400) or one over the cap (413); past
    the cap while the app reads the body, raises the 413 HTTPException the
    app's handler answers. The SQS face's cap is one message's worth, the
    native face's ten."""

    def __init__(self, app: ASGIApp, config: GatewayConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await refusal_response(scope, refusal, self.config)(scope, receive, send)
        else:
            await self.app(scope, self._capped(scope, receive), send)

    def _limit(self, scope: Scope) -> int:
        config = self.config
        return config.max_sqs_request_bytes if is_sqs_request(scope) else config.max_request_bytes

    def _refusal(self, scope: Scope) -> ApiError | None:
        try:
            length = declared_length(scope)
        except ValueError:
            return ApiError(400, "bad_request", "Content-Length is not a number")
        limit = self._limit(scope)
        if length is not None and length > limit:
            return ApiError(413, "request_too_large", f"the request body is over {limit} bytes", "body")
        return None

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        limit = self._limit(scope)
        # an HTTPException: the app's handler answers it (413)
        return capped_receive(receive, limit, lambda: StarletteHTTPException(
            413, f"the request body is over {limit} bytes"))


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (None: not given); ValueError if it is no number.
    A length of more digits than any cap is read as "too large", never converted."""
    length = dict(scope["headers"]).get(b"content-length")
    if length is None:
        return None
    if not length.isdigit():
        raise ValueError("Content-Length is not a number")
    return int(length) if len(length) <= 18 else 10**18


def capped_receive(receive: Receive, limit: int, refusal: Callable[[], Exception]) -> Receive:
    """``receive``, raising ``refusal()`` once the body read so far is over ``limit`` bytes."""
    seen = 0

    async def capped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise refusal()
        return message

    return capped
