"""``receipts``: the receipts a handle issued (``IssuedReceipts``) and the
moves of a held message (``HeldMessages``), constructed directly on a real
queue directory with real group leases and a fake listing that records
what it is told."""

from __future__ import annotations

import os
import threading

import pytest

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import InvalidReceipt, StaleReceipt
from vsqs._core.format import SlotRef
from vsqs._core.groups import GroupLeases
from vsqs._core.metadata import Store, open_store
from vsqs._core.receipts import KEPT, HeldMessages, IssuedReceipts, stale_message

NOW_US = 1_700_000_000_000_000
SECOND = 1_000_000
GROUP = _format.group_hash("orders")


class FakeListing:
    def __init__(self) -> None:
        self.remembered: list[tuple[str, int]] = []
        self.freed: list[str] = []

    def remember(self, name: str, until_us: int = 0) -> None:
        self.remembered.append((name, until_us))

    def slot_freed(self, group: str) -> None:
        self.freed.append(group)


class Handle:
    """What a queue handle gives HeldMessages: its store, leases, lock and listing."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.groups = GroupLeases(store.layout.path)
        self.listing = FakeListing()
        self.held = HeldMessages(store, self.groups, threading.Lock(), self.listing)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def clock(monkeypatch) -> list[int]:
    now = [NOW_US]
    monkeypatch.setattr(_format, "now_us", lambda: now[0])
    return now


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def store(request, tmp_path) -> Store:
    return open_store(str(tmp_path / "q"), create=True, shards=request.param)


@pytest.fixture
def handle(store) -> Handle:
    return Handle(store)


def receive(handle: Handle, group: str = "", count: int = 1, body: bytes = b"body") -> tuple[str, str]:
    """A message held by a receive (as the queue's claim leaves it): (its key, its receipt)."""
    key = _format.new_key()
    until = NOW_US + 30 * SECOND
    slot = None
    if group:
        slot = handle.groups.claim(group, 1, until, NOW_US, 0)
        assert slot is not None
    name = _format.hidden_name(_format.make_stem(key, group_hash=group), until, count)
    with open(handle.store.layout.message_file(name), "wb") as file:
        file.write(body)
    return key, _format.make_receipt(handle.store.id, name, slot)


def files(store: Store) -> list[_format.Name]:
    return store.layout.names()


def only_name(store: Store) -> _format.Name:
    (name,) = files(store)
    return name


def content(store: Store, name: _format.Name) -> bytes:
    with open(store.layout.message_file(str(name)), "rb") as file:
        return file.read()


# -- IssuedReceipts -------------------------------------------------------------------


def test_an_issued_receipt_is_taken_once():
    issued = IssuedReceipts()
    slot = SlotRef(0, 3)
    issued.add("r1", "name1", slot)
    issued.add("r2", "name2", None)
    assert len(issued) == 2
    assert issued.take("r1") == ("name1", slot)
    assert issued.take("r1") is None
    assert issued.take("r2") == ("name2", None)
    assert issued.take("other") is None and len(issued) == 0


def test_issued_receipts_keep_two_generations():
    issued = IssuedReceipts(size=2)
    for n in range(1, 6):
        issued.add(f"r{n}", f"n{n}", None)
    assert len(issued) == 3  # r3, r4 (the old generation) and r5
    assert [issued.take(f"r{n}") for n in (1, 2)] == [None, None]
    assert [issued.take(f"r{n}") for n in (3, 4, 5)] == [("n3", None), ("n4", None), ("n5", None)]


def test_issued_receipts_are_bounded_by_default():
    issued = IssuedReceipts()
    assert issued.size == KEPT
    for n in range(5 * KEPT):
        issued.add(str(n), "name", None)
    assert len(issued) <= 2 * KEPT


def test_the_stale_wording_names_the_message():
    text = stale_message("9-0000000000000001-0000000000000001")
    assert "9-0000000000000001-0000000000000001" in text and "stale" in text


# -- change of visibility ---------------------------------------------------------------


def test_change_visibility_moves_the_message_and_returns_its_new_receipt(handle):
    key, receipt = receive(handle, count=3)
    old = only_name(handle.store)
    new_receipt = handle.held.change_visibility(receipt, 12.5)
    new = only_name(handle.store)
    assert new.key == key and new.receive_count == 3 and new.until_us == NOW_US + 12_500_000
    assert new.tag == old.tag  # the receive's secret stays: only UNTIL changes
    assert new_receipt == _format.make_receipt(handle.store.id, str(new))
    assert content(handle.store, new) == b"body"
    assert handle.listing.remembered == [(str(new), NOW_US + 12_500_000)]
    assert handle.listing.freed == []


def test_change_visibility_to_zero_hides_until_now(handle):
    _, receipt = receive(handle)
    handle.held.change_visibility(receipt, 0)
    assert only_name(handle.store).until_us == NOW_US


def test_change_visibility_with_a_spent_receipt_is_stale(handle, clock):
    key, receipt = receive(handle)
    handle.held.change_visibility(receipt, 5)
    clock[0] += 1  # (at the same microsecond the move would be the same name: done already, not stale)
    with pytest.raises(StaleReceipt) as caught:
        handle.held.change_visibility(receipt, 5)
    assert str(caught.value) == stale_message(key)
    assert len(files(handle.store)) == 1 and len(handle.listing.remembered) == 1


def test_a_receipt_of_another_queue_is_refused(handle, tmp_path):
    other = Handle(open_store(str(tmp_path / "other"), create=True))
    _, receipt = receive(other)
    for move in (lambda: handle.held.change_visibility(receipt, 5), lambda: handle.held.release(receipt),
                 lambda: handle.held.current(receipt)):
        with pytest.raises(InvalidReceipt, match="another queue"):
            move()
    with pytest.raises(InvalidReceipt, match="malformed"):
        handle.held.release(f"{handle.store.id}:../../etc/passwd")


# -- release ------------------------------------------------------------------------------


def test_release_makes_the_message_ready_keeping_its_count(handle):
    key, receipt = receive(handle, count=2)
    handle.held.release(receipt)
    ready = only_name(handle.store)
    assert ready.state is _format.State.READY and ready.key == key and ready.receive_count == 2
    assert handle.listing.remembered == [(str(ready), 0)]


def test_a_second_release_with_the_same_receipt_is_stale(handle):
    key, receipt = receive(handle)
    handle.held.release(receipt)
    with pytest.raises(StaleReceipt, match=key):  # the ready name exists: not the answer of this release
        handle.held.release(receipt)
    assert only_name(handle.store).state is _format.State.READY


def test_release_after_the_message_was_received_again_is_stale(handle):
    key, receipt = receive(handle)
    handle.held.release(receipt)
    ready = only_name(handle.store)
    again = _format.hidden_name(ready.stem, NOW_US + SECOND, 2)  # another consumer's receive
    os.rename(handle.store.layout.message_file(str(ready)), handle.store.layout.message_file(again))
    with pytest.raises(StaleReceipt, match=key):
        handle.held.release(receipt)
    assert [str(name) for name in files(handle.store)] == [again]
    assert len(handle.listing.remembered) == 1


# -- the current receipt -----------------------------------------------------------------


def test_the_current_receipt_of_an_unmoved_message_is_itself(handle):
    _, receipt = receive(handle)
    assert handle.held.current(receipt) == receipt


def test_the_current_receipt_follows_moves_made_elsewhere(handle):
    _, receipt = receive(handle)
    elsewhere = Handle(handle.store)
    moved = elsewhere.held.change_visibility(receipt, 10)
    moved_again = elsewhere.held.change_visibility(moved, 20)
    assert handle.held.current(receipt) == moved_again
    assert handle.held.current(moved) == moved_again


@pytest.mark.parametrize("end", ["deleted", "released"])
def test_the_current_receipt_of_a_settled_message_is_stale(handle, end):
    key, receipt = receive(handle)
    moved = handle.held.change_visibility(receipt, 10)
    if end == "deleted":
        os.unlink(handle.store.layout.message_file(_format.parse_receipt(handle.store.id, moved)[1]))
    else:
        handle.held.release(moved)
    with pytest.raises(StaleReceipt, match=key):
        handle.held.current(receipt)


def test_another_receive_of_the_message_is_not_this_receipts(handle):
    key, receipt = receive(handle, count=1)
    name = only_name(handle.store)
    again_same_count = _format.hidden_name(name.stem, NOW_US + SECOND, 1)  # another receive id
    again_next = _format.hidden_name(name.stem, NOW_US + SECOND, 2, name.tag)  # the next receive, same tag
    for other in (again_same_count, again_next):
        layout = handle.store.layout
        os.rename(layout.message_file(str(only_name(handle.store))), layout.message_file(other))
        with pytest.raises(StaleReceipt, match=key):
            handle.held.current(receipt)


def test_the_current_receipt_lists_only_the_messages_directory(handle, monkeypatch):
    _, receipt = receive(handle)
    moved = Handle(handle.store).held.change_visibility(receipt, 10)
    listed = []
    real = _fs.list_names
    monkeypatch.setattr(_fs, "list_names", lambda directory: listed.append(directory) or real(directory))
    assert handle.held.current(receipt) == moved
    name = _format.parse_receipt(handle.store.id, moved)[1]
    assert listed == [os.path.dirname(handle.store.layout.message_file(name))]


# -- messages of groups: the slot lease moves first ----------------------------------------


def test_change_visibility_of_a_groups_message_extends_its_slot(handle):
    _, receipt = receive(handle, group=GROUP)
    slot = _format.parse_receipt(handle.store.id, receipt)[2]
    new_receipt = handle.held.change_visibility(receipt, 40)
    name, _, new_slot = _format.parse_receipt(handle.store.id, new_receipt)
    assert new_slot == SlotRef(slot.index, slot.gen + 1)
    assert handle.groups.held_until(GROUP, slot.index, name.until_us) == new_slot
    assert handle.listing.freed == [GROUP]
    assert handle.listing.remembered == [(str(name), NOW_US + 40 * SECOND)]


def test_a_groups_message_whose_slot_was_taken_is_stale_and_stays(handle):
    key, receipt = receive(handle, group=GROUP)
    held = only_name(handle.store)
    other = GroupLeases(handle.store.layout.path)
    other.refresh()
    later = NOW_US + 31 * SECOND  # the lease ran out; another consumer took the slot
    assert other.claim(GROUP, 1, later + 30 * SECOND, later, 0) is not None
    with pytest.raises(StaleReceipt, match=key):
        handle.held.change_visibility(receipt, 5)
    assert only_name(handle.store) == held
    assert handle.listing.remembered == []


def test_a_groups_message_that_is_gone_moves_no_slot(handle):
    # (its receipt may be made up: only its TAG is secret) the slot waits for its lease
    _, receipt = receive(handle, group=GROUP)
    os.unlink(handle.store.layout.message_file(str(only_name(handle.store))))
    leases = sorted(os.listdir(os.path.join(handle.store.layout.path, _format.GROUPS_DIR)))
    for move in (lambda: handle.held.change_visibility(receipt, 5), lambda: handle.held.release(receipt)):
        with pytest.raises(StaleReceipt):
            move()
    assert sorted(os.listdir(os.path.join(handle.store.layout.path, _format.GROUPS_DIR))) == leases


def test_a_groups_message_gone_during_its_extension_gives_its_slot_back(handle, monkeypatch):
    _, receipt = receive(handle, group=GROUP)
    real = _fs.rename
    monkeypatch.setattr(_fs, "rename", lambda src, dst: os.unlink(src) or real(src, dst))  # deleted meanwhile
    with pytest.raises(StaleReceipt):
        handle.held.change_visibility(receipt, 5)
    other = GroupLeases(handle.store.layout.path)
    other.refresh()
    assert other.claim(GROUP, 1, NOW_US + SECOND, NOW_US, 0) is not None  # free again


def test_release_of_a_groups_message_frees_its_slot(handle):
    _, receipt = receive(handle, group=GROUP)
    handle.held.release(receipt)
    other = GroupLeases(handle.store.layout.path)
    other.refresh()
    assert other.claim(GROUP, 1, NOW_US + SECOND, NOW_US, 0) is not None
    assert handle.listing.freed == [GROUP]
    assert handle.listing.remembered == [(str(only_name(handle.store)), 0)]


def test_the_current_receipt_of_a_groups_message_carries_its_slot(handle):
    _, receipt = receive(handle, group=GROUP)
    moved = Handle(handle.store).held.change_visibility(receipt, 10)
    assert handle.held.current(receipt) == moved
    # the slot went to someone else since: the message is no longer this receipt's
    slot = _format.parse_receipt(handle.store.id, moved)[2]
    handle.groups.free(GROUP, slot)
    with pytest.raises(StaleReceipt):
        handle.held.current(receipt)
