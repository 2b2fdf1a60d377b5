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


def test_cycling_the_64s_of_a_48_gets_the_48s_share_and_no_more():
    guesses = KeyGuesses(clock=Clock())  # the gateway's limits; no time passes
    first = "2001:db8:7:0::1"
    allowed = _attack(guesses, [first] + [f"2001:db8:7:{n:x}::1" for n in range(1, 10_001)])
    assert allowed == 1280  # 128 /64s' worth: 4 /56s of 32 (else 100,010)
    assert guesses.wait(first) > 0  # still held back: never refilled for free
    assert len(guesses) < 150  # 128 /64s and their prefixes: the others never got to guess


def test_a_flood_of_addresses_keeps_the_table_bounded_and_forgets_no_debt():
    """Addresses from everywhere, 20 times as many as the table holds: those forgotten
    count as spent (their prefix's floor), so going through them again gets nothing."""
    clock = Clock()
    guesses = KeyGuesses(max_addresses=500, clock=clock)
    addresses = [f"{n % 223 + 1}.{n * 7 % 256}.{n * 13 % 256}.{n % 251}" for n in range(10_000)]
    assert _attack(guesses, addresses) <= 100_000  # each its own burst at most: no prefix is spent (a botnet's)
    assert len(guesses) <= 500
    assert guesses.wait(addresses[0]) > 0
    assert _attack(guesses, addresses) == 0  # none starts afresh
    clock.now += 60  # a minute without a wrong key: every bucket full again
    assert guesses.wait(addresses[0]) == 0


def test_one_wrong_key_from_every_address_of_a_24_holds_back_none_of_them():
    """A key rotation: every client of a /24 presents the old key once."""
    guesses = KeyGuesses(clock=Clock())
    for host in range(1, 255):
        guesses.wrong(f"203.0.113.{host}")
    assert [guesses.wait(f"203.0.113.{host}") for host in range(1, 256)] == [0] * 255


def test_guessers_spread_over_a_8_never_hold_back_the_rest_of_it():
    """65 addresses in three /16s of a /8, each spending its own burst (650 wrong keys):
    an address elsewhere in the /8 is not held back, now or while one of them keeps guessing."""
    clock = Clock()
    guesses = KeyGuesses(clock=clock)
    guessers = [f"52.{a}.{b}.{host}" for a in (1, 2, 3) for b in (1, 2) for host in range(1, 12)][:65]
    assert _attack(guesses, guessers) == 650
    assert guesses.wait("52.200.9.9") == 0
    for _ in range(600):  # one of them sends a wrong key whenever it may, for 10 minutes
        if guesses.wait("52.1.1.1") == 0:
            guesses.wrong("52.1.1.1")
        assert guesses.wait("52.200.9.9") == 0
        clock.now += 1


def test_a_spent_prefix_holds_back_its_addresses_only_while_wrong_keys_keep_coming():
    clock = Clock()
    guesses = KeyGuesses(clock=clock)
    assert _attack(guesses, [f"198.51.100.{host}" for host in range(1, 41)]) == 320  # the /24's share: 32 addresses'
    assert guesses.wait("198.51.100.200") == 1  # one more every 6/32 s, for the whole /24
    clock.now += 60  # no wrong key for a minute: the /24's bucket is full again
    assert guesses.wait("198.51.100.200") == 0
    assert _attack(guesses, ["198.51.100.200"]) == 10
    refused = 0
    for _ in range(600):  # one address guessing whenever it may: only it is held back
        if guesses.wait("198.51.100.1") == 0:
            guesses.wrong("198.51.100.1")
        refused += guesses.wait("198.51.100.201") > 0
        clock.now += 1
    assert refused == 0


def test_a_key_rotation_across_a_8_holds_back_no_client_elsewhere_in_it():
    """200 executors in 10.1-4.x.x retry the old key every second for a minute."""
    clock = Clock()
    guesses = KeyGuesses(clock=clock)
    fleet = [f"10.{1 + i % 4}.{i % 8}.{10 + i}" for i in range(200)]
    for _ in range(60):
        for address in fleet:
            if guesses.wait(address) == 0:
                guesses.wrong(address)
        assert guesses.wait("10.200.0.5") == 0  # a client with the new key
        assert guesses.wait("10.1.0.250") == 0  # in the executors' own /24 too
        clock.now += 1


