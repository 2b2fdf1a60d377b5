"""FIFO message groups: order inside a group, N in flight, fairness across groups."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest

import vsqs
from vsqs._core import format as _format


def test_one_in_flight_per_group_in_order(queue):
    for i in range(3):
        queue.publish(f"a{i}", group="a")
    queue.publish(b"b0", group="b")
    first = queue.receive()
    assert (first.body, first.group) == (b"a0", "a")
    second = queue.receive()
    assert second.body == b"b0"  # group a is held up, b is not
    assert queue.receive() is None  # a1 waits for a0
    first.delete()
    assert queue.receive().body == b"a1"


def test_group_waits_across_handles(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    m = vsqs.Queue(queue.path).receive()
    assert vsqs.Queue(queue.path).receive() is None
    m.delete()
    assert vsqs.Queue(queue.path).receive().body == b"2"


def test_group_resumes_after_lease_runs_out(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    crashed = queue.receive(visibility_timeout=0.2)  # its consumer dies holding it
    assert queue.receive() is None
    time.sleep(0.25)
    again = vsqs.Queue(queue.path).receive()
    assert (again.id, again.receive_count) == (crashed.id, 2)  # in order: the same one first
    again.delete()
    assert queue.receive().body == b"2"


def test_release_gives_the_group_back(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    m = queue.receive()
    m.release()
    again = vsqs.Queue(queue.path).receive()
    assert again.id == m.id and again.receive_count == 2


def test_current_receipt_follows_the_group_slot(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    first = queue.receive(visibility_timeout=30).receipt
    moved = vsqs.Queue(queue.path).change_visibility(first, 60)
    assert queue.current_receipt(first) == moved  # the slot's generation followed too
    queue.delete(queue.current_receipt(first))
    assert queue.receive().body == b"2"  # the slot was freed: the group goes on


def test_current_receipt_refuses_a_slot_taken_by_another(queue):
    queue.publish(b"1", group="g")
    first = queue.receive(visibility_timeout=0.05).receipt
    time.sleep(0.1)
    again = vsqs.Queue(queue.path).receive(visibility_timeout=30)  # lease ran out: received again
    assert again is not None
    with pytest.raises(vsqs.StaleReceipt):
        queue.current_receipt(first)


def test_extended_lease_keeps_the_group_held(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    m = queue.receive(visibility_timeout=0.2)
    m.change_visibility(30)
    time.sleep(0.25)
    assert vsqs.Queue(queue.path).receive() is None
    m.delete()  # the new receipt frees the slot
    assert vsqs.Queue(queue.path).receive().body == b"2"


def test_group_concurrency(queue):
    queue.configure(group_concurrency=2)
    queue.publish_batch([b"1", b"2", b"3"], group="g")
    got = [m.body for m in queue.receive_batch(10)]
    assert got == [b"1", b"2"]
    assert vsqs.Queue(queue.path).receive() is None


def test_groups_take_turns(flat_queue):
    queue = flat_queue  # in a sharded queue groups take turns within each shard
    queue.configure(group_concurrency=100)
    queue.publish_batch([b"busy-%d" % i for i in range(50)], group="busy")
    queue.publish(b"quiet-1", group="quiet")
    queue.publish(b"quiet-2", group="other")
    got = [m.body for m in queue.receive_batch(3)]
    assert sorted(got) == [b"busy-0", b"quiet-1", b"quiet-2"]  # round-robin, not 3 busy ones


@pytest.mark.parametrize("handle", ["the releasing handle", "a fresh handle"])
def test_groups_that_came_back_wait_behind_the_groups_never_received(flat_queue, handle):
    queue = flat_queue
    for body, group in [("g1-m1", "g1"), ("g1-m2", "g1"), ("g1-m3", "g1"), ("g2-m1", "g2"), ("g3-m1", "g3")]:
        queue.publish(body.encode(), group=group)
    run = queue.receive_batch(2, group_runs=True)
    [g2] = queue.receive_batch(1, group_runs=True)
    assert [m.body for m in [*run, g2]] == [b"g1-m1", b"g1-m2", b"g2-m1"]
    for message in [*run, g2]:
        message.release()  # visible again at once, received once
    receiver = queue if handle == "the releasing handle" else vsqs.Queue(queue.path)
    got = [m.body.decode() for m in receiver.receive_batch(10, group_runs=True)]
    assert got[:2] == ["g3-m1", "g1-m1"]  # (a handle's own releases leave it no run to take)
    assert [body for body in got if body.startswith("g1")] == ["g1-m1", "g1-m2", "g1-m3"][: len(got) - 2]
    assert got[-1] == "g2-m1"


def test_a_group_whose_timeout_ran_out_waits_behind_the_groups_never_received(flat_queue):
    queue = flat_queue
    queue.publish(b"a1", group="a")
    assert queue.receive(visibility_timeout=0.1).body == b"a1"
    queue.publish(b"b1", group="b")
    time.sleep(0.2)  # a1's timeout is over: visible again, received once
    assert [m.body for m in queue.receive_batch(10)] == [b"b1", b"a1"]


def test_ungrouped_messages_are_not_held_up(queue):
    queue.publish_batch([b"g1", b"g2"], group="g")
    queue.publish(b"free")
    assert sorted(m.body for m in queue.receive_batch(5)) == [b"free", b"g1"]


def test_group_with_priority_is_refused(queue):
    with pytest.raises(vsqs.InvalidArgument, match="priority cannot be combined with group"):
        queue.publish(b"x", group="g", priority=5)
    with pytest.raises(vsqs.InvalidArgument, match="group must be"):
        queue.publish(b"x", group="")


def test_group_in_listing_and_receipt(queue):
    queue.publish(b"x", group="tenant-7")
    [info] = queue.messages(bodies=True)
    assert info.group == "tenant-7"
    m = queue.receive()
    assert m.receipt.count(":") == 2  # the slot lease travels in the receipt
    with pytest.raises(vsqs.InvalidReceipt):
        queue.delete(m.receipt + "9x")
    m.delete()


def test_lease_files_are_swept(queue):
    for _ in range(5):
        queue.publish(b"x", group="g")
        queue.receive().delete()
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    assert len(os.listdir(leases)) == 10  # a claim and a free per message
    old = time.time() - 3600
    for name in os.listdir(leases):
        os.utime(os.path.join(leases, name), (old, old))
    queue.collect_garbage()
    group = _format.group_hash("g")
    assert sorted(os.listdir(leases)) == [f"{group}.0.1", f"{group}.0.10"]  # first and newest
    queue.publish(b"y", group="g")
    assert vsqs.Queue(queue.path).receive().body == b"y"  # the chain goes on from the newest


def _group_consumer(path: str, barrier, out) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    log = []
    deadline = time.monotonic() + 60
    idle = 0
    while time.monotonic() < deadline and idle < 30:
        m = q.receive(visibility_timeout=30)
        if m is None:
            idle += 1
            time.sleep(0.01)
            continue
        idle = 0
        start = time.time()
        time.sleep(0.002)
        log.append((m.group, m.body.decode(), start, time.time()))
        m.delete()
    out.put(log)


def test_racing_consumers_never_overlap_in_a_group(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    for g in range(4):
        q.publish_batch([f"{i}" for i in range(40)], group=f"g{g}", durable=False)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_group_consumer, args=(q.path, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    logs = [entry for _ in procs for entry in out.get(timeout=120)]
    for p in procs:
        p.join(60)
    assert len(logs) == 160
    for g in range(4):
        handled = sorted((start, end, int(body)) for group, body, start, end in logs if group == f"g{g}")
        assert [body for *_, body in handled] == list(range(40))  # strictly in order
        for (_, end, _), (start, _, _) in zip(handled, handled[1:], strict=False):
            assert start >= end  # never two of one group at once


def test_stats_per_group(queue):
    queue.publish_batch([b"1", b"2"], group="tenant-a")
    queue.publish(b"x", group="tenant-b")
    queue.publish(b"plain")
    queue.receive_batch(10)
    s = queue.stats(groups=True)
    assert s.groups == {
        "tenant-a": {"ready": 1, "in_flight": 1, "delayed": 0},
        "tenant-b": {"ready": 0, "in_flight": 1, "delayed": 0},
    }
    assert queue.stats().groups is None


def test_relist_while_settings_expire_does_not_deadlock(queue, monkeypatch):
    # the settings cache runs out in the middle of a listing of a grouped queue
    import vsqs._core.queue as queue_module

    queue.publish_batch([b"1", b"2"], group="g")
    monkeypatch.setattr(queue_module, "_SETTINGS_TTL", 0.0)
    got = []
    worker = threading.Thread(target=lambda: got.append(queue.receive()), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and got[0].body == b"1"


def test_receipt_of_a_grouped_message_needs_its_slot(queue):
    queue.publish(b"x", group="g")
    m = queue.receive()
    without_slot = m.receipt.rsplit(":", 1)[0]
    with pytest.raises(vsqs.InvalidReceipt):
        queue.delete(without_slot)
    m.delete()


def test_extend_after_the_slot_was_taken_is_stale(queue):
    queue.publish_batch([b"1", b"2"], group="g")
    m = queue.receive(visibility_timeout=0.1)
    time.sleep(0.15)
    again = vsqs.Queue(queue.path).receive(visibility_timeout=30)  # takes slot and message
    assert again.id == m.id
    with pytest.raises(vsqs.StaleReceipt):
        m.change_visibility(30)
    assert vsqs.Queue(queue.path).receive() is None  # still one in flight, held by `again`


def test_a_handle_with_an_old_view_cannot_restart_a_swept_chain(queue):
    from vsqs._core import groups as _groups

    queue.publish_batch([b"1", b"2"], group="g")
    group = _format.group_hash("g")
    old_view = _groups.GroupLeases(queue.path)  # saw nothing
    holder = queue.receive(visibility_timeout=30)  # generation 1
    holder.change_visibility(30)  # generation 2
    holder.change_visibility(30)  # generation 3
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    os.unlink(os.path.join(leases, f"{group}.0.2"))  # as if swept
    now = _format.now_us()
    assert old_view.claim(group, 1, now + 10**6, now, 0) is None  # generation 1 is still there
    old_view._newest[(group, 0)] = 1  # a view from before the sweep...
    with open(os.path.join(leases, f"{group}.0.1"), "wb") as f:
        f.write(b"free\n")  # ...in which the slot looked free
    assert old_view.claim(group, 1, now + 10**6, now, 0) is None  # re-made 2, saw 3, backed off
    assert not os.path.exists(os.path.join(leases, f"{group}.0.2"))


def test_a_gap_of_any_length_after_generation_1_stops_an_old_view(queue):
    from vsqs._core import groups as _groups

    queue.publish_batch([b"1", b"2"], group="g")
    group = _format.group_hash("g")
    holder = queue.receive(visibility_timeout=30)  # generation 1
    for _ in range(4):
        holder.change_visibility(30)  # generations 2 to 5
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    for gen in (2, 3, 4):
        os.unlink(os.path.join(leases, f"{group}.0.{gen}"))  # as if swept: 1 and 5 are left
    with open(os.path.join(leases, f"{group}.0.1"), "wb") as f:
        f.write(b"free\n")  # the old generation looked free
    old_view = _groups.GroupLeases(queue.path)
    old_view._newest[(group, 0)] = 1  # a view from before the sweep
    now = _format.now_us()
    assert old_view.claim(group, 1, now + 10**6, now, 0) is None  # made 2, listed 5, backed off
    assert not os.path.exists(os.path.join(leases, f"{group}.0.2"))
    assert vsqs.Queue(queue.path).receive() is None  # still held, by one consumer only


def test_a_stale_listing_of_the_leases_only_delays_by_one_lookup(queue, monkeypatch):
    # A network filesystem's client may list a directory from its cache long
    # after another host moved a slot's chain on. The handle that loses the
    # exclusive create learns the newest generation by name, and a stale
    # listing does not take that knowledge back.
    from vsqs._core import fs as _fs

    queue.publish_batch([str(i).encode() for i in range(6)], group="g")
    other = vsqs.Queue(queue.path)
    first = queue.receive(visibility_timeout=30)
    first.delete()  # this handle's view: the slot is free at generation 2
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    frozen = sorted(os.listdir(leases))
    real = _fs.list_names
    monkeypatch.setattr(_fs, "list_names", lambda d: list(frozen) if d == leases else real(d))
    for _ in range(3):  # the other host takes and settles three (generations 3 to 8)
        other.receive(visibility_timeout=30).delete()
    assert sorted(os.listdir(leases)) != frozen
    got = [queue.receive(visibility_timeout=30) for _ in range(2)]
    taken = next(m for m in got if m is not None)  # the first may lose the create; it finds the newest
    assert taken.body == b"4"


def _receive_within(queue, seconds):
    deadline = time.monotonic() + seconds
    while True:
        got = queue.receive(visibility_timeout=30)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_a_lease_that_could_not_be_written_does_not_hold_the_group_back(queue, monkeypatch):
    # A generation this handle failed to create (a full disk) is no
    # generation it knows: kept over every listing, it would make the slot
    # unclaimable for this handle until someone else moved the chain past it.
    import errno

    from vsqs._core import fs as _fs

    queue.publish_batch([b"1", b"2"], group="g")
    queue.receive().delete()  # the chain is listed: generations 1 and 2 (free)
    real = _fs.create_exclusive

    def disk_full(path, data, **kwargs):
        if os.path.basename(os.path.dirname(path)) == _format.GROUPS_DIR:
            raise _fs.storage_error(OSError(errno.ENOSPC, "No space left on device", path), "cannot create")
        return real(path, data, **kwargs)

    monkeypatch.setattr(_fs, "create_exclusive", disk_full)
    with pytest.raises(vsqs.StorageError):
        queue.receive()  # generation 3 could not be made
    monkeypatch.setattr(_fs, "create_exclusive", real)  # room again
    got = _receive_within(queue, 5)
    assert got is not None and got.body == b"2"


def test_a_chain_made_again_does_not_block_a_handle_that_knew_the_old_one(tmp_path):
    # The queue deleted and made again while a handle stays open: the new
    # chain starts over at generation 1, below what the handle knew.
    spool = vsqs.Spool(tmp_path)
    old_handle = spool.create_queue("q")
    old_handle.publish_batch([b"1", b"2", b"3"], group="g")
    for _ in range(3):
        old_handle.receive().delete()  # this handle knows generation 6
    spool.delete_queue("q")
    other = spool.create_queue("q")
    other.publish_batch([b"a", b"b"], group="g")
    other.receive().delete()  # the new chain: generations 1 and 2
    got = _receive_within(old_handle, 5)
    assert got is not None and got.body == b"b"


def test_settling_a_first_lease_lists_no_group_chains(queue, monkeypatch):
    # Making a chain's generation 2 checks a listing of .groups/ only when
    # generation 1 may have been taken over (it ran out, or was free): the
    # usual case, a holder settling its own first lease, costs one read, not
    # a listing of every group ever used (a listing a message: quadratic).
    from vsqs._core import fs as _fs

    queue.publish_batch([b"x"] * 1, group="warm")
    queue.receive().delete()  # the listing of the groups is made once
    for i in range(100):
        queue.publish(b"x", group=f"g{i}")
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    listings = []
    real = _fs.list_names
    monkeypatch.setattr(_fs, "list_names", lambda d: listings.append(d) or real(d))
    taken = 0
    while (m := queue.receive()) is not None:
        m.delete()
        taken += 1
    assert taken == 100
    assert listings.count(leases) < 10, listings.count(leases)


def test_an_old_receipt_of_this_handle_makes_no_swept_generation_again(queue):
    # A handle deletes by a receipt it made without reading it again; one it
    # made before a change of visibility is old, and its generation may be swept
    queue.publish_batch([b"0", b"1", b"2", b"3"], group="g")
    group = _format.group_hash("g")
    queue.receive().delete()  # generations 1 and 2
    held = queue.receive(visibility_timeout=30)  # generation 3
    queue.delete(queue.change_visibility(held.receipt, 30))  # 4, and 5 free
    queue.receive().delete()  # 6 and 7
    leases = os.path.join(queue.path, _format.GROUPS_DIR)
    for gen in range(2, 7):
        os.unlink(os.path.join(leases, f"{group}.0.{gen}"))  # as if swept: 1 and the newest, 7, stay
    with pytest.raises(vsqs.StaleReceipt):
        queue.delete(held.receipt)
    assert sorted(os.listdir(leases)) == [f"{group}.0.1", f"{group}.0.7"]  # no free made at 4
    assert vsqs.Queue(queue.path).receive(visibility_timeout=30).body == b"3"  # generation 8
    now = _format.now_us()
    assert queue._groups.claim(group, 1, now + 10**6, now, 0) is None  # (as a receive from its cached listing)
