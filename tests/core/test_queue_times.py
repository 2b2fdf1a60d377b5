"""The queue's creation and settings-change times, and the id behind a receipt
(public accessors the SQS face reports as CreatedTimestamp,
LastModifiedTimestamp, and uses to tell a deleted message from a stale handle
and an expired FIFO handle from a live one)."""

from __future__ import annotations

import json
import os
import time

import pytest

import vsqs


def test_created_at_is_the_metadata_time_and_settings_change_later(tmp_path):
    before = time.time()
    queue = vsqs.Queue(tmp_path / "q", create=True)
    created = queue.created_at
    with open(os.path.join(queue.path, ".vsqs.json")) as f:
        assert created == json.load(f)["created"]
    assert created is not None and created >= before - 1
    assert queue.settings_changed_at is None  # never configured
    queue.configure(visibility_timeout=5)
    changed = queue.settings_changed_at
    assert changed is not None and changed >= created - 1  # (file times may be coarser than time.time())
    assert vsqs.Queue(queue.path).settings_changed_at == changed  # another handle reads the same


def test_created_at_is_none_for_metadata_without_it(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    meta = os.path.join(queue.path, ".vsqs.json")
    with open(meta) as f:
        doc = json.load(f)
    del doc["created"]
    with open(meta, "w") as f:
        json.dump(doc, f)
    assert vsqs.Queue(queue.path).created_at is None


def test_message_id_of_a_receipt_stale_or_not(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    message_id = queue.publish(b"x")
    message = queue.receive()
    assert message is not None
    assert queue.message_id(message.receipt) == message_id
    queue.delete(message.receipt)
    assert queue.message_id(message.receipt) == message_id  # a stale receipt still names its message
    with pytest.raises(vsqs.InvalidReceipt):
        queue.message_id("garbage")
    other = vsqs.Queue(tmp_path / "other", create=True)
    with pytest.raises(vsqs.InvalidReceipt):
        other.message_id(message.receipt)


def test_held_until_is_the_end_of_the_receipts_lease(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.publish(b"x", group="g")
    before = time.time()
    message = queue.receive(visibility_timeout=600)
    after = time.time()
    assert message is not None
    first = message.receipt
    assert before + 600 - 1e-6 <= queue.held_until(first) <= after + 600 + 1e-6
    extended = message.change_visibility(3600)
    assert queue.held_until(extended) >= after + 3600 - 1e-6 > queue.held_until(first)  # each receipt its own
    message.delete()
    assert queue.held_until(extended) > after  # read from the receipt alone, held or not
    with pytest.raises(vsqs.InvalidReceipt):
        queue.held_until("garbage")
    other = vsqs.Queue(tmp_path / "other", create=True)
    with pytest.raises(vsqs.InvalidReceipt):
        other.held_until(first)
