"""Issue 13, the gateway's limits: what an unauthenticated or malformed request
may cost the server (CPU, memory, a connection slot), and that bad input is
a 4xx in each face's format, never a 500.

Most tests run `vsqs serve` in a process of its own (tests/gateway/server.py);
those that count the server's work through a seam run the same app under
uvicorn in this process, on a loopback socket. No test rests on timing:
where the server must act "soon", the test waits for it with a generous,
bounded wait that only a broken server exhausts.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")
import httpx
import uvicorn
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.gateway.server import free_port
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

