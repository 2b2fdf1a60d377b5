"""Facts FORMAT.md and the README state about a queue's behaviour, checked
against the library: what max_messages counts, stats' dead_lettered and
oldest_ready_age, the order within a group turn, where a queue-wide
de-duplication id's holder is found in a sharded queue, the path in
``.sources``, and the shards and mode of a dead-letter queue made on demand."""

from __future__ import annotations

import json
import os
import stat

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core.settings import SETTINGS_DIR


def test_max_messages_counts_ready_delayed_and_in_flight_messages(flat_queue):
    flat_queue.configure(max_messages=3)
    flat_queue.publish(b"ready")
    flat_queue.publish(b"delayed", delay=60)
    flat_queue.publish(b"in flight")
    assert flat_queue.receive(visibility_timeout=60).body == b"ready"
    with pytest.raises(vsqs.QueueFull, match="3 messages"):
        vsqs.Queue(flat_queue.path).publish(b"one more")


def test_max_messages_counts_neither_new_files_nor_staged_messages(flat_queue):
    flat_queue.configure(max_messages=3)
    flat_queue.publish(b"1")
    open(os.path.join(flat_queue.path, f"9-{'1' * 16}-{'a' * 16}.new"), "wb").close()  # a publisher at work
    flat_queue.publish_staged([b"s1", b"s2"], stage="batch")  # checked as a publish, but not in the queue yet
    vsqs.Queue(flat_queue.path).publish_batch([b"2", b"3"])  # a fresh count: 1 message
    with pytest.raises(vsqs.QueueFull, match="3 messages"):
        vsqs.Queue(flat_queue.path).publish(b"4")


def lease_run_out(monkeypatch, message: vsqs.Message) -> _format.Name:
    """Set the library's wall clock (``format.now_us``) to just after ``message``'s
    lease runs out; the name it holds, whose times the clock is set by."""
    name = _format.parse_receipt(message.queue.id, message.receipt)[0]
    monkeypatch.setattr(_format, "now_us", lambda: name.until_us + 1)
    return name


def test_oldest_ready_age_is_from_the_send_time_of_the_oldest_ready_message(flat_queue, monkeypatch):
    flat_queue.publish(b"delayed first", delay=3600)  # sent first, not ready: not counted
    flat_queue.publish(b"received", delay=0)
    flat_queue.publish(b"later")
    held = flat_queue.receive(visibility_timeout=1)
    assert held.body == b"received"
    name = lease_run_out(monkeypatch, held)  # ready again, its send time kept
    assert flat_queue.stats().oldest_ready_age == (name.until_us + 1 - name.sent_us) / 1e6
    flat_queue.purge()
    assert flat_queue.stats().oldest_ready_age == 0.0


def test_dead_lettered_counts_this_queues_messages_in_its_dead_letter_queue_in_any_state(tmp_path):
    source = vsqs.Queue(tmp_path / "jobs", create=True)
    source.configure(max_receives=1)
    for body in (b"a", b"b"):
        source.publish(body)
        source.receive().dead_letter()
    assert source.stats().dead_lettered == 2
    dlq = source.dead_letter_queue()
    held = dlq.receive(visibility_timeout=60)  # in flight in the dead-letter queue: still counted
    dlq.publish(b"published there directly")  # no origin: not this queue's
    assert source.stats().dead_lettered == 2 and source.stats().total == 0
    held.delete()
    assert source.stats().dead_lettered == 1


def test_a_due_dead_letter_counts_as_ready_until_it_moves(tmp_path, monkeypatch):
    source = vsqs.Queue(tmp_path / "jobs", create=True)
    source.configure(max_receives=1)
    source.publish(b"x")
    lease_run_out(monkeypatch, source.receive(visibility_timeout=1))
    stats = source.stats()
    assert (stats.ready, stats.dead_lettered) == (1, 0)  # lazy: moved by the next receive
    assert source.receive() is None
    stats = source.stats()
    assert (stats.ready, stats.dead_lettered) == (0, 1)


def test_a_group_turn_goes_in_name_order_with_the_ungrouped_in_the_first(flat_queue):
    flat_queue.configure(group_concurrency=3)
    for body, group in [("b1", "b"), ("a1", "a"), ("u1", None), ("a2", "a"), ("b2", "b"), ("a3", "a")]:
        flat_queue.publish(body.encode(), group=group)
    flat_queue.publish(b"u2", priority=5)
    got = [m.body.decode() for m in flat_queue.receive_batch(10)]
    # turn 0: each group's first and the ungrouped, by priority then send time; then turn 1, turn 2
    assert got == ["u2", "b1", "a1", "u1", "a2", "b2", "a3"]


def _groups_in_two_shards(shards: int) -> tuple[str, str]:
    found: dict[int, str] = {}
    for i in range(1000):
        group = f"g{i}"
        found.setdefault(int(_format.group_hash(group)[:2], 16) % shards, group)
        if len(found) >= 2:
            first, second = list(found.values())[:2]
            return first, second
    raise AssertionError("no two groups in two shards")


def test_a_queue_wide_dedup_id_is_held_by_a_message_in_another_shard(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True, shards=4)
    q.configure(dedup_scope="queue", group_concurrency=1)
    one, other = _groups_in_two_shards(4)
    first = q.publish(b"x", group=one, dedup_id="order-42")
    assert vsqs.Queue(q.path).publish(b"x", group=other, dedup_id="order-42") == first
    assert q.stats().total == 1


def test_sources_holds_the_source_path_absolute_and_normalised(tmp_path):
    spool = tmp_path / "spool"
    os.makedirs(spool / "sub")
    source = vsqs.Queue(f"{spool}//sub/.././jobs", create=True)
    source.configure(max_receives=1)
    source.publish(b"x")
    source.receive().dead_letter()
    directory = os.path.join(spool, "jobs.dlq", _format.SOURCES_DIR)
    [entry] = os.listdir(directory)
    with open(os.path.join(directory, entry), "rb") as file:
        assert file.read().decode() == os.path.join(spool, "jobs")  # no "//", ".", ".."; no newline


def test_a_dead_letter_queue_made_on_demand_has_no_shards_and_the_sources_mode(tmp_path):
    source = vsqs.Queue(tmp_path / "jobs", create=True, shards=4, mode="640")
    source.configure(max_receives=1)
    source.publish(b"x")
    source.receive().dead_letter()
    dlq = os.path.join(tmp_path, "jobs.dlq")
    with open(os.path.join(dlq, _format.METADATA_NAME)) as file:
        meta = json.load(file)
    assert (meta["format"], meta["shards"]) == (3, 1)
    assert stat.S_IMODE(os.stat(dlq).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(os.path.join(dlq, _format.METADATA_NAME)).st_mode) == 0o640
    assert vsqs.Queue(dlq).settings["file_mode"] == "0640"  # its own setting, for every file made in it


def test_an_existing_dead_letter_queue_without_a_mode_takes_the_sources(tmp_path):
    shared = vsqs.Queue(tmp_path / "shared", create=True, shards=2)
    source = vsqs.Queue(tmp_path / "jobs", create=True, mode="660")
    source.configure(max_receives=1, dead_letter="shared")
    source.publish(b"x")
    source.receive().dead_letter()
    assert vsqs.Queue(shared.path).settings["file_mode"] == "0660" and shared.shards == 2
    assert os.path.isdir(os.path.join(shared.path, SETTINGS_DIR))
