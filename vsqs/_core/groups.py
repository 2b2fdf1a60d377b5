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

**Runs.** With one slot (N = 1), one receive may take a group's next
messages together, as Amazon SQS FIFO does: a *run*, held on the one lease,
whose form every version reads (``UNTIL``, never below a member's in
flight). Beside the chain, in names older versions ignore: marks
``GROUP.S.RUN.dI`` (member I done) and ``xI`` (its message left the queue),
and records ``GROUP.S.GEN.r`` naming the runs a generation holds. A run's
last mark settles it through the record: frees the slot, or leaves it to
the runs left. **Hand-over:** while the lease is in force, a receive of runs
takes the group's visible prefix; the record names every member in flight,
so a member a listing misses is never passed over. See FORMAT.md, Runs.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections import defaultdict

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import StorageError
from vsqs._core.format import SlotRef

log = logging.getLogger("vsqs")

_WRITE_GRACE = 10.0  # a lease file still empty after this long lost its writer
SWEEP_GRACE = 60.0  # a generation superseded this long ago can go
_WALK_MAX = 1 << 16  # the longest step of a search for a chain's newest generation
_RAISE_TRIES = 100  # reads of a chain a run's extension makes before it gives up (stale: a delay)
# a run's extension that finds the newest generation younger than _WRITE_GRACE without its
# record waits this long, this many times, for it (then writes on without one: a delay)
_RECORD_WAIT = 0.005
_RECORD_WAITS = 200


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
        """Re-read the newest generations (with every listing of the queue).

        A chain only grows, so a generation this handle already knows to exist
        (it wrote it, or found it by name) outlives a listing that does not
        show it yet: a network filesystem's client may serve a directory
        listing from its cache long after another host moved the chain on."""
        newest: dict[tuple[str, int], int] = {}
        if _fs.is_private_dir(self._dir):
            self._ready = True
            for name in _fs.list_names(self._dir):
                parsed = _format.parse_lease_name(name)
                if parsed is not None:
                    group, index, gen = parsed
                    newest[(group, index)] = max(gen, newest.get((group, index), 0))
        known = self._newest
        for key, gen in newest.items():  # (only chains listed: memory stays bounded by the listing)
            # kept only while it exists (one lookup per chain the listing lags on):
            # a chain deleted and made again (the queue was) starts over below it
            if known.get(key, 0) > gen and _fs.exists(self._path(key[0], key[1], known[key])):
                newest[key] = known[key]
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

    def _next(self, group: str, index: int, gen: int, content: bytes, lone: bool = True) -> SlotRef | None:
        """Create generation gen+1; None if someone else did first. ``lone``: the
        writer holds the slot alone (a claim, or its holder's free or extend), so a
        generation 1 in force was never superseded; not so for runs, whose
        hand-overs and settles write above a generation 1 in force."""
        if not self._ready:
            _fs.make_dirs(self._dir, self.mode)
            self._ready = True
        path = self._path(group, index, gen + 1)
        # (known only once it exists: a create that failed, a full disk, made nothing to keep)
        if not _fs.create_exclusive(path, content, durable=False, mode=self.mode):
            self._newest[(group, index)] = self._newest_beyond(group, index, gen + 1)
            return None
        self._newest[(group, index)] = gen + 1
        # our view was so old that gen+1 had been swept: the chain is further on
        if _fs.exists(self._path(group, index, gen + 2)):
            self._newest[(group, index)] = gen + 2  # (ours goes: the newest known is one that stays)
            _fs.unlink(path)
            return None
        if gen == 1 and not (lone and self._in_force(group, index, 1)) and self._listed_beyond(group, index, 2):
            # (sweeps leave generation 1 and a gap after it, of any length: made
            # 2, which happens once a chain, look at the whole listing)
            _fs.unlink(path)
            return None
        return SlotRef(index, gen + 1)

    def _in_force(self, group: str, index: int, gen: int) -> bool:
        """Whether generation ``gen`` is a lease that has not run out by this
        host's clock. Lease files are never rewritten, so one in force now
        was in force since it was made: no one could take the slot over it
        (a claimer on another host waits for UNTIL + skew, its clock within
        the skew of ours), so no later generation was made and swept. The
        usual case of making generation 2, its holder settling its own first
        lease, needs no listing then: one small read, not a listing of every
        group's chain."""
        data = _fs.read_control(self._path(group, index, gen))
        until = _format.decode_lease(data) if data else None
        return until is not None and until > _format.now_us()

    def _listed_beyond(self, group: str, index: int, gen: int) -> bool:
        """Whether a listing shows a generation of the slot after ``gen`` (and
        if so, this handle's view moves to the newest it shows)."""
        newest = max((parsed[2] for parsed in map(_format.parse_lease_name, _fs.list_names(self._dir))
                      if parsed is not None and parsed[:2] == (group, index)), default=0)
        if newest <= gen:
            return False
        self._newest[(group, index)] = newest
        return True

    def _newest_beyond(self, group: str, index: int, gen: int) -> int:
        """The newest generation at or after ``gen``, which exists (another
        handle just created it), found by name: doubling steps, then halving.
        The generations from any existing one after the first up to the
        newest all exist (sweeps remove the oldest first; from generation 1 it
        may stop at the gap after it, see :meth:`_next`); a lookup a
        client cache answers "missing" for a file that exists only finds an
        older generation, which the next exclusive create corrects. At most
        about 2 x log2(distance) lookups, capped."""
        low, step = gen, 1  # low exists
        while step <= _WALK_MAX and _fs.exists(self._path(group, index, low + step)):
            low += step
            step *= 2
        high = low + step  # taken for missing (or beyond the cap)
        while high - low > 1:
            middle = (low + high) // 2
            if _fs.exists(self._path(group, index, middle)):
                low = middle
            else:
                high = middle
        return low

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

    def holds(self, group: str, slot: SlotRef, until_us: int) -> bool:
        """Whether generation ``slot.gen`` of the slot is the lease until exactly
        ``until_us``: the one the claim or extend of a message hidden until then
        wrote. A receipt from outside is checked so before it frees or extends
        its slot: one whose ``S.GEN`` was altered to another holder's would
        otherwise open the group to one more consumer than it allows."""
        data = _fs.read_control(self._path(group, slot.index, slot.gen))
        return data is not None and _format.decode_lease(data) == until_us

    def free_purged(self, held: dict[str, set[int]], removed: dict[str, set[str]]) -> int:
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
            runs = self.record(group, index, gen)
            if runs is not None and not {key for entry in runs for key in entry.keys} <= (
                    removed.get(group, set()) | self.gone_members(group, runs)):
                continue  # a member of the runs held may be in flight (taken over meanwhile): the lease runs out
            if data is not None and _format.decode_lease(data) in untils:
                freed += self._next(group, index, gen, _format.FREE_LEASE) is not None
        return freed

    # -- runs ----------------------------------------------------------------

    def _newest_from(self, group: str, index: int, hint: int) -> tuple[int, int | None] | None:
        """The slot's newest generation (looked for from ``hint`` on) and its
        lease (UNTIL, 0 if free, None if unreadable); None if it cannot be
        read (swept under us: taken for lost).

        Generation 1 is never swept while those after it are, so a walk from
        1 could stop at a gap and take 1 for the newest: a run member's
        receipt still at 1 lists instead (as does one whose generation went);
        from what this handle knows, if newer (a retry lists only once)."""
        hint = max(hint, self._newest.get((group, index), 0))
        if hint == 1 or not _fs.exists(self._path(group, index, hint)):  # (a gap after 1, or swept): list
            self.refresh()
            hint = max(hint, self._newest.get((group, index), 0))
        gen = hint
        while _fs.exists(self._path(group, index, gen + 1)):
            gen += 1
        data = _fs.read_control(self._path(group, index, gen))
        if data is None:
            return None
        self._newest[(group, index)] = max(gen, self._newest.get((group, index), 0))
        return gen, _format.decode_lease(data)

    def run_extend(self, group: str, slot: SlotRef, until_us: int, new_until: int, skew_us: int) -> SlotRef | None:
        """Let a member of a run (now hidden until ``until_us``) be hidden until
        ``new_until``: raise the slot's lease to it if it is lower. The slot as
        now known, or None if the run may have lost it (the member's own lease
        had run out when the chain was read: then no generation is provably
        the run's, and nothing is written)."""
        waited = 0
        for _ in range(_RAISE_TRIES + _RECORD_WAITS):
            found = self._newest_from(group, slot.index, slot.gen)
            if found is None or _format.now_us() + skew_us >= until_us:  # (the clock read after the chain)
                return None
            gen, lease = found
            if lease == 0:  # freed (a purge): the member is gone with it
                return None
            if lease is not None and lease >= new_until:
                return slot._replace(gen=gen)
            runs = self.record(group, slot.index, gen)  # the runs it holds, held by the next too
            if runs is None and waited < _RECORD_WAITS and self._young(group, slot.index, gen):
                waited += 1  # (a hand-over's, being written after its renames: copied once there)
                time.sleep(_RECORD_WAIT)
                continue
            if lease is not None and self._next(group, slot.index, gen, _format.encode_lease(new_until), lone=False):
                if runs is not None:
                    self.write_record(group, slot.index, gen + 1, runs)
                return slot._replace(gen=gen + 1)
            # a run-mate's raise being written, or won first: read again
        return None

    def run_done(self, group: str, slot: SlotRef, key: str, until_us: int, skew_us: int, gone: bool = False) -> bool:
        """Mark member ``slot.member`` of its run done (its message deleted or moved
        out of the queue, ``gone``; or released, made visible; it was hidden until
        ``until_us``); the last one to be marked settles the run, if the slot is
        provably still held by it (see :meth:`run_extend`). Whether the slot was freed."""
        if not self._ready:
            _fs.make_dirs(self._dir, self.mode)
            self._ready = True
        if not self._names_member(group, slot, key):
            return False  # a receipt whose R.I.K is not the record's: it marks nothing (the lease runs out)
        if gone:  # before the done mark: a hand-over that meets the latter alone cannot tell it gone
            _fs.create_exclusive(self._mark(group, slot, slot.member, _format.GONE_MARK), b"",
                                 durable=False, mode=self.mode)
        marks = [self._mark(group, slot, member) for member in range(slot.size)]
        _fs.create_exclusive(marks[slot.member], b"", durable=False, mode=self.mode)  # (taken already: fine)
        if not all(_fs.exists(mark) for mark in reversed(marks)):  # (the last first: members settle in order)
            return False
        return self._settle(group, slot.index, slot.run, until_us, skew_us)

    def _names_member(self, group: str, slot: SlotRef, key: str) -> bool:
        """Whether run ``slot.run``'s member ``slot.member`` is message ``key`` (of ``slot.size``
        members), by the slot's newest record or the run's own; neither known: False."""
        found = self._newest_from(group, slot.index, slot.gen)
        for gen in ([found[0]] if found is not None else []) + [slot.run]:
            runs = self.record(group, slot.index, gen)
            entry = next((entry for entry in runs or [] if entry.run == slot.run), None)
            if entry is not None:
                return len(entry.keys) == slot.size and entry.keys[slot.member] == key
        return False

    def _settle(self, group: str, index: int, run: int | None, until_us: int, skew_us: int) -> bool:
        """Drop the runs that are over from the slot's newest record: free the slot
        if none is left, else make a generation (the same lease) naming the others.
        Only while the record names ``run`` (None: any) and, for a run, its member
        hidden until ``until_us`` shows the slot is still held (see run_extend);
        read again after a race lost. Whether the slot was freed."""
        for _ in range(_RAISE_TRIES):
            found = self._newest_from(group, index, 0 if run is None else run)
            if found is None or not found[1]:
                return False  # freed already (or cannot be read)
            if run is not None and _format.now_us() + skew_us >= until_us:
                return False  # not provably the run's: the lease runs out by itself
            gen, lease = found[0], found[1]
            runs = self.record(group, index, gen)
            if runs is None or (run is not None and all(entry.run != run for entry in runs)):
                return False  # unknown, or the run is not named there: the lease runs out by itself
            left = [entry for entry in runs if not self._over(group, index, entry)]
            if len(left) == len(runs) and run is None:
                return False  # nothing over
            if self._replace(group, index, gen, lease, left):
                self._unmark(group, index, [entry for entry in runs if entry not in left])
                # a run named now whose last mark came meanwhile: its settle may have read
                # the generation before ours, or ours without its record yet, and stopped
                over = any(self._over(group, index, entry) for entry in left)
                return not left or (over and self._settle(group, index, None, 0, 0))
        return False

    def _young(self, group: str, index: int, gen: int) -> bool:
        written = _fs.mtime(self._path(group, index, gen))
        return written is not None and written > time.time() - _WRITE_GRACE

    def _replace(self, group: str, index: int, gen: int, lease: int, runs: list[_format.RunEntry]) -> bool:
        """Make generation gen+1: ``free`` if no run is left, else ``lease`` with a
        record naming ``runs``. Whether it was made (else someone else wrote it)."""
        if not runs:
            return self._next(group, index, gen, _format.FREE_LEASE, lone=False) is not None
        if self._next(group, index, gen, _format.encode_lease(lease), lone=False) is None:
            return False
        self.write_record(group, index, gen + 1, runs)
        return True

    # -- hand-over (see FORMAT.md, Runs) -----------------------------------------

    def record(self, group: str, index: int, gen: int) -> list[_format.RunEntry] | None:
        """The runs generation ``gen`` of the slot holds, from its record; None if unknown."""
        data = _fs.read_control(os.path.join(self._dir, _format.run_record_name(group, index, gen)))
        return None if data is None else _format.decode_run_record(data, gen)

    def write_record(self, group: str, index: int, gen: int, runs: list[_format.RunEntry]) -> None:
        """Write the record of generation ``gen`` (which this handle just made). One that
        cannot be written (too large, an error) stays unknown: the slot waits for its lease."""
        data = _format.encode_run_record(runs)
        if data is not None:
            path = os.path.join(self._dir, _format.run_record_name(group, index, gen))
            try:
                _fs.create_exclusive(path, data, durable=False, mode=self.mode)
            except StorageError as exc:
                log.warning("%s", exc)

    def holders(self, group: str, now_us: int, skew_us: int) -> tuple[int, int, list[_format.RunEntry]] | None:
        """The group's one slot, when a hand-over may be judged: its newest
        generation, a lease in force, and the runs its record names; else None."""
        found = self._newest_from(group, 0, 0)
        if found is None or not found[1] or found[1] + skew_us <= now_us:
            return None
        runs = self.record(group, 0, found[0])
        return None if runs is None else (found[0], found[1], runs)

    def gone_members(self, group: str, runs: list[_format.RunEntry]) -> set[str]:
        """The KEYs of the members of ``runs`` whose message is gone from the queue
        (deleted, or moved out: marked so by whoever removed it)."""
        return {key for entry in runs for member, key in enumerate(entry.keys)
                if _fs.exists(self._mark(group, SlotRef(0, entry.run, entry.run), member, _format.GONE_MARK))}

    def mark_gone(self, group: str, key: str, runs: list[_format.RunEntry] | None = None) -> None:
        """The message ``key`` of the group left the queue (dead-lettered, past
        retention) outside its run's receipts: mark it gone and done in ``runs``
        (by default those the newest record names), and settle the runs over."""
        if runs is None:
            found = self._newest_from(group, 0, 0)
            runs = self.record(group, 0, found[0]) if found is not None else None
        for entry in runs or []:
            if key in entry.keys:
                slot = SlotRef(0, entry.run, entry.run)
                for kind in (_format.GONE_MARK, _format.DONE_MARK):
                    _fs.create_exclusive(self._mark(group, slot, entry.keys.index(key), kind), b"",
                                         durable=False, mode=self.mode)
        if runs:
            self._settle(group, 0, None, 0, 0)

    def take_over(self, group: str, gen: int, until_us: int) -> SlotRef | None:
        """A hand-over's generation gen+1, a lease until ``until_us``; None if someone wrote it first."""
        return self._next(group, 0, gen, _format.encode_lease(until_us), lone=False)

    def hand_over_done(
        self, group: str, slot: SlotRef, lease: int, runs: list[_format.RunEntry], keys: list[str]
    ) -> None:
        """After a hand-over's renames: mark its messages done in the runs that held
        them (their receipts there move them no more), and write the record of its
        generation: the runs not over, and its own run of ``keys``. A hand-over that
        took nothing replaces its generation with the one before it (``lease``), or
        frees the slot if no run is left."""
        taken = set(keys)
        for entry in runs:
            for member, key in enumerate(entry.keys):
                if key in taken:
                    _fs.create_exclusive(self._mark(group, SlotRef(0, entry.run, entry.run), member), b"",
                                         durable=False, mode=self.mode)
        left = [entry for entry in runs if not self._over(group, slot.index, entry)]
        if keys:
            self.write_record(group, slot.index, slot.gen, [*left, _format.RunEntry(slot.gen, tuple(keys))])
            made = True
        else:
            made = self._replace(group, slot.index, slot.gen, lease, left)
        if made:
            self._unmark(group, slot.index, [entry for entry in runs if entry not in left])
            if any(self._over(group, slot.index, entry) for entry in left):  # (see _settle)
                self._settle(group, slot.index, None, 0, 0)

    def _over(self, group: str, index: int, entry: _format.RunEntry) -> bool:
        slot = SlotRef(index, entry.run, entry.run)
        return all(_fs.exists(self._mark(group, slot, member)) for member in reversed(range(len(entry.keys))))

    def _unmark(self, group: str, index: int, runs: list[_format.RunEntry]) -> None:
        for entry in runs:
            slot = SlotRef(index, entry.run, entry.run)
            for member, kind in itertools.product(range(len(entry.keys)), (_format.DONE_MARK, _format.GONE_MARK)):
                _fs.unlink(self._mark(group, slot, member, kind))

    def _mark(self, group: str, slot: SlotRef, member: int, kind: str = _format.DONE_MARK) -> str:
        return os.path.join(self._dir, _format.run_mark_name(group, slot.index, slot.run, member, kind))

    def sweep(self, grace: float = SWEEP_GRACE) -> int:
        """Remove generations superseded more than ``grace`` seconds ago, oldest
        first, so the files left of a slot are its first and its newest ones."""
        if not _fs.is_private_dir(self._dir):
            return 0
        chains: dict[tuple[str, int], list[int]] = defaultdict(list)
        marks: list[tuple[str, int, int, str]] = []
        records: list[tuple[str, int, int, str]] = []
        for name in _fs.list_names(self._dir):
            parsed = _format.parse_lease_name(name)
            if parsed is not None:
                chains[(parsed[0], parsed[1])].append(parsed[2])
            elif (mark := _format.parse_run_mark(name)) is not None:
                marks.append((mark[0], mark[1], mark[2], name))
            elif (record := _format.parse_run_record_name(name)) is not None:
                records.append((*record, name))
        cutoff = time.time() - grace
        removed = self._sweep_marks(marks, chains, cutoff)
        for group, index, gen, name in records:  # a record stays while its generation is the newest
            if gen == max(chains.get((group, index), [0])):
                continue
            written = _fs.mtime(os.path.join(self._dir, name))
            if written is not None and written <= cutoff:
                removed += _fs.unlink(os.path.join(self._dir, name))
        for (group, index), gens in chains.items():
            gens.sort()
            # generation 1 stays: a handle that never saw the chain cannot start it again
            for gen, successor in zip(gens[1:], gens[2:], strict=False):
                superseded = _fs.mtime(self._path(group, index, successor))
                if superseded is None or superseded > cutoff:
                    break
                removed += _fs.unlink(self._path(group, index, gen))
        return removed

    def _sweep_marks(
        self, marks: list[tuple[str, int, int, str]], chains: dict[tuple[str, int], list[int]], cutoff: float
    ) -> int:
        """Remove the marks of runs that are over: older than ``cutoff`` while
        their slot is free or its lease has run out. (A mark removed too early
        only means its run's slot is not freed early: it waits for its lease.)"""
        removed = 0
        now = _format.now_us()
        for group, index, run, name in marks:
            path = os.path.join(self._dir, name)
            written = _fs.mtime(path)
            gens = chains.get((group, index))
            if written is None or written > cutoff or (gens and run > max(gens)):
                continue  # (a run past the newest generation listed: this listing is old)
            data = _fs.read_control(self._path(group, index, max(gens))) if gens else None
            until = _format.decode_lease(data) if data is not None else 0
            if until is not None and until <= now:
                removed += _fs.unlink(path)
        return removed
