"""Priorities, scheduling, attributes and batch receipts."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import datetime, timedelta, timezone

import pytest

import vsqs
from tests.conftest import message_names, message_path
from vsqs._core import format as _format


def test_priority_goes_first_fifo_within(flat_queue):
    queue = flat_queue
    queue.publish(b"low-1")
    queue.publish(b"high-1", priority=9)
    queue.publish(b"mid", priority=5)
    queue.publish(b"high-2", priority=9)
    queue.publish(b"low-2")
    got = [m.body for m in queue.receive_batch(10)]
    assert got == [b"high-1", b"high-2", b"mid", b"low-1", b"low-2"]


@pytest.mark.parametrize("priority", [-1, 10, 1.5, "9", True])
def test_bad_priority(queue, priority):
    with pytest.raises(vsqs.InvalidArgument, match="priority"):
        queue.publish(b"x", priority=priority)


def test_priority_in_listing(queue):
    queue.publish(b"x", priority=7)
    assert [i.priority for i in queue.messages()] == [7]


def test_at_schedules(queue):
    queue.publish(b"later", at=datetime.now(timezone.utc) + timedelta(seconds=0.3))
    queue.publish(b"past", at=datetime.now() - timedelta(hours=1))  # naive: local time
    assert queue.receive().body == b"past"
    assert queue.receive() is None
    time.sleep(0.35)
    assert queue.receive().body == b"later"


def test_at_and_delay_conflict(queue):
    with pytest.raises(vsqs.InvalidArgument, match="delay or at"):
        queue.publish(b"x", delay=1, at=datetime.now())
    with pytest.raises(vsqs.InvalidArgument, match="at must be a datetime"):
        queue.publish(b"x", at=12345)


def test_attributes_and_md5(queue):
    queue.publish(b"body\nwith newline", attributes={"trace-id": "abc", "lang": "fr"})
    queue.publish(b"plain")
    m, plain = sorted(queue.receive_batch(2), key=lambda m: m.body == b"plain")
    assert m.body == b"body\nwith newline"
    assert m.attributes == {"trace-id": "abc", "lang": "fr"}
    assert m.md5 == hashlib.md5(b"body\nwith newline").hexdigest()
    assert (plain.attributes, plain.body) == ({}, b"plain")
    [info] = [i for i in queue.messages(bodies=True) if i.id == m.id]
    assert info.attributes == {"trace-id": "abc", "lang": "fr"} and info.body == m.body


def test_attributes_with_lazy_body(queue):
    queue.publish(b"x", attributes={"k": "v"})
    [m] = queue.receive_batch(1, read_bodies=False)
    assert m.attributes == {"k": "v"} and m.body == b"x"


def test_attributes_survive_dead_lettering_and_redrive(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.configure(max_receives=1)
    q.publish(b"x", attributes={"k": "v"})
    q.receive(visibility_timeout=0)
    q.requeue_expired()
    dlq = vsqs.Queue(tmp_path / "q.dlq")
    assert dlq.receive(visibility_timeout=0).attributes == {"k": "v"}
    dlq.redrive()
    assert q.receive().attributes == {"k": "v"}


def test_attribute_names_take_latin_letters(queue):
    queue.publish(b"x", attributes={"attr.1øßä": "v", "Ā-ſ": "w"})
    assert queue.receive().attributes == {"attr.1øßä": "v", "Ā-ſ": "w"}


@pytest.mark.parametrize(
    "attributes, match",
    [
        ({"bad name": "v"}, "attribute name"),
        ({"a×b": "v"}, "attribute name"),  # a sign among the Latin letters
        ({"ø" * 200: "v" * (64 * 1024 - 300)}, "bytes in all"),  # a Latin letter is two bytes
        ({"k": 1}, "must be a str"),
        ({f"k{i}": "v" for i in range(51)}, "at most 50"),
        ({"k": "v" * 70000}, "bytes in all"),
        (["k", "v"], "must be a mapping"),
    ],
)
def test_bad_attributes(queue, attributes, match):
    with pytest.raises(vsqs.InvalidArgument, match=match):
        queue.publish(b"x", attributes=attributes)
    assert queue.stats().total == 0


def test_corrupt_envelope_is_an_error_not_a_loss(queue):
    queue.publish(b"x", attributes={"k": "v"})
    [name] = [n for n in message_names(queue.path) if _format.parse_name(n)]
    with open(message_path(queue, name), "wb") as f:
        f.write(b"truncated header without newline")
    with pytest.raises(vsqs.StorageError, match="corrupt message envelope"):
        queue.receive(visibility_timeout=0.1)
    time.sleep(0.15)
    assert queue.stats().ready == 1  # still there, visible again


def test_delete_batch_reports_each_entry(queue):
    queue.publish_batch([b"1", b"2", b"3"])
    a, b, c = queue.receive_batch(3)
    b.delete()
    outcomes = queue.delete_batch([a.receipt, b.receipt, "garbage", c.receipt])
    assert outcomes[0] is None and outcomes[3] is None
    assert isinstance(outcomes[1], vsqs.StaleReceipt)
    assert isinstance(outcomes[2], vsqs.InvalidReceipt)
    assert queue.stats().total == 0


def test_change_visibility_batch(queue):
    queue.publish_batch([b"1", b"2"])
    a, b = queue.receive_batch(2)
    outcomes = queue.change_visibility_batch(
        [(a.receipt, 0), (b.receipt, -1), ("garbage", 5), ("lonely",), (b.receipt, 60)]
    )
    assert isinstance(outcomes[0], str) and outcomes[0] != a.receipt
    assert isinstance(outcomes[1], vsqs.InvalidArgument)
    assert isinstance(outcomes[2], vsqs.InvalidReceipt)
    assert isinstance(outcomes[3], vsqs.InvalidArgument)
    assert isinstance(outcomes[4], str)
    assert queue.receive().id == a.id  # visible again
    queue.delete(outcomes[4])


# -- flow control ---------------------------------------------------------------------


def test_suspend_and_resume_in_every_handle(queue):
    queue.publish_batch([b"1", b"2"])
    m = queue.receive()
    other = vsqs.Queue(queue.path)
    queue.suspend("publish", "receive")
    for handle in (queue, vsqs.Queue(queue.path)):
        with pytest.raises(vsqs.QueueSuspended, match="publish is suspended"):
            handle.publish(b"x")
        with pytest.raises(vsqs.QueueSuspended, match="receive is suspended"):
            handle.receive()
    m.delete()  # delete still works
    time.sleep(1.05)  # other handles re-read settings at most every second
    with pytest.raises(vsqs.QueueSuspended):
        other.receive()
    queue.resume("receive")
    assert queue.receive().body == ({b"1", b"2"} - {m.body}).pop()
    queue.suspend()
    assert queue.settings["suspended"] == ["delete", "publish", "receive"]
    queue.resume()
    assert queue.settings["suspended"] == []
    with pytest.raises(vsqs.InvalidArgument, match="unknown operation"):
        queue.suspend("purge")


def test_throttle_limits_receives_per_window(queue):
    queue.configure(throttle=(3, 60))
    queue.publish_batch([b"%d" % i for i in range(10)])
    got = queue.receive_batch(10)
    assert len(got) == 3
    assert vsqs.Queue(queue.path).receive() is None  # other handles share the budget
    assert queue.throttled()
    assert queue.stats().ready == 7  # nothing was lost or hidden by the throttle


def test_throttle_recovers_next_window(queue):
    queue.configure(throttle=(2, 0.5))
    queue.publish_batch([b"%d" % i for i in range(5)])
    assert len(queue.receive_batch(5)) == 2
    time.sleep(0.5 - (time.time() % 0.5) + 0.01)  # the next window
    assert len(queue.receive_batch(5)) == 2


def test_throttle_tokens_are_swept(queue):
    queue.configure(throttle=(1, 0.1))
    queue.publish_batch([b"%d" % i for i in range(6)])
    for _ in range(6):
        while queue.receive() is None:
            time.sleep(0.02)
    tokens = os.listdir(os.path.join(queue.path, ".throttle"))
    assert len(tokens) <= 3  # only the last windows' tokens remain


def test_retention_drops_old_messages_in_gc(queue):
    queue.publish(b"old")
    time.sleep(0.3)
    queue.publish(b"new")
    queue.configure(retention=0.2)
    assert queue.collect_garbage() == 1
    assert [m.body for m in queue.receive_batch(5)] == [b"new"]


def test_corrupt_message_does_not_strand_the_rest_of_a_batch(queue):
    queue.publish(b"bad", attributes={"k": "v"})
    queue.publish_batch([b"good-1", b"good-2"])
    [name] = [n for n in message_names(queue.path) if n.endswith("-e")]
    with open(message_path(queue, name), "wb") as f:
        f.write(b"no header line")
    assert sorted(m.body for m in queue.receive_batch(10)) == [b"good-1", b"good-2"]


def test_worker_survives_a_corrupt_message(queue):
    queue.publish(b"bad", attributes={"k": "v"})
    [name] = [n for n in message_names(queue.path) if n.endswith("-e")]
    with open(message_path(queue, name), "wb") as f:
        f.write(b"no header line")
    queue.publish_batch([b"good-1", b"good-2"])
    seen = []
    stats = vsqs.Worker(queue, lambda m: seen.append(m.body), burst=True, wait=0.1).work()
    assert sorted(seen) == [b"good-1", b"good-2"] and stats.processed == 2


def test_long_poll_notices_a_suspension(queue):
    import threading

    threading.Timer(0.2, lambda: vsqs.Queue(queue.path).suspend("receive")).start()
    started = time.monotonic()
    with pytest.raises(vsqs.QueueSuspended):
        queue.receive(wait=30)
    assert time.monotonic() - started < 30  # woken by the change, not at the end of its wait


def test_stages_respect_limits_and_suspension(queue):
    queue.configure(max_message_bytes=4)
    with pytest.raises(vsqs.MessageTooLarge):
        queue.publish_staged([b"12345"], stage="s")
    queue.suspend("publish")
    with pytest.raises(vsqs.QueueSuspended):
        queue.publish_staged([b"1"], stage="s")


def test_throttle_window_has_a_floor(queue):
    with pytest.raises(vsqs.InvalidArgument, match="at least 0.001"):
        queue.configure(throttle=(5, 1e-6))


def test_future_settings_format_is_refused(queue):
    os.makedirs(os.path.join(queue.path, ".settings"), exist_ok=True)
    with open(os.path.join(queue.path, ".settings", "000000001.json"), "w") as f:
        f.write('{"format": 9, "settings": {}}')
    with pytest.raises(vsqs.IncompatibleFormat, match="format 9"):
        _ = vsqs.Queue(queue.path).settings


# -- per-message options in batches and stages -------------------------------------


def test_publish_batch_with_outgoing_entries(flat_queue):
    queue = flat_queue
    ids = queue.publish_batch(
        [
            b"plain",
            vsqs.Outgoing(b"urgent", priority=9),
            vsqs.Outgoing(b"later", delay=60),
            vsqs.Outgoing(b"tagged", attributes={"k": "v"}),
            vsqs.Outgoing(b"grouped", group="g"),
        ],
        attributes={"batch": "1"},
    )
    assert len(set(ids)) == 5
    got = {m.body: m for m in queue.receive_batch(10)}
    assert list(got)[0] == b"urgent"
    assert got[b"plain"].attributes == {"batch": "1"}
    assert got[b"tagged"].attributes == {"k": "v"}
    assert got[b"grouped"].group == "g"
    assert b"later" not in got and queue.stats().delayed == 1


def test_outgoing_options_are_checked(queue):
    with pytest.raises(vsqs.InvalidArgument, match="priority"):
        queue.publish_batch([b"ok", vsqs.Outgoing(b"x", priority=42)])
    assert queue.stats().total == 0  # nothing of the batch was published


def test_batch_dedup_ids_per_entry(queue):
    first = queue.publish_batch([vsqs.Outgoing(b"a", dedup_id="1"), vsqs.Outgoing(b"b", dedup_id="2")])
    again = queue.publish_batch([vsqs.Outgoing(b"a2", dedup_id="1"), vsqs.Outgoing(b"c", dedup_id="3")])
    assert again[0] == first[0] and again[1] not in first
    assert queue.stats().ready == 3


def test_stage_with_options_and_dedup_at_commit(flat_queue):
    queue = flat_queue
    queue.publish(b"already", dedup_id="order-1")
    queue.publish_staged(
        [
            vsqs.Outgoing(b"dup", dedup_id="order-1"),
            vsqs.Outgoing(b"new", dedup_id="order-2", attributes={"k": "v"}),
            vsqs.Outgoing(b"urgent", priority=9),
            vsqs.Outgoing(b"later", delay=60),
        ],
        stage="s",
    )
    assert queue.commit_stage("s") == 3  # the duplicate was taken back
    bodies = [m.body for m in queue.receive_batch(10)]
    assert bodies[0] == b"urgent" and sorted(bodies) == [b"already", b"new", b"urgent"]
    assert queue.stats().delayed == 1
    # the committed dedup id holds from now on
    queue.publish_staged([vsqs.Outgoing(b"new again", dedup_id="order-2")], stage="t")
    assert queue.commit_stage("t") == 0
    assert queue.stages() == []  # the stage went, the duplicate in it too


def test_read_message_by_receipt_and_priority(queue):
    queue.publish(b"x", priority=7, attributes={"k": "v"})
    [claimed] = queue.receive_batch(1, read_bodies=False)
    m = vsqs.Queue(queue.path).read_message(claimed.receipt)
    assert (m.id, m.body, m.attributes, m.receive_count, m.priority) == (claimed.id, b"x", {"k": "v"}, 1, 7)
    assert m.sent_at == claimed.sent_at
    m.delete()
    with pytest.raises(vsqs.StaleReceipt):
        queue.read_message(claimed.receipt)


def test_stats_count_staged_messages_until_their_commit(queue):
    queue.publish_staged([b"a", b"b", b"c"], stage="s")
    queue.publish_staged([b"d"], stage="t")
    stats = queue.stats()
    assert (stats.staged, stats.total) == (4, 0)  # written, not yet in the queue
    queue.commit_stage("s")
    queue.abort_stage("t")
    stats = queue.stats()
    assert (stats.staged, stats.total) == (0, 3)
