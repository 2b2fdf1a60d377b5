"""Wrong API keys are counted by address: guessing the key is slow (vsqs._gateway.guesses)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the gateway needs the server extra: pip install 'vsqs[server]'")

from tests.console.helpers import ConsoleClient
from tests.gateway.server import running_gateway
from vsqs._gateway.auth import ApiKeyAuth
from vsqs._gateway.guesses import KeyGuesses

KEY = "guesses-test-key-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_wrong_keys_then_one_a_while():
    clock = Clock()
    guesses = KeyGuesses(burst=3, per_guess=6.0, clock=clock)
    assert guesses.wait("a") == 0
    for _ in range(3):
        guesses.wrong("a")
    assert guesses.wait("a") == 6  # the burst is spent: one more in 6 s
    assert guesses.wait("b") == 0  # per address
    clock.now += 4
    assert guesses.wait("a") == 2
    clock.now += 2
    assert guesses.wait("a") == 0
    guesses.wrong("a")
    assert guesses.wait("a") == 6
    clock.now += 3600  # refilled, never beyond the burst
    for _ in range(3):
        assert guesses.wait("a") == 0
        guesses.wrong("a")
    assert guesses.wait("a") > 0


def test_the_addresses_remembered_are_bounded():
    guesses = KeyGuesses(burst=1, per_guess=60.0, max_addresses=100, clock=Clock())
    for n in range(1000):
        guesses.wrong(f"10.0.{n // 256}.{n % 256}")
    assert guesses.wait("10.0.3.231") > 0  # the latest are kept
    assert guesses.wait("10.0.0.0") == 0  # the oldest were forgotten: memory stays bounded


def call(app: Any, headers: list[tuple[bytes, bytes]], client: str = "192.0.2.7") -> tuple[int, dict[bytes, bytes]]:
    sent: list[dict] = []
    scope = {"type": "http", "path": "/queues", "method": "GET", "headers": headers, "client": (client, 4000),
             "query_string": b"", "http_version": "1.1", "scheme": "http", "server": ("testserver", 80)}

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start.get("headers", []))


async def inner(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_api_refuses_a_guessers_keys_unread():
    app = ApiKeyAuth(inner, KEY, KeyGuesses(burst=3, per_guess=60.0, clock=Clock()))
    right, wrong = [(b"authorization", f"Bearer {KEY}".encode())], [(b"x-api-key", b"guess")]
    assert call(app, right)[0] == 200
    assert [call(app, wrong)[0] for _ in range(3)] == [401, 401, 401]
    status, headers = call(app, wrong)
    assert status == 429 and headers[b"retry-after"] == b"60"
    assert call(app, right)[0] == 429  # refused unread while the address waits: a guess tells nothing
    assert call(app, right, client="192.0.2.8")[0] == 200  # another address is not held back
    assert [call(app, [], client="192.0.2.9")[0] for _ in range(5)] == [401] * 5  # no key: not a guess
    assert call(app, right, client="192.0.2.9")[0] == 200


def test_the_console_sign_in_counts_the_same_guesses(tmp_path):
    with running_gateway(str(tmp_path), env={"VSQS_API_KEY": KEY}) as server:
        client = ConsoleClient(server.url)
        try:
            statuses = []
            for _ in range(11):
                answer = client.post("/ui/login", {"csrf": client.token("/ui/login"), "key": "guess", "next": "/ui"})
                statuses.append(answer.status_code)
            assert statuses == [401] * 10 + [429]
            assert int(answer.headers["retry-after"]) > 0 and "Too many wrong keys" in answer.text
            right = client.post("/ui/login", {"csrf": client.token("/ui/login"), "key": KEY, "next": "/ui"})
            assert right.status_code == 429  # the right key too, while this address waits
            assert client.get("/queues", headers={"Authorization": f"Bearer {KEY}"}).status_code == 429  # one count
        finally:
            client.close()


def test_one_host_is_one_address_whatever_form_it_takes():
    """An IPv6 host holds a /64 (2**64 addresses to rotate through), and an IPv4 client of a
    dual-stack socket comes as ``::ffff:a.b.c.d``: each is one address to the count. What is
    no IP address (a Unix socket, a proxy's X-Forwarded-For of any text) is one address too,
    so that neither the count nor its memory grows with made-up names."""
    from vsqs._gateway.guesses import client_address

    def of(host: str | None) -> str:
        return client_address({"client": (host, 1) if host is not None else None})

    assert of("2001:db8:1:2::1") == of("2001:db8:1:2:ffff:1:2:3") != of("2001:db8:1:3::1")
    assert of("::ffff:192.0.2.7") == of("192.0.2.7") != of("192.0.2.8")
    assert of("not-an-address") == of("x" * 10_000) == of(None) and len(of("x" * 10_000)) < 64
    assert of("fe80::1%eth0") == of("fe80::2%eth0")


def test_the_names_remembered_on_the_way_are_bounded_too():
    """A proxy's X-Forwarded-For can make a client's 'host' up to a request head long:
    the cache of what each host counts as keeps no such text."""
    from vsqs._gateway.guesses import _address_of, client_address

    _address_of.cache_clear()
    for n in range(100):
        client_address({"client": (f"{n}-" + "x" * 10_000, 1)})
    assert _address_of.cache_info().currsize == 0  # none kept: each would have held 10 kB


def test_an_ipv6_guesser_cannot_rotate_through_its_64():
    app = ApiKeyAuth(inner, KEY, KeyGuesses(burst=3, per_guess=60.0, clock=Clock()))
    wrong = [(b"x-api-key", b"guess")]
    statuses = [call(app, wrong, client=f"2001:db8:7:7::{n:x}")[0] for n in range(1, 5)]
    assert statuses == [401, 401, 401, 429]
    assert call(app, [(b"x-api-key", KEY.encode())], client="2001:db8:7:8::1")[0] == 200  # another /64


def test_the_sqs_face_signed_with_the_api_key_counts_the_same_guesses(tmp_path):
    """With no AWS key pairs the SQS face takes the API key as the secret access key:
    a wrong signature is a wrong key, counted with the API's (before, unlimited)."""
    import httpx
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    def signed(url: str, secret: str) -> httpx.Response:
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
        request = AWSRequest(method="POST", url=url + "/", data=b"{}", headers=headers)
        SigV4Auth(Credentials("AKIDANY", secret), "sqs", "us-east-1").add_auth(request)
        return httpx.post(url + "/", content=b"{}", headers=dict(request.headers.items()), timeout=30)

    with running_gateway(str(tmp_path), env={"VSQS_API_KEY": KEY}) as server:
        assert signed(server.url, KEY).status_code == 200
        statuses = [signed(server.url, "guess").status_code for _ in range(11)]
        assert statuses == [403] * 10 + [429]
        refused = signed(server.url, KEY)
        assert refused.status_code == 429 and refused.json()["__type"].endswith("RequestThrottled")
        assert httpx.get(server.url + "/queues", headers={"X-Api-Key": KEY}).status_code == 429  # one count


def test_a_presigned_url_is_a_key_presented_too(tmp_path):
    import httpx
    from botocore.auth import SigV4QueryAuth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    def presigned(url: str, secret: str, encoded: bool = False) -> httpx.Response:
        request = AWSRequest(method="GET", url=url + "/?Action=ListQueues&Version=2012-11-05")
        SigV4QueryAuth(Credentials("AKIDANY", secret), "sqs", "us-east-1", expires=300).add_auth(request)
        if encoded:  # the same name, percent-encoded: still the signature, still counted
            return httpx.get(request.url.replace("X-Amz-Signature=", "X-Amz-Signatur%65="), timeout=30)
        return httpx.get(request.url, timeout=30)

    for encoded in (False, True):
        with running_gateway(str(tmp_path), env={"VSQS_API_KEY": KEY}) as server:
            assert presigned(server.url, KEY, encoded).status_code == 200
            assert [presigned(server.url, "guess", encoded).status_code for _ in range(11)] == [403] * 10 + [429]
            assert presigned(server.url, KEY, encoded).status_code == 429  # a right guess is refused too
