"""Who may talk to the gateway: two pure-ASGI middlewares.

:class:`BrowserGuard` refuses what a web page could make a browser send,
keys or no keys: a ``Host`` the server was not started for (what DNS
rebinding produces), a request another origin sent (``Origin``,
``Sec-Fetch-Site``), and a body in a content type the route does not take.
:class:`ApiKeyAuth` refuses (401) a request to the native face without the
configured key, compared in constant time. The health check and the schema
pages stay open to the key check; the SQS face checks its own signatures
(:mod:`vsqs._gateway.sqs.endpoint`).
"""

from __future__ import annotations

import hmac
import re
import socket
from urllib.parse import urlsplit

from fastapi.responses import Response

from vsqs._gateway.asgi import ASGIApp, Receive, Scope, Send
from vsqs._gateway.config import (
    GatewayConfig,
    check_host_name,
    host_name,
    is_ip_literal,
)
from vsqs._gateway.errors import ApiError, error_response
from vsqs._gateway.guesses import KeyGuesses, client_address
from vsqs._gateway.sqs.protocol import SqsError
from vsqs._gateway.sqs.wire import content_type as sqs_content_type
from vsqs._gateway.sqs.wire import is_sqs_request, refusal

CONSOLE_PREFIX = "/ui"  # the web console checks its own sessions (the same key, given on its sign-in page)
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})

