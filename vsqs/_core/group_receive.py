"""Receiving and settling messages of groups: the FIFO side of receive and delete.

:class:`Queue` hands a candidate of a group here (its hot path stays for
messages without one). A group's message is taken with a slot lease first
(see :mod:`vsqs._core.groups`); with ``runs`` (Amazon SQS FIFO's behaviour,
``receive_batch(group_runs=True)``) and one slot a group, the group's next
messages, in order, follow it in the same receive: a *run*, all held on the
one slot until every member is done; and while runs hold the slot, a receive
of runs takes the group's visible prefix, the messages ahead of every one
still in flight (a *hand-over*, judged from the slot's record).

A run is taken in steps a crash may stop between: the slot lease (until
UNTIL), then one rename per member, each hidden until that same UNTIL. A
crash leaves members in flight without receipts and the group held, both
until UNTIL: a delay, never two receivers in one group. A run's members are
taken from this handle's listing in the group's order, and only while each
rename succeeds: a name that moved since the listing ends the run, so no
message is passed over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.errors import DamagedEntry, StorageError
from vsqs._core.format import SlotRef, State
from vsqs._core.groups import GroupLeases
from vsqs._core.limits import MAX_RUN
from vsqs._core.listing import Listing
from vsqs._core.message import Message
from vsqs._core.metadata import Store
from vsqs._core.receipts import IssuedReceipts
from vsqs._core.throttle import Throttle

if TYPE_CHECKING:
    from vsqs._core.message import Queue  # the queue a Message belongs to (a part never imports it)

log = logging.getLogger("vsqs")

_KEY_LENGTH = _format.KEY_LENGTH


class Taken:
    """What one claim of a group gave: messages, bytes of bodies read, and
    the first storage error (reported only if the whole receive got nothing)."""

    __slots__ = ("failure", "held", "messages", "moved")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.held = 0
        self.failure: StorageError | None = None
        self.moved = False  # a message went into flight (or to the dead-letter queue)


class GroupReceiver:
    """Claims and settles messages of groups in one queue. The parts come from
    the queue (never the queue itself: see :meth:`Queue._open_store`); ``lock``
    is the queue's, which guards the listing and the group leases."""

    def __init__(
        self, store: Store, groups: GroupLeases, listing: Listing, lock: threading.Lock,
        receipts: IssuedReceipts, throttle: Throttle, dead_letters: DeadLetters[Any], skew_us: int,
    ) -> None:
        self._layout = store.layout
        self._queue_id = store.id
        self._first_receive = store.first_receive  # format 3: a first receive writes -rFIRST
        self._groups = groups
        self._listing = listing
        self._lock = lock
        self._receipts = receipts
        self._throttle = throttle
        self._dead_letters = dead_letters
        self._skew_us = skew_us

    def want_runs(self) -> None:
        """A receive asks for runs: the listing keeps them from now on (see Listing.want_runs)."""
        with self._lock:
            self._listing.want_runs()

    def claim(
        self, queue: Queue, name: str, parsed: _format.Name, lease_us: int, room: int, read_bodies: bool,
        byte_room: int, runs: bool, settings: Mapping[str, Any],
    ) -> Taken:
        """Take the group's candidate ``name`` (already checked for dead-lettering
        and throttling by the caller), and with ``runs`` the group's next
        messages after it, up to ``room`` messages in all."""
        taken = Taken()
        group, lock, cache = parsed.group_hash, self._lock, self._listing
        now = _format.now_us()
        until = now + lease_us
        concurrency = settings["group_concurrency"]
        with lock:
            slot = self._groups.claim(group, concurrency, until, now, self._skew_us)
            following = cache.take_run(group)  # taken even when unused: it is of this listing only
            if slot is None and not (runs and concurrency == 1):
                cache.block(group)  # its slots are all held
                return taken
        if slot is None:  # held: a hand-over, judged from the group's names as listed
            view = cache.view(group)
            if view is None:  # (none in flight as listed: the candidate and the names after it)
                view = [parsed, *filter(None, map(_format.parse_name, following))]
            return self._hand_over(queue, group, view, now, until, room, read_bodies, byte_room, settings)
        if not runs or concurrency != 1:
            following = []
        members: list[_Member] = []
        if not self._move(name, parsed, until, members):
            with lock:
                self._groups.free(group, slot)
                cache.block(group)  # our view of the group is stale
            return taken
        cache.claimed += 1
        taken.moved = True
        byte_room -= self._read(members[0], read_bodies, taken)
        for following_name in following:
            if len(members) >= room or byte_room <= 0:
                break
            member = _format.parse_name(following_name)
            if member is None or member.group_hash != group or member.key <= members[-1].parsed.key:
                break  # (cannot happen with a listing of this queue: a guard)
            follow = self._may_follow(member, settings, taken)
            if follow is None:
                continue
            if not follow:
                break
            if not self._move(following_name, member, until, members):
                break  # moved since the listing: the run ends before it, in order
            byte_room -= self._read(members[-1], read_bodies, taken)
        if len(members) > 1:  # the run's record, before its receipts (see FORMAT.md, Runs)
            with lock:
                run = _format.RunEntry(slot.gen, tuple(_keys(members)))
                self._groups.write_record(group, slot.index, slot.gen, [run])
        self._issue(queue, slot, members, taken)
        return taken

    def _hand_over(
        self, queue: Queue, group: str, view: list[_format.Name], now: int, until: int, room: int,
        read_bodies: bool, byte_room: int, settings: Mapping[str, Any],
    ) -> Taken:
        """Take the group's visible prefix while its slot's lease is in force: the
        messages from its first on that are visible, up to the first one that is
        (or may be) in flight, judged from the runs the slot's record names and
        this listing's ``view`` of the group (see FORMAT.md, Runs: Hand-over)."""
        taken = Taken()
        lock, cache, groups = self._lock, self._listing, self._groups
        with lock:
            held = groups.holders(group, now, self._skew_us)
            prefix = self._visible_prefix(group, view, held[2], now) if held is not None else []
            slot = groups.take_over(group, held[0], max(held[1], until)) if held is not None and prefix else None
            if held is None or slot is None:
                cache.block(group)
                return taken
        members: list[_Member] = []
        for name in prefix:
            if len(members) >= room or byte_room <= 0:
                break
            follow = self._may_follow(name, settings, taken, held[2]) if members else True
            if follow is None:
                continue
            if not follow:
                break
            if not self._move(str(name), name, until, members):
                break  # moved since the listing: the hand-over ends before it, in order
            byte_room -= self._read(members[-1], read_bodies, taken)
        with lock:
            groups.hand_over_done(group, slot, held[1], held[2], _keys(members))
            cache.block(group)  # (its view is of this listing: judged once)
        if members:
            cache.claimed += 1
            taken.moved = True
        self._issue(queue, slot, members, taken, as_run=True)
        return taken

    def _may_follow(
        self, member: _format.Name, settings: Mapping[str, Any], taken: Taken,
        runs: list[_format.RunEntry] | None = None,
    ) -> bool | None:
        """Whether a run's next member may be taken (True), ends the run (False), or
        was moved to the dead-letter queue, out of the group's order (None: go on)."""
        if settings["max_receives"] is not None and member.receive_count >= settings["max_receives"]:
            try:
                if self._dead_letters.bury(member):
                    with self._lock:  # (a hand-over's ``runs``: its own generation has no record yet)
                        self._groups.mark_gone(member.group_hash, member.key, runs)
                    return None
            except StorageError as exc:
                taken.failure = taken.failure or exc
            return False  # not moved: the run ends before it, in order
        if settings["throttle"] is not None:
            count, seconds = settings["throttle"]
            with self._lock:
                if not self._throttle.take(count, seconds, time.time()):
                    return False
        return True

    def _visible_prefix(
        self, group: str, view: list[_format.Name], runs: list[_format.RunEntry], now: int
    ) -> list[_format.Name]:
        """The group's visible prefix (see :meth:`_hand_over`): a member of a run
        marked gone (its message left the queue) is passed, listed or not (a listing
        may be older than its removal); one not listed and not marked gone may be
        in flight (being renamed as the listing was read), and ends it."""
        listed = {name.key: name for name in view}
        members = {key for entry in runs for key in entry.keys}
        gone = self._groups.gone_members(group, runs)
        prefix: list[_format.Name] = []
        skew = self._skew_us
        for key in sorted(listed.keys() | members):
            name = listed.get(key)
            if key in gone and (name is None or name.receive_count):  # (COUNT 0: redriven since, back)
                continue
            if name is None:
                break
            if name.state is State.HIDDEN and name.until_us + skew > now:
                if name.receive_count:
                    break  # in flight
                continue  # delayed: not yet in the group's order
            prefix.append(name)
            if len(prefix) >= MAX_RUN:
                break
        return prefix

    def bury(self, parsed: _format.Name) -> StorageError | bool:
        """Move a message received ``max_receives`` times to the dead-letter queue;
        the error if it could not (e.g. a dead-letter queue on another filesystem).
        A group's candidate buried: the next message of its run is its candidate,
        or, if the listing kept none and this call moved it, True: list again before
        the next candidate."""
        try:
            moved = self._dead_letters.bury(parsed)
        except StorageError as exc:
            return exc
        if parsed.group_hash:
            with self._lock:
                if moved and parsed.receive_count:  # a run's member, maybe: a hand-over must not wait for it
                    self._groups.mark_gone(parsed.group_hash, parsed.key)
                # (a listing again is paid for by a message moved out: bounded by the queue's depth)
                return self._listing.skip_removed(parsed.group_hash) and bool(moved)
        return False

    def _move(self, name: str, parsed: _format.Name, until: int, members: list[_Member]) -> bool:
        """Rename ``name`` into flight until ``until``; appended to ``members`` if it moved."""
        count = parsed.receive_count + 1
        stem = _format.received_stem(parsed, _format.now_us()) if count == 1 and self._first_receive else parsed.stem
        new = _format.hidden_name(stem, until, count)
        layout = self._layout
        directory = layout.prefix if layout.locate is None else layout.locate(name)  # (KEY and GROUP keep the shard)
        path = directory + new
        if not _fs.rename(directory + name, path):
            return False
        members.append(_Member(new, path, count, parsed))
        return True

    def _read(self, member: _Member, read_bodies: bool, taken: Taken) -> int:
        """Read a member's body (as :meth:`Queue._claim` does inline); the bytes read.
        A member that cannot be read stays in flight without a receipt."""
        if not read_bodies:
            member.issued = True  # its body is read when first used
            return 0
        try:
            data = _fs.read(member.path)
            if data is None:
                return 0  # only if another host's clock is far ahead: it took our lease
            size = len(data)
            if member.parsed.envelope:
                data, member.header = _envelope.decode_content(member.parsed, data, member.path)
        except DamagedEntry as exc:  # skipped, left in flight (see Queue._claim)
            self._layout.report_damage(member.path, str(exc.strerror))
            return 0
        except StorageError as exc:
            log.warning("%s", exc)
            taken.failure = taken.failure or exc
            return 0
        member.body, member.issued = data, True
        taken.held += size
        return size

    def _issue(self, queue: Queue, slot: SlotRef, members: list[_Member], taken: Taken, as_run: bool = False) -> None:
        """Make the receipts and messages of a claim: a message alone keeps the
        receipt form every version reads; the members of a run carry the run, and
        so does a hand-over's message alone (``as_run``: it settles its run only)."""
        size = len(members)
        for index, member in enumerate(members):
            if not member.issued:
                continue  # unreadable: in flight without a receipt (its run waits for its lease)
            ref = slot if size == 1 and not as_run else SlotRef(slot.index, slot.gen, slot.gen, index, size)
            receipt = _format.make_receipt(self._queue_id, member.new, ref)
            self._receipts.add(receipt, member.new, ref)
            taken.messages.append(
                Message(queue, member.parsed.key, member.body, receipt, member.count, None, member.header)
            )

    def settled(self, text: str, slot: SlotRef, done: bool, issued: bool = False, one_slot: bool = True) -> None:
        """After the delete (or release) of the hidden message ``text`` held on
        ``slot``: free the slot, or for a member of a run, mark it done (only if
        ``done``: this call moved it) and free the slot with the last one.
        ``issued``: the receipt is one this handle made; its slot needs no check
        if this call deleted the message. A receipt from outside frees only
        with its message (a made-up name, its TAG unknown, deletes nothing);
        one of ours that did not delete it is stale, and checked (its
        generation may be swept, and made again by a free). ``one_slot``: see
        :class:`HeldMessages` (a run's receipt from outside counts only then)."""
        group = _format.group_of(text)
        with self._lock:
            if not slot.run:
                if done and issued:
                    self._groups.free(group, slot)  # harmless if the slot moved on: the next generation exists then
                elif done or issued:
                    name = _format.parse_name(text)
                    if name is not None and self._groups.holds(group, slot, name.until_us):
                        self._groups.free(group, slot)
            elif done and (issued or one_slot):
                name = _format.parse_name(text)
                if name is not None:
                    self._groups.run_done(group, slot, name.key, name.until_us, self._skew_us, gone=True)
            self._listing.slot_freed(group)



def _keys(members: list[_Member]) -> list[str]:
    return [member.parsed.key for member in members]


class _Member:
    """A message of a claim, moved into flight: its new name and path, and once read, its body."""

    __slots__ = ("body", "count", "header", "issued", "new", "parsed", "path")

    def __init__(self, new: str, path: str, count: int, parsed: _format.Name) -> None:
        self.new, self.path, self.count, self.parsed = new, path, count, parsed
        self.body: bytes | None = None
        self.header: dict[str, Any] | None = None
        self.issued = False  # read (or not to be read): it gets a receipt
