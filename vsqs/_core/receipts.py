"""Receipts: what a handle remembers of the receipts it issued, the moves of
a held message other than its delete (a change of visibility, a release),
the lookup of a message's current receipt, and the one wording of a stale
receipt, the read of a held message. (Delete is the queue's hot path and stays in :class:`Queue`.)"""

from __future__ import annotations

import threading
from typing import Any

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import StaleReceipt
from vsqs._core.format import SlotRef, State
from vsqs._core.groups import GroupLeases
from vsqs._core.listing import Listing
from vsqs._core.message import to_us
from vsqs._core.metadata import Store

KEPT = 1024  # receipts a handle remembers parsed (two generations of this many)


class IssuedReceipts:
    """Receipts this handle issued, with what delete needs from them, so that a
    delete of a receipt just received does not parse it again. Bounded: two
    generations of ``size`` entries; older receipts are simply parsed.

    Only an exact receipt string this handle made is found here, so nothing
    foreign gets past validation; a stale one is caught, as always, by the
    system call that fails on its name.
    """

    __slots__ = ("new", "old", "size")

    def __init__(self, size: int | None = None) -> None:
        self.size = KEPT if size is None else size  # (the module's, looked up now: a test seam)
        self.new: dict[str, tuple[str, SlotRef | None]] = {}
        self.old: dict[str, tuple[str, SlotRef | None]] = {}

    def add(self, receipt: str, name: str, slot: SlotRef | None) -> None:
        if len(self.new) >= self.size:
            self.old, self.new = self.new, {}  # each step is atomic: safe across threads
        self.new[receipt] = (name, slot)

    def take(self, receipt: str) -> tuple[str, SlotRef | None] | None:
        """(hidden name, slot) of a receipt issued here, forgotten as it is taken."""
        found = self.new.pop(receipt, None)
        return found if found is not None else self.old.pop(receipt, None)

    def __len__(self) -> int:
        return len(self.new) + len(self.old)


def stale_message(key: str) -> str:
    """The text of :class:`StaleReceipt` for the message ``key``."""
    return (
        f"receipt for message {key} is stale: the message was deleted, its visibility "
        "was changed with this receipt already, or its lease ran out and it was received again"
    )


def read_held(store: Store, receipt: str) -> tuple[_format.Name, bytes, dict[str, Any] | None]:
    """The name, body and header of the message ``receipt`` holds in the
    queue ``store``, read without moving it; :class:`StaleReceipt` if it is gone."""
    name, text, _ = _format.parse_receipt(store.id, receipt)
    path = store.layout.message_file(text)
    data = _fs.read(path)
    if data is None:
        raise StaleReceipt(stale_message(name.key))
    return (name, *_envelope.decode_content(name, data, path))


