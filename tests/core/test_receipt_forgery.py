"""Receipts cannot be forged, on real directories.

A receipt names the message's hidden file, and ``Queue.current_receipt``
follows a receipt to the message's current name after a visibility change.
An attacker knows a message's id (published), its receive count (reported)
and the queue id (in any receipt of the queue). Before the fix the TAG came
from the same Mersenne Twister as the published ids, so ~312 ids predicted
it, and the lookup matched on the first 6 hex digits of the TAG alone.
"""

from __future__ import annotations

import os

import pytest

import vsqs
from tests.conftest import message_names
from tests.mersenne import KEYS_NEEDED, clone, next_tag_after, outputs_of_keys
from vsqs._core import format as _format
from vsqs._core.groups import GroupLeases


def _forged(receipt: str, tag: str, until_us: int = 1_700_000_000_000_000) -> str:
    """``receipt`` with another UNTIL and TAG: what an attacker who knows the
    queue id, the stem and the receive count can write."""
    queue_id, name = receipt.split(":", 1)
    parsed = _format.parse_name(name)
    assert parsed is not None
    return _format.make_receipt(queue_id, _format.hidden_name(parsed.stem, until_us, parsed.receive_count, tag))


def test_published_ids_do_not_predict_the_next_tag(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    ids = [queue.publish(b"x", durable=False) for _ in range(KEYS_NEEDED + 88)]  # ~400 ids, as in the report
    predicted = next_tag_after(ids)
    victim = queue.receive(visibility_timeout=300)
    assert victim is not None
    assert victim.receipt.rsplit(".", 1)[1] != predicted
    attacker = vsqs.Queue(queue.path)
    try:
        attacker.delete(attacker.current_receipt(_forged(victim.receipt, predicted)))
    except vsqs.StaleReceipt:
        pass
    assert queue.stats().in_flight == 1  # the victim's message is still held
    victim.delete()


def test_current_receipt_wants_the_whole_tag(queue):
    queue.publish(b"x")
    victim = queue.receive(visibility_timeout=300)
    assert victim is not None
    tag = victim.receipt.rsplit(".", 1)[1]
    attacker = vsqs.Queue(queue.path)
    for guess in (tag[:6] + ("000000" if tag[6:] != "000000" else "ffffff"),  # the receive id alone
                  ("000000" if tag[:6] != "000000" else "ffffff") + tag[6:]):
        forged = _forged(victim.receipt, guess)
        try:
            attacker.current_receipt(forged)
        except vsqs.StaleReceipt:
            continue
        raise AssertionError(f"a receipt with TAG {guess} found the message held with TAG {tag}")
    victim.delete()


def test_current_receipt_follows_a_genuine_receipt_with_its_whole_tag(queue):
    queue.publish(b"x")
    first = queue.receive(visibility_timeout=300).receipt
    other = vsqs.Queue(queue.path)
    moved = other.change_visibility(other.change_visibility(first, 400), 500)
    assert moved != first
    assert queue.current_receipt(first) == moved
    # any earlier receipt of the same receive finds it too: it carries the receive's TAG
    assert queue.current_receipt(_forged(first, first.rsplit(".", 1)[1], 1)) == moved
    queue.delete(queue.current_receipt(first))
    assert queue.stats().total == 0


def test_a_delayed_message_tag_is_not_predicted_by_the_ids_before_it(tmp_path):
    """A delayed publish draws its id, then its TAG: the ids before it predict
    the id (ids are no secret), never the TAG."""
    queue = vsqs.Queue(tmp_path / "q", create=True)
    ids = [queue.publish(b"x", durable=False) for _ in range(KEYS_NEEDED)]
    twin = clone(outputs_of_keys(ids))
    predicted_id_rand, predicted_tag = f"{twin.getrandbits(64):016x}", f"{twin.getrandbits(48):012x}"
    later = queue.publish(b"later", delay=600, durable=False)
    assert later.endswith(predicted_id_rand)  # the attack works on what it may work on
    delayed = [n for n in message_names(queue.path) if n.startswith(later)]
    assert len(delayed) == 1 and delayed[0].count(".") == 3
    assert not delayed[0].endswith(predicted_tag)



# A group's slot leases are what keeps its order when a listing is
# incomplete: a readdir that races a rename may miss the renamed entry
# (POSIX allows it; NFS clients list from their cache), so a consumer may
# see a group's next message as its first with none in flight. A receipt's
# slot (``S.GEN``) comes from outside: one altered to another holder's must
# neither free nor take that holder's slot.


def _with_slot(receipt: str, donor: str) -> str:
    """``receipt`` carrying the slot (``S.GEN``) of ``donor``'s receipt instead
    of its own: what a consumer who saw a receipt of the group can write."""
    return receipt.rsplit(":", 1)[0] + ":" + donor.rsplit(":", 1)[1]


def _blind_to(monkeypatch, message_id: str) -> None:
    """Listings of the queue miss ``message_id``'s file (as a readdir racing its rename may)."""
    from vsqs._core import fs as _fs

    real = _fs.list_names
    monkeypatch.setattr(
        _fs, "list_names",
        lambda d: [n for n in real(d) if message_id not in n] if _format.GROUPS_DIR not in d else real(d),
    )


def _ignore_stale(call) -> None:
    try:
        call()
    except vsqs.StaleReceipt:
        pass


def _fifo_with_an_old_receipt(queue):
    """A FIFO group of three; the first message received and deleted (its
    receipt kept: old, and the attacker's), the second held by a victim."""
    queue.configure(group_concurrency=1)
    queue.publish_batch([b"1", b"2", b"3"], group="g")
    old = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert old is not None and old.body == b"1"
    old.delete()
    victim = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert victim is not None and victim.body == b"2"
    return old.receipt, victim


def _group_still_held(queue, victim, monkeypatch) -> None:
    """A consumer whose listing misses the victim's message still gets
    nothing of the group while it is in flight (its slot is held); once the
    victim deletes it, the next comes, in order."""
    with monkeypatch.context() as patch:
        _blind_to(patch, victim.id)
        assert vsqs.Queue(queue.path).receive(visibility_timeout=300) is None
    victim.delete()
    after = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert after is not None and after.body == b"3"


def test_a_delete_with_another_holders_slot_frees_nothing(queue, monkeypatch):
    old, victim = _fifo_with_an_old_receipt(queue)
    _ignore_stale(lambda: vsqs.Queue(queue.path).delete(_with_slot(old, victim.receipt)))
    _group_still_held(queue, victim, monkeypatch)


def test_a_release_with_another_holders_slot_frees_nothing(queue, monkeypatch):
    old, victim = _fifo_with_an_old_receipt(queue)
    _ignore_stale(lambda: vsqs.Queue(queue.path).release(_with_slot(old, victim.receipt)))
    _group_still_held(queue, victim, monkeypatch)


def test_a_visibility_change_with_another_holders_slot_takes_nothing(queue, monkeypatch):
    # two slots; the attacker holds a message of the group on one, the victim on the other
    queue.configure(group_concurrency=2)
    queue.publish_batch([b"1", b"2", b"3", b"4"], group="g")
    mine = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    victim = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert (mine.body, victim.body) == (b"1", b"2")
    attacker = vsqs.Queue(queue.path)
    # the victim's slot taken over by an extension, and given up with the new receipt ...
    _ignore_stale(lambda: attacker.delete(attacker.change_visibility(_with_slot(mine.receipt, victim.receipt), 300)))
    _ignore_stale(lambda: attacker.delete(mine.receipt))  # ... and the attacker's own, by its genuine receipt
    with monkeypatch.context() as patch:
        _blind_to(patch, victim.id)
        others = [vsqs.Queue(queue.path).receive(visibility_timeout=300) for _ in range(2)]
    assert [m.body for m in others if m is not None] == [b"3"]  # the victim's and one more: two in flight
    victim.delete()


def test_a_genuine_receipt_from_another_handle_still_frees_its_slot(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    held = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    moved = vsqs.Queue(queue.path).change_visibility(held.receipt, 300)  # another handle: checked, and its own
    vsqs.Queue(queue.path).delete(moved)
    after = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert after is not None and after.body == b"2"
    vsqs.Queue(queue.path).release(after.receipt)
    again = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert again is not None and again.body == b"2"


# What the slot check rests on: a receipt that holds its message. A hidden
# name can be made up from what is known (the stem of a message of the
# group, a receive count, an UNTIL: a time known to within a few
# milliseconds, so a few thousand guesses), all but its TAG; whatever a
# receipt names, its slot moves only with a message found under that name.


def _made_up(receipt: str, stem: str, count: int, until_us: int, slot: str) -> str:
    """A receipt of ``receipt``'s queue for a hidden name made up of ``stem``,
    ``count`` and ``until_us`` (and a TAG guessed), holding ``slot``."""
    queue_id = receipt.split(":", 1)[0]
    return f"{queue_id}:{_format.hidden_name(stem, until_us, count, 'a' * 12)}:{slot}"


def _ready_stem(queue) -> str:
    """The stem of the group's one message waiting (its id is published; the
    group's hash is in any receipt of the group)."""
    (name,) = [os.path.basename(n) for n in message_names(queue.path) if "." not in os.path.basename(n)]
    return name


def _slot_of(receipt: str) -> tuple[int, int]:
    index, gen = receipt.rsplit(":", 1)[1].split(".")[:2]
    return int(index), int(gen)


@pytest.mark.parametrize("settle", ["delete", "release", "change_visibility"])
def test_a_made_up_name_with_the_holders_until_frees_nothing(queue, monkeypatch, settle):
    old, victim = _fifo_with_an_old_receipt(queue)
    until = _format.parse_name(victim.receipt.split(":")[1]).until_us  # known here; else guessed
    stem = _format.parse_name(old.split(":")[1]).stem
    forged = _made_up(old, stem, 1, until, victim.receipt.rsplit(":", 1)[1])
    attacker = vsqs.Queue(queue.path)
    act = {"delete": attacker.delete, "release": attacker.release,
           "change_visibility": lambda receipt: attacker.change_visibility(receipt, 300)}[settle]
    _ignore_stale(lambda: act(forged))
    _group_still_held(queue, victim, monkeypatch)


def test_a_release_of_made_up_run_members_frees_nothing(queue, monkeypatch):
    # the made-up name's release reports success: its ready name (the group's
    # next message, never received) exists, as after a retransmitted rename
    old, victim = _fifo_with_an_old_receipt(queue)
    index, gen = _slot_of(victim.receipt)
    far = _format.now_us() + 3600 * 10**6
    attacker = vsqs.Queue(queue.path)
    for member in (0, 1):  # a run of two: both marked done, the last frees the slot
        forged = _made_up(old, _ready_stem(queue), 0, far, f"{index}.{gen}.1.{member}.2")
        _ignore_stale(lambda forged=forged: attacker.release(forged))
    _group_still_held(queue, victim, monkeypatch)


def test_a_visibility_change_of_a_made_up_run_member_raises_no_lease(queue):
    old, victim = _fifo_with_an_old_receipt(queue)
    index, gen = _slot_of(victim.receipt)
    forged = _made_up(old, _ready_stem(queue), 0, _format.now_us() + 3600 * 10**6, f"{index}.{gen}.1.0.2")
    _ignore_stale(lambda: vsqs.Queue(queue.path).change_visibility(forged, 43200))
    victim.delete()  # frees the slot, unless a raise took the next generation: held 12 hours
    after = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    assert after is not None and after.body == b"3"


@pytest.mark.parametrize("settle", ["delete", "release"])
def test_held_messages_made_run_members_of_another_holders_slot_free_nothing(queue, settle):
    # Runs are taken only with one slot a group; with three, a consumer holding
    # two messages of the group (its own slots) calls them the two members of
    # a run on the victim's slot: deleting them marked the run done and freed
    # the victim's slot, and once the consumer's own leases ran out, four were
    # in flight
    queue.configure(group_concurrency=3)
    queue.publish_batch([b"1", b"2", b"3", b"4"], group="g")
    victim = vsqs.Queue(queue.path).receive(visibility_timeout=300)
    mine = vsqs.Queue(queue.path).receive_batch(2, visibility_timeout=300)
    assert victim.body == b"1" and [m.body for m in mine] == [b"2", b"3"]
    index, gen = _slot_of(victim.receipt)
    attacker = vsqs.Queue(queue.path)
    for member, message in enumerate(mine):
        forged = message.receipt.rsplit(":", 1)[0] + f":{index}.{gen}.{gen}.{member}.2"
        _ignore_stale(lambda forged=forged: getattr(attacker, settle)(forged))
    until = _format.parse_name(victim.receipt.split(":")[1]).until_us
    leases = GroupLeases(queue.path)
    assert leases.held_until(_format.group_hash("g"), index, until) is not None  # still the victim's
    if settle == "delete":
        assert vsqs.Queue(queue.path).receive(visibility_timeout=300) is None  # three slots held
