"""De-duplication ids: publishing twice stores one message.

A de-duplication id (per group, if any, unless the queue's ``dedup_scope``
is ``queue``) is reserved by a chain of files in
the queue's ``.dedup/`` directory, ``HASH.GEN`` (GEN = 1, 2, ...), each created
with an exclusive create and never rewritten; the newest says who holds the
id: ``KEY`` (reserved for message KEY while it is in the queue) or
``gone TIME KEY`` (KEY left the queue at about TIME; reserved for the
``dedup_window`` after that). A publisher reads the newest generation; if it
still reserves the id, it stores nothing and returns KEY; otherwise it creates
the next generation for its own new key (one racer wins) and publishes.

A publisher writes its message's ``.new`` file first and reserves the id
after, so a reservation always has a message, or a publisher at work, behind
it. A publisher that fails or dies half-way leaves a pending reservation
whose message is absent (or a stale ``.new`` file): the next publisher takes
the id over; a pending id never counts as published, so no window keeps it.
Nothing stays reserved forever, and ``gc`` removes dead chains.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import defaultdict
from collections.abc import Callable

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import InvalidArgument
from vsqs._core.limits import MAX_DEDUP_ID
from vsqs._core.rules import is_dedup_id

DEDUP_DIR = ".dedup"
WRITE_GRACE = 5.0  # a .new file or empty reservation this old lost its writer
_POLL = 0.01


def dedup_hash(dedup_id: object, group: str | None) -> str:
    if not is_dedup_id(dedup_id):
        raise InvalidArgument(f"dedup_id must be a str of 1-{MAX_DEDUP_ID} characters, not {dedup_id!r}")
    scope = (group or "") + "\x00" + dedup_id
    return hashlib.sha256(scope.encode("utf-8")).hexdigest()[:32]


def _parse(data: bytes) -> tuple[str, str, float] | None:
    """(kind, key, gone_at) of a generation: kind "pending", "published" or
    "gone"; None if unreadable (being written, or torn)."""
    parts = data.decode("ascii", "replace").split()
    if len(parts) == 1 and _format.is_key(parts[0]):
        return "published", parts[0], 0.0
    if len(parts) == 2 and parts[0] == "pending" and _format.is_key(parts[1]):
        return "pending", parts[1], 0.0
    if len(parts) == 3 and parts[0] == "gone" and _format.is_key(parts[2]):
        try:
            return "gone", parts[2], float(parts[1])
        except ValueError:
            return None
    return None


class Reservations:
    """The de-duplication reservations of one queue."""

    def __init__(self, queue_path: str) -> None:
        self.mode: int | None = None  # the queue's file_mode, set by the queue
        self._dir = os.path.join(queue_path, DEDUP_DIR)

    def _path(self, digest: str, gen: int) -> str:
        return os.path.join(self._dir, f"{digest}.{gen}")

    def _newest(self, digest: str) -> int:
        """The newest generation (0: none), by galloping stats: chains are contiguous from 1."""
        if not _fs.exists(self._path(digest, 1)):
            return 0
        low, high = 1, 2
        while _fs.exists(self._path(digest, high)):
            low, high = high, high * 2
        while high - low > 1:  # low exists, high does not
            middle = (low + high) // 2
            if _fs.exists(self._path(digest, middle)):
                low = middle
            else:
                high = middle
        return low

    def reserve(
        self, digest: str, new_key: str, window: float, presence: Callable[[str], str | None]
    ) -> tuple[str | None, int]:
        """Reserve the id for ``new_key`` (as pending): (None, generation made);
        or, if a message holds it, (its key, 0).

        ``presence(key)`` tells whether a message is in the queue ("live"),
        being written by a publisher that may be at work ("writing"), or neither.
        """
        _fs.make_dirs(self._dir, self.mode)
        deadline = time.monotonic() + WRITE_GRACE + 1
        pause = _POLL
        while True:
            gen = self._newest(digest)
            if gen:
                holder = self._holder(digest, gen, new_key, window, presence)
                if holder == new_key:
                    return None, gen  # ours: a create that reported an error had succeeded
                if holder == "":  # undecided: a publisher is at work; look again soon
                    if time.monotonic() < deadline:
                        time.sleep(pause)
                        pause = min(pause * 2, 0.2)
                        continue
                elif holder is not None:
                    return holder, 0
            pending = f"pending {new_key}\n".encode()
            # not fsynced: a reservation lost in a crash can only let a duplicate in
            if _fs.create_exclusive(self._path(digest, gen + 1), pending, durable=False, mode=self.mode):
                return None, gen + 1
            # another publisher reserved it first (or our create was ambiguous): look again

    def peek(self, digest: str, window: float, presence: Callable[[str], str | None]) -> str | None:
        """The key holding the id now, if any (a first look: reserving decides)."""
        gen = self._newest(digest)
        if not gen:
            return None
        parsed, writing = self._readable(digest, gen)
        if writing or parsed is None:
            return None
        kind, key, gone_at = parsed
        if kind == "gone":
            return key if gone_at + window > time.time() else None
        return key if presence(key) == "live" else None

    def confirm(self, digest: str, gen: int, key: str) -> None:
        """Mark the reservation made at ``gen`` published (its message is in the queue)."""
        _fs.create_exclusive(self._path(digest, gen + 1), key.encode() + b"\n", durable=False, mode=self.mode)

    def _holder(
        self,
        digest: str,
        gen: int,
        new_key: str,
        window: float,
        presence: Callable[[str], str | None],
    ) -> str | None:
        """Who holds the id, ``gen`` being the newest generation: a key, None
        (nobody), or "" (can't tell yet). A generation its writer left empty
        does not count: the one before it does."""
        parsed, writing = self._readable(digest, gen)
        if writing:
            return ""
        if parsed is None:
            return None
        kind, key, gone_at = parsed
        if key == new_key:
            return key
        now = time.time()
        if kind == "gone":
            return key if gone_at + window > now else None
        state = presence(key)
        if state == "live":
            return key
        if state == "writing":
            return ""  # its publisher is at work: wait to see it finish
        if kind == "pending" or window <= 0:
            return None  # never published (its publisher failed), or no window to keep
        # published, now gone: mark when it was first seen gone; the window runs from there
        record = f"gone {now:.6f} {key}\n".encode()
        if _fs.create_exclusive(self._path(digest, gen + 1), record, durable=False, mode=self.mode):
            return key
        return ""

    def _readable(self, digest: str, gen: int) -> tuple[tuple[str, str, float] | None, bool]:
        """The newest generation that parses, at or below ``gen``; and whether
        a newer one is still being written."""
        for older in range(gen, 0, -1):
            path = self._path(digest, older)
            data = _fs.read_control(path)
            parsed = _parse(data) if data else None
            if parsed is not None:
                return parsed, False
            written = _fs.mtime(path)
            if written is not None and written > time.time() - WRITE_GRACE:
                return None, True
        return None, False

    def forget(self, keys: set[str]) -> int:
        """Free the ids held by the messages ``keys`` (a purge removed them): each chain whose newest
        generation names one of them gets ``gone 0 KEY``, a window that ended long ago. A chain a
        publisher moved on meanwhile (its newest names another key, or is being written) is left
        alone; a lost create is looked at again. One read a chain: its newest generation is the
        listing's (a newer one made since makes the create fail, and is found then). How many ids
        were freed."""
        if not keys or not _fs.is_private_dir(self._dir):
            return 0
        chains: dict[str, int] = {}
        for name in _fs.list_names(self._dir):
            digest, _, number = name.partition(".")
            if len(digest) == 32 and number.isdigit() and int(number) > chains.get(digest, 0):
                chains[digest] = int(number)
        freed = 0
        for digest, gen in chains.items():
            while gen:
                parsed, writing = self._readable(digest, gen)
                if writing or parsed is None or parsed[1] not in keys or (parsed[0] == "gone" and parsed[2] == 0):
                    break
                mark = f"gone 0 {parsed[1]}\n".encode()
                if _fs.create_exclusive(self._path(digest, gen + 1), mark, durable=False, mode=self.mode):
                    freed += 1
                    break
                gen = self._newest(digest)  # a publisher moved the chain on since the listing: look again
        return freed

    def sweep(self, window: float, present: set[str]) -> int:
        """Remove chains whose id nobody holds any more, oldest generation first.
        ``present``: the keys of every message in the queue (one listing)."""
        if not _fs.is_private_dir(self._dir):
            return 0
        chains: dict[str, list[int]] = defaultdict(list)
        for name in _fs.list_names(self._dir):
            digest, _, number = name.partition(".")
            if len(digest) == 32 and number.isdigit():
                chains[digest].append(int(number))
        removed = 0
        for digest, gens in chains.items():
            gens.sort()
            written = _fs.mtime(self._path(digest, gens[-1]))
            parsed, _ = self._readable(digest, gens[-1])
            if written is None or written > time.time() - max(WRITE_GRACE, window) - 60:
                continue  # recent: leave it
            if parsed is not None and parsed[0] != "gone" and parsed[1] in present:
                continue  # its message is still here
            if parsed is not None and parsed[0] == "published" and window > 0:
                # gone since it was published, at some moment after this file was
                # written: the window starts now, as for a publisher that finds it gone
                now = time.time()
                mark = f"gone {now:.6f} {parsed[1]}\n".encode()
                _fs.create_exclusive(self._path(digest, gens[-1] + 1), mark, durable=False, mode=self.mode)
                continue
            if parsed is not None and parsed[0] == "gone" and parsed[2] + window > time.time():
                continue
            for gen in gens:
                removed += _fs.unlink(self._path(digest, gen))
        return removed
