"""Retention at receive: what a receive does with the messages past their
queue's ``retention`` it meets (docs/FORMAT.md, Retention).

A receive never delivers such a message: it removes it as gc would
(:func:`vsqs._core.fs.remove_message`: damage stays), at most
:data:`~vsqs._core.listing.REMOVALS_PER_CALL` a call. Nothing here may make
a receive raise while it holds messages it claimed, nor list again for a
name that stays: a failure is handed back for the receive to report.
"""

from __future__ import annotations

import threading

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import StorageError
from vsqs._core.layout import Layout
from vsqs._core.listing import Listing


def remove_candidate(
    layout: Layout, lock: threading.Lock, listing: Listing, name: str, parsed: _format.Name
) -> bool | StorageError | None:
    """Remove the candidate ``name``, past the queue's retention: True if this
    call unlinked it; False if it was not there (a racer claimed or removed it
    first, or a stray outside its shard); the error if it could not be looked at
    or unlinked (left in place, as after a lost claim: the receive goes on).
    Damage is never removed: ``None``, and the caller goes on with it as with
    any candidate (claimed, then reported). For a message of a group, the next
    one of its run becomes the group's candidate (Listing.skip_removed); when
    none was kept the listing is made stale, and the caller lists again only if
    this call removed the file (as a claim lets it), so a name that stays can
    never make a receive spin."""
    try:
        removed: bool | StorageError | None = _fs.remove_message(layout.message_file(name))
    except StorageError as exc:
        removed = exc
    if removed is not None and parsed.group_hash:
        with lock:
            listing.skip_removed(parsed.group_hash)
    return removed


def remove_listed(layout: Layout, names: list[str]) -> tuple[int, StorageError | None]:
    """Remove ``names``, past retention, that a listing kept aside (Listing.expired:
    members of groups, met in their group's order, and ready names it left out of
    its window; never candidates); damage stays, reported. How many this call
    unlinked, and the first failure, if any (the rest go on)."""
    failure: StorageError | None = None
    removed = 0
    for name in names:
        path = layout.message_file(name)
        try:
            gone = _fs.remove_message(path)
        except StorageError as exc:
            failure = failure or exc
            continue
        if gone is None:
            layout.report_damage(path, "not a regular file, or too large")
        removed += bool(gone)
    return removed, failure
