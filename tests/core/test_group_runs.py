"""Group runs: ``receive_batch(group_runs=True)`` takes a group's
next messages together, as Amazon SQS FIFO does, all held on the group's one
slot lease; and an older vsqs on the same spool still sees the group held."""

from __future__ import annotations

import os
import re

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core import groups as _groups
from vsqs._core.errors import InvalidReceipt

# What vsqs before runs accepts (copied from its format.py: the contract older readers keep)
OLD_SLOT_REF = re.compile(r"(0|[1-9][0-9]{0,5})\.([1-9][0-9]{0,17})")


def old_decode_lease(data: bytes) -> int | None:
    if data == b"free\n":
        return 0
    text = data.decode("ascii", "replace").strip()
    return int(text) if len(text) == 16 and text.isdigit() else None


def lease_of(queue: vsqs.Queue, group: str) -> bytes:
    """The content of the newest generation of the group's slot 0."""
    directory = os.path.join(queue.path, _format.GROUPS_DIR)
    gens = [p[2] for p in map(_format.parse_lease_name, os.listdir(directory))
            if p and p[0] == _format.group_hash(group) and p[1] == 0]
    with open(os.path.join(directory, _format.lease_name(_format.group_hash(group), 0, max(gens))), "rb") as f:
        return f.read()


def until_of(message: vsqs.Message) -> int:
    return _format.parse_receipt(message.queue.id, message.receipt)[0].until_us


def publish(queue: vsqs.Queue, group: str, count: int) -> None:
    queue.publish_batch([f"{group}{i}" for i in range(count)], group=group)


def bodies(messages: list[vsqs.Message]) -> list[str]:
    return [m.body.decode() for m in messages]


def test_a_receive_takes_the_groups_next_messages_in_order(queue):
    publish(queue, "g", 5)
    publish(queue, "h", 2)
    got = queue.receive_batch(10, group_runs=True)
    assert sorted(bodies(got)) == ["g0", "g1", "g2", "g3", "g4", "h0", "h1"]
    assert [b for b in bodies(got) if b[0] == "g"] == ["g0", "g1", "g2", "g3", "g4"]
    assert vsqs.Queue(queue.path).receive_batch(10, group_runs=True) == []


def test_without_group_runs_a_batch_takes_one_message_a_group(queue):
    publish(queue, "g", 5)
    publish(queue, "h", 2)
    assert sorted(bodies(queue.receive_batch(10))) == ["g0", "h0"]  # existing callers: unchanged


def test_a_run_stops_at_the_batch_size_and_the_rest_waits(queue):
    publish(queue, "g", 5)
    run = queue.receive_batch(3, group_runs=True)
    assert bodies(run) == ["g0", "g1", "g2"]
    for message in run[:2]:
        message.delete()
        assert vsqs.Queue(queue.path).receive_batch(10, group_runs=True) == []  # held while any member is in flight
    run[2].delete()
    assert bodies(vsqs.Queue(queue.path).receive_batch(10, group_runs=True)) == ["g3", "g4"]


def test_no_runs_with_more_than_one_slot_a_group(queue):
    queue.configure(group_concurrency=2)
    publish(queue, "g", 5)
    got = queue.receive_batch(10, group_runs=True)
    assert bodies(got) == ["g0", "g1"]  # two slots, one message each, as before
    assert all(OLD_SLOT_REF.fullmatch(m.receipt.split(":")[2]) for m in got)


def test_a_message_alone_keeps_the_receipt_older_versions_read(queue):
    publish(queue, "g", 1)
    (alone,) = queue.receive_batch(10, group_runs=True)
    assert OLD_SLOT_REF.fullmatch(alone.receipt.split(":")[2])


def test_an_older_vsqs_refuses_a_runs_receipts(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, group_runs=True)
    for message in run:
        assert not OLD_SLOT_REF.fullmatch(message.receipt.split(":")[2])  # InvalidReceipt there: nothing moves


