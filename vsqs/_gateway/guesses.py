"""Wrong API keys, counted per client address, so that guessing the key is slow.

The native API (``Authorization: Bearer KEY``, ``X-Api-Key``) and the
console's sign-in form check the same key. Each address may present a wrong
one ``BURST`` times; after that, one more guess every ``PER_GUESS`` seconds
(a token bucket), and until then every request of that address that presents
a key, right or wrong, is answered 429 with ``Retry-After``, without the key
being compared: a guesser learns nothing while refused. A request that
presents no key is not a guess and is never counted. Each gateway process
keeps its own count (``--workers N`` allows N times as many guesses), in
memory bounded by ``MAX_ADDRESSES``: the address idle longest is forgotten
first.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

BURST = 10  # wrong keys an address may present at once ...
PER_GUESS = 6.0  # ... then one every this many seconds
MAX_ADDRESSES = 10_000  # addresses remembered (each a few hundred bytes)


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
        with self._lock:
            if address not in self._left:
                return 0
            left = self._now_left(address, self._clock())
        return 0 if left >= 1 else max(1, math.ceil((1 - left) * self._per_guess))

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
    """The peer's address as the server saw it (``?`` if unknown: a Unix socket)."""
    client = scope.get("client")
    return str(client[0]) if client else "?"
