"""The native face's hot routes (:mod:`vsqs._gateway.rest.hot`): what
clients get from them, valid requests and invalid ones, without the API key
and past the caps, answered by the hot routes and, with none, by the FastAPI
routes they are declared as (the same answers: one declaration each)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

import vsqs
from vsqs._gateway.app import create_app
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.rest import hot
from vsqs._gateway.rest.models import QueueName

API_KEY = "k" * 32
KEY = [("authorization", "Bearer " + API_KEY)]
TEXT = [*KEY, ("content-type", "text/plain")]
QUEUE_PATTERN = "'^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$'"
Answer = tuple[int, dict[str, str], bytes]


def call(app: Any, method: str, path: str, query: str = "", headers: Sequence[tuple[str, str]] = KEY,
         chunks: Sequence[bytes] = (b"",)) -> Answer:
    """One request through the whole ASGI app, its body in ``chunks``."""
    sent: list[dict[str, Any]] = []
    pending = list(chunks)

    async def receive() -> dict[str, Any]:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        await asyncio.sleep(3600)  # no disconnect: the app must not read past the body
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    raw_headers = [(b"host", b"localhost"), *((k.encode(), v.encode()) for k, v in headers)]
    scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "headers": raw_headers, "scheme": "http",
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 40000), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


def invalid(parameter: str, message: str) -> tuple[int, str]:
    return 422, ('{"error":{"code":"invalid_parameter","message":"%s: %s","parameter":"%s"}}'
                 % (parameter, message.replace('"', '\\"'), parameter))


NOT_AN_INTEGER = "Input should be a valid integer, unable to parse string as an integer"
NOT_A_NUMBER = "Input should be a valid number, unable to parse string as a number"
NO_QUEUE = (404, '{"error":{"code":"queue_not_found","message":"no queue \'missing\'","parameter":"queue"}}')
UNAUTHORIZED = (401, '{"error":{"code":"unauthorized","message":"a valid API key is required '
                     '(Authorization: Bearer KEY)"}}')
NOT_ALLOWED = (405, '{"error":{"code":"method_not_allowed","message":"Method Not Allowed"}}')

# (method, path, query, headers, body) -> (status, body): what clients got from the hot routes
# when they were answered by FastAPI (and by the fast path that copied its answers)
ANSWERS: list[tuple[tuple[str, str, str, Sequence[tuple[str, str]], bytes], tuple[int, str]]] = [
    (("POST", "/queues/q/messages", "priority=abc", TEXT, b"x"), invalid("priority", NOT_AN_INTEGER)),
    (("POST", "/queues/q/messages", "priority=99999", TEXT, b"x"),
     invalid("priority", "Input should be less than or equal to 9")),
    (("POST", "/queues/q/messages", "delay=-1", TEXT, b"x"),
     invalid("delay", "Input should be greater than or equal to 0")),
    (("POST", "/queues/q/messages", "group=", TEXT, b"x"), invalid("group", "String should have at least 1 character")),
    (("POST", "/queues/q/messages", "dedup_id=" + "d" * 1000, TEXT, b"x"),
     invalid("dedup_id", "String should have at most 128 characters")),
    (("POST", "/queues/q/messages", "delay=1&delay=x", TEXT, b"x"), invalid("delay", NOT_A_NUMBER)),  # the last one
    (("POST", "/queues/q/messages", "delay=x&priority=abc", TEXT, b"x"), invalid("delay", NOT_A_NUMBER)),  # the first
    (("POST", "/queues/q/messages", "priority=3&group=g1", TEXT, b"x"),
     (422, '{"error":{"code":"invalid_argument","message":"priority cannot be combined with group: '
           'a group is strictly in order","parameter":"priority"}}')),
    (("POST", "/queues/bad!name/messages", "priority=x", TEXT, b"x"),  # the path's error first
     invalid("queue", f"String should match pattern {QUEUE_PATTERN}")),
    (("POST", "/queues/missing/messages", "", TEXT, b"x"), NO_QUEUE),
    (("POST", "/queues/q/messages", "", [("content-type", "text/plain")], b"x"), UNAUTHORIZED),
    (("POST", "/queues/q/messages", "", [("authorization", "Bearer wrong")], b"x"), UNAUTHORIZED),
    (("POST", "/queues/q/messages", "", [*TEXT, ("content-length", "2000")], b"x" * 2000),
     (413, '{"error":{"code":"message_too_large","message":"the request body is over 1024 bytes",'
           '"parameter":"body"}}')),
    (("POST", "/queues/q/messages", "", [*KEY, ("content-type", "not a type")], b"x"),
     (422, '{"error":{"code":"invalid_parameter","message":"Content-Type must be a media type such as text/plain",'
           '"parameter":"Content-Type"}}')),
    (("HEAD", "/queues/q/messages", "", KEY, b""), NOT_ALLOWED),  # never a receive
    (("PUT", "/queues/q/messages", "", KEY, b""), NOT_ALLOWED),
    (("GET", "/queues/q/messages", "wait=-1", KEY, b""), invalid("wait", "Input should be greater than or equal to 0")),
    (("GET", "/queues/q/messages", "wait=", KEY, b""), invalid("wait", NOT_A_NUMBER)),
    (("GET", "/queues/q/messages", "wait=21", KEY, b""), invalid("wait", "Input should be less than or equal to 20")),
    (("GET", "/queues/q/messages", "visibility_timeout=1e9", KEY, b""),
     invalid("visibility_timeout", "Input should be less than or equal to 43200")),
    (("GET", "/queues/missing/messages", "", KEY, b""), NO_QUEUE),
    (("GET", "/queues/q/messages", "", [], b""), UNAUTHORIZED),
    (("DELETE", "/queues/q/messages/not-a-receipt", "", KEY, b""),
     (400, '{"error":{"code":"invalid_receipt","message":"malformed receipt: \'not-a-receipt\'",'
           '"parameter":"receipt"}}')),
    (("DELETE", "/queues/missing/messages/x", "", KEY, b""), NO_QUEUE),
    (("DELETE", "/queues/q/messages/" + "r" * 600, "", KEY, b""),
     invalid("receipt", "String should have at most 512 characters")),
    (("DELETE", "/queues/bad!q/messages/x", "", KEY, b""),
     invalid("queue", f"String should match pattern {QUEUE_PATTERN}")),
]


@pytest.fixture(params=["hot", "fastapi"])
def answered_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The app's hot routes answer (the names of those that did, listed), or FastAPI's routes do (none)."""
    answered: list[str] = []
    original = hot.call_bounded

    async def counted(handler: Any, request: Any, route: str) -> Any:
        answered.append(route)
        return await original(handler, request, route)

    monkeypatch.setattr(hot, "call_bounded", counted)
    if request.param == "fastapi":
        monkeypatch.setattr(hot, "HOT_ROUTES", frozenset())
    yield answered


