"""The native face's fast path (:mod:`vsqs._gateway.rest.fast`) answers as
FastAPI does.

Each scenario runs the same requests through two apps, each on its own spool:
one as built, one with the fast path given no routes (every request through
FastAPI's full path). Every answer (status, headers, body; ids, receipts and
times aside) and every metric sample must be the same, valid requests and
invalid ones, errors of the storage and of the checks around the app. The
fast app must also have answered the valid hot requests itself.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")

from fastapi import FastAPI, Query, Request, Response

import vsqs
from vsqs._gateway.app import create_app
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.errors import ApiError
from vsqs._gateway.rest import fast

API_KEY = "k" * 32
VOLATILE = {"message-id", "message-receipt", "message-timestamp", "date", "x-request-id"}
MESSAGE_ID = re.compile(rb"\d+-\d{10,}-[0-9a-f]{8,}")  # in error messages; each spool has its own
Answer = tuple[int, dict[str, str], bytes]


def call(app: Any, method: str, path: str, query: str = "", headers: Sequence[tuple[str, str]] = (),
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


def comparable(answer: Answer) -> tuple[int, dict[str, str], bytes]:
    status, headers, body = answer
    return status, {k: v for k, v in headers.items() if k not in VOLATILE}, MESSAGE_ID.sub(b"ID", body)


def scenario(app: Any, spool: str) -> list[tuple[int, dict[str, str], bytes]]:
    """Valid and invalid requests to the fast routes (and their neighbours); their answers."""
    key = [("authorization", "Bearer " + API_KEY)]
    text = [*key, ("content-type", "text/plain")]
    answers = []

    def ask(method: str, path: str, query: str = "", headers: Sequence[tuple[str, str]] = key,
            chunks: Sequence[bytes] = (b"",)) -> Answer:
        answer = call(app, method, path, query, headers, chunks)
        answers.append(comparable(answer))
        return answer

    ask("POST", "/queues/q/messages", headers=text, chunks=[b"hello"])
    ask("POST", "/queues/q/messages", "priority=3&delay=0&group=g1&dedup_id=d1", text, [b"hel", b"lo"])
    ask("POST", "/queues/q/messages", "group=g1&dedup_id=d1", text, [b"again"])  # a duplicate
    ask("POST", "/queues/q/messages", headers=[*key, ("content-type", "not a type")], chunks=[b"x"])
    ask("POST", "/queues/q/messages", headers=key, chunks=[b"\xff\x00binary"])
    for query in ("priority=abc", "priority=99999", "delay=-1", "group=", "dedup_id=" + "d" * 1000,
                  "delay=1&delay=x", "unknown=1"):
        ask("POST", "/queues/q/messages", query, text, [b"x"])
    ask("POST", "/queues/bad!name/messages", headers=text, chunks=[b"x"])
    ask("POST", "/queues/missing/messages", headers=text, chunks=[b"x"])
    ask("POST", "/queues/q/messages", headers=[*text, ("content-length", "2000")], chunks=[b"x" * 2000])
    ask("POST", "/queues/q/messages", headers=text, chunks=[b"x" * 600, b"x" * 600])  # past the cap, streamed
    ask("POST", "/queues/q/messages", headers=[("content-type", "text/plain")], chunks=[b"no key"])
    ask("POST", "/queues/q/messages", headers=[("authorization", "Bearer wrong")], chunks=[b"bad key"])
    ask("HEAD", "/queues/q/messages")
    ask("PUT", "/queues/q/messages")
    receipts = []
    for query in ("", "wait=0&visibility_timeout=30", "visibility_timeout=0.5"):
        answer = ask("GET", "/queues/q/messages", query)
        if answer[0] == 200:
            receipts.append(answer[1]["message-receipt"])
    for query in ("wait=-1", "wait=x", "visibility_timeout=1e9", "wait="):
        ask("GET", "/queues/q/messages", query)
    ask("GET", "/queues/missing/messages")
    ask("GET", "/queues/q/messages", headers=[])
    for receipt in receipts:
        ask("DELETE", f"/queues/q/messages/{receipt}")
    if receipts:
        ask("DELETE", f"/queues/q/messages/{receipts[0]}")  # deleted already
    ask("DELETE", "/queues/q/messages/not-a-receipt")
    ask("DELETE", "/queues/missing/messages/not-a-receipt")
    ask("DELETE", "/queues/q/messages/" + "r" * 600)
    ask("DELETE", "/queues/q/messages/x", headers=[])
    ask("GET", "/queues/q/messages", "wait=0")  # what is left
    ask("GET", "/queues/q/stats")  # a route of FastAPI's
    vsqs.Spool(spool).queue("q").suspend("receive")
    ask("GET", "/queues/q/messages")
    metrics = call(app, "GET", "/metrics", headers=key)[2].decode()
    answers.append((0, {}, "\n".join(sorted(line for line in metrics.splitlines()
                                            if line.startswith("vsqs_gateway_requests_total"))).encode()))
    return answers


def make_app(tmp_path: Any, name: str) -> tuple[Any, str]:
    spool = str(tmp_path / name)
    vsqs.Spool(spool, create=True).create_queue("q")
    return create_app(GatewayConfig(spool=spool, api_key=API_KEY, max_body_bytes=1024,
                                    gc_interval=0, console_interval=0)), spool


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the routes the fast path answers from now on."""
    answered: list[str] = []
    original: Callable[..., Any] = fast.NativeFastPath._answer

    async def spying(self: Any, route: Any, *args: Any) -> None:
        answered.append(route.route.name)
        await original(self, route, *args)

    monkeypatch.setattr(fast.NativeFastPath, "_answer", spying)
    return answered


