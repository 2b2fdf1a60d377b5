"""Which names a listing keeps: the first of a window, dealt to shares.

Pure functions over lists of names (no I/O): the listing (``listing.py``)
keeps the first WINDOW names of a directory in delivery order, and a handle
that takes a share of the queue first (``Queue.prefer_share``) gets them
dealt in two heaps.
"""

from __future__ import annotations

import heapq
from typing import Any

from vsqs._core import format as _format
from vsqs._core.limits import SHARE_DIGITS


def first(items: list[Any], n: int) -> list[Any]:
    """The ``n`` smallest of ``items`` as a heap (``items`` itself, heapified, if
    there are no more than ``n``).

    For a long list, a sorted sample gives a cutoff, the items below it are
    sorted (a sorted list is a heap) and cut to ``n``: much cheaper than a heap
    selection over a million names. Any cutoff yields an exact prefix of the
    sorted order; if the sample set it too low, a heap selection does it.
    """
    if len(items) <= n:
        heapq.heapify(items)
        return items
    step = max(1, len(items) // 4096)
    sample = sorted(items[::step])
    cutoff = sample[min(len(sample) - 1, (n + n // 4) // step)]  # some slack: usually > n pass
    below = [item for item in items if item <= cutoff]
    if len(below) < n:
        return heapq.nsmallest(n, items)
    below.sort()
    del below[n:]
    return below


def deal(names: list[str], share: frozenset[str]) -> tuple[list[str], list[str]]:
    """``names`` (a heap of ready names) dealt for a handle that takes a share
    first: the names of the share, of the best priority present, as a heap;
    and the rest as another, for once those are taken. Consumers that split
    a queue's messages among them (the partitions of a Spark micro-batch)
    then race for the same names far less. A message's share is the last
    SHARE_DIGITS hex digits of its KEY (random); no lower priority comes
    before a higher one (names that come back later go to the rest if their
    priority is below its best: ``Listing._push_ready``); a foreign name is
    dealt to the rest."""
    best = names[0][:1]
    if not _format.is_message_name(names[0]):  # a foreign name first: the best priority of the messages
        best = min((name[:1] for name in names if _format.is_message_name(name)), default=best)
    end = _format.KEY_LENGTH
    start = end - SHARE_DIGITS
    mine = [name for name in names if name[start:end] in share and name[:1] == best]
    if not mine:
        return names, []
    rest = [name for name in names if not (name[start:end] in share and name[:1] == best)]
    heapq.heapify(mine)
    heapq.heapify(rest)
    return mine, rest


def first_messages(names: list[str], n: int) -> tuple[list[str], bool]:
    """The ``n`` first message names of ``names`` (as :func:`first`), none of
    them foreign, and whether any message name was left out. When the window
    leaves names out, a foreign name must not take a place in it, or foreign
    names first in order could starve every message."""
    kept = first(names, n)
    while len(kept) < len(names):
        foreign = {name for name in kept if not _format.is_message_name(name)}
        if not foreign:
            # fresh copies, packed together: the originals lie scattered among the
            # whole listing's strings and would keep all their memory pages alive
            return "\0".join(kept).split("\0"), True  # no file name holds a NUL
        names = [name for name in names if name not in foreign]
        kept = first(names, n)
    return kept, False