def make_app(tmp_path: Any) -> tuple[Any, str]:
    spool = str(tmp_path / "spool")
    vsqs.Spool(spool, create=True).create_queue("q")
    return create_app(GatewayConfig(spool=spool, api_key=API_KEY, max_body_bytes=1024,
                                    gc_interval=0, console_interval=0)), spool


def test_messages_go_through_the_hot_routes(tmp_path: Any, answered_by: list[str]) -> None:
    app, spool = make_app(tmp_path)
    status, headers, _ = call(app, "POST", "/queues/q/messages", "priority=3&delay=0&dedup_id=d1", TEXT,
                              [b"hel", b"lo"])
    assert status == 201 and headers["message-md5"] == "5d41402abc4b2a76b9719d911017c592"
    status, _, _ = call(app, "POST", "/queues/q/messages", "unknown=1", KEY, [b"\xff\x00binary"])
    assert status == 201  # an unknown query parameter is ignored, as FastAPI ignores it
    received = {}
    for query in ("visibility_timeout=30", "wait=0&visibility_timeout=30"):
        status, headers, body = call(app, "GET", "/queues/q/messages", query)
        assert status == 200
        received[body] = (headers["content-type"], headers["message-receipt"])
    assert {body: kind for body, (kind, _) in received.items()} == {
        b"hello": "text/plain; charset=utf-8", b"\xff\x00binary": "application/octet-stream"}
    assert call(app, "GET", "/queues/q/messages", "wait=0")[0] == 204  # both in flight
    receipt = received[b"hello"][1]
    assert call(app, "DELETE", f"/queues/q/messages/{receipt}")[0] == 204
    assert call(app, "DELETE", f"/queues/q/messages/{receipt}")[0] == 409
    assert vsqs.Spool(spool).queue("q").stats().total == 1
    if answered_by:
        assert answered_by == ["publish_raw"] * 2 + ["receive_raw"] * 3 + ["delete"] * 2