def test_the_lease_keeps_the_old_form_and_covers_every_member(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(10, visibility_timeout=60, group_runs=True)
    lease = lease_of(queue, "g")
    assert re.fullmatch(rb"[0-9]{16}\n", lease)
    assert old_decode_lease(lease) == max(until_of(m) for m in run)  # an older reader: held until then
    moved = queue.change_visibility(run[1].receipt, 600)
    held = _format.parse_receipt(queue.id, moved)[0].until_us
    assert old_decode_lease(lease_of(queue, "g")) == held  # raised first, never below a member's time
    queue.change_visibility(run[2].receipt, 5)
    assert old_decode_lease(lease_of(queue, "g")) == held  # never lowered


def test_an_older_reader_sees_the_group_held_until_the_whole_run_is_done(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(10, group_runs=True)
    run[0].delete()
    run[1].delete()
    assert old_decode_lease(lease_of(queue, "g")) > _format.now_us()  # still held: run[2] is in flight
    run[2].delete()
    assert old_decode_lease(lease_of(queue, "g")) == 0  # free
    assert [n for n in os.listdir(os.path.join(queue.path, _format.GROUPS_DIR))
            if _format.parse_run_mark(n)] == []  # the marks went with it


def test_a_released_member_comes_back_first_once_the_run_is_done(queue):
    publish(queue, "g", 5)
    run = queue.receive_batch(4, group_runs=True)
    run[1].release()
    other = vsqs.Queue(queue.path)
    assert other.receive_batch(10, group_runs=True) == []  # g0, g2, g3 still in flight
    for i in (0, 2, 3):
        run[i].delete()
    again = vsqs.Queue(queue.path).receive_batch(10, group_runs=True)  # (a handle that lists now)
    assert bodies(again) == ["g1", "g4"]
    assert [m.receive_count for m in again] == [2, 1]


def test_a_member_made_visible_ahead_of_the_others_is_handed_over_at_once(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(10, group_runs=True)
    run[0].change_visibility(0)
    other = vsqs.Queue(queue.path)
    [again] = other.receive_batch(10, group_runs=True)  # the visible prefix: g1 and g2 are in flight
    assert (again.body, again.receive_count) == (b"g0", 2)
    assert vsqs.Queue(queue.path).receive_batch(10, group_runs=True) == []
    run[1].delete()
    run[2].delete()
    assert vsqs.Queue(queue.path).receive_batch(10, group_runs=True) == []  # g0 is in flight
    again.delete()
    assert vsqs.Queue(queue.path).receive_batch(10, group_runs=True) == []
    assert queue.stats().total == 0


def test_a_member_made_visible_cannot_be_taken_back_by_its_receipt(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, group_runs=True)
    visible = queue.change_visibility(run[0].receipt, 0)
    with pytest.raises(vsqs.StaleReceipt):  # done for its run: it may be the next receiver's
        queue.change_visibility(visible, 30)


def test_a_member_whose_lease_ran_out_is_not_extended(queue, monkeypatch):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, visibility_timeout=30, group_runs=True)
    lease = lease_of(queue, "g")
    later = until_of(run[0]) + 1
    monkeypatch.setattr(_format, "now_us", lambda: later)  # (the clock the run's checks read)
    with pytest.raises(vsqs.StaleReceipt):
        queue.change_visibility(run[0].receipt, 30)
    assert lease_of(queue, "g") == lease  # nothing written: the slot may be someone else's by now


def test_the_last_member_does_not_free_a_slot_it_cannot_prove_is_its_runs(queue, monkeypatch):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, visibility_timeout=30, group_runs=True)
    run[0].delete()
    later = until_of(run[1]) + 1
    monkeypatch.setattr(_format, "now_us", lambda: later)
    run[1].delete()  # (deleted: its lease ran out, but no one had taken it)
    assert old_decode_lease(lease_of(queue, "g")) != 0  # not freed: the lease runs out by itself


def test_current_receipt_follows_a_member(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, group_runs=True)
    moved = vsqs.Queue(queue.path).change_visibility(run[1].receipt, 60)
    assert queue.current_receipt(run[1].receipt).split(":")[1] == moved.split(":")[1]
    queue.delete(queue.current_receipt(run[1].receipt))
    run[0].delete()
    assert old_decode_lease(lease_of(queue, "g")) == 0


def test_a_run_ends_where_the_listing_is_out_of_date(flat_queue):
    queue = flat_queue
    publish(queue, "a", 1)
    publish(queue, "g", 4)
    assert queue.receive_batch(1, group_runs=True)[0].body == b"a0"  # this handle has listed the queue
    names = sorted(n for n in os.listdir(queue.path) if _format.group_of(n) == _format.group_hash("g"))
    moved = _format.parse_name(names[2])  # g2, behind the handle's back (as a release elsewhere would)
    os.rename(os.path.join(queue.path, names[2]),
              os.path.join(queue.path, _format.ready_name(moved.stem, 1)))
    run = queue.receive_batch(10, group_runs=True)
    assert bodies(run) == ["g0", "g1"]  # never g3 before g2
    for message in run:
        message.delete()
    assert bodies(vsqs.Queue(queue.path).receive_batch(10, group_runs=True)) == ["g2", "g3"]


def test_a_delayed_message_that_turns_visible_takes_no_run_kept_for_a_later_one(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish(b"x")
    queue.publish(b"m1", group="g", delay=30)
    queue.publish_batch([b"m2", b"m3", b"m4"], group="g")
    # this handle lists the queue: g's candidate is m2 (m1 is delayed), with the run m3, m4
    [first] = queue.receive_batch(1, group_runs=True)
    assert first.body == b"x"
    first.delete()
    later = _format.now_us() + 31_000_000
    monkeypatch.setattr(_format, "now_us", lambda: later)  # m1's delay is over; the cached listing promotes it
    delivered = []
    while got := queue.receive_batch(10, group_runs=True):
        delivered += bodies(got)
        for message in got:
            message.delete()
    assert delivered == ["m1", "m2", "m3", "m4"]


def test_a_member_at_max_receives_goes_to_the_dead_letter_queue(queue):
    queue.configure(max_receives=1)
    publish(queue, "g", 3)
    first = queue.receive_batch(1, group_runs=True)[0]
    first.release()  # g0 has had its one receive
    run = vsqs.Queue(queue.path).receive_batch(10, group_runs=True)
    assert bodies(run) == ["g1", "g2"]
    assert bodies(queue.dead_letter_queue().receive_batch(10)) == ["g0"]


def test_purge_frees_a_runs_group(queue):
    publish(queue, "g", 3)
    queue.receive_batch(10, visibility_timeout=3600, group_runs=True)
    queue.purge()
    publish(queue, "g", 1)
    assert bodies(vsqs.Queue(queue.path).receive_batch(10, group_runs=True)) == ["g0"]


def test_sweep_removes_the_marks_of_runs_that_are_over(queue, monkeypatch):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, visibility_timeout=30, group_runs=True)
    run[0].delete()  # its marks (gone, done); run[1] is never settled: its consumer died
    directory = os.path.join(queue.path, _format.GROUPS_DIR)
    marks = [n for n in os.listdir(directory) if _format.parse_run_mark(n)]
    assert len(marks) == 2
    leases = _groups.GroupLeases(queue.path)
    assert leases.sweep(grace=0) == 0  # its run's lease is in force: kept
    later = until_of(run[1]) + 1
    monkeypatch.setattr(_format, "now_us", lambda: later)
    assert leases.sweep(grace=0) == 2
    assert [n for n in os.listdir(directory) if _format.parse_run_mark(n)] == []


def test_run_receipts_are_validated(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(10, group_runs=True)
    head, slot = run[0].receipt.rsplit(":", 1)
    index, gen, start, member, size = slot.split(".")
    for forged in (f"{index}.{gen}.{start}.{member}.0",  # a run of none
                   f"{index}.{gen}.{start}.2.2",  # a member past its run
                   f"{index}.{gen}.{int(gen) + 1}.{member}.{size}",  # begun after its generation
                   f"{index}.{gen}.{start}.{member}.101"):  # longer than a run can be
        with pytest.raises(InvalidReceipt):
            queue.delete(f"{head}:{forged}")


def test_a_member_of_a_run_at_max_receives_goes_to_the_dead_letter_queue(flat_queue):
    queue = flat_queue
    queue.configure(max_receives=5)
    publish(queue, "g", 3)
    names = sorted(n for n in os.listdir(queue.path) if _format.group_of(n) == _format.group_hash("g"))
    g1 = _format.parse_name(names[1])
    os.rename(os.path.join(queue.path, names[1]), os.path.join(queue.path, _format.ready_name(g1.stem, 5)))
    assert bodies(queue.receive_batch(10, group_runs=True)) == ["g0", "g2"]
    assert bodies(queue.dead_letter_queue().receive_batch(10)) == ["g1"]


def test_an_extension_from_generation_1_after_a_sweep_raises_the_newest_lease(queue):
    # A run taken at generation 1 (a group's first claim): one member raises
    # the lease three times (generations 2..4), the sweep removes 2 and 3 (it
    # keeps 1 and the newest). A member whose receipt still says generation 1
    # must raise the newest lease, not recreate generation 2 beside it: else
    # the newest lease runs out while that member is in flight, and another
    # receiver takes the group.
    queue.publish_batch(["a0", "a1", "a2"], group="g")
    first, second, _ = queue.receive_batch(10, visibility_timeout=100, group_runs=True)
    for timeout in (200, 300, 400):
        second.change_visibility(timeout)
    queue._groups.sweep(grace=0)
    names = os.listdir(os.path.join(queue.path, _format.GROUPS_DIR))
    chain = sorted(parsed[2] for parsed in map(_format.parse_lease_name, names) if parsed is not None)
    assert chain == [1, 4]
    other = vsqs.Queue(queue.path)  # (a handle that knows nothing of the chain: it reads it from the receipt on)
    receipt = other.change_visibility(first.receipt, 1000)
    assert _format.decode_lease(lease_of(queue, "g")) >= _format.parse_receipt(queue.id, receipt)[0].until_us
    assert _format.decode_lease(lease_of(queue, "g")) >= until_of(second)
