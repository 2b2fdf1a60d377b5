"""What each native route may take in its request body, judged before it is
read in full or parsed: :class:`BoundedRoute`, the route class of the native
router.

The face's cap (:mod:`vsqs._gateway.size_cap`) is that of its largest
request, a batch of full-size messages; most routes take a few hundred
bytes of settings, receipts or options. So each route has its own cap, in
bytes (the declared Content-Length, then the bytes read) and in JSON values
(counted on the text, before it is parsed: see :mod:`vsqs._gateway.json_body`),
and its JSON is parsed on the thread pool when large.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.errors import ApiError
from vsqs._gateway.json_body import BodyRefused, parse_json_async
from vsqs._gateway.limits import MAX_BATCH_JSON_VALUES, MAX_SMALL_BODY_BYTES, MAX_SMALL_JSON_VALUES
from vsqs._gateway.size_cap import capped_receive, declared_length
from vsqs._gateway.state import gateway_of

_CODES = {400: "malformed_json", 413: "request_too_large", 422: "invalid_parameter"}


def body_limits(route: str, config: GatewayConfig) -> tuple[int, int, str]:
    """(bytes, JSON values, error code past the bytes) the route named ``route`` takes."""
    if route == "publish":  # a JSON batch of up to MAX_JSON_BATCH messages
        return config.max_request_bytes, MAX_BATCH_JSON_VALUES, "request_too_large"
    if route == "publish_raw":  # one message, as is
        return config.max_body_bytes, 0, "message_too_large"
    return MAX_SMALL_BODY_BYTES, MAX_SMALL_JSON_VALUES, "request_too_large"


class _Refused(StarletteHTTPException):
    """An :class:`ApiError` raised where FastAPI reads the body (it passes on only
    HTTP exceptions from there); :class:`BoundedRoute` raises the error itself."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.status, error.message)
        self.error = error


def api_error_of_refusal(refused: BodyRefused) -> ApiError:
    """The native face's answer to a refused JSON body."""
    message = refused.message if refused.status != 422 else f"{refused.parameter or 'body'}: {refused.message}"
    return ApiError(refused.status, _CODES[refused.status], message,
                    refused.parameter if refused.status == 422 else None)


class _BoundedRequest(Request):
    """A request whose JSON is parsed with :func:`parse_json_async` (bounded, off the
    event loop when large) instead of starlette's ``json.loads`` on the loop."""

    max_values = MAX_SMALL_JSON_VALUES

    async def json(self) -> Any:
        if not hasattr(self, "_bounded_json"):
            try:
                self._bounded_json = await parse_json_async(await self.body(), self.max_values)
            except BodyRefused as refused:
                raise _Refused(api_error_of_refusal(refused)) from None
        return self._bounded_json


async def call_bounded(handler: Callable[[Request], Awaitable[Response]], request: Request, route: str) -> Response:
    """``handler(request)`` with the body caps of the route named ``route``
    (:func:`body_limits`): a declared Content-Length over them is refused
    before anything is read, a body that grows past them while read too, and
    its JSON is parsed with bounded cost. FastAPI's routes
    (:class:`BoundedRoute`) and the hot routes (:mod:`.hot`) both call it."""
    max_bytes, max_values, code = body_limits(route, gateway_of(request).config)
    too_large = ApiError(413, code, f"the request body is over {max_bytes} bytes", "body")
    try:
        length = declared_length(request.scope)
    except ValueError:
        length = None  # the face's cap has answered it already
    if length is not None and length > max_bytes:
        raise too_large
    receive = capped_receive(request.receive, max_bytes, lambda: _Refused(too_large))
    bounded_request = _BoundedRequest(request.scope, receive)
    bounded_request.max_values = max_values
    try:
        return await handler(bounded_request)
    except _Refused as refused:
        raise refused.error from None


class BoundedRoute(APIRoute):
    """A native route that refuses a body over its own caps (:func:`body_limits`)
    before reading it in full, and parses its JSON with bounded cost."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        name = self.name

        async def bounded(request: Request) -> Response:
            return await call_bounded(handler, request, name)

        return bounded
