"""Wrong API keys, counted per client address and per wider prefix, so that guessing the key is slow.

The native API (``Authorization: Bearer KEY``, ``X-Api-Key``), the
console's sign-in form and the SQS face (a SigV4 signature, whose secret is
the API key when no AWS key pairs are configured, else theirs) check the
same key or a secret like it: one count, kept in token buckets (each as the
time its debt is paid off). Every wrong key is charged to its address and to
each of the address's wider prefixes (IPv4 /24, /16, /8; IPv6 /56, /48 ...
/8, eight bits a step):

* an address may present ``BURST`` wrong keys, then one more every
  ``PER_GUESS`` seconds;
* a prefix, as a whole, as many as ``SHARE`` addresses for a /24 or /56,
  four times as many each step wider (:func:`share`): a /24 320 wrong keys,
  then 32 every 6 seconds; a /16 1,280, then 128; a /8 5,120, then 512
  (IPv6: a /56 as a /24, a /48 as a /16, a /40 as a /8, a /32 20,480 ...).

While the bucket of an address, or of one of its prefixes, is spent, every
request of that address that presents a key, right or wrong, is answered 429
with ``Retry-After``, without the key being compared: a guesser learns
nothing while refused. A prefix's bucket holds its addresses back only while
wrong keys come from under it faster than its share: a spent one lets one
more through every ``PER_GUESS / share`` seconds, and is full again a minute
after the last. A request that presents no key is not a guess and is never
counted. Each gateway process keeps its own count (``--workers N`` allows N
times as many guesses). An address is what a guesser cannot multiply
cheaply: an IPv4 address, an IPv6 /64 (one host's share: it may use any
address in it), and one, without prefixes, for all that is no IP address at
all (:func:`client_address`).

An address that showed the right key (:meth:`KeyGuesses.right`) in the last
``TRUST_SECONDS`` is trusted (the ``TRUSTED`` that showed it last are
remembered): its wrong keys are charged to its own bucket alone, and its
prefixes' buckets never hold it back, so that the wrong keys of its
neighbours (a guesser's, or clients that still hold a rotated key) never stop
a client that holds the key. A key is compared only when its address is not
held back, so only a client that holds the key becomes trusted.

Memory is bounded: ``MAX_ADDRESSES`` buckets and ``TRUSTED`` trusted
addresses, a few hundred bytes each. A bucket added to a full table makes
room by forgetting the one charged longest ago (a /8's is kept: at most 513
of them), so that each wrong key costs a few dictionary steps a level and
no pass over the table. A bucket forgotten while it still owes leaves the
time it is paid off (at most a spent bucket's: one burst from now) with the
nearest wider bucket kept, as its ``floor``: every bucket under that one
that has no entry counts as owing until then. Forgetting so gives a guesser
no fresh budget; it costs an untrusted address under a forgotten bucket its
burst and a wait of ``PER_GUESS`` at most, for a minute at most after it.
A bucket paid off holds nothing back: it is dropped when an address under it
next presents a key, or forgotten first when room is needed.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from vsqs._gateway.limits import KEY_GUESS_ADDRESSES as MAX_ADDRESSES
from vsqs._gateway.limits import KEY_GUESS_BURST as BURST
from vsqs._gateway.limits import KEY_GUESS_LONGEST_WAIT as LONGEST_WAIT
from vsqs._gateway.limits import KEY_GUESS_PREFIX_SHARE as SHARE
from vsqs._gateway.limits import KEY_GUESS_SECONDS as PER_GUESS
from vsqs._gateway.limits import KEY_GUESS_TRUST_SECONDS as TRUST_SECONDS
from vsqs._gateway.limits import KEY_GUESS_TRUSTED as TRUSTED

_LONGEST_IP = 64  # characters of an IP address's text (45, and an IPv6 zone's name)
NOT_AN_IP = "?"  # the one address of every client that has none (a Unix socket, a proxy's odd X-Forwarded-For)
_GROWTH = 4  # a prefix's share is this many times its next narrower one's
_REFRESH = 60.0  # seconds: a trusted address's time is renewed at most this often (most right keys cost a lookup)

Key = tuple[int, int, int]  # (IP version, the prefix's network as an int, its length); (0, 0, 0): no IP address
_NO_IP: Key = (0, 0, 0)
_BITS = {4: 32, 6: 128}
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}
_LEVELS = {0: (0,), 4: (32, 24, 16, 8), 6: (64, 56, 48, 40, 32, 24, 16, 8)}  # an address's bucket first, then wider
_MASKS = {version: [((1 << _BITS[version]) - (1 << (_BITS[version] - length)), length) for length in lengths[::-1]]
          for version, lengths in _LEVELS.items() if version}  # the chain of an address (below): widest first
_LEVEL_OF = {(version, length): level for version, lengths in _LEVELS.items() for level, length in enumerate(lengths)}
_DEEPEST = max(len(lengths) for lengths in _LEVELS.values()) - 1
# (version, length) of the buckets a full table may forget, a wider one being kept: all but the /8s and no IP's
_FORGETTABLE = frozenset(kind for kind, level in _LEVEL_OF.items() if level + 1 < len(_LEVELS[kind[0]]))


def share(level: int, first: int = SHARE) -> int:
    """How many addresses' wrong keys a bucket of ``level`` may take: 1 for an
    address (level 0), ``first`` for a /24 or /56, four times as many each level wider."""
    return 1 if level == 0 else first * _GROWTH ** (level - 1)


class KeyGuesses:
    """The count of wrong keys by client address and by its wider prefixes, and the addresses that showed the key."""

    def __init__(
        self, burst: int = BURST, per_guess: float = PER_GUESS, max_addresses: int = MAX_ADDRESSES,
        clock: Callable[[], float] = time.monotonic, prefix_share: int = SHARE, longest_wait: float = LONGEST_WAIT,
        trusted: int = TRUSTED, trust_seconds: float = TRUST_SECONDS,
    ) -> None:
        self._max = max_addresses
        self._clock = clock
        self._most_trusted = trusted
        self._trust = trust_seconds
        self._spent = burst * per_guess  # a bucket's debt (seconds) once its whole burst is spent, at any level
        levels = []  # (a wrong key's debt, the debt a bucket may owe and still guess, the largest debt kept)
        for level in range(_DEEPEST + 1):
            step = per_guess / share(level, prefix_share)
            levels.append((step, self._spent - step, self._spent - step + longest_wait))
        self._free = levels[0][1]  # an address's
        self._own = levels[0]
        self._rows = {len(lengths): tuple(levels[: len(lengths)][::-1]) for lengths in _LEVELS.values()}  # as chains
        self._lock = threading.Lock()  # (the console's sign-in runs on the event loop, the API too: cheap)
        # -> [when its debt is paid off, its floor (the module's doc)], the one charged longest ago first
        self._buckets: OrderedDict[Key, list[float]] = OrderedDict()
        # address -> [when it last showed the key, when its own bucket is paid off], the longest unseen first
        self._trusted: OrderedDict[str, list[float]] = OrderedDict()
        self._trusted_owe = False  # whether a trusted address has presented a wrong key

    def wait(self, address: str) -> int:
        """Seconds (rounded up) before ``address`` may present a key again; 0: now."""
        trusted = self._trusted.get(address)
        if trusted is not None:
            now = self._clock()
            if now - trusted[0] <= self._trust:
                return _seconds(trusted[1] - now - self._free)
        chain = _chain(address)
        buckets = self._buckets
        if trusted is None and chain[0] not in buckets and chain[-1] not in buckets \
                and not any(key in buckets for key in chain):  # (the common case: no lock)
            return 0
        with self._lock:
            now = self._clock()
            late = self._late(chain, now)
            if trusted is not None:  # trusted no longer: its own bucket counts as well as the table's
                late = max(late, trusted[1] - now - self._free)
        return _seconds(late)

    def counts_any(self) -> bool:
        """Whether any address has presented a wrong key lately (else none need be told apart)."""
        return bool(self._buckets) or self._trusted_owe

    def __len__(self) -> int:
        """Buckets held (addresses and prefixes)."""
        return len(self._buckets)

    def wrong(self, address: str) -> None:
        """``address`` presented a wrong key."""
        with self._lock:
            now = self._clock()
            own = -math.inf  # a formerly trusted address's own bucket
            trusted = self._trusted.get(address)
            if trusted is not None:
                if now - trusted[0] <= self._trust:
                    step, _, most = self._own
                    trusted[1] = min(max(trusted[1], now) + step, now + most)
                    self._trusted_owe = True
                    return
                own = self._trusted.pop(address)[1]
            chain = _chain(address)
            buckets = self._buckets
            floor = -math.inf
            for key, (step, _, most) in zip(chain, self._rows[len(chain)], strict=True):  # the widest first:
                entry = buckets.get(key)  # (its floor counts for the narrower ones)
                if entry is None:
                    paid = floor
                    entry = buckets[key] = [paid, -math.inf]
                else:
                    buckets.move_to_end(key)
                    paid = entry[0]
                    if entry[1] > floor:
                        floor = entry[1]
                if key is chain[-1] and own > paid:
                    paid = own
                entry[0] = min((paid if paid > now else now) + step, now + most)
            self._make_room(now)

    def right(self, address: str) -> None:
        """``address`` presented the right key: it is trusted for ``TRUST_SECONDS``. Called for
        every request that presents the right key: most return after one lookup."""
        trusted = self._trusted.get(address)
        if trusted is not None and self._clock() - trusted[0] < _REFRESH:
            return
        with self._lock:
            now = self._clock()
            trusted = self._trusted.get(address)
            if trusted is not None:
                trusted[0] = now
                self._trusted.move_to_end(address)
                return
            entry = self._buckets.get(_chain(address)[-1])  # its own debt goes with it (none of its prefixes')
            self._trusted[address] = [now, entry[0] if entry is not None else -math.inf]
            if len(self._trusted) > self._most_trusted:
                forgotten, (_, paid) = self._trusted.popitem(last=False)
                if paid > now:  # its own debt is the table's again
                    entry = self._buckets.setdefault(_chain(forgotten)[-1], [-math.inf, -math.inf])
                    entry[0] = max(entry[0], paid)
                    self._make_room(now)

    def _late(self, chain: tuple[Key, ...], now: float) -> float:
        """How far the most indebted bucket of ``chain`` is past the debt it may owe and still
        guess; those of its buckets that are paid off, floor and all, are dropped (they hold nothing)."""
        buckets = self._buckets
        late = floor = -math.inf
        for key, (_, free, _) in zip(chain, self._rows[len(chain)], strict=True):  # the widest first
            entry = buckets.get(key)
            if entry is None:
                paid = floor
            elif entry[0] <= now and entry[1] <= now:
                del buckets[key]
                continue
            else:
                paid = entry[0]
                if entry[1] > floor:
                    floor = entry[1]
            if paid - now - free > late:
                late = paid - now - free
        return late

    def _make_room(self, now: float) -> None:
        """Forget the buckets charged longest ago (a /8's is kept) until the table holds
        ``MAX_ADDRESSES``; each that still owes leaves its time as a floor above it."""
        buckets = self._buckets
        kept = 0  # /8s passed over (at most 513: the loop ends)
        while len(buckets) > self._max and kept < len(buckets):
            key, (paid, floor) = buckets.popitem(last=False)
            until = paid if paid > floor else floor
            if until <= now:
                continue  # paid off: it would start full anyway
            if (key[0], key[2]) not in _FORGETTABLE:
                buckets[key] = [paid, floor]  # (to the end: the next one charged longest ago comes first)
                kept += 1
                continue
            self._leave_floor(key, min(until, now + self._spent))

    def _leave_floor(self, key: Key, until: float) -> None:
        """Every bucket under the nearest wider one kept (or made: a /8's) counts as owing until ``until``."""
        wider = _wider(key)
        while wider is not None:
            above = _wider(wider)
            entry = self._buckets.get(wider)
            if entry is None and above is None:
                entry = self._buckets[wider] = [-math.inf, -math.inf]
            if entry is not None:
                entry[1] = max(entry[1], until)
                self._buckets.move_to_end(wider)
                return
            wider = above


def _seconds(late: float) -> int:
    """A wait as whole seconds, rounded up; 0 if there is none."""
    return 0 if late <= 0 else max(1, math.ceil(late))


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
    """The buckets that count for ``address`` as :func:`client_address` gives it
    (an IPv4 address, an IPv6 /64; any other text is :data:`NOT_AN_IP`): its
    widest prefix first, its own bucket last."""
    version = 6 if ":" in address else 4
    try:
        number = int.from_bytes(socket.inet_pton(_FAMILY[version], address.partition("/")[0]))
    except (OSError, ValueError):
        return (_NO_IP,)
    return tuple([(version, number & mask, length) for mask, length in _MASKS[version]])


def client_address(scope: Mapping[str, Any]) -> str:
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