LOOPBACK_NAMES = frozenset({"localhost"})  # loopback IP literals pass as IP literals
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})  # --host values that mean every address
JSON_CONTENT_TYPE = "application/json"
# Sec-Fetch-Site of what a browser sends from the gateway's own pages, or for a URL typed in
_SAME_ORIGIN_FETCHES = frozenset({b"same-origin", b"none"})
_RAW_PUBLISH = re.compile(r"/queues/[^/]+/messages")  # POST: any body, any Content-Type (documented)
_BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BrowserGuard:
    """Refuses, before anything else reads the request, what a web page could
    make a visitor's browser send to a gateway it can reach (on loopback, or
    on the visitor's network), keys or no keys:

    * a ``Host`` that is no name the server was started for (421): a page
      whose DNS name was rebound to the gateway's address sends its own name.
      Accepted: ``localhost``, any IP literal (a rebound page never has one),
      the ``--host`` name, the machine's name when listening on every
      address, and the ``--public-host`` names and the ``--public-url`` host;
    * a request another origin sent (403): ``Sec-Fetch-Site`` other than
      ``same-origin`` or ``none``, or an ``Origin`` that is neither the
      request's own (scheme aside, its ``Host``: the gateway's pages, /docs)
      nor a public name (a GET of the health check or the schema pages,
      which change nothing, is let through, so a link to /docs works);
    * on the native face, a ``Content-Type`` other than ``application/json``
      (or a body without one) on a JSON route, and on the SQS face one other
      than its protocol's (415): ``application/x-amz-json-1.0``, or
      ``application/x-www-form-urlencoded`` for the Query protocol. (The raw
      publish takes any type, as documented; the SQS face's X-Amz-Target
      alone already needs a CORS preflight, which the gateway never grants.
      A Query form needs none, as any HTML form: what keeps a page's form
      out is the ``Origin`` and ``Sec-Fetch-Site`` check above, since
      browsers send them with every cross-origin POST and ``Sec-Fetch-Site``
      with every GET. Browsers too old for ``Sec-Fetch-Site`` send a
      cross-site GET with neither, and a link opened from another
      application comes as ``none``: on a gateway with no keys the SQS
      endpoint takes a GET that changes the spool only with a SigV4
      ``Authorization`` header, which no page can add.)

    Each answer is in the shape of the face the request was meant for.
    Clients that are no browsers (SDKs, the AWS CLI, curl) send no
    ``Origin`` nor ``Sec-Fetch-*`` and pass.
    """

    def __init__(self, app: ASGIApp, config: GatewayConfig) -> None:
        self.app = app
        self._public = frozenset(config.public_hosts) | _url_host(config.public_url)
        self._names = LOOPBACK_NAMES | self._public | _listen_names(config.listen_host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await _answer(scope, *refusal)(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str, str] | None:
        """(status, native code, SQS error name, message) of a refused request, or None."""
        hosts, origin, fetch_site, content_type, has_body = _headers(scope)
        if len(hosts) > 1:
            return 400, "bad_request", "InvalidParameterValue", "one Host header, please"
        host = hosts[0] if hosts else None
        if host is not None and not self.allows_host(host):
            return (421, "misdirected_request", "MisdirectedRequest",
                    "this gateway does not serve that Host (see vsqs serve --public-host)")
        if scope["method"] in ("GET", "HEAD") and scope["path"] in OPEN_PATHS:
            return None  # the health check and the schema pages change nothing: a link to them works
        if fetch_site is not None and fetch_site not in _SAME_ORIGIN_FETCHES:
            return 403, "cross_origin_request", "AccessDenied", "the gateway takes no requests from other sites"
        if origin is not None and not self.allows_origin(origin, host):
            return 403, "cross_origin_request", "AccessDenied", "the gateway takes no requests from other origins"
        wanted = self._content_type(scope)
        if wanted is not None and not _is_type(content_type, wanted):
            # the SQS face: a Content-Type, if given, must be its own; a JSON route: any body too
            if content_type is not None or (has_body and wanted == JSON_CONTENT_TYPE):
                return 415, "unsupported_media_type", "UnsupportedMediaType", f"Content-Type must be {wanted}"
        return None

    def allows_host(self, host: str) -> bool:
        name = host_name(host)
        return name is not None and (name in self._names or is_ip_literal(name))

    def allows_origin(self, origin: str, host: str | None) -> bool:
        scheme, sep, authority = origin.strip().lower().partition("://")
        if not sep or scheme not in ("http", "https"):
            return False  # "null" (a sandboxed or file: page), or no origin a browser sends
        if host is not None and authority == host.strip().lower():
            return True  # the gateway's own pages (/docs)
        return host_name(authority) in self._public

    @staticmethod
    def _content_type(scope: Scope) -> str | None:
        """The media type the request's route takes (None: any, or no body)."""
        if is_sqs_request(scope):
            return sqs_content_type(scope)
        method, path = scope["method"], scope["path"]
        if method in _BODYLESS_METHODS or not path.startswith("/queues/"):
            return None
        if method == "POST" and _RAW_PUBLISH.fullmatch(path):
            return None
        return JSON_CONTENT_TYPE


def _listen_names(listen_host: str) -> frozenset[str]:
    """The names ``--host`` stands for: itself, and the machine's name on every address."""
    if listen_host.lower() in WILDCARD_HOSTS:
        machine = socket.gethostname().lower()
        return frozenset({machine, machine.split(".", 1)[0]})
    try:
        return frozenset({check_host_name(listen_host)})
    except ValueError:
        return frozenset()


def _url_host(url: str | None) -> frozenset[str]:
    name = urlsplit(url).hostname if url else None
    return frozenset({name.lower()}) if name else frozenset()


def _headers(scope: Scope) -> tuple[list[str], str | None, bytes | None, str | None, bool]:
    """Host values, Origin, Sec-Fetch-Site, Content-Type and whether a body is
    announced, from one pass over the headers."""
    hosts: list[str] = []
    origin = content_type = None
    fetch_site = None
    has_body = False
    for key, value in scope["headers"]:
        if key == b"host":
            hosts.append(value.decode("latin-1"))
        elif key == b"origin":
            origin = value.decode("latin-1")
        elif key == b"sec-fetch-site":
            fetch_site = value.strip().lower()
        elif key == b"content-type":
            content_type = value.decode("latin-1")
        elif key == b"transfer-encoding" or (key == b"content-length" and value.strip() not in (b"", b"0")):
            has_body = True
    return hosts, origin, fetch_site, content_type, has_body


def _is_type(content_type: str | None, wanted: str) -> bool:
    """Whether ``content_type`` is the media type ``wanted`` (parameters such as charset aside)."""
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == wanted


def _answer(scope: Scope, status: int, code: str, sqs_name: str, message: str) -> Response:
    if is_sqs_request(scope):
        return refusal(scope, SqsError(sqs_name, message, status))
    return error_response(ApiError(status, code, message))


class ApiKeyAuth:
    """``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``; with no key configured,
    every request passes. Wrong keys are counted by address and prefix
    (``guesses``): past a few, that address's keys are refused unread for a
    while (429). An address that presents the right key is trusted: only its
    own wrong keys hold it back."""

    def __init__(self, app: ASGIApp, api_key: str | None, guesses: KeyGuesses | None = None) -> None:
        self.app = app
        self._key = api_key.encode() if api_key else None
        self._guesses = guesses if guesses is not None else KeyGuesses()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._key is None or self._open(scope):
            await self.app(scope, receive, send)
            return
        given = self._given_key(scope)
        if given is not None:
            wait = self._guesses.wait(client_address(scope)) if self._guesses.counts_any() else 0  # (none: no address)
            if wait:
                refusal = ApiError(429, "too_many_wrong_keys",
                                   f"too many wrong API keys from this address: try again in {wait} s",
                                   headers={"Retry-After": str(wait)})
                await error_response(refusal)(scope, receive, send)
                return
            if hmac.compare_digest(given, self._key):
                self._guesses.right(client_address(scope))  # (its neighbours' wrong keys never hold it back)
                await self.app(scope, receive, send)
                return
            self._guesses.wrong(client_address(scope))
        refusal = ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer KEY)",
                           headers={"WWW-Authenticate": 'Bearer realm="vsqs"'})
        await error_response(refusal)(scope, receive, send)

    @staticmethod
    def _open(scope: Scope) -> bool:
        """The health check, the schema pages, the SQS face (signed its own way) and
        the console (``/ui``: its own sign-in and session, vsqs._gateway.console)."""
        path = scope["path"]
        return path in OPEN_PATHS or path == CONSOLE_PREFIX or path.startswith(CONSOLE_PREFIX + "/") \
            or is_sqs_request(scope)

    @staticmethod
    def _given_key(scope: Scope) -> bytes | None:
        headers = dict(scope["headers"])
        given = headers.get(b"x-api-key")
        auth = headers.get(b"authorization", b"")
        if given is None and auth[:7].lower() == b"bearer ":
            given = auth[7:].strip()
        return given
