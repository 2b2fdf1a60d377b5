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
    assert guesses.wait("192.0.2.1") == 0
    for _ in range(3):
        guesses.wrong("192.0.2.1")
    assert guesses.wait("192.0.2.1") == 6  # the burst is spent: one more in 6 s
    assert guesses.wait("192.0.2.2") == 0  # per address
    clock.now += 4
    assert guesses.wait("192.0.2.1") == 2
    clock.now += 2
    assert guesses.wait("192.0.2.1") == 0
    guesses.wrong("192.0.2.1")
    assert guesses.wait("192.0.2.1") == 6
    clock.now += 3600  # refilled, never beyond the burst
    for _ in range(3):
        assert guesses.wait("192.0.2.1") == 0
        guesses.wrong("192.0.2.1")
    assert guesses.wait("192.0.2.1") > 0


def test_the_addresses_remembered_are_bounded():
    guesses = KeyGuesses(burst=1, per_guess=60.0, max_addresses=100, clock=Clock())
    for n in range(1000):
        guesses.wrong(f"10.0.{n // 256}.{n % 256}")
    assert len(guesses) <= 100  # memory stays bounded
    assert guesses.wait("10.0.3.231") > 0  # the latest are held back
    assert guesses.wait("10.0.0.0") > 0  # and the oldest: none was forgotten with its debt


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


def _attack(guesses: KeyGuesses, addresses) -> int:
    """Guess from each address while it may (as a guesser who reads the 429s would): the guesses let through."""
    allowed = 0
    for address in addresses:
        while guesses.wait(address) == 0:
            guesses.wrong(address)
            allowed += 1
    return allowed


def test_cycling_the_64s_of_a_48_never_gives_the_first_a_fresh_budget():
    """More /64s than the table holds, from one /48 (10 wrong keys each, at first):
    the prefixes they share are counted as one, with the wrong keys of all of them."""
    guesses = KeyGuesses(clock=Clock())  # the gateway's limits; no time passes
    first = "2001:db8:7:0::1"
    allowed = _attack(guesses, [first] + [f"2001:db8:7:{n:x}::1" for n in range(1, 10_001)])
    assert guesses.wait(first) > 0  # still held back: never forgotten, never refilled for free
    assert allowed < 3_000  # ~17 /56s of 17 /64s with 10 each, then the /48 is one count (else 100,010)
    assert len(guesses) < 100


def test_an_ipv4_guesser_across_the_internet_is_held_at_wider_prefixes():
    """Addresses from everywhere, more than the table holds: under that pressure the
    count is kept for wider prefixes (at most /8), so none starts afresh and memory stays bounded."""
    guesses = KeyGuesses(max_addresses=1000, clock=Clock())
    addresses = [f"{n % 223 + 1}.{n * 7 % 256}.{n * 13 % 256}.{n % 251}" for n in range(20_000)]
    allowed = _attack(guesses, addresses)
    assert guesses.wait(addresses[0]) > 0
    assert allowed <= 1000 * 10 + 10  # the table's worth, once (else 200,000)
    assert len(guesses) <= 1000


def test_a_prefix_counted_as_one_carries_the_wrong_keys_of_its_addresses():
    clock = Clock()
    guesses = KeyGuesses(burst=3, per_guess=6.0, clock=clock)
    assert _attack(guesses, [f"192.0.2.{n}" for n in range(1, 17)]) == 16 * 3
    assert guesses.wait("192.0.2.200") == 0  # 16 addresses of a /24 are told apart
    guesses.wrong("192.0.2.17")  # the 17th: the /24 is one count, owing all 49
    assert guesses.wait("192.0.2.200") == (49 - 2) * 6  # (2 of the burst's 3 may be owed before a wait)
    assert guesses.wait("192.0.3.1") == 0  # the next /24 is not held back
    clock.now += (49 - 2) * 6
    assert guesses.wait("192.0.2.1") == 0
    for n in range(100):  # a hundred /24s of a /16 with 17 addresses each: owed for an hour at most
        _attack(guesses, [f"198.51.{n}.{host}" for host in range(1, 18)])
    assert 0 < guesses.wait("198.51.200.1") <= 3600
