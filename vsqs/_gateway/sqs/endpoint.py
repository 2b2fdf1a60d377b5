"""The SQS face: ``POST /`` (and, for the Query protocol, ``GET /`` and the
queue URLs' paths): authenticate the request, dispatch on the action it
names, answer its result or its error in the request's protocol
(:mod:`.wire`: JSON 1.0 or Query, which reads the parameters and renders
the answers)."""

from __future__ import annotations

import functools
import logging
import random
import time
import uuid
from collections.abc import Iterator, Mapping

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from vsqs import QueueNotFound, VsqsError
from vsqs._gateway import sigv4 as _sigv4
from vsqs._gateway.asgi import ASGIApp, Receive, Scope, Send
from vsqs._gateway.guesses import client_address
from vsqs._gateway.limits import (
    INLINE_SIGNATURE_BYTES,
    INLINE_SIGNATURE_HEAD_BYTES,
    MAX_SMALL_BODY_BYTES,
)
from vsqs._gateway.size_cap import declared_length, http_refusal
from vsqs._gateway.sqs.actions import (
    ACTIONS,
    MESSAGE_ACTIONS,
    READ_ONLY_ACTIONS,
    UNSUPPORTED_ACTIONS,
)
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.protocol import SqsError, action_of, no_such_queue, sqs_error_of, too_large
from vsqs._gateway.sqs.query import named_action, split_form
from vsqs._gateway.sqs.receipts import ReceiptAliases
from vsqs._gateway.sqs.wire import JSON, Incoming, is_sqs_request, wire_of
from vsqs._gateway.state import Gateway

log = logging.getLogger("vsqs.gateway.sqs")

# what a wrong secret (or an access key id of none) answers: a wrong key, counted (vsqs._gateway.guesses)
_WRONG_KEY_CODES = frozenset({"SignatureDoesNotMatch", "InvalidClientTokenId"})


class _AnyAccessKey(Mapping[str, str]):
    """Every access key id, one secret: the API key, when no AWS key pairs are configured."""

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def __getitem__(self, key: str) -> str:
        return self._secret

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _check_unkeyed_get(request: Request, action: str) -> None:
    """On a gateway with no keys, a Query ``GET`` of an action that changes something
    must carry a SigV4 ``Authorization`` header: a web page can make a visitor's
    browser send any GET (a link, an image), and a browser too old to send
    ``Sec-Fetch-Site``, or a link opened from another application
    (``Sec-Fetch-Site: none``), passes the browser guard; but no page can add an
    ``Authorization`` header without a CORS preflight, which the gateway never
    grants. (A presigned URL proves nothing here: with no keys, no signature is
    checked.) Clients POST their forms, or sign in the headers (boto 2's GETs)."""
    if request.method != "GET" or action not in ACTIONS or action in READ_ONLY_ACTIONS:
        return
    if request.headers.get("authorization", "").strip().startswith(_sigv4.ALGORITHM + " "):
        return
    raise SqsError("AccessDenied", f"this gateway has no keys: a GET of {action}, which changes the spool, must be "
                   "signed in an Authorization header (a web page could make a browser send it otherwise); "
                   "POST the form instead, or configure keys", 403)


