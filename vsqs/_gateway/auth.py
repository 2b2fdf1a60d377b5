"""The native API's key: a pure-ASGI middleware that refuses (401) a request
to the native face without the configured key, compared in constant time.
The health check and the schema pages stay open; the SQS face checks its own
signatures (:mod:`vsqs._gateway.sqs.endpoint`)."""

from __future__ import annotations

import hmac

from vsqs._gateway.asgi import ASGIApp, Receive, Scope, Send
from vsqs._gateway.errors import ApiError, error_response
from vsqs._gateway.sqs.protocol import is_sqs_request

OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class ApiKeyAuth:
    """``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; with no key configured,
    every request passes."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._key is None or self._open(scope) or self._holds_key(scope):
            await self.app(scope, receive, send)
            return
        refusal = ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)",
                           headers={"WWW-Authenticate": 'Bearer realm="vsqs"'})
        await error_response(refusal)(scope, receive, send)

    @staticmethod
    def _open(scope: Scope) -> bool:
        return scope["path"] in OPEN_PATHS or is_sqs_request(scope)

    def _holds_key(self, scope: Scope) -> bool:
        assert self._key is not None
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given is not None and hmac.compare_digest(given, self._key)
