"""What the benchmark scripts observe inside vsqs handles, through seams of
the engine's parts rather than a handle's private members: the listings a
handle makes (``Listing.relist`` wrapped for the run), its listing cache and
the receipts it remembers (the parts' own attributes), and the window size
(``vsqs._core.listing.WINDOW``)."""

from __future__ import annotations

import sys
from typing import Any

from vsqs._core import listing as _listing
from vsqs._core import receipts as _receipts


def window() -> int:
    """How many names a handle keeps of one listing."""
    return int(_listing.WINDOW)


def set_window(size: int) -> None:
    """Handles made from now on keep at most ``size`` names of a listing."""
    _listing.WINDOW = size


class Probe:
    """Counts every handle's listings from now on and keeps the last listing
    cache that listed, and the last receipt memory made."""

    def __init__(self) -> None:
        self.listings = 0
        self.cache: Any = None
        self.receipts: Any = None
        relist, made = _listing.Listing.relist, _receipts.IssuedReceipts.__init__

        def counted(cache: Any, now: int) -> None:
            self.listings += 1
            self.cache = cache
            relist(cache, now)

        def remembered(issued: Any, size: int | None = None) -> None:
            made(issued, size)
            self.receipts = issued

        _listing.Listing.relist = counted  # type: ignore[method-assign]
        _receipts.IssuedReceipts.__init__ = remembered  # type: ignore[method-assign]

    def cache_bytes(self) -> int:
        """Bytes held by the last listing cache and receipt memory (objects and lists)."""
        total = 0
        cache, receipts = self.cache, self.receipts
        if cache is not None:
            total += sys.getsizeof(cache.visible) + sum(map(sys.getsizeof, cache.visible))
            for heap in (cache.hidden, cache.grouped):
                total += sys.getsizeof(heap) + sum(sys.getsizeof(x) + sys.getsizeof(x[1]) for x in heap)
        if receipts is not None:
            for generation in (receipts.new, receipts.old):
                total += sys.getsizeof(generation) + sum(
                    sys.getsizeof(k) + sys.getsizeof(v) + sys.getsizeof(v[0]) for k, v in generation.items()
                )
        return total
