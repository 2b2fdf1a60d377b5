"""Wrong API keys, counted per client address, so that guessing the key is slow.

The native API (``Authorization: Bearer KEY``, ``X-Api-Key``), the
console's sign-in form and the SQS face (a SigV4 signature, whose secret is
the API key when no AWS key pairs are configured, else theirs) check the
same key or a secret like it: one count. Each address may present a wrong
one ``BURST`` times; after that, one more guess every ``PER_GUESS`` seconds
(a token bucket), and until then every request of that address that presents
a key, right or wrong, is answered 429 with ``Retry-After``, without the key
being compared: a guesser learns nothing while refused. A request that
presents no key is not a guess and is never counted. Each gateway process
keeps its own count (``--workers N`` allows N times as many guesses), in
memory bounded by ``MAX_ADDRESSES``: the address idle longest is forgotten
first. An address is what a guesser cannot multiply cheaply: an IPv4 address,
an IPv6 /64 (one host's share: it may use any address in it), and one for all
that is no IP address at all (:func:`client_address`).
"""

from __future__ import annotations

import functools
import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from vsqs._gateway.limits import KEY_GUESS_ADDRESSES as MAX_ADDRESSES
from vsqs._gateway.limits import KEY_GUESS_BURST as BURST
from vsqs._gateway.limits import KEY_GUESS_SECONDS as PER_GUESS

_LONGEST_IP = 64  # characters of an IP address's text (45, and an IPv6 zone's name)
NOT_AN_IP = "?"  # the one address of every client that has none (a Unix socket, a proxy's odd X-Forwarded-For)


class KeyGuesses:
    """The count of wrong keys by client address (a token bucket each)."""

    def __init__(
        self, burst: int = BURST, per_guess: float = PER_GUESS, max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._burst = burst
        self._per_guess = per_guess
        self._max = max_addresses
        self._clock = clock
        self._lock = threading.Lock()  # (the console's sign-in runs on the event loop, the API too: cheap)
        self._left: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (guesses left, at)

    def _now_left(self, address: str, now: float) -> float:
        entry = self._left.get(address)
        if entry is None:
            return float(self._burst)
        left, at = entry
        return min(float(self._burst), left + (now - at) / self._per_guess)

    def wait(self, address: str) -> int:
        """Seconds (rounded up) before ``address`` may present a key again; 0: now."""
        if address not in self._left:  # (the common case, every right key: one lookup, no lock)
            return 0
        with self._lock:
            if address not in self._left:
                return 0
            left = self._now_left(address, self._clock())
        return 0 if left >= 1 else max(1, math.ceil((1 - left) * self._per_guess))

    def counts_any(self) -> bool:
        """Whether any address has presented a wrong key lately (else none need be told apart)."""
        return bool(self._left)

    def wrong(self, address: str) -> None:
        """``address`` presented a wrong key."""
        with self._lock:
            now = self._clock()
            left = self._now_left(address, now) - 1
            self._left[address] = (left, now)
            self._left.move_to_end(address)
            while len(self._left) > self._max:
                self._left.popitem(last=False)


def client_address(scope: dict) -> str:
    """The address that wrong keys count against: the client's IPv4 address (also
    when a dual-stack socket shows it as ``::ffff:a.b.c.d``), its IPv6 /64, or
    :data:`NOT_AN_IP` (no client: a Unix socket; or text that is no address, which
    a proxy's ``X-Forwarded-For`` can make of it), so that a host cannot rotate
    through addresses, nor names, to guess afresh."""
    client = scope.get("client")
    if not client or not isinstance(client[0], str) or len(client[0]) > _LONGEST_IP:
        return NOT_AN_IP  # (a long one is no address, and is not kept in the cache below)
    return _address_of(client[0])


@functools.lru_cache(maxsize=4096)  # (a few hundred bytes each; the hit costs less than the parse)
def _address_of(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return NOT_AN_IP
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))
    return str(ip)
