"""The gateway's fast paths keep every check.

``POST /`` goes to the SQS face straight from the middleware
(:class:`~vsqs._gateway.sqs.endpoint.SqsDispatch`), past FastAPI; each test
here drives the whole ASGI app and fails if one check of the middleware were
skipped on that path: the size cap, the API key (SigV4 with it as the
secret), the browser guard, metrics, error translation. Then storage kept
off the event loop (a slow filesystem holds up no other request), the access
log (off unless ``--access-log``), and the HTTP protocols' bounds on request
heads.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import httpx
import uvicorn
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

import vsqs
from tests.gateway.server import free_port, running_gateway
from vsqs._gateway.app import create_app
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.limits import MAX_REQUEST_HEAD_BYTES
from vsqs._gateway.sqs import endpoint
from vsqs._gateway.timeouts import protocol_factory

WAIT = 30.0
SQS_JSON = "application/x-amz-json-1.0"


def sqs_headers(action: str, **more: str) -> list[tuple[bytes, bytes]]:
    headers = {"host": "localhost", "x-amz-target": f"AmazonSQS.{action}", "content-type": SQS_JSON, **more}
    return [(k.encode(), v.encode()) for k, v in headers.items()]


def call(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
         chunks: Sequence[bytes] = (b"",)) -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app, its body sent in ``chunks``; (status, headers, body)."""
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

    scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": headers, "scheme": "http", "server": ("127.0.0.1", 8080),
             "client": ("127.0.0.1", 40000), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, body


@pytest.fixture
def spool(tmp_path: Any) -> str:
    path = str(tmp_path / "spool")
    vsqs.Spool(path, create=True).create_queue("q")
    return path


def sqs_type(body: bytes) -> str:
    return str(json.loads(body)["__type"]).split("#")[1]


def test_sqs_requests_skip_fastapi(monkeypatch: pytest.MonkeyPatch, spool: str) -> None:
    """POST / reaches the SQS face without FastAPI's router; other requests go to FastAPI."""
    seen: list[str] = []
    original = endpoint.SqsDispatch.__init__

    def spying_init(self: Any, app: Any, face: Any) -> None:
        async def fastapi(scope: Any, receive: Any, send: Any) -> None:
            seen.append(scope["path"])
            await app(scope, receive, send)
        original(self, fastapi, face)

    monkeypatch.setattr(endpoint.SqsDispatch, "__init__", spying_init)
    app = create_app(GatewayConfig(spool=spool))
    status, _, body = call(app, "POST", "/", sqs_headers("ListQueues"), [b"{}"])
    assert status == 200 and json.loads(body)["QueueUrls"] == ["http://localhost/000000000000/q"]
    assert seen == []
    status, _, _ = call(app, "GET", "/", [(b"host", b"localhost")])
    assert status == 405 and seen == ["/"]  # FastAPI's router: POST only


