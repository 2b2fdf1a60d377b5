"""Dead-letter queues and redrive through the Queue: a message moved after
max_receives or by dead_letter(), redrive home or elsewhere, groups going on
(the DeadLetters part alone: test_dead_letters.py)."""

from __future__ import annotations

import os
import stat

import pytest

import vsqs
from tests.conftest import message_files
from vsqs._core import format as _format


@pytest.fixture
def spool(tmp_path):
    return vsqs.Spool(tmp_path / "spool", create=True)


def fail_times(q, n):
    """Receive and give back the next message n times (a handler that keeps failing)."""
    for _ in range(n):
        m = q.receive(visibility_timeout=0)
        assert m is not None
    return m


def test_message_moves_to_dlq_after_max_receives(spool):
    q = spool.create_queue("jobs", max_receives=3, dead_letter="jobs-dead")
    message_id = q.publish(b"poison")
    sent = next(q.messages()).sent_at
    last = fail_times(q, 3)
    assert last.receive_count == 3
    assert q.receive() is None  # the 4th receive moved it instead of delivering it
    assert q.stats().total == 0
    dlq = spool.queue("jobs-dead")  # created on demand
    [info] = dlq.messages()
    assert (info.id, info.receive_count, info.sent_at, info.state) == (message_id, 3, sent, "ready")
    m = dlq.receive()
    assert (m.id, m.body, m.receive_count) == (message_id, b"poison", 4)


