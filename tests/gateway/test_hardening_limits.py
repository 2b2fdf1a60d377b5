"""The gateway's limits: what an unauthenticated or malformed request
may cost the server (CPU, memory, a connection slot), and that bad input is
a 4xx in each face's format, never a 500.

Most tests run `vsqs serve` in a process of its own (tests/gateway/server.py);
those that count the server's work through a seam run the same app under
uvicorn in this process, on a loopback socket. No test rests on timing:
where the server must act "soon", the test waits for it with a generous,
bounded wait that only a broken server exhausts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import httpx
import uvicorn
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.gateway.server import Server, free_port, running_gateway
from vsqs._gateway import sigv4 as _sigv4
from vsqs._gateway.app import create_app
from vsqs._gateway.config import GatewayConfig

KEY, SECRET = "AKIDHARDENING", "hardening-secret"
WAIT = 60.0  # the most any test waits for the server to do what it must (a broken server exhausts it)


# -- helpers ------------------------------------------------------------------------


@contextmanager
def in_process_gateway(config: GatewayConfig) -> Iterator[str]:
    """The gateway's app under uvicorn in this process, on a loopback port, so that
    a test can count the work the server does through seams; yields its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(int(WAIT * 10)):
            if server.started:
                break
            time.sleep(0.1)
        assert server.started, "uvicorn did not start"
        yield url
    finally:
        server.should_exit = True
        thread.join(WAIT)


