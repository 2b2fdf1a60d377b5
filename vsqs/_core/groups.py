"""FIFO message groups: at most N messages of a group in flight, across hosts.

Each of a group's N slots is a chain of lease files in the queue's
``.groups/`` directory, ``GROUP.SLOT.GEN``, each created with an exclusive
create and never rewritten; the highest generation tells the slot's state:
held until a time, or free. To take a slot a consumer reads the newest
generation, and if it is free or its time has passed, creates the next
generation: exactly one racer can. The holder frees or extends its slot the
same way, by creating the next generation, so no lock is ever left behind: a
consumer that dies holds its slot only until its lease runs out, like its
message.

Slots back up the rule every consumer follows anyway (deliver a group's
messages in order, none while N are in flight), so a stale or incomplete
listing cannot let two consumers past each other.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.format import SlotRef

_WRITE_GRACE = 10.0  # a lease file still empty after this long lost its writer
SWEEP_GRACE = 60.0  # a generation superseded this long ago can go


class GroupLeases:
    """The slot leases of one queue, with this handle's view of their newest generations."""

    def __init__(self, queue_path: str) -> None:
        self.mode: int | None = None  # the queue's file_mode, set by the queue
        self._dir = os.path.join(queue_path, _format.GROUPS_DIR)
        self._newest: dict[tuple[str, int], int] = {}
        self._ready = False

    def _path(self, group: str, index: int, gen: int) -> str:
        return os.path.join(self._dir, _format.lease_name(group, index, gen))

    def refresh(self) -> None:
        """Re-read the newest generations (with every listing of the queue)."""
        newest: dict[tuple[str, int], int] = {}
        if _fs.is_private_dir(self._dir):
            self._ready = True
            for name in _fs.list_names(self._dir):
                parsed = _format.parse_lease_name(name)
                if parsed is not None:
                    group, index, gen = parsed
                    newest[(group, index)] = max(gen, newest.get((group, index), 0))
        self._newest = newest

    def claim(self, group: str, limit: int, until_us: int, now_us: int, skew_us: int) -> SlotRef | None:
        """Take one of the group's ``limit`` slots until ``until_us``; None if all are held."""
        for index in range(limit):
            gen = self._newest.get((group, index), 0)
            if gen and not self._claimable(group, index, gen, now_us, skew_us):
                continue
            taken = self._next(group, index, gen, _format.encode_lease(until_us))
            if taken is not None:
                return taken
        return None

    def _claimable(self, group: str, index: int, gen: int, now_us: int, skew_us: int) -> bool:
        path = self._path(group, index, gen)
        data = _fs.read_control(path)
        if data is None:
            return False  # swept: our view is old, wait for the next listing
        until = _format.decode_lease(data)
        if until is None:  # being written, or its writer died
            written = _fs.mtime(path)
            return written is not None and written < time.time() - _WRITE_GRACE
        return until == 0 or until + skew_us <= now_us

    def _next(self, group: str, index: int, gen: int, content: bytes) -> SlotRef | None:
        """Create generation gen+1; None if someone else did first."""
        if not self._ready:
            _fs.make_dirs(self._dir, self.mode)
            self._ready = True
        self._newest[(group, index)] = gen + 1  # ours, or theirs: either way the newest we know
        path = self._path(group, index, gen + 1)
        if not _fs.create_exclusive(path, content, durable=False, mode=self.mode):
            return None
        if _fs.exists(self._path(group, index, gen + 2)):
            # our view was so old that gen+1 had been swept: the chain is further on
            _fs.unlink(path)
            return None
        return SlotRef(index, gen + 1)

    def extend(self, group: str, slot: SlotRef, until_us: int) -> SlotRef | None:
        """Hold the slot until ``until_us``; None if it was lost (its lease ran out and was taken)."""
        return self._next(group, slot.index, slot.gen, _format.encode_lease(until_us))

    def held_until(self, group: str, index: int, until_us: int) -> SlotRef | None:
        """The slot's newest generation if it is a lease until exactly ``until_us``
        (the one its holder last wrote), else None: the slot went to someone else."""
        self.refresh()
        gen = self._newest.get((group, index), 0)
        data = _fs.read_control(self._path(group, index, gen)) if gen else None
        if data is None or _format.decode_lease(data) != until_us:
            return None
        return SlotRef(index, gen)

    def free(self, group: str, slot: SlotRef) -> None:
        """Give the slot up (after delete or release)."""
        self._next(group, slot.index, slot.gen, _format.FREE_LEASE)

    def free_purged(self, held: dict[str, set[int]]) -> int:
        """Free the slots whose newest lease is one of ``held`` (group -> the
        UNTILs of its in-flight messages a purge removed); how many were freed.

        A slot holds its message's UNTIL exactly (a claim and an extend write
        the same time into the lease and the name), so a slot taken since by
        another receive (another UNTIL) is left alone; a holder that frees or
        extends after this finds generation gen+1 taken: harmless."""
        if not held or not _fs.is_private_dir(self._dir):
            return 0
        self.refresh()
        freed = 0
        for (group, index), gen in list(self._newest.items()):
            untils = held.get(group)
            if not untils:
                continue
            data = _fs.read(self._path(group, index, gen))
            if data is not None and _format.decode_lease(data) in untils:
                freed += self._next(group, index, gen, _format.FREE_LEASE) is not None
        return freed

    def sweep(self, grace: float = SWEEP_GRACE) -> int:
        """Remove generations superseded more than ``grace`` seconds ago, oldest
        first, so the files left of a slot are its first and its newest ones."""
        if not _fs.is_private_dir(self._dir):
            return 0
        chains: dict[tuple[str, int], list[int]] = defaultdict(list)
        for name in _fs.list_names(self._dir):
            parsed = _format.parse_lease_name(name)
            if parsed is not None:
                chains[(parsed[0], parsed[1])].append(parsed[2])
        cutoff = time.time() - grace
        removed = 0
        for (group, index), gens in chains.items():
            gens.sort()
            # generation 1 stays: a handle that never saw the chain cannot start it again
            for gen, successor in zip(gens[1:], gens[2:], strict=False):
                superseded = _fs.mtime(self._path(group, index, successor))
                if superseded is None or superseded > cutoff:
                    break
                removed += _fs.unlink(self._path(group, index, gen))
        return removed