def test_an_address_that_showed_the_right_key_answers_only_for_its_own_wrong_keys():
    clock = Clock()
    guesses = KeyGuesses(clock=clock, trust_seconds=3600.0)
    guesses.right("198.51.100.7")
    neighbours = [f"198.51.{net}.{host}" for net in range(100, 104) for host in range(8, 255)]
    assert _attack(guesses, neighbours) == 1280  # the /16's share, spent
    assert guesses.wait("198.51.100.250") > 0  # a neighbour that never showed the key is held back
    assert guesses.wait("198.51.100.7") == 0  # it is not
    assert _attack(guesses, ["198.51.100.7"]) == 10  # its own wrong keys count against it
    assert guesses.wait("198.51.100.7") == 6
    clock.now += 60
    assert _attack(guesses, ["198.51.100.7"]) == 10
    assert _attack(guesses, neighbours[:100]) == 320  # none of its 20 was charged to its /24
    clock.now += 3600  # not shown again for longer than it is trusted: counted as any address
    guesses.wrong("198.51.100.7")
    assert _attack(guesses, neighbours[:100]) == 319
    assert guesses.wait("198.51.100.7") > 0


def test_the_trusted_addresses_are_bounded_and_one_forgotten_keeps_its_debt():
    clock = Clock()
    guesses = KeyGuesses(clock=clock, trusted=2)
    guesses.right("192.0.2.1")
    assert _attack(guesses, ["192.0.2.1"]) == 10
    guesses.right("192.0.2.2")
    clock.now += 61  # (a trusted address's time is renewed once a minute at most)
    guesses.right("192.0.2.2")
    guesses.right("192.0.2.3")  # the third: the one unseen longest is trusted no longer
    assert guesses.wait("192.0.2.1") == 0  # its own debt paid off (61 s)...
    assert _attack(guesses, ["192.0.2.1"]) == 10  # ...and again counted with its prefixes'
    assert [guesses.wait(f"192.0.2.{host}") for host in (2, 3, 4)] == [0, 0, 0]
    assert len(guesses._trusted) == 2


def test_a_guesser_who_never_spends_an_addresss_burst_is_held_at_its_prefix():
    """9 wrong keys from each /64 (one short of its burst) count as much as 10 would."""
    guesses = KeyGuesses(clock=Clock())
    allowed = 0
    for n in range(10_000):
        address = f"2001:db8:9:{n:x}::1"
        for _ in range(9):
            if guesses.wait(address) == 0:
                guesses.wrong(address)
                allowed += 1
    assert allowed == 1280  # the /48's share: 128 addresses'


def test_each_face_lets_an_address_that_showed_the_right_key_through_while_its_neighbours_guess(
        tmp_path, monkeypatch):
    """The native API, the SQS face and the console's sign-in each trust an address once it
    has shown the right key: neighbours spending their /24's share never hold it back. An
    address that never showed it is held back with them, its right key refused unread."""
    import functools
    import html
    import re

    import httpx
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    import vsqs
    from vsqs._gateway import state
    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig

    monkeypatch.setattr(state, "KeyGuesses", functools.partial(KeyGuesses, clock=Clock()))  # no time passes
    vsqs.Spool(tmp_path, create=True)
    app = create_app(GatewayConfig(spool=str(tmp_path), api_key=KEY, gc_interval=0, console_interval=0))
    base = "http://127.0.0.1"

    def client(address: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app, client=(address, 4000)), base_url=base,
                                 headers={"Sec-Fetch-Site": "same-origin", "Origin": base})

    async def native(address: str, key: str) -> int:
        async with client(address) as http:
            return (await http.get("/queues", headers={"X-Api-Key": key})).status_code

    async def sqs(address: str, key: str) -> int:
        headers = {"Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"}
        request = AWSRequest(method="POST", url=base + "/", data=b"{}", headers=headers)
        SigV4Auth(Credentials("AKIDANY", key), "sqs", "us-east-1").add_auth(request)
        async with client(address) as http:
            return (await http.post("/", content=b"{}", headers=dict(request.headers.items()))).status_code

    async def sign_in(address: str, key: str) -> int:
        async with client(address) as http:
            page = await http.get("/ui/login")
            token = html.unescape(re.search(r'name="csrf" value="([^"]*)"', page.text)[1])
            return (await http.post("/ui/login", data={"csrf": token, "key": key, "next": "/ui"})).status_code

    async def run() -> None:
        assert [await native("198.51.100.1", KEY), await sqs("198.51.100.2", KEY),
                await sign_in("198.51.100.3", KEY)] == [200, 200, 303]
        for host in range(10, 255):  # neighbours guessing while they may
            while await native(f"198.51.100.{host}", "guess") == 401:
                pass
        assert await native("198.51.100.4", KEY) == 429  # never showed the key: held back, its key unread
        assert [await native("198.51.100.1", KEY), await sqs("198.51.100.2", KEY),
                await sign_in("198.51.100.3", KEY)] == [200, 200, 303]

    asyncio.run(run())