def test_default_dlq_name(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish(b"x")
    fail_times(q, 1)
    assert q.receive() is None
    assert spool.queues() == ["jobs", "jobs.dlq"]
    assert spool.queue("jobs.dlq").stats().ready == 1


def test_other_messages_are_not_held_up(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish_batch([b"poison", b"fine"])
    assert q.receive(visibility_timeout=0).body == b"poison"
    assert q.receive().body == b"fine"


def test_requeue_pass_dead_letters_too(spool):
    q = spool.create_queue("jobs", max_receives=2)
    q.publish_batch([b"a", b"b", b"c"])
    a, b, c = q.receive_batch(3, visibility_timeout=60)
    b.release()  # ready again, count 1
    c.change_visibility(0)  # expired, count 1
    a.change_visibility(0)
    again = vsqs.Queue(q.path).receive(visibility_timeout=0)  # a's second receive
    assert (again.id, again.receive_count) == (a.id, 2)
    assert q.requeue_expired() == 2  # a to the dlq, c requeued; b was ready already
    assert sorted((i.id, i.state, i.receive_count) for i in q.messages()) == [
        (b.id, "ready", 1),
        (c.id, "ready", 1),
    ]
    [dead] = vsqs.Queue(q.path + ".dlq").messages()
    assert (dead.id, dead.receive_count) == (a.id, 2)


def test_redrive_home_resets_count(spool):
    jobs = spool.create_queue("jobs", max_receives=1, dead_letter="dead")
    other = spool.create_queue("other", max_receives=1, dead_letter="dead")
    jobs.publish(b"j")
    other.publish(b"o")
    for q in (jobs, other):
        fail_times(q, 1)
        assert q.receive() is None
    dead = spool.queue("dead")
    assert dead.stats().ready == 2
    assert dead.redrive() == 2  # a shared dlq returns each message home
    assert [m.body for m in jobs.receive_batch(5)] == [b"j"]
    [m] = other.receive_batch(5)
    assert m.body == b"o" and m.receive_count == 1  # count was reset
    assert dead.stats().total == 0


def test_redrive_to_and_max_messages(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish_batch([b"1", b"2", b"3"])
    for _ in range(3):
        q.receive(visibility_timeout=0)
    q.requeue_expired()
    dlq = spool.queue("jobs.dlq")
    assert dlq.stats().ready == 3
    elsewhere = spool.create_queue("elsewhere")
    assert dlq.redrive(to=elsewhere, max_messages=2) == 2
    assert dlq.redrive(to=elsewhere.path) == 1
    assert sorted(m.body for m in elsewhere.receive_batch(5)) == [b"1", b"2", b"3"]


def test_redrive_leaves_in_flight_and_homeless_messages(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish(b"x")
    q.receive(visibility_timeout=0)
    q.requeue_expired()
    dlq = spool.queue("jobs.dlq")
    dlq.publish(b"published here directly")
    held = dlq.receive()  # in flight in the dlq: not redriven
    assert dlq.redrive() == 0
    held.release()
    assert dlq.redrive() == 1  # the dead letter went home; the direct one has none
    assert [m.body for m in dlq.receive_batch(5)] == [b"published here directly"]
    assert q.receive().body == b"x"


def test_dead_letter_keeps_one_file_per_message(spool):
    q = spool.create_queue("jobs", max_receives=1)
    ids = q.publish_batch([b"%d" % i for i in range(20)])
    for _ in range(20):
        q.receive(visibility_timeout=0)
    q.receive_batch(20)  # moves all twenty
    dlq = spool.queue("jobs.dlq")
    assert set(message_files(dlq.path)) == set(ids)
    assert all(c == 1 for c in message_files(dlq.path).values())
    assert message_files(q.path) == {}
    assert all(_format.parse_name(n).origin == q.id for n in os.listdir(dlq.path) if _format.parse_name(n))


def test_stats_count_dead_letters_per_source(spool):
    jobs = spool.create_queue("jobs", max_receives=1, dead_letter="dead")
    other = spool.create_queue("other", max_receives=1, dead_letter="dead")
    for q, n in ((jobs, 2), (other, 1)):
        q.publish_batch([b"x"] * n)
        q.receive_batch(n, visibility_timeout=0)
        q.requeue_expired()
    assert jobs.stats().dead_lettered == 2 and other.stats().dead_lettered == 1
    assert spool.create_queue("plain").stats().dead_lettered == 0


@pytest.mark.parametrize("target", ["jobs", "..", "../x", "a/b", ".hidden", "relative/path"])
def test_bad_dead_letter_targets(spool, target):
    q = spool.create_queue("jobs")
    with pytest.raises(vsqs.InvalidArgument, match="dead_letter"):
        q.configure(dead_letter=target, max_receives=1)


def test_dead_letter_to_an_ancestor_path_is_refused(spool):
    q = spool.create_queue("jobs")
    with pytest.raises(vsqs.InvalidArgument, match="directory above it"):
        q.configure(dead_letter=spool.root, max_receives=1)
    q.configure(dead_letter=os.path.join(spool.root, "elsewhere"), max_receives=1)


def test_sources_of_a_dead_letter_queue_take_its_own_file_mode(tmp_path):
    """.sources lives in the dead-letter queue: its files take that queue's
    file_mode, not the mode of the queue whose messages died."""
    old = os.umask(0o022)
    try:
        vsqs.Queue(tmp_path / "q.dlq", create=True, mode=0o640)
        q = vsqs.Queue(tmp_path / "q", create=True, mode=0o600)
        q.configure(max_receives=1, visibility_timeout=0)
        q.publish(b"x")
        q.receive()
        assert q.receive() is None  # dead-lettered on the way
        sources = tmp_path / "q.dlq" / ".sources"
        assert [stat.S_IMODE(p.stat().st_mode) for p in sources.iterdir()] == [0o640]
    finally:
        os.umask(old)


def test_configure_on_a_fresh_handle_keeps_the_queues_file_mode(tmp_path):
    """A handle that has not read the settings yet writes the next settings
    version with the queue's file_mode, not the process umask's."""
    old = os.umask(0o077)
    try:
        vsqs.Queue(tmp_path / "q", create=True, mode=0o660)
        vsqs.Queue(tmp_path / "q").configure(retention=100)
        versions = sorted((tmp_path / "q" / ".settings").iterdir())
        assert [stat.S_IMODE(p.stat().st_mode) for p in versions] == [0o660] * len(versions)
    finally:
        os.umask(old)


# -- dead-lettering a held message at once (a task that failed for good) --------


@pytest.mark.parametrize("shards", [1, 4])
def test_dead_letter_moves_a_held_message_now_and_redrive_brings_it_home(spool, shards):
    q = spool.create_queue("jobs", shards=shards, max_receives=5)
    poison = q.publish(b"poison", attributes={"k": "v"})
    m = q.receive()
    q.publish(b"fine")
    m.dead_letter()
    assert m.settled
    [dead] = q.dead_letter_queue().messages(bodies=True)
    assert (dead.id, dead.body, dead.attributes, dead.receive_count) == (poison, b"poison", {"k": "v"}, m.receive_count)
    assert q.dead_letter_queue().dead_letter_sources() == [q.path]
    assert q.receive().body == b"fine"
    assert q.dead_letter_queue().redrive() == 1
    assert q.receive().id == poison


def test_dead_letter_with_a_stale_receipt_moves_nothing(spool):
    q = spool.create_queue("jobs", max_receives=5)
    q.publish(b"x")
    first = q.receive(visibility_timeout=0)
    second = q.receive()
    with pytest.raises(vsqs.StaleReceipt):
        first.dead_letter()
    assert q.dead_letter_queue().stats().total == 0
    second.dead_letter()
    with pytest.raises(vsqs.StaleReceipt):
        q.dead_letter(second.receipt)
    assert q.dead_letter_queue().stats().total == 1


def test_dead_letter_needs_a_dead_letter_queue(spool):
    q = spool.create_queue("jobs")
    q.publish(b"x")
    m = q.receive()
    with pytest.raises(vsqs.InvalidArgument, match="no dead-letter queue"):
        m.dead_letter()
    m.delete()  # still held


def test_dead_letter_frees_the_groups_turn(spool):
    q = spool.create_queue("jobs", max_receives=5)
    q.publish(b"first", group="g")
    q.publish(b"second", group="g")
    m = q.receive()
    assert q.receive() is None  # the group's turn is held
    m.dead_letter()
    assert q.receive().body == b"second"


def test_a_receive_that_dead_letters_a_groups_head_goes_on_with_the_group(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish(b"1", group="g")
    q.publish(b"2", group="g")
    assert q.receive(visibility_timeout=0).body == b"1"  # its one receive: a dead letter at the next look
    q.publish(b"plain")
    fresh = vsqs.Queue(q.path)
    assert [m.body for m in fresh.receive_batch(1, visibility_timeout=60)] == [b"2"]  # in order, before plain
    assert [m.body for m in fresh.receive_batch(10, visibility_timeout=60)] == [b"plain"]
    assert q.dead_letter_queue().stats().total == 1


def test_a_batch_that_dead_letters_a_groups_head_is_not_empty(spool):
    q = spool.create_queue("jobs", max_receives=1)
    q.publish(b"1", group="g")
    q.publish(b"2", group="g")
    q.receive(visibility_timeout=0)
    assert [m.body for m in vsqs.Queue(q.path).receive_batch(10, visibility_timeout=60)] == [b"2"]


def test_a_group_whose_first_messages_are_all_dead_goes_on_at_once(spool):
    q = spool.create_queue("jobs", max_receives=100)
    for n in range(12):
        q.publish(b"dead %d" % n, group="g")
    q.publish(b"live", group="g")
    for m in q.receive_batch(12, group_runs=True):  # received once each...
        m.release()
    q.configure(max_receives=1)  # ...and now dead, all twelve before the live one
    fresh = vsqs.Queue(q.path)
    assert [m.body for m in fresh.receive_batch(10, visibility_timeout=60)] == [b"live"]
    assert q.dead_letter_queue().stats().total == 12