def test_the_size_cap_applies_to_sqs_requests(spool: str) -> None:
    """Over the face's cap, declared (refused before the body is read) or streamed
    without a length (refused as it grows): 413, in SQS's shape."""
    config = GatewayConfig(spool=spool, max_body_bytes=1024)
    app = create_app(config)
    over = config.max_sqs_request_bytes + 1
    status, headers, body = call(app, "POST", "/", sqs_headers("SendMessage", **{"content-length": str(over)}),
                                 [b"x" * over])
    assert status == 413 and sqs_type(body) == "InvalidParameterValueException" and headers["x-amzn-query-error"]
    chunk = b" " * 65536
    chunks = [chunk] * (over // len(chunk) + 2)
    status, _, body = call(app, "POST", "/", sqs_headers("SendMessage", **{"transfer-encoding": "chunked"}), chunks)
    assert status == 413 and sqs_type(body) == "InvalidParameterValueException"
    status, _, metrics = call(app, "GET", "/metrics", [(b"host", b"localhost")])
    counted = 'vsqs_gateway_requests_total{operation="sqs.SendMessage",outcome="413"} 1.0'
    assert counted in metrics.decode()  # the streamed one under its action, as before the fast path
    doc = b'{"QueueUrl": "q", "MessageBody": "hi"}'
    status, _, body = call(app, "POST", "/", sqs_headers("SendMessage", **{"content-length": "12x"}), [doc])
    assert status == 400 and b"Content-Length is not a number" in body  # the middleware's check alone
    assert vsqs.Spool(spool).queue("q").stats().total == 0


def test_the_api_key_closes_the_sqs_face(spool: str) -> None:
    """With an API key and no AWS key pairs, an unsigned SQS request is refused."""
    app = create_app(GatewayConfig(spool=spool, api_key="k" * 32))
    doc = json.dumps({"QueueUrl": "q", "MessageBody": "hi"}).encode()
    status, _, body = call(app, "POST", "/", sqs_headers("SendMessage", **{"content-length": str(len(doc))}), [doc])
    assert status == 403 and sqs_type(body) == "MissingAuthenticationToken"
    status, _, body = call(app, "POST", "/", sqs_headers("SendMessage", authorization="Bearer " + "k" * 32), [doc])
    assert status == 400 and sqs_type(body) == "IncompleteSignature"  # a bearer token is no signature
    assert vsqs.Spool(spool).queue("q").stats().total == 0


@pytest.mark.parametrize(("header", "value", "status", "name"), [
    ("origin", "http://evil.example", 403, "AccessDenied"),
    ("sec-fetch-site", "cross-site", 403, "AccessDenied"),
    ("host", "evil.example", 421, "MisdirectedRequest"),
    ("content-type", "text/plain", 415, "UnsupportedMediaType"),
])
def test_the_browser_guard_applies_to_sqs_requests(spool: str, header: str, value: str, status: int,
                                                   name: str) -> None:
    app = create_app(GatewayConfig(spool=spool))
    doc = json.dumps({"QueueUrl": "q", "MessageBody": "hi"}).encode()
    headers = [h for h in sqs_headers("SendMessage") if h[0] != header.encode()] + [(header.encode(), value.encode())]
    got, _, body = call(app, "POST", "/", headers, [doc])
    assert (got, sqs_type(body)) == (status, name)
    assert vsqs.Spool(spool).queue("q").stats().total == 0


def test_sqs_requests_are_counted_and_their_errors_translated(monkeypatch: pytest.MonkeyPatch, spool: str) -> None:
    """Metrics count the fast path's requests; vsqs errors and failures come back in SQS's terms."""
    app = create_app(GatewayConfig(spool=spool))
    status, _, body = call(app, "POST", "/", sqs_headers("GetQueueUrl"), [b'{"QueueName": "nope"}'])
    assert status == 400 and sqs_type(body) == "QueueDoesNotExist"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(vsqs.Queue, "purge", broken)
    status, _, body = call(app, "POST", "/", sqs_headers("PurgeQueue"), [b'{"QueueUrl": "q"}'])
    assert status == 500 and sqs_type(body) == "InternalError" and b"broken" not in body
    status, _, metrics = call(app, "GET", "/metrics", [(b"host", b"localhost")])
    text = metrics.decode()
    assert 'vsqs_gateway_requests_total{operation="sqs.GetQueueUrl",outcome="QueueDoesNotExist"} 1.0' in text
    assert 'vsqs_gateway_requests_total{operation="sqs.PurgeQueue",outcome="InternalError"} 1.0' in text


def test_a_client_gone_while_its_body_came_is_counted_under_its_action(spool: str) -> None:
    """As before the fast path (FastAPI's route named the operation): a disconnect
    mid-body is counted under the action X-Amz-Target names, not as 'unrouted'."""
    app = create_app(GatewayConfig(spool=spool))
    parts: list[dict[str, Any]] = [{"type": "http.request", "body": b"{", "more_body": True},
                                   {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return parts.pop(0)

    async def send(message: dict[str, Any]) -> None:
        pass

    scope = {"type": "http", "http_version": "1.1", "method": "POST", "path": "/", "raw_path": b"/",
             "query_string": b"", "headers": sqs_headers("SendMessage", **{"content-length": "100"}),
             "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 40000), "root_path": ""}
    with pytest.raises(ClientDisconnect):
        asyncio.run(app(scope, receive, send))
    _, _, metrics = call(app, "GET", "/metrics", [(b"host", b"localhost")])
    assert 'vsqs_gateway_requests_total{operation="sqs.SendMessage",outcome="500"} 1.0' in metrics.decode()


# -- the access log -------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [False, True])
def test_the_access_log_is_off_unless_asked_for(tmp_path: Any, flag: bool) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    args = ["--log-level", "info", *(["--access-log"] if flag else [])]
    with running_gateway(str(spool), *args) as server:
        assert httpx.get(server.url + "/queues", timeout=WAIT).status_code == 200
        server.process.terminate()
        server.process.wait(WAIT)
        log = server.log()
    assert "Application startup complete" in log  # the log is at level info
    assert ('"GET /queues HTTP/1.1" 200' in log) is flag


# -- request heads, with either HTTP protocol -----------------------------------------------------


@contextmanager
def serving(app: Any, http: Any) -> Iterator[int]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", http=http,
                                          h11_max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(int(WAIT * 10)):
            if server.started:
                break
            time.sleep(0.1)
        assert server.started
        yield port
    finally:
        server.should_exit = True
        thread.join(WAIT)


def _until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


PROTOCOLS = {"default": protocol_factory(0.5), "h11": protocol_factory(0.5, http=H11Protocol)}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_request_heads_are_bounded_in_size_and_time(spool: str, protocol: str) -> None:
    """A head past MAX_REQUEST_HEAD_BYTES is refused (4xx, closed), a head that
    never ends is closed with a 408 after the header timeout; a whole one is answered."""
    with serving(create_app(GatewayConfig(spool=spool)), PROTOCOLS[protocol]) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            for i in range(MAX_REQUEST_HEAD_BYTES // 1000 + 2):
                try:
                    sock.sendall(b"X-Padding-%d: %s\r\n" % (i, b"p" * 1000))
                except (BrokenPipeError, ConnectionResetError):
                    break
            try:
                answer = _until_closed(sock)
            except ConnectionResetError:
                # the server refused and closed while our head was still coming: the kernel
                # answers the unread bytes with a reset, which may come before its 4xx is read.
                # A server that read the head on without bound would have read it all and
                # closed cleanly (a 408 at its deadline): a reset is a refusal.
                answer = b"HTTP/1.1 431 (reset)"
        assert answer.split(b" ")[1] in (b"400", b"431")
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
            assert _until_closed(sock).startswith(b"HTTP/1.1 408 ")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_request_answered_past_the_header_timeout_keeps_its_connection(spool: str, protocol: str) -> None:
    """The head deadline waits for heads, not answers: a long poll of 1.5 s on
    a server that gives heads 0.5 s is answered, and its connection then takes
    the next request and gives its head the deadline again."""
    with serving(create_app(GatewayConfig(spool=spool)), PROTOCOLS[protocol]) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(b"GET /queues/q/messages?wait=1.5 HTTP/1.1\r\nHost: localhost\r\n\r\n")
            started = time.monotonic()
            assert sock.recv(65536).startswith(b"HTTP/1.1 204 ")
            assert time.monotonic() - started >= 1.4
            sock.sendall(b"PUT /queues/r HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 2\r\n\r\n{}")
            assert sock.recv(65536).startswith(b"HTTP/1.1 201 ")
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            assert _until_closed(sock).startswith(b"HTTP/1.1 408 ")


def _head_of(size: int, path: bytes = b"/healthz") -> bytes:
    """A GET head of exactly ``size`` bytes (one long header)."""
    start = b"GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Padding: " % path
    return start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"


def test_a_whole_head_in_one_read_is_bounded_too(spool: str) -> None:
    """A head that comes whole in one read (never incomplete, so never counted
    while it came) is refused past MAX_REQUEST_HEAD_BYTES as well, and one of
    exactly that size is answered (the default protocol: httptools)."""
    with serving(create_app(GatewayConfig(spool=spool)), protocol_factory(WAIT)) as port:
        answers = {}
        for size in (MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEAD_BYTES + 1, 4 * MAX_REQUEST_HEAD_BYTES):
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
                sock.sendall(_head_of(size))
                answers[size] = _until_closed(sock).split(b"\r\n", 1)[0]
    assert answers == {MAX_REQUEST_HEAD_BYTES: b"HTTP/1.1 200 OK",
                       MAX_REQUEST_HEAD_BYTES + 1: b"HTTP/1.1 431 Request Header Fields Too Large",
                       4 * MAX_REQUEST_HEAD_BYTES: b"HTTP/1.1 431 Request Header Fields Too Large"}


def test_a_head_is_measured_across_reads(spool: str) -> None:
    """A head whose blank line is split between two reads is measured whole,
    and the body after it is no part of it: with a head of exactly
    MAX_REQUEST_HEAD_BYTES and a 20 KB body the message is published; one
    byte more of head is refused."""
    body = b"b" * 20_000
    with serving(create_app(GatewayConfig(spool=spool)), protocol_factory(WAIT)) as port:
        answers = {}
        for size in (MAX_REQUEST_HEAD_BYTES, MAX_REQUEST_HEAD_BYTES + 1):
            start = b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n" \
                    b"Content-Length: %d\r\nX-Padding: " % len(body)
            head = start + b"p" * (size - len(start) - 4) + b"\r\n\r\n"
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(head[:-3])
                time.sleep(0.2)  # a read of its own
                try:
                    sock.sendall(head[-3:] + body)
                    answers[size] = _until_closed(sock).split(b"\r\n", 1)[0]
                except ConnectionResetError:
                    answers[size] = b"(reset)"
    assert answers[MAX_REQUEST_HEAD_BYTES] == b"HTTP/1.1 201 Created"
    assert answers[MAX_REQUEST_HEAD_BYTES + 1] in (b"HTTP/1.1 431 Request Header Fields Too Large", b"(reset)")
    assert vsqs.Spool(spool).queue("q").stats().total == 1


def test_a_refusal_before_the_body_keeps_the_head_deadline(spool: str) -> None:
    """A request answered before its body was read (here: no API key) keeps
    its connection, and the next head on it has the deadline again."""
    config = GatewayConfig(spool=spool, api_key="k" * 32)
    with serving(create_app(config), protocol_factory(0.5)) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        for _ in range(2):
            sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\n\r\nhi")
            assert sock.recv(65536).startswith(b"HTTP/1.1 401 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _until_closed(sock).startswith(b"HTTP/1.1 408 ")


def test_a_pipelined_head_is_bounded_while_a_request_is_answered(monkeypatch: pytest.MonkeyPatch,
                                                                 spool: str) -> None:
    """The next request's head, sent while a request is being answered (held
    here in the library, as a long poll holds it), is bounded too: past
    MAX_REQUEST_HEAD_BYTES the connection gets a 431 and is closed at once,
    before the held request is answered. (It was not counted until the answer:
    httptools buffered the partial header whole, tens of MB, copying it at
    each read on the event loop.)"""
    entered, release = threading.Event(), threading.Event()
    original = vsqs.Queue.publish_batch

    def held_publish(self: vsqs.Queue, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        release.wait(WAIT)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(vsqs.Queue, "publish_batch", held_publish)
    monkeypatch.setattr(vsqs.Queue, "publish", lambda self, body, **kw: held_publish(self, [body])[0])
    body = b'{"QueueUrl": "q", "MessageBody": "hi"}'
    first = (b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n"
             b"Content-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (SQS_JSON.encode(), len(body), body))
    try:
        with serving(create_app(GatewayConfig(spool=spool)), protocol_factory(WAIT)) as port, \
                socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
            sock.sendall(first)
            assert entered.wait(WAIT), "the publish never reached the library"
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: ")
            sent = 0
            try:
                while sent < 64 * 1024 * 1024:  # far past anything the kernel buffers
                    sock.sendall(b"p" * 65536)
                    sent += 65536
            except (BrokenPipeError, ConnectionResetError):
                pass
            release.set()
            try:
                answer = _until_closed(sock)
            except ConnectionResetError:
                answer = b""  # closed with our unread bytes: nothing to read
    finally:
        release.set()
    assert sent < 64 * 1024 * 1024, "the partial head was read on without bound"
    assert not answer.startswith(b"HTTP/1.1 200")


# -- storage stays off the event loop ------------------------------------------------------------


@pytest.mark.parametrize("face", ["sqs", "native"])
def test_slow_storage_holds_up_no_other_request(monkeypatch: pytest.MonkeyPatch, spool: str, face: str) -> None:
    """A publish held inside the library (a slow network filesystem) until
    /healthz has answered: /healthz answers meanwhile (the action's storage
    work runs on the thread pool, in its one hop), then the publish completes."""
    entered, healthz_answered = threading.Event(), threading.Event()
    waited: list[bool] = []
    original = vsqs.Queue.publish_batch

    def slow_publish(self: vsqs.Queue, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        waited.append(healthz_answered.wait(WAIT))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(vsqs.Queue, "publish_batch", slow_publish)
    monkeypatch.setattr(vsqs.Queue, "publish", lambda self, body, **kw: slow_publish(self, [body])[0])
    with serving(create_app(GatewayConfig(spool=spool)), protocol_factory(WAIT)) as port:
        url = f"http://127.0.0.1:{port}"
        answers: list[httpx.Response] = []

        def publish() -> None:
            if face == "sqs":
                answers.append(httpx.post(url + "/", timeout=2 * WAIT,
                                          content=b'{"QueueUrl": "q", "MessageBody": "hi"}',
                                          headers={"X-Amz-Target": "AmazonSQS.SendMessage",
                                                   "Content-Type": SQS_JSON}))
            else:
                answers.append(httpx.post(url + "/queues/q/messages", content=b"hi", timeout=2 * WAIT))

        sender = threading.Thread(target=publish)
        sender.start()
        assert entered.wait(WAIT), "the publish never reached the library"
        try:
            health = httpx.get(url + "/healthz", timeout=WAIT).status_code
        except httpx.TimeoutException:
            health = None  # the event loop was held
        healthz_answered.set()
        sender.join(2 * WAIT)
    assert health == 200
    assert waited == [True], "the publish held the event loop until /healthz gave up"
    assert answers[0].status_code in (200, 201)
    assert vsqs.Spool(spool).queue("q").stats().total == 1


# -- a Query form is decoded after authentication, off the event loop when large ------------------


def _query_form(size: int) -> bytes:
    return b"Action=SendMessage&Version=2012-11-05&QueueUrl=q&MessageBody=" + b"%41" * (size // 3)


def _form_headers(length: int) -> list[tuple[bytes, bytes]]:
    return [(b"host", b"localhost"), (b"content-type", b"application/x-www-form-urlencoded"),
            (b"content-length", str(length).encode())]


def test_an_unauthenticated_query_form_is_never_decoded(monkeypatch: pytest.MonkeyPatch, spool: str) -> None:
    decoded = []
    monkeypatch.setattr(endpoint, "split_form", lambda data: decoded.append(len(data)) or {})
    app = create_app(GatewayConfig(spool=spool, api_key="k" * 24))
    form = _query_form(2 * 1024 * 1024)
    status, _, body = call(app, "POST", "/", _form_headers(len(form)), [form])
    assert status == 403 and b"MissingAuthenticationToken" in body
    assert decoded == []  # refused on its action and its signature alone


def test_a_large_query_form_is_decoded_on_a_thread(monkeypatch: pytest.MonkeyPatch, spool: str) -> None:
    vsqs.Queue(f"{spool}/q", create=True)
    threads = []
    real = endpoint.split_form

    def split_form(data: bytes) -> dict[str, str]:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(data)

    monkeypatch.setattr(endpoint, "split_form", split_form)
    config = GatewayConfig(spool=spool)
    app = create_app(config)
    for size in (300, 200 * 1024):
        url = f"http%3A%2F%2Flocalhost%2F{config.account_id}%2Fq".encode()
        form = _query_form(size).replace(b"QueueUrl=q", b"QueueUrl=" + url)
        status, _, body = call(app, "POST", "/", _form_headers(len(form)), [form])
        assert status == 200, body
    assert threads == [True, False]  # a small form in place, a large one off the event loop


def test_a_console_form_without_a_session_is_never_parsed(monkeypatch: pytest.MonkeyPatch, spool: str) -> None:
    from vsqs._gateway.console import forms

    parsed = []

    async def read_form(request: Any) -> dict[str, str]:
        parsed.append(request.url.path)
        return {}

    monkeypatch.setattr(forms, "read_form", read_form)
    app = create_app(GatewayConfig(spool=spool, api_key="k" * 24))
    form = b"key=" + b"%41" * 60_000
    for path in ("/ui/login", "/ui/logout", "/ui/queues/q/purge"):
        status, _, _ = call(app, "POST", path, _form_headers(len(form)) + [(b"origin", b"http://localhost")], [form])
        assert status in (401, 403), path
    assert parsed == []  # refused on the cookie alone: no session, no token to match


def _refused_or_reset(sock: socket.socket, more: bytes) -> tuple[int, bytes]:
    """Send ``more`` in pieces until the server stops taking it (up to 64 MiB);
    how much was sent, and what the server answered."""
    sent = 0
    try:
        while sent < 64 * 1024 * 1024:
            sock.sendall(more)
            sent += len(more)
    except (BrokenPipeError, ConnectionResetError):
        pass
    try:
        return sent, _until_closed(sock)
    except ConnectionResetError:
        return sent, b""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_blank_lines_before_a_request_line_end_no_head(spool: str, protocol: str) -> None:
    """Parsers skip blank lines before a request line: they do not end a head,
    so a head after them is bounded as any other (on a new connection and on
    one kept alive)."""
    with serving(create_app(GatewayConfig(spool=spool)), PROTOCOLS[protocol]) as port:
        for kept_alive in (False, True):
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
                if kept_alive:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
                sock.sendall(b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: ")
                sent, answer = _refused_or_reset(sock, b"p" * 65536)
            assert sent < 64 * 1024 * 1024, "the head after blank lines was read on without bound"
            assert not answer or answer.split(b" ")[1] in (b"400", b"431")


def test_a_head_pipelined_behind_a_long_poll_is_bounded(spool: str) -> None:
    """A request without a body (a long poll, which reads its empty body only
    at its end) lets the next head be counted at once: past its bound the
    connection is refused while the poll still waits."""
    vsqs.Spool(spool).create_queue("q")
    with serving(create_app(GatewayConfig(spool=spool)), protocol_factory(WAIT)) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"GET /queues/q/messages?wait=20 HTTP/1.1\r\nHost: localhost\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: ")
        started = time.monotonic()
        sent, _ = _refused_or_reset(sock, b"p" * 65536)
    assert sent < 64 * 1024 * 1024, "the partial head was read on without bound"
    assert time.monotonic() - started < 15, "refused only when the poll ended"


def test_a_body_sent_after_its_refusal_keeps_the_connection(spool: str) -> None:
    """A client that sends its whole body although the answer (413: too large)
    came before it was read keeps its connection: the rest of the body it
    declared is no head, and the next request on the connection is answered."""
    config = GatewayConfig(spool=spool)
    body = b"b" * (config.max_body_bytes + 100_000)
    with serving(create_app(config), protocol_factory(WAIT)) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n" % len(body))
        assert sock.recv(65536).startswith(b"HTTP/1.1 413 ")
        sock.sendall(body + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while b"HTTP/1.1 200" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
        assert b"HTTP/1.1 200" in answer


def _answers(sock: socket.socket, count: int) -> list[bytes]:
    """The status lines of the next ``count`` answers on ``sock`` (their bodies read by length)."""
    statuses, data = [], b""
    while len(statuses) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {statuses}"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(data) < length:
            data += sock.recv(65536)
        data = data[length:]
        statuses.append(head.split(b"\r\n")[0])
    return statuses


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_chunked_body_refused_part_read_keeps_the_connection(spool: str, protocol: str) -> None:
    """A chunked body refused before its end (413: over the route's cap): the
    rest of it, past a head's bound, then trailers, is no head, and the next
    request on the connection is answered."""
    vsqs.Spool(spool).create_queue("q")
    config = GatewayConfig(spool=spool)
    sent = config.max_body_bytes + 1  # a raw publish's cap, plus one: all of it is read before the refusal
    with serving(create_app(config), PROTOCOLS[protocol]) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % (sent + 65536) + b"b" * sent)
        assert _answers(sock, 1)[0].startswith(b"HTTP/1.1 413 ")
        sock.sendall(b"b" * 65536 + b"\r\n1;x=y\r\nb\r\n0\r\nTrailer: t\r\n\r\n"
                     b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _answers(sock, 1)[0] == b"HTTP/1.1 200 OK"
    assert vsqs.Spool(spool).queue("q").stats().ready == 0


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_body_refused_as_it_came_keeps_the_connection(spool: str, protocol: str) -> None:
    """Part of a body too large (413, refused by its Content-Length) comes with
    its head, the rest after the answer: none of it is a head, and the next
    request on the connection is answered."""
    vsqs.Spool(spool).create_queue("q")
    config = GatewayConfig(spool=spool)
    large, small = b"b" * (config.max_body_bytes + 100_000), b"s" * 100_000
    with serving(create_app(config), PROTOCOLS[protocol]) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
                     % len(large) + large[:60_000])
        assert _answers(sock, 1)[0].startswith(b"HTTP/1.1 413 ")
        sock.sendall(large[60_000:])
        sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
                     % len(small) + small)
        assert _answers(sock, 1)[0] == b"HTTP/1.1 201 Created"
    assert vsqs.Spool(spool).queue("q").stats().ready == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_pipelined_requests_are_each_answered(spool: str, protocol: str) -> None:
    """Requests sent in one write, the second with a body past a head's bound,
    are each answered and stored: a body is never taken for a head."""
    vsqs.Spool(spool).create_queue("q")
    large = b"o" * 300_000
    with serving(create_app(GatewayConfig(spool=spool)), PROTOCOLS[protocol]) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello"
                     b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3\r\nabc\r\n0\r\n\r\n"
                     b"POST /queues/q/messages HTTP/1.1\r\nHost: localhost\r\nContent-Length: %d\r\n\r\n"
                     % len(large) + large + b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _answers(sock, 4) == [b"HTTP/1.1 201 Created"] * 3 + [b"HTTP/1.1 200 OK"]
    assert vsqs.Spool(spool).queue("q").stats().ready == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_what_follows_an_upgrade_request_is_bounded_as_a_head(spool: str, protocol: str) -> None:
    """llhttp ends an upgrade request at its head, whatever its Content-Length
    declares, and reads on as a new request: what follows is bounded as a
    head while the upgrade request (a long poll) is answered, with either
    parser."""
    vsqs.Spool(spool).create_queue("q")
    with serving(create_app(GatewayConfig(spool=spool)), PROTOCOLS[protocol]) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as sock:
        sock.sendall(b"GET /queues/q/messages?wait=20 HTTP/1.1\r\nHost: localhost\r\n"
                     b"Connection: Upgrade\r\nUpgrade: h2c\r\n"
                     b"Content-Length: 100000000000\r\n\r\n")
        time.sleep(0.3)  # (in a read of its own, llhttp parses what follows as a new request)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: ")
        sent, _ = _refused_or_reset(sock, b"p" * 65536)
    assert sent < 64 * 1024 * 1024, "the bytes after an upgrade request were read on without bound"
