"""The request size cap: a pure-ASGI middleware that refuses a request whose
Content-Length is over the cap of the face it is meant for, before any
parsing, and stops reading a body that grows past it; and the refusal's
answer, in that face's shape."""

from __future__ import annotations

from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from vsqs._gateway.asgi import ASGIApp, Message, Receive, Scope, Send
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.errors import ApiError, error_response
from vsqs._gateway.sqs.protocol import is_sqs_request, request_timeout, request_too_large


def refusal_response(scope: Scope, error: ApiError, config: GatewayConfig) -> Response:
    """The answer to a refused request, in the shape of the face it was meant for."""
    if is_sqs_request(scope) and error.status == 413:
        return request_too_large(config.max_sqs_request_bytes)
    if is_sqs_request(scope) and error.status == 408:
        return request_timeout(error.message)
    return error_response(error)


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
        length = dict(scope["headers"]).get(b"content-length")
        if length is None:
            return None
        if not length.isdigit():
            return ApiError(400, "bad_request", "Content-Length is not a number")
        limit = self._limit(scope)
        if int(length) > limit:
            return ApiError(413, "request_too_large", f"the request body is over {limit} bytes", "body")
        return None

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        limit = self._limit(scope)
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:  # an HTTPException: the app's handler answers it (413)
                    raise StarletteHTTPException(413, f"the request body is over {limit} bytes")
            return message

        return capped
