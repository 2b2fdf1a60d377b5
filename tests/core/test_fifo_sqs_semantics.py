"""FIFO behaviours that follow Amazon SQS: purge frees groups,
de-duplication scope, sequence numbers."""

from __future__ import annotations

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core.errors import StaleReceipt
from vsqs._core.groups import GroupLeases

# -- purge frees the groups ---------------------------------------------------------


def test_purge_frees_a_group_whose_message_was_in_flight(queue):
    queue.publish_batch([b"a0", b"a1"], group="a")
    held = queue.receive(visibility_timeout=3600)
    assert held.body == b"a0"
    assert queue.purge() == 2
    queue.publish(b"a2", group="a")
    got = vsqs.Queue(queue.path).receive()  # another handle: the slot itself is free, not just our view
    assert got is not None and got.body == b"a2"


def test_a_holder_of_a_purged_message_cannot_block_the_freed_group(queue):
    queue.publish(b"a0", group="a")
    old = queue.receive(visibility_timeout=3600)
    queue.purge()
    queue.publish_batch([b"a1", b"a2"], group="a")
    other = vsqs.Queue(queue.path)
    new = other.receive(visibility_timeout=3600)
    assert new.body == b"a1"
    # the old holder's late moves fail and leave the new holder's slot alone
    with pytest.raises(StaleReceipt):
        old.change_visibility(3600)
    with pytest.raises(StaleReceipt):
        old.delete()
    assert other.receive() is None  # a2 still waits for a1: the group is held by the new receive
    new.delete()
    assert other.receive().body == b"a2"


def test_purge_frees_only_slots_held_by_the_messages_it_removed(queue):
    queue.publish(b"a0", group="a")
    queue.receive(visibility_timeout=3600)
    leases = GroupLeases(queue.path)
    assert leases.free_purged({_format.group_hash("a"): {1}}, {}) == 0  # another UNTIL: someone else's lease
    assert queue.receive() is None


# -- de-duplication scope -----------------------------------------------------------


def test_dedup_scope_is_the_group_by_default(queue):
    assert queue.settings["dedup_scope"] == "group"
    first = queue.publish(b"x", group="a", dedup_id="d")
    second = queue.publish(b"x", group="b", dedup_id="d")
    assert first != second
    assert queue.publish(b"x", group="a", dedup_id="d") == first


def test_dedup_scope_queue_spans_groups(queue):
    queue.configure(dedup_scope="queue")
    first = queue.publish(b"x", group="a", dedup_id="d")
    assert queue.publish(b"y", group="b", dedup_id="d") == first
    assert queue.publish(b"z", dedup_id="d") == first
    assert queue.stats().ready == 1


def test_dedup_scope_and_throughput_limit_are_checked(queue):
    with pytest.raises(vsqs.InvalidArgument):
        queue.configure(dedup_scope="everywhere")
    with pytest.raises(vsqs.InvalidArgument):
        queue.configure(throughput_limit="perQueue")
    assert queue.settings["throughput_limit"] is None
    queue.configure(throughput_limit="group")
    assert vsqs.Queue(queue.path).settings["throughput_limit"] == "group"


# -- sequence numbers ---------------------------------------------------------------


def test_sequence_numbers_increase_within_a_group_in_delivery_order(queue):
    ids = queue.publish_batch([f"m{i}".encode() for i in range(5)], group="g")
    ids += [queue.publish(b"late", group="g")]
    numbers = [vsqs.Message.sequence_number_of(i) for i in ids]
    assert all(n.isdigit() and len(n) >= 20 for n in numbers)
    assert [int(n) for n in numbers] == sorted(int(n) for n in numbers)
    assert len(set(numbers)) == len(numbers)
    received = []
    while (m := queue.receive()) is not None:
        received.append(m.sequence_number)
        m.delete()
    assert received == numbers


def test_sequence_number_of_refuses_what_is_no_id():
    with pytest.raises(vsqs.InvalidArgument):
        vsqs.Message.sequence_number_of("nope")
