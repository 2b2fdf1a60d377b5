"""Wrong API keys, counted per client address, so that guessing the key is slow.

The native API (``Authorization: Bearer KEY``, ``X-Api-Key``), the
console's sign-in form and the SQS face (a SigV4 signature, whose secret is
the API key when no AWS key pairs are configured, else theirs) check the
same key or a secret like it: one count. Each address may present a wrong
one ``BURST`` times; after that, one more guess every ``PER_GUESS`` seconds
(a token bucket, kept as the time its debt is paid off), and until then
every request of that address that presents a key, right or wrong, is
answered 429 with ``Retry-After``, without the key being compared: a
guesser learns nothing while refused. A request that presents no key is not
a guess and is never counted. Each gateway process keeps its own count
(``--workers N`` allows N times as many guesses). An address is what a
guesser cannot multiply cheaply: an IPv4 address, an IPv6 /64 (one host's
share: it may use any address in it), and one for all that is no IP address
at all (:func:`client_address`).

A guesser with many addresses gets no fresh budget by cycling through them:
the count is kept for wider prefixes (IPv4 /32, /24, /16, /8; IPv6 /64,
/56, /48 ... /8, eight bits a step) when

* a prefix holds more owing entries than ``SPREAD`` (a /24 or /56), twice
  as many a level wider (32 for a /16 or /48 ...): its entries are folded
  into one for the prefix, which owes the sum of their debts;
* the table holds ``MAX_ADDRESSES`` entries: those paid off are dropped
  (they would start with a full budget anyway), then, while more than three
  quarters remain, every entry of the narrowest level is folded into its
  next wider prefix, as far as /8 (a table smaller than the /8s, 512 at
  most, is held to those).

An address is counted against the entry that covers it (there is at most
one: no entry covers another), so every address of a folded prefix shares
its debt; a prefix's debt is capped so that it waits ``LONGEST_WAIT`` at
most. Memory stays bounded (``MAX_ADDRESSES`` entries, a few hundred bytes
each), and each wrong key costs a few dictionary and bisect steps, a fold
a pass over the entries it folds (the table's pass is amortised over the
quarter of it that it frees). The price: under a flood of addresses, a
guesser's neighbours in its prefix wait with it.
"""

from __future__ import annotations

import bisect
import functools
import ipaddress
import math
import socket
import threading
import time
from collections.abc import Callable

from vsqs._gateway.limits import KEY_GUESS_ADDRESSES as MAX_ADDRESSES
from vsqs._gateway.limits import KEY_GUESS_BURST as BURST
from vsqs._gateway.limits import KEY_GUESS_LONGEST_WAIT as LONGEST_WAIT
from vsqs._gateway.limits import KEY_GUESS_SECONDS as PER_GUESS
from vsqs._gateway.limits import KEY_GUESS_SPREAD as SPREAD

_LONGEST_IP = 64  # characters of an IP address's text (45, and an IPv6 zone's name)
NOT_AN_IP = "?"  # the one address of every client that has none (a Unix socket, a proxy's odd X-Forwarded-For)

Key = tuple[int, int, int]  # (IP version, the prefix's network as an int, its length); (0, 0, 0): no IP address
_NO_IP: Key = (0, 0, 0)
_BITS = {4: 32, 6: 128}
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_LEVELS = {4: (32, 24, 16, 8), 6: (64, 56, 48, 40, 32, 24, 16, 8)}  # an address's entry first, then wider
_LEVEL_OF = {(version, length): level for version, lengths in _LEVELS.items() for level, length in enumerate(lengths)}
_DEEPEST = max(len(lengths) for lengths in _LEVELS.values()) - 1