async def _authenticate(request: Request, gateway: Gateway, body: bytes, action: str) -> None:
    """SigV4 against the AWS key pairs; with none but an API key, against the API key
    as the secret (any access key id), so that a key closes both faces. The check
    hashes the body and the canonical request: in place for a small body and a
    small head (a few tens of microseconds, less than a hop to a thread), on the
    thread pool when either is large (a head of thousands of hosts or query
    pairs), so that it never holds up the event loop (its cost is bounded: see
    :mod:`vsqs._gateway.sigv4`). A wrong secret counts against the client's
    address with the API's wrong keys, and past them a signed request is
    refused unread (``RequestThrottled``, 429), so guessing a secret through
    this face is as slow as guessing the API key; a right signature makes the
    address trusted, as the right API key does (:mod:`vsqs._gateway.guesses`)."""
    config = gateway.config
    credentials: Mapping[str, str] = config.aws_credentials
    if not credentials:
        if not config.api_key:
            _check_unkeyed_get(request, action)
            return  # none configured: every signature is accepted (the gateway warned at start-up)
        credentials = _AnyAccessKey(config.api_key)
    check = functools.partial(
        _sigv4.verify,
        method=request.method,
        raw_path=request.scope.get("raw_path", request.url.path.encode()).decode("latin-1"),
        raw_query=request.scope.get("query_string", b"").decode("latin-1"),
        headers=_sigv4.header_map(request.scope["headers"]),
        body=body,
        credentials=credentials,
        now=time.time(),
    )
    guesses, scope = gateway.key_guesses, request.scope
    wait = guesses.wait(client_address(scope)) if guesses.counts_any() and _presents_signature(scope) else 0
    if wait:  # too many wrong keys from this address: refused unread, as the native API's (docs/gateway.md)
        raise SqsError("RequestThrottled", f"too many wrong keys from this address: try again in {wait} s")
    try:
        if len(body) <= INLINE_SIGNATURE_BYTES and _head_bytes(request.scope) <= INLINE_SIGNATURE_HEAD_BYTES:
            check()
        else:
            await gateway.call(check)
    except _sigv4.SigV4Error as exc:
        if exc.code in _WRONG_KEY_CODES:
            guesses.wrong(client_address(scope))
        raise SqsError(exc.code, exc.message, exc.status) from None
    guesses.right(client_address(scope))  # (its neighbours' wrong keys never hold it back)


def _presents_signature(scope: Scope) -> bool:
    """Whether the request carries a signature (an ``Authorization`` header, or a presigned query)."""
    return any(key == b"authorization" for key, _ in scope["headers"]) \
        or _sigv4.has_presigned_signature(scope.get("query_string", b"").decode("latin-1"))


def _request_id() -> str:
    """A random UUID for ``x-amzn-RequestId`` (it only tells requests apart, in logs:
    Python's generator, without the system call of :func:`uuid.uuid4`)."""
    return str(uuid.UUID(int=random.getrandbits(128), version=4))