def hostile_sqs_request(url: str, *, hosts: int = 1200, forwarded: int = 300, pairs: int = 600,
                        secret: str = "not-the-secret") -> tuple[str, dict[str, str]]:
    """The issue's request, within the 16 KB an HTTP head may take: signed (with a
    wrong secret), with hundreds of query pairs and of forwarded hosts; (url with
    query, headers)."""
    query = "&".join(f"p{i}=v" for i in range(pairs))
    request = AWSRequest(method="POST", url=f"{url}/?{query}", data=b"{}", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    SigV4Auth(Credentials(KEY, secret), "sqs", "us-east-1").add_auth(request)
    headers = dict(request.headers)
    headers["X-Forwarded-Host"] = ",".join(f"h{i}" for i in range(hosts))
    headers["Forwarded"] = ";".join(f"host=f{i}" for i in range(forwarded))
    return f"{url}/?{query}", headers


def sigv4_request(headers: dict[str, str], url: str, body: bytes) -> dict[str, Any]:
    """verify()'s keyword arguments for a request as the gateway receives it."""
    path, _, query = url.split("/", 3)[3].partition("?")
    return {"method": "POST", "raw_path": "/" + path, "raw_query": query,
            "headers": {name.lower(): value for name, value in headers.items()}, "body": body}


@contextmanager
def counting(monkeypatch: pytest.MonkeyPatch, module: Any, *names: str,
             before: Callable[[str], None] | None = None) -> Iterator[Counter[str]]:
    """Count the calls of ``module.<name>`` for each name (``before(name)`` runs first)."""
    calls: Counter[str] = Counter()
    for name in names:
        original = getattr(module, name)

        def counted(*args: Any, __name: str = name, __original: Any = original, **kwargs: Any) -> Any:
            calls[__name] += 1
            if before is not None:
                before(__name)
            return __original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    yield calls


# -- item 1: SigV4 work is bounded, and off the event loop ----------------------------------


SIGV4_WORK = ("canonical_query", "signing_key", "string_to_sign")


def test_sigv4_work_is_bounded_whatever_the_request_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thousands of forwarded hosts and query pairs: the canonical query is built
    once, the key derived once, and at most MAX_CANDIDATE_HOSTS signatures tried."""
    url, headers = hostile_sqs_request("http://127.0.0.1:8080", hosts=3000, forwarded=3000, pairs=3000)
    with counting(monkeypatch, _sigv4, *SIGV4_WORK) as calls:
        with pytest.raises(_sigv4.SigV4Error) as refused:
            _sigv4.verify(**sigv4_request(headers, url, b"{}"), credentials={KEY: SECRET}, now=time.time())
    assert refused.value.code == "SignatureDoesNotMatch"
    assert calls["canonical_query"] == 1 and calls["signing_key"] == 1
    assert 1 <= calls["string_to_sign"] <= _sigv4.MAX_CANDIDATE_HOSTS


def test_the_first_forwarded_host_is_still_tried() -> None:
    """A proxy's host (first of many X-Forwarded-Host or Forwarded entries) still verifies."""
    url, headers = hostile_sqs_request("https://queues.example.com", hosts=0, forwarded=0, pairs=3, secret=SECRET)
    signed = sigv4_request(headers, url, b"{}")
    signed["headers"]["host"] = "127.0.0.1:8080"
    for name, value in (("x-forwarded-host", "queues.example.com, proxy.internal, h1, h2"),
                        ("forwarded", 'for=10.0.0.1;proto=https;host="queues.example.com", host=proxy.internal')):
        request = {**signed, "headers": {**signed["headers"], "x-forwarded-host": "", "forwarded": "", name: value}}
        assert _sigv4.verify(**request, credentials={KEY: SECRET}, now=time.time()) == KEY


def test_hostile_signatures_do_not_hold_up_other_requests(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Several of the issue's requests in flight, each held inside its signature
    check until /healthz has answered: /healthz answers (the checks run off the
    event loop), each hostile request is refused, and the server did the bounded
    work of one verification per request."""
    in_flight = 4
    healthz_answered = threading.Event()
    waited: list[bool] = []

    def hold(name: str) -> None:  # the first key derivation of each request waits for /healthz
        if name == "signing_key" and len(waited) < in_flight:
            waited.append(healthz_answered.wait(WAIT))

    config = GatewayConfig(spool=str(tmp_path), aws_credentials={KEY: SECRET})
    with counting(monkeypatch, _sigv4, *SIGV4_WORK, before=hold) as calls, in_process_gateway(config) as url:
        hostile_url, headers = hostile_sqs_request(url)
        answers: list[httpx.Response] = []

        def send() -> None:
            answers.append(httpx.post(hostile_url, headers=headers, content=b"{}", timeout=2 * WAIT))

        senders = [threading.Thread(target=send) for _ in range(in_flight)]
        for sender in senders:
            sender.start()
        for _ in range(int(WAIT * 10)):  # until every hostile request is inside its check
            if calls["signing_key"] >= in_flight:
                break
            time.sleep(0.1)
        health = httpx.get(url + "/healthz", timeout=WAIT)
        healthz_answered.set()
        for sender in senders:
            sender.join(2 * WAIT)
    assert health.status_code == 200
    assert waited == [True] * in_flight, "a signature check held the event loop until /healthz gave up"
    assert [a.status_code for a in answers] == [403] * in_flight
    assert all(a.json()["__type"].endswith("#SignatureDoesNotMatch") for a in answers)
    assert calls["canonical_query"] == in_flight and calls["signing_key"] == in_flight
    assert calls["string_to_sign"] <= in_flight * _sigv4.MAX_CANDIDATE_HOSTS



# -- item 3: half-sent requests are timed out --------------------------------------------


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a broken server
    that never closes it makes the socket time out: the test fails)."""
    sock.settimeout(WAIT)
    received = b""
    for _ in range(1000):
        chunk = sock.recv(65536)
        if not chunk:
            return received
        received += chunk
    raise AssertionError("the server kept sending")


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (head, and a body of its Content-Length), the connection left open."""
    received = b""
    for _ in range(1000):
        head, sep, body = received.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            if len(body) >= length:
                return received
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection mid-response"
        received += chunk
    raise AssertionError("no whole response")


def _healthy(url: str) -> int:
    """/healthz's status, asked until the server has let go of closed connections
    (it counts them against --limit-concurrency until it has run their close)."""
    status = 0
    for _ in range(100):
        status = httpx.get(url + "/healthz", timeout=WAIT).status_code
        if status == 200:
            break
        time.sleep(0.1)
    return status


@pytest.fixture(scope="module")
def impatient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway that gives clients 1 s for a request head and 1 s for its body,
    and takes 4 connections at once."""
    spool = tmp_path_factory.mktemp("impatient") / "spool"
    spool.mkdir()
    with running_gateway(str(spool), "--header-timeout", "1", "--body-timeout", "1",
                         "--limit-concurrency", "4") as server:
        yield server


def test_connections_that_never_finish_their_heads_are_closed(impatient: Server) -> None:
    """The issue's stall: connections that send part of a head (or nothing) fill
    --limit-concurrency; the server closes each after --header-timeout (408 if
    part of a head had come), and answers again. Bytes trickling in do not
    move the deadline, nor does a kept-alive connection escape it."""
    host, port = impatient.url.removeprefix("http://").split(":")
    with ExitStack() as sockets:
        def connect() -> socket.socket:
            sock = sockets.enter_context(socket.create_connection((host, int(port))))
            sock.settimeout(WAIT)
            return sock

        kept_alive = connect()
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert _read_response(kept_alive).startswith(b"HTTP/1.1 200")
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request, never finished
        half_sent = [connect() for _ in range(2)]
        for sock in half_sent:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        silent = connect()
        assert httpx.get(impatient.url + "/healthz", timeout=WAIT).status_code == 503  # 4 of 4 are held
        for sock in half_sent:
            sock.sendall(b"X-Trickle: 1\r\n")  # a byte now and then does not keep it open
        for sock in [*half_sent, kept_alive]:
            assert _read_until_closed(sock).startswith(b"HTTP/1.1 408 ")
        assert _read_until_closed(silent) == b""
    assert _healthy(impatient.url) == 200


@pytest.mark.parametrize("face", ["native", "sqs"])
def test_a_body_that_never_comes_in_full_is_answered_408(impatient: Server, face: str) -> None:
    """A head announcing 100 bytes, then one: after --body-timeout the server answers
    408 in the face's format and closes the connection."""
    host, port = impatient.url.removeprefix("http://").split(":")
    native = b"PUT /queues/slow HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    sqs = (b"POST / HTTP/1.1\r\nHost: localhost\r\nX-Amz-Target: AmazonSQS.ListQueues\r\n"
           b"Content-Type: application/x-amz-json-1.0\r\n")
    head = native if face == "native" else sqs
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(head + b"Content-Length: 100\r\n\r\n{")
        answer = _read_until_closed(sock)
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408 ")
    body = rest.partition(b"\r\n\r\n")[2]
    if face == "native":
        assert json.loads(body)["error"]["code"] == "request_timeout"
    else:
        assert json.loads(body)["__type"].endswith("#RequestTimeout")
    assert not os.path.exists(os.path.join(impatient.spool, "slow"))
    assert _healthy(impatient.url) == 200


# -- item 4: bodies are judged before they are parsed ---------------------------------------


JSON = {"Content-Type": "application/json"}


def sqs_call(url: str, action: str, body: bytes) -> httpx.Response:
    """An SQS request to a gateway with no credentials (it takes any signature)."""
    return httpx.post(url + "/", content=body, timeout=WAIT, headers={
        "X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"})


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A gateway with the default limits and no credentials; queue ``q`` exists."""
    spool = tmp_path_factory.mktemp("limits") / "spool"
    spool.mkdir()
    with running_gateway(str(spool)) as server:
        assert httpx.put(server.url + "/queues/q").status_code in (200, 201)
        yield server
        assert "Traceback" not in server.log(), server.log()[-3000:]


def test_each_route_caps_its_body_before_reading_it(server: Server) -> None:
    """Settings, receipts and SQS actions without messages take a small body (413
    past it, whatever the face's cap); the batch route still takes big ones."""
    pad = "x" * (300 * 1024)
    settings = httpx.patch(f"{server.url}/queues/q", json={"visibility_timeout": 5, "pad": pad}, timeout=WAIT)
    assert (settings.status_code, settings.json()["error"]["code"]) == (413, "request_too_large")
    receipts = httpx.post(f"{server.url}/queues/q/messages/delete", json={"receipts": [pad]}, timeout=WAIT)
    assert (receipts.status_code, receipts.json()["error"]["code"]) == (413, "request_too_large")
    listing = sqs_call(server.url, "ListQueues", json.dumps({"QueueNamePrefix": pad}).encode())
    assert (listing.status_code, listing.json()["__type"]) == (413, "com.amazonaws.sqs#InvalidParameterValueException")
    big = {"messages": [{"body": "b" * 1_000_000} for _ in range(10)]}
    published = httpx.post(f"{server.url}/queues/q/messages/batch", json=big, timeout=WAIT)
    assert published.status_code == 201 and len(published.json()["messages"]) == 10
    assert httpx.post(f"{server.url}/queues/q/purge", timeout=WAIT).json()["count"] == 10


def _peak_memory_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's peak memory in /proc")
def test_a_batch_of_tiny_entries_is_refused_before_it_is_parsed(server: Server) -> None:
    """The issue's bodies: three 14 MB batches of a million tiny entries at once.
    Each is refused (413) on a count of its values, never parsed: the server's
    peak memory grows by about the bodies it buffers (it grew by 300 MB when it
    parsed them), and nothing is stored."""
    body = b'{"messages":[' + b",".join([b'{"body":""}'] * 1_150_000) + b"]}"
    before = _peak_memory_kb(server.process.pid)
    answers: list[httpx.Response] = []

    def send() -> None:
        answers.append(httpx.post(f"{server.url}/queues/q/messages/batch", content=body, headers=JSON,
                                  timeout=2 * WAIT))

    senders = [threading.Thread(target=send) for _ in range(3)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(2 * WAIT)
    grown_mb = (_peak_memory_kb(server.process.pid) - before) / 1024
    assert [(a.status_code, a.json()["error"]["code"]) for a in answers] == [(413, "request_too_large")] * 3
    assert grown_mb < 150, f"the server's peak memory grew by {grown_mb:.0f} MB for {3 * len(body) >> 20} MB of bodies"
    assert httpx.get(f"{server.url}/queues/q/stats", timeout=WAIT).json()["ready"] == 0


def test_large_json_is_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """A large JSON body (a native batch, an SQS send) is parsed on the thread pool;
    a small one where it is."""
    import asyncio

    from vsqs._gateway import json_body

    parsed: list[tuple[int, bool]] = []
    original = json_body.parse_json

    def parse_json(data: bytes, max_values: int) -> Any:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        parsed.append((len(data), on_loop))
        return original(data, max_values)

    monkeypatch.setattr(json_body, "parse_json", parse_json)
    with in_process_gateway(GatewayConfig(spool=str(tmp_path))) as url:
        assert httpx.put(url + "/queues/q", json={"visibility_timeout": 5}, timeout=WAIT).status_code == 201
        batch = {"messages": [{"body": "b" * 100_000} for _ in range(5)]}
        assert httpx.post(url + "/queues/q/messages/batch", json=batch, timeout=WAIT).status_code == 201
        send = json.dumps({"QueueUrl": url + "/000000000000/q", "MessageBody": "s" * 200_000}).encode()
        assert sqs_call(url, "SendMessage", send).status_code == 200
    assert [on_loop for size, on_loop in parsed if size > json_body.INLINE_JSON_BYTES] == [False, False]
    assert [on_loop for size, on_loop in parsed if size <= json_body.INLINE_JSON_BYTES] == [True]


# -- item 5: bad input is a 4xx in each face's format, never a 500 ----------------------------


def _queue_url(server: Server) -> str:
    return f"{server.url}/000000000000/q"


NATIVE_BAD = [  # (path, body, status, code, parameter)
    ("/queues/q/messages/batch", b'{"messages":[{"body":"\\ud800"}]}', 422, "invalid_parameter", "messages.0.body"),
    ("/queues/q/messages/batch", b'{"messages":[{"body":"x","attributes":{"a":"\\udc00"}}]}', 422,
     "invalid_parameter", "messages.0.attributes.a"),
    ("/queues/q/messages/batch", b'{"messages":[{"body":"x","group":"g\\udfff"}]}', 422, "invalid_parameter",
     "messages.0.group"),
    ("/queues/q/messages/batch", b'{"messages":[{"body":"\xed\xa0\x80"}]}', 400, "malformed_json", None),
    ("/queues/q/messages/delete", b'{"receipts":["\\ud800"]}', 422, "invalid_parameter", "receipts.0"),
    ("/queues/q/messages/batch", b'{"messages":[{"body":"x","delay":NaN}]}', 400, "malformed_json", None),
    ("/queues/q/messages/batch", b'{"messages":[{"body":"x","delay":1e999}]}', 400, "malformed_json", None),
    ("/queues/q/messages/receive", b'{"wait":' + b"[" * 900 + b"]" * 900 + b"}", 400, "malformed_json", None),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "parameter"), NATIVE_BAD)
def test_bad_strings_numbers_and_nesting_on_the_native_face(
        server: Server, path: str, body: bytes, status: int, code: str, parameter: str | None) -> None:
    answer = httpx.post(server.url + path, content=body, headers=JSON, timeout=WAIT)
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error.get("parameter")) == (status, code, parameter), answer.text


def _redrive(arn: str = "arn:aws:sqs:us-east-1:000000000000:dlq", count: object = 3) -> str:
    return json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": count})


SQS_BAD = [  # (action, parameters as JSON text, with {url} for the queue's URL; status, error's JSON type)
    ("ListQueues", "[" * 900 + "]" * 900, 400, "SerializationException"),
    ("ListQueues", '{"a":' * 900 + "1" + "}" * 900, 400, "SerializationException"),
    ("SendMessage", '{"QueueUrl":"{url}","MessageBody":"x","X":' + "[" * 5000 + "]" * 5000 + "}", 400,
     "SerializationException"),
    ("SetQueueAttributes", json.dumps({"QueueUrl": "{url}", "Attributes": {"RedrivePolicy": "[" * 5000 + "]" * 5000}}),
     400, "InvalidParameterValueException"),
    ("SetQueueAttributes",
     json.dumps({"QueueUrl": "{url}", "Attributes": {"RedrivePolicy": _redrive(count="9" * 5000)}}),
     400, "InvalidParameterValueException"),
    ("SetQueueAttributes", json.dumps({"QueueUrl": "{url}", "Attributes": {"RedrivePolicy": _redrive(count="\u00b2")}}),
     400, "InvalidParameterValueException"),
    ("SendMessage", '{"QueueUrl":"{url}","MessageBody":"\\ud800"}', 400, "InvalidMessageContents"),
    ("SendMessage", '{"QueueUrl":"{url}","MessageBody":"x","MessageAttributes":{"a":{"DataType":"String",'
     '"StringValue":"\\udc00"}}}', 400, "InvalidMessageContents"),
    ("SendMessage", '{"QueueUrl":"{url}","MessageBody":"x","MessageGroupId":"\\ud800"}', 400,
     "InvalidParameterValueException"),
    ("SendMessage", '{"QueueUrl":"{url}","MessageBody":"x","DelaySeconds":1e999}', 400, "SerializationException"),
    ("ReceiveMessage", '{"QueueUrl":"{url}","VisibilityTimeout":' + "9" * 5000 + "}", 400, "SerializationException"),
]


@pytest.mark.parametrize(("action", "params", "status", "name"), SQS_BAD)
def test_bad_strings_numbers_and_nesting_on_the_sqs_face(
        server: Server, action: str, params: str, status: int, name: str) -> None:
    answer = sqs_call(server.url, action, params.replace("{url}", _queue_url(server)).encode("utf-8"))
    assert answer.status_code == status, answer.text
    assert answer.json()["__type"].endswith(f"#{name}"), answer.text
    assert answer.headers["x-amzn-query-error"].endswith(";Sender")