def test_invalid_requests_are_answered_as_before(tmp_path: Any, answered_by: list[str]) -> None:
    app, _ = make_app(tmp_path)
    got = [call(app, method, path, query, headers, [body]) for (method, path, query, headers, body), _ in ANSWERS]
    assert [(status, body.decode()) for status, _, body in got] == [answer for _, answer in ANSWERS]
    assert got[14][1]["allow"] == "POST"  # HEAD: the raw publish's 405
    metrics = call(app, "GET", "/metrics")[2].decode()
    for operation, outcome, count in [("publish_raw", "422", 10), ("publish_raw", "405", 2), ("receive_raw", "422", 4),
                                      ("delete", "422", 2), ("delete", "400", 1), ("unrouted", "401", 3)]:
        assert f'vsqs_gateway_requests_total{{operation="{operation}",outcome="{outcome}"}} {count}.0' in metrics


def test_a_body_past_the_cap_while_it_streams_is_refused(tmp_path: Any, answered_by: list[str]) -> None:
    app, spool = make_app(tmp_path)
    status, _, body = call(app, "POST", "/queues/q/messages", "", TEXT, [b"x" * 600, b"x" * 600])
    assert status == 413 and b'"message_too_large"' in body
    assert vsqs.Spool(spool).queue("q").stats().total == 0


def route_of(function: Any) -> Any:
    router = APIRouter(prefix="/queues")
    router.get("/{queue}/messages", name="receive_raw")(function)
    return router.routes[0]


class Options(BaseModel):
    wait: float | None = None


def test_a_route_a_hot_route_cannot_answer_is_refused_at_start() -> None:
    """A hot route gives its function the request, path parameters and one
    model of query parameters, awaited: a function that takes more (a body, a
    header), or that FastAPI would run on a thread, is refused when the app
    is built, not answered without it."""

    async def with_a_body(request: Request, queue: QueueName, body: Options) -> Response:
        return Response()

    async def with_a_header(request: Request, queue: QueueName, x_token: Annotated[str, Query()]) -> Response:
        return Response()

    def on_a_thread(request: Request, queue: QueueName) -> Response:
        return Response()

    async def without_the_request(queue: QueueName, options: Annotated[Options, Query()]) -> Response:
        return Response()

    for function in (with_a_body, with_a_header, on_a_thread, without_the_request):
        with pytest.raises(TypeError, match=function.__name__):
            hot.HotRoute(route_of(function))

    async def fine(request: Request, queue: QueueName, options: Annotated[Options, Query()]) -> Response:
        return Response()

    assert hot.HotRoute(route_of(fine)).methods == {"GET"}


def test_an_error_no_handler_answers_is_a_500_and_raised(tmp_path: Any, answered_by: list[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the app has no handler for: the server-error answer (FastAPI's
    own, a plain 500), then the error raised for the server to log, whichever
    routes answer."""
    from vsqs._gateway.rest import routes

    def broken(request: Any) -> Any:
        raise RuntimeError("broken")

    monkeypatch.setattr(routes, "gateway_of", broken)
    app, _ = make_app(tmp_path)
    sent: list[dict[str, Any]] = []
    given = [{"type": "http.request", "body": b"x", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return given.pop() if given else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"localhost"), *((k.encode(), v.encode()) for k, v in TEXT)]
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": "/queues/q/messages",
             "raw_path": b"/queues/q/messages", "query_string": b"", "headers": headers, "scheme": "http",
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 40000), "root_path": ""}
    with pytest.raises(RuntimeError, match="broken"):
        asyncio.run(app(scope, receive, send))
    assert [(m["type"], m.get("status"), m.get("body")) for m in sent] == [
        ("http.response.start", 500, None), ("http.response.body", None, b"Internal Server Error")]
    assert answered_by == (["publish_raw"] if hot.HOT_ROUTES else [])