def _head_bytes(scope: Scope) -> int:
    """The size of what a signature check reads beside the body: the headers, the path and query."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
    for key, value in scope["headers"]:
        size += len(key) + len(value) + 4
    return size


async def _body(request: Request, limit: int) -> bytes | None:
    """The request body, or None if it is over ``limit`` bytes (declared or read):
    an action's own cap, below the face's (only sends carry messages)."""
    try:
        length = declared_length(request.scope)
    except ValueError:
        length = None  # the face's cap has answered it already
    if length is not None and length > limit:
        return None
    chunks: list[bytes] = []
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _read(request: Request, json: bool, cap: int) -> Incoming:
    """The request's action and body. JSON 1.0: the action is X-Amz-Target's,
    and an action that carries no message takes a small body. Query: the form
    (a GET's is its query string) names the action and holds the parameters,
    under the same caps. SqsError (413) over a cap."""
    if json:
        target = request.headers.get("x-amz-target", "")
        action = action_of(target)
        limit = cap if action in MESSAGE_ACTIONS else MAX_SMALL_BODY_BYTES
        body = await _body(request, limit)  # over the face's cap: the middleware answers
        if body is None:
            raise too_large(limit)
        return Incoming(action, target, body)
    body = await _body(request, cap) if request.method == "POST" else b""
    if body is None:
        raise too_large(cap)
    form = body if request.method == "POST" else request.scope.get("query_string", b"")
    named = named_action(form)  # (its fields are decoded once it is authenticated: see _fields)
    if named not in MESSAGE_ACTIONS and len(form) > MAX_SMALL_BODY_BYTES:
        raise too_large(MAX_SMALL_BODY_BYTES)
    bare_get = request.method == "GET" and not named and request.url.path != "/"
    return Incoming(named if named in ACTIONS else "", named, body, form=form, bare_get=bare_get)


async def _fields(gateway: Gateway, incoming: Incoming) -> None:
    """Decode a Query form's fields (after the request was authenticated): in place when
    small, on the thread pool when large (3 MiB of escapes take a second or more)."""
    if incoming.form is None or incoming.fields is not None:
        return
    if len(incoming.form) <= INLINE_SIGNATURE_BYTES:
        incoming.fields = split_form(incoming.form)
    else:
        incoming.fields = await gateway.call(split_form, incoming.form)


class SqsFace:
    """The SQS face as a plain ASGI app: read the request (within the action's
    cap), authenticate, read its parameters, dispatch to the action it names,
    answer its result or its error, all in the request's protocol (JSON 1.0 or
    Query: :func:`.wire.wire_of`).

    The gateway calls it straight from its middleware (:class:`SqsDispatch`),
    past FastAPI's router and its layers, which the SQS face does not use; it
    is also the router's route for ``POST /``, so the answer is the same either
    way. Every check of the middleware applies before it (metrics, browser
    guard, body deadline, size cap, API key); what the middleware raises while
    the body is read (the size cap past the cap, the body deadline) is
    answered here, in the face's shape, as the app's error handler would.
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.aliases = ReceiptAliases()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            response = await self.answer(request)
        except StarletteHTTPException as exc:  # the size cap or the body deadline, while the body came
            scope.setdefault("vsqs.operation", _operation_named(request))  # counted under its action
            response = http_refusal(scope, exc, self.gateway.config)
        except ClientDisconnect:  # gone while its body came: no answer, counted under its action
            scope.setdefault("vsqs.operation", _operation_named(request))
            raise
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        """The answer to one SQS request."""
        request_id = _request_id()
        gateway = self.gateway
        scope = request.scope
        wire = wire_of(scope)  # the request's protocol: reads its parameters, renders its answers
        try:
            incoming = await _read(request, wire is JSON, gateway.config.max_sqs_request_bytes)
        except SqsError as exc:  # over a size cap, or a form that cannot be read
            scope["vsqs.operation"] = _operation_named(request)
            scope["vsqs.outcome"] = exc.name
            return wire.error_response(exc, request_id)
        action = incoming.action
        handler = ACTIONS.get(action)
        scope["vsqs.operation"] = f"sqs.{action}" if handler else "sqs.unknown"
        try:
            await _authenticate(request, gateway, incoming.body, action)
            await _fields(gateway, incoming)
            if handler is None:
                if action in UNSUPPORTED_ACTIONS:
                    raise SqsError("UnsupportedOperation", f"vsqs does not support {action}.")
                raise wire.unknown_operation(incoming)
            call = Call.of(gateway, request, await wire.params(incoming, request.url.path), self.aliases)
            try:
                result = await handler(call)
            except VsqsError as exc:
                if isinstance(exc, QueueNotFound):
                    if call.queue_name:
                        call.gateway.forget(call.queue_name)
                    raise no_such_queue() from None  # Amazon's wording, no path
                raise sqs_error_of(exc, *(spool.root for spool in gateway.spools())) from None
        except SqsError as exc:
            scope["vsqs.outcome"] = exc.name
            if exc.status >= 500:
                log.warning("SQS %s failed: %s: %s", action or "request", exc.name, exc.message)
            return wire.error_response(exc, request_id)
        except Exception:
            log.exception("SQS %s failed", action or "request")
            scope["vsqs.outcome"] = "InternalError"
            return wire.error_response(SqsError("InternalError", "The gateway failed to answer; see its log."),
                                       request_id)
        scope["vsqs.outcome"] = call.outcome
        return wire.result_response(action, result, request_id)


def _operation_named(request: Request) -> str:
    """The metrics' operation of a request whose body was not read: the action its
    X-Amz-Target names (JSON 1.0), else ``sqs.unknown`` (a Query form's is in its body)."""
    named = action_of(request.headers.get("x-amz-target", "")) if wire_of(request.scope) is JSON else ""
    return f"sqs.{named}" if named in ACTIONS else "sqs.unknown"


def route(face: SqsFace) -> Route:
    """The router's route for the SQS face: ``POST /`` (so ``GET /`` without a
    Query form is a 405)."""
    return Route("/", face, methods=["POST"], name="sqs", include_in_schema=False)


def is_sqs_route(scope: Scope) -> bool:
    """Whether the request is for the SQS face: ``POST /`` (JSON 1.0, or a Query
    form), a JSON 1.0 request to a queue URL's path, or a Query request by
    ``GET /`` or to a queue URL's path."""
    return (scope["path"] == "/" and scope["method"] == "POST") or is_sqs_request(scope)


class SqsDispatch:
    """The innermost middleware: sends the SQS face's requests straight to it, past
    FastAPI's router (the face's route would be the last of all its routes to
    match) and its middleware and exception layers; everything else to ``app``."""

    def __init__(self, app: ASGIApp, face: SqsFace) -> None:
        self.app = app
        self.face = face

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_sqs_route(scope):
            await self.face(scope, receive, send)
        else:
            await self.app(scope, receive, send)