def test_the_fast_path_answers_as_fastapi_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    answered = counting(monkeypatch)
    fast_app, fast_spool = make_app(tmp_path, "fast")
    fast_answers = scenario(fast_app, fast_spool)
    assert answered.count("publish_raw") >= 4 and answered.count("receive_raw") >= 3
    assert answered.count("delete") >= 4
    monkeypatch.setattr(fast, "FAST_ROUTES", frozenset())
    answered.clear()
    slow_app, slow_spool = make_app(tmp_path, "slow")
    slow_answers = scenario(slow_app, slow_spool)
    assert answered == []
    assert len(fast_answers) == len(slow_answers)
    for number, (got, wanted) in enumerate(zip(fast_answers, slow_answers, strict=True)):
        assert got == wanted, f"request {number}"
    statuses = [status for status, _, _ in fast_answers]
    assert {201, 200, 204, 401, 404, 409, 413, 422}.issubset(statuses)  # the scenario reached each outcome


def test_invalid_parameters_go_to_fastapi(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """The fast path validates with the route's own declarations and leaves
    every request they refuse to FastAPI (which answers with its messages)."""
    answered = counting(monkeypatch)
    app, _ = make_app(tmp_path, "spool")
    key = [("authorization", "Bearer " + API_KEY)]
    for query in ("priority=abc", "priority=99999", "delay=-1", "group=", "group=" + "g" * 200):
        status, _, body = call(app, "POST", "/queues/q/messages", query, key, [b"x"])
        assert status == 422 and b"invalid_parameter" in body
    status, _, _ = call(app, "GET", "/queues/bad!name/messages", "", key)
    assert status == 422
    assert answered == []


def test_a_route_the_fast_path_cannot_answer_is_refused_at_start(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Any) -> None:
    """A fast route that took a body model or a dependency would be answered
    without it: building the app fails instead."""
    monkeypatch.setattr(fast, "FAST_ROUTES", frozenset({"publish"}))  # takes a JSON body
    with pytest.raises(TypeError, match="publish"):
        make_app(tmp_path, "spool")


def sent_and_raised(app: Any, method: str, path: str) -> tuple[list[tuple[str, Any, bytes]], str | None]:
    """What a request through the whole app sent, and the class of what it raised (if anything)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 40000),
             "root_path": "", "headers": [(b"host", b"localhost"), (b"authorization", b"Bearer " + API_KEY.encode())]}
    raised = None
    try:
        asyncio.run(app(scope, receive, send))
    except Exception as exc:  # noqa: BLE001 - what is raised is compared
        raised = type(exc).__name__
    return [(m["type"], m.get("status"), m.get("body", b"")) for m in sent], raised


def fastapi_app_of(app: Any) -> Any:
    """The FastAPI app inside the gateway's middleware."""
    while not isinstance(app, fast.NativeFastPath):
        app = app.app
    return app.app


HOT_REQUESTS = [("POST", "/queues/q/messages"), ("GET", "/queues/q/messages"), ("DELETE", "/queues/q/messages/r")]


@pytest.mark.parametrize("error", [RuntimeError("the handler failed"), ApiError(418, "teapot", "a handled one")])
def test_an_error_of_an_error_handler_is_answered_as_fastapi_does(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                                   error: Exception) -> None:
    """The app's handler of an error fails itself: FastAPI's outer exception
    layer answers that error if it has a handler, else 500 (and raises it,
    for the server to log); the fast path must not leave the client to the
    server's own answer (without the gateway's headers)."""
    from vsqs._gateway.state import Gateway

    async def missing(*args: Any, **kwargs: Any) -> Any:
        raise vsqs.QueueNotFound("q")

    def failing(self: Any, name: str) -> None:
        raise error

    answered = counting(monkeypatch)
    answers = {}
    for name in ("fast", "slow"):
        if name == "slow":
            monkeypatch.setattr(fast, "FAST_ROUTES", frozenset())
        app, _ = make_app(tmp_path, name)
        with monkeypatch.context() as patched:
            patched.setattr(Gateway, "on", missing)
            patched.setattr(Gateway, "receive", missing)
            patched.setattr(Gateway, "forget", failing)
            answers[name] = [sent_and_raised(app, method, path) for method, path in HOT_REQUESTS]
    assert answered == ["publish_raw", "receive_raw", "delete"]
    assert answers["fast"] == answers["slow"]
    assert answers["slow"][0][0][0][1] == (500 if isinstance(error, RuntimeError) else 418)


def test_a_handler_of_every_exception_answers_as_in_fastapi(monkeypatch: pytest.MonkeyPatch,
                                                            tmp_path: Any) -> None:
    """A handler of ``Exception`` (or of 500) is starlette's server-error
    handler: it answers, and the error is still raised for the server to log."""
    from fastapi.responses import PlainTextResponse

    from vsqs._gateway.state import Gateway

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    async def apologise(request: Any, exc: Exception) -> Any:
        return PlainTextResponse("sorry", status_code=503)

    answered = counting(monkeypatch)
    answers = {}
    for name in ("fast", "slow"):
        if name == "slow":
            monkeypatch.setattr(fast, "FAST_ROUTES", frozenset())
        app, _ = make_app(tmp_path, name)
        fastapi_app_of(app).add_exception_handler(Exception, apologise)
        with monkeypatch.context() as patched:
            patched.setattr(Gateway, "on", broken)
            patched.setattr(Gateway, "receive", broken)
            answers[name] = [sent_and_raised(app, method, path) for method, path in HOT_REQUESTS]
    assert answered == ["publish_raw", "receive_raw", "delete"]
    assert answers["fast"] == answers["slow"]
    assert answers["slow"][0] == ([("http.response.start", 503, b""), ("http.response.body", None, b"sorry")],
                                  "KeyError")


def test_parameters_are_read_by_their_declared_names() -> None:
    """A parameter declared with an alias (the name clients send) is read by
    it, as FastAPI reads it: not ignored (its default used) or let through
    unchecked."""
    app = FastAPI()
    received: list[dict[str, Any]] = []

    @app.get("/queues/{queue}/messages", name="receive_raw")
    async def receive_raw(request: Request, queue: str, wait: Annotated[float | None, Query(alias="Wait", ge=0)] = None,
                          visibility_timeout: Annotated[float | None, Query(ge=0)] = None) -> Response:
        received.append({"queue": queue, "wait": wait, "visibility_timeout": visibility_timeout})
        return Response()

    route = next(route for route in app.router.routes if getattr(route, "name", None) == "receive_raw")
    parameters = fast._FastRoute(route)
    for query in ("Wait=5&visibility_timeout=1", "wait=5", "Wait=-5", "Wait=x"):
        received.clear()
        status, _, _ = call(app, "GET", "/queues/q/messages", query)
        assert parameters.arguments({"queue": "q"}, query.encode()) == (received[0] if status == 200 else None)


def test_a_plain_function_route_is_refused_at_start() -> None:
    """FastAPI calls a plain (not async) route function on its thread pool; the
    fast path awaits the function's answer, so building it for one fails."""
    app = FastAPI()

    @app.get("/queues/{queue}/messages", name="receive_raw")
    def receive_raw(request: Request, queue: str) -> Response:
        return Response()

    with pytest.raises(TypeError, match="receive_raw"):
        fast.NativeFastPath(app)