class KeyGuesses:
    """The count of wrong keys by client address and, under pressure, by wider prefix."""

    def __init__(
        self, burst: int = BURST, per_guess: float = PER_GUESS, max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic, spread: int = SPREAD, longest_wait: float = LONGEST_WAIT,
    ) -> None:
        self._burst = burst
        self._per_guess = per_guess
        self._max = max_addresses
        self._clock = clock
        self._spread = spread
        self._free = (burst - 1) * per_guess  # the debt (in seconds) an entry may owe and still guess
        self._most = self._free + longest_wait  # the largest debt kept
        self._lock = threading.Lock()  # (the console's sign-in runs on the event loop, the API too: cheap)
        self._paid: dict[Key, float] = {}  # entry -> when its wrong keys are paid off (clock seconds)
        self._sorted: list[Key] = []  # the same entries in order: those under a prefix lie together

    def wait(self, address: str) -> int:
        """Seconds (rounded up) before ``address`` may present a key again; 0: now."""
        chain = _chain(address)
        paid = self._paid
        if not any(key in paid for key in chain):  # (the common case, every right key: no lock)
            return 0
        with self._lock:
            key = self._covering(chain)
            if key is None:
                return 0
            late = self._paid[key] - self._clock() - self._free
        return 0 if late <= 0 else max(1, math.ceil(late))

    def counts_any(self) -> bool:
        """Whether any address has presented a wrong key lately (else none need be told apart)."""
        return bool(self._paid)

    def __len__(self) -> int:
        """Entries held (addresses and prefixes)."""
        return len(self._paid)

    def wrong(self, address: str) -> None:
        """``address`` presented a wrong key."""
        chain = _chain(address)
        with self._lock:
            now = self._clock()
            key = self._covering(chain)
            if key is not None:
                self._paid[key] = min(max(self._paid[key], now) + self._per_guess, now + self._most)
                return
            self._add(chain[0], now + self._per_guess)
            for level, prefix in enumerate(chain[1:], 1):
                self._settle(prefix, self._spread << (level - 1), now)
            if len(self._paid) > self._max:
                self._shrink(now)

    def _covering(self, chain: tuple[Key, ...]) -> Key | None:
        """The entry that counts for an address (its own, or a prefix's): at most one exists."""
        for key in chain:
            if key in self._paid:
                return key
        return None

    def _add(self, key: Key, paid: float) -> None:
        self._paid[key] = paid
        bisect.insort(self._sorted, key)

    def _settle(self, prefix: Key, most: int, now: float) -> None:
        """Fold the entries under ``prefix`` into one if more than ``most`` of them owe."""
        version, network, length = prefix
        low = bisect.bisect_left(self._sorted, (version, network, 0))
        high = bisect.bisect_left(self._sorted, (version, network + (1 << (_BITS[version] - length)), 0))
        if high - low <= most:
            return
        owing = []
        for key in self._sorted[low:high]:
            if self._paid[key] > now:
                owing.append(key)
            else:
                del self._paid[key]  # paid off: it would start afresh anyway
        if len(owing) <= most:
            self._sorted[low:high] = owing
            return
        debt = sum(self._paid.pop(key) - now for key in owing)
        del self._sorted[low:high]
        self._add(prefix, now + min(debt, self._most))

    def _shrink(self, now: float) -> None:
        """The table is full: drop what is paid off, then count the narrowest entries
        at their next wider prefix, level by level, until a quarter of it is free."""
        paid = {key: at for key, at in self._paid.items() if at > now}
        for level in range(_DEEPEST):
            if len(paid) <= self._max * 3 // 4:
                break
            folded: dict[Key, float] = {}
            for key, at in paid.items():
                wider = _wider(key) if _LEVEL_OF.get(key[::2]) == level else None
                if wider is None:
                    folded[key] = at  # (no other entry folds into it: none covers another)
                else:
                    folded[wider] = min(folded.get(wider, now) + at - now, now + self._most)
            paid = folded
        self._paid, self._sorted = paid, sorted(paid)


def _wider(key: Key) -> Key | None:
    """The next wider prefix of an entry; None past /8 (or for no IP address)."""
    version, network, length = key
    level = _LEVEL_OF.get((version, length))
    if level is None or level + 1 == len(_LEVELS[version]):
        return None
    wider = _LEVELS[version][level + 1]
    drop = _BITS[version] - wider
    return version, network >> drop << drop, wider


@functools.lru_cache(maxsize=4096)  # (the chain of a guesser's address is asked for on each of its requests)
def _chain(address: str) -> tuple[Key, ...]:
    """The entries that may count for ``address`` as :func:`client_address` gives it
    (an IPv4 address, an IPv6 /64; any other text is :data:`NOT_AN_IP`): its own
    first, then its wider prefixes."""
    version = 6 if ":" in address else 4
    try:
        number = int.from_bytes(socket.inet_pton(_FAMILY[version], address.partition("/")[0]))
    except (OSError, ValueError):
        return (_NO_IP,)
    bits = _BITS[version]
    return tuple((version, number >> (bits - length) << (bits - length), length) for length in _LEVELS[version])


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