class HeldMessages:
    """The moves of messages held by receipts, in one queue (``store``): each
    is one rename of the message file, and for a message of a group the
    slot lease moves first. The new name goes into the handle's ``listing``,
    so the handle sees its own moves; ``lock`` is the queue's, which guards
    the group leases and the listing. A member of a run (see
    :mod:`vsqs._core.groups`) moves only while its own lease has not run
    out (``skew_us``: the queue's clock-skew allowance), and is marked done
    once it is deleted, released or made visible. ``one_slot``: the queue's
    groups have one slot each, the only way runs are taken; else a run's
    receipt is made up (of messages held on the group's other slots, whose
    deletes would mark the run done and free a slot another consumer
    holds), and moves no slot."""

    def __init__(
        self, store: Store, groups: GroupLeases, lock: threading.Lock, listing: Listing, skew_us: int = 0,
        one_slot: bool = True,
    ) -> None:
        self._store = store
        self._groups = groups
        self._lock = lock
        self._listing = listing
        self._skew_us = skew_us
        self._one_slot = one_slot

    def change_visibility(self, receipt: str, timeout: float) -> str:
        """Hide the message for ``timeout`` (checked) seconds from now; the new receipt.
        The new name keeps the TAG, the receive's secret (see :meth:`current`):
        only UNTIL changes."""
        queue_id, layout = self._store.id, self._store.layout
        name, text, slot = _format.parse_receipt(queue_id, receipt)
        until = _format.now_us() + to_us(timeout)
        new = _format.hidden_name(name.stem, until, name.receive_count, name.tag)
        if slot is not None:  # the slot first: a crash between leaves the group blocked, not open
            if not _fs.exists(layout.message_file(text)):  # (see release: a made-up name moves no slot)
                raise StaleReceipt(stale_message(name.key))
            with self._lock:
                if slot.run:  # (a raise of the run's lease if it is lower: never lowered)
                    extended = (self._groups.run_extend(name.group_hash, slot, name.until_us, until, self._skew_us)
                                if self._one_slot else None)
                elif self._groups.holds(name.group_hash, slot, name.until_us):  # (see holds: not another's)
                    extended = self._groups.extend(name.group_hash, slot, until)
                else:
                    extended = None
            if extended is None:  # the lease ran out and the slot was taken: so was the message
                raise StaleReceipt(stale_message(name.key))
            slot = extended
        if not _fs.rename(layout.message_file(text), layout.message_file(new)):
            if slot is not None and not slot.run:  # (a run's raise stays: its members may need it)
                with self._lock:
                    self._groups.free(name.group_hash, slot)
            raise StaleReceipt(stale_message(name.key))
        if slot is not None and slot.run and until <= _format.now_us() + self._skew_us:
            with self._lock:  # visible now: done for its run (and no more movable by this receipt)
                self._groups.run_done(name.group_hash, slot, name.key, name.until_us, self._skew_us)
        with self._lock:
            if slot is not None:
                self._listing.slot_freed(name.group_hash)  # its lease moved: it may be free from ``until``
            self._listing.remember(new, until)
        return _format.make_receipt(queue_id, new, slot)

    def current(self, receipt: str) -> str:
        """The receipt that holds ``receipt``'s message now (see :meth:`Queue.current_receipt`).

        The hidden name of the same message (STEM), the same receive (COUNT)
        and the whole TAG: a TAG is 48 bits from the OS's cryptographic
        generator that only the receipts of that receive carry, so a receipt
        made up from what is public (the id, the receive count, the queue id)
        finds nothing."""
        queue_id, layout = self._store.id, self._store.layout
        name, text, slot = _format.parse_receipt(queue_id, receipt)
        if _fs.exists(layout.message_file(text)):
            return receipt
        for other in layout.names(beside=text):  # (its shard: the stem stays)
            if (other.tag != name.tag or other.stem != name.stem or other.state is not State.HIDDEN
                    or other.receive_count != name.receive_count):
                continue
            if slot is None:
                return _format.make_receipt(queue_id, str(other), None)
            if slot.run:  # a member whose lease has not run out: the run still holds the slot
                if other.until_us > _format.now_us() + self._skew_us:
                    return _format.make_receipt(queue_id, str(other), slot)
                continue
            with self._lock:
                held = self._groups.held_until(name.group_hash, slot.index, other.until_us)
            if held is not None:
                return _format.make_receipt(queue_id, str(other), held)
        raise StaleReceipt(stale_message(name.key))

    def release(self, receipt: str) -> None:
        """Make the message visible again now (ready), keeping its receive count."""
        queue_id, layout = self._store.id, self._store.layout
        name, text, slot = _format.parse_receipt(queue_id, receipt)
        ready = _format.ready_name(name.stem, name.receive_count)
        path = layout.message_file(text)
        # The message must be found under its held name first: the rename alone
        # reports success when its source is gone and the ready name exists (the
        # answer to a retransmitted rename), which is also what a second release
        # with the same receipt, or a made-up name (its TAG, 48 secret bits,
        # unknown), would meet; neither moves the message nor its slot
        held = _fs.exists(path)
        released = _fs.rename(path, layout.message_file(ready))
        if slot is not None:
            with self._lock:
                moved = held and released
                if moved and slot.run and self._one_slot:
                    self._groups.run_done(name.group_hash, slot, name.key, name.until_us, self._skew_us)
                elif moved and not slot.run and self._groups.holds(name.group_hash, slot, name.until_us):
                    self._groups.free(name.group_hash, slot)  # (see holds: not another's)
                self._listing.slot_freed(name.group_hash)
        if not (held and released):
            raise StaleReceipt(stale_message(name.key))
        with self._lock:
            self._listing.remember(ready)
