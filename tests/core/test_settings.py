"""Spools, queue names and per-queue settings."""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import vsqs
from vsqs._core import settings as _settings


@pytest.fixture
def spool(tmp_path):
    return vsqs.Spool(tmp_path / "spool", create=True)


def test_spool_missing_root(tmp_path):
    with pytest.raises(vsqs.QueueNotFound, match="no spool"):
        vsqs.Spool(tmp_path / "nope")


def test_spool_queues(spool):
    spool.create_queue("jobs")
    spool.create_queue("jobs.dlq", max_receives=None)
    os.mkdir(os.path.join(spool.root, "not-a-queue"))
    assert spool.queues() == ["jobs", "jobs.dlq"]
    assert "jobs" in spool and "not-a-queue" not in spool
    assert spool["jobs"].path == os.path.join(spool.root, "jobs")
    with pytest.raises(vsqs.QueueNotFound):
        spool.queue("missing")


@pytest.mark.parametrize(
    "name", ["", ".", "..", ".hidden", "a/b", "../x", "-rf", "a..b", "x" * 81, "a\x00b", "/abs", None]
)
def test_bad_queue_names(spool, name):
    with pytest.raises(vsqs.InvalidArgument, match="bad queue name"):
        spool.create_queue(name)
    assert os.listdir(spool.root) == []


def test_delete_queue(spool):
    q = spool.create_queue("q")
    q.publish_batch([b"1", b"2"])
    assert spool.delete_queue("q") == 2
    assert spool.queues() == [] and os.listdir(spool.root) == [".deleted"]  # the deletion's record
    with pytest.raises(vsqs.QueueNotFound):
        spool.delete_queue("q")
    with pytest.raises(vsqs.QueueNotFound):
        q.publish(b"x")  # the handle sees the queue gone


def test_create_queue_with_settings(spool):
    q = spool.create_queue("q", visibility_timeout=5, max_receives="3")
    assert q.settings["visibility_timeout"] == 5.0 and q.settings["max_receives"] == 3
    assert q.settings["delay"] == 0.0  # defaults filled in
    assert vsqs.Queue(q.path).settings == q.settings  # another handle reads the same


def test_bad_setting_creates_nothing(spool):
    with pytest.raises(vsqs.InvalidArgument, match="unknown queue setting 'visibilty_timeout'"):
        spool.create_queue("q", visibilty_timeout=5)
    with pytest.raises(vsqs.InvalidArgument, match="max_receives must be"):
        spool.create_queue("q", max_receives=0)
    assert spool.queues() == []


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"visibility_timeout": -1}, "visibility_timeout must be >= 0"),
        ({"visibility_timeout": "abc"}, "visibility_timeout must be a number"),
        ({"retention": 0}, "retention must be > 0"),
        ({"max_messages": 1.5}, "max_messages must be a whole number"),
        ({"group_concurrency": 0}, "group_concurrency must be"),
        ({"throttle": 5}, "throttle must be"),
        ({"throttle": (5, 0)}, "throttle must be > 0"),
        ({"dead_letter": ""}, None),  # "" unsets
        ({"content_dedup": "maybe"}, "content_dedup must be true or false"),
        ({"content_dedup": 1}, "content_dedup must be true or false"),
        ({"receive_wait": 21}, "receive_wait must be at most 20"),
        ({"file_mode": "2660"}, "setuid, setgid and sticky bits are not kept"),
        ({"file_mode": 0o1770}, "setuid, setgid and sticky bits are not kept"),
        ({"file_mode": "440"}, "must let the owner read and write"),
        ({"policy": '{"Version": NaN}'}, "policy is not JSON"),
        ({"policy": '{"Sid": "a", "Sid": "b"}'}, "policy is not JSON"),
        ({"policy": "[]"}, "policy must be a JSON object"),
    ],
)
def test_setting_validation(queue, changes, match):
    if match is None:
        queue.configure(**changes)
        return
    with pytest.raises(vsqs.InvalidArgument, match=match):
        queue.configure(**changes)


def test_content_dedup_setting_dedups_plain_publishes(queue):
    queue.configure(content_dedup="true", dedup_window=60)
    first = queue.publish(b"same")
    assert queue.publish(b"same") == first  # no dedup argument: the setting applies
    assert queue.publish(b"other") != first
    assert queue.publish(b"same", dedup_id="explicit") != first  # an explicit id wins
    assert queue.stats().ready == 3


def test_receive_wait_setting_is_the_default_long_poll(queue):
    queue.configure(receive_wait=0.3)
    started = time.monotonic()
    assert queue.receive() is None
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    assert queue.receive(wait=0) is None  # the caller's wait wins
    assert time.monotonic() - started < 0.3


def test_friendly_input_is_written_in_the_stored_form(queue):
    queue.configure(
        visibility_timeout="2.5", max_receives="4", throttle="100/2", content_dedup="yes",
        dedup_scope=" Queue ", suspended="receive, publish", file_mode="0o660", tags='{"b": "2", "a": "1"}',
        policy={"Version": "2012-10-17"},
    )
    with open(os.path.join(queue.path, _settings.SETTINGS_DIR, _settings.version_name(1)), "rb") as file:
        stored = json.load(file)["settings"]
    assert {key: stored[key] for key in ("visibility_timeout", "max_receives", "throttle", "content_dedup")} == {
        "visibility_timeout": 2.5, "max_receives": 4, "throttle": [100, 2.0], "content_dedup": True
    }
    assert (stored["dedup_scope"], stored["suspended"]) == ("queue", ["publish", "receive"])
    assert stored["file_mode"] == "0660"
    assert stored["tags"] == {"a": "1", "b": "2"} and stored["policy"] == '{"Version":"2012-10-17"}'


SET = {  # a value of each setting other than its default, in its stored form
    "visibility_timeout": 2.5, "delay": 60.0, "receive_wait": 20.0, "retention": 86400.0, "max_messages": 10,
    "max_message_bytes": 2**40, "max_receives": 4, "dead_letter": "/srv/spool/jobs.dlq", "group_concurrency": 3,
    "dedup_window": 0.001, "content_dedup": True, "throttle": [100, 2.5], "suspended": ["delete", "receive"],
    "dedup_scope": "queue", "file_mode": "0640", "throughput_limit": "group", "tags": {"a": "1", "b": ""},
    "policy": '{"Version": "2012-10-17"}', "kms_master_key_id": "alias/k", "kms_data_key_reuse_period": 300,
    "sqs_managed_sse": False,
}


EXACT = [  # values that six significant digits (``:g``) once rounded: 1.23457e+06, 1e+06/60
    ("retention", 1234567.0), ("visibility_timeout", 0.1234567), ("throttle", [1000000, 60.0]),
    ("dedup_window", 1234567.0), ("delay", 1e-05), ("throttle", [10**9, 0.1234567]),
]


def test_each_settings_text_is_taken_back():
    """What ``vsqs config`` shows of a setting, set or unset, sets it again as it was, exactly."""
    assert sorted(SET) == sorted(_settings.SCHEMA)
    cases = [(key, value) for key, setting in _settings.SCHEMA.items() for value in (SET[key], setting.default)]
    for key, value in cases + EXACT:
        text = _settings.SCHEMA[key].text(value)
        assert _settings.validate({key: text}) == {key: value}, (key, text)


def test_numbers_are_shown_exactly_and_whole_ones_without_a_fraction():
    text = _settings.number_text
    assert [text(v) for v in (1209600.0, 30.0, 0, 2**40, 0.1234567, 1e-05)] == [
        "1209600", "30", "0", "1099511627776", "0.1234567", "1e-05"]
    assert _settings.SCHEMA["throttle"].text([1000000, 60.0]) == "1000000/60"


# the settings in the order of Queue.settings, of the native API's JSON and its
# body's fields (so which of two bad fields a refusal names); a new one goes last
ORDER = [
    "visibility_timeout", "delay", "retention", "max_messages", "max_message_bytes", "max_receives", "dead_letter",
    "group_concurrency", "dedup_window", "content_dedup", "dedup_scope", "throughput_limit", "receive_wait",
    "throttle", "suspended", "file_mode", "tags", "policy", "kms_master_key_id", "kms_data_key_reuse_period",
    "sqs_managed_sse",
]


def test_the_settings_keep_their_order(queue):
    assert list(_settings.SCHEMA)[:len(ORDER)] == ORDER
    assert list(queue.settings)[:len(ORDER)] == ORDER
    queue.configure(receive_wait=1)
    assert list(queue.settings)[:len(ORDER)] == ORDER


def test_configure_merges_and_unsets(queue):
    queue.configure(visibility_timeout=5, max_messages=10)
    queue.configure(max_messages=None, throttle="100/2")
    assert queue.settings["visibility_timeout"] == 5.0
    assert queue.settings["max_messages"] is None
    assert queue.settings["throttle"] == [100, 2.0]
    with pytest.raises(TypeError):
        queue.settings["delay"] = 3  # read-only


def test_settings_versions_never_overwrite(queue):
    for timeout in (1, 2, 3):
        queue.configure(visibility_timeout=timeout)
    versions = sorted(os.listdir(os.path.join(queue.path, _settings.SETTINGS_DIR)))
    assert versions == ["000000001.json", "000000002.json", "000000003.json"]


def test_torn_settings_version_is_skipped(queue):
    queue.configure(visibility_timeout=7)
    torn = os.path.join(queue.path, _settings.SETTINGS_DIR, _settings.version_name(2))
    with open(torn, "w") as f:
        f.write('{"format": 1, "sett')  # a writer died half-way
    assert vsqs.Queue(queue.path).settings["visibility_timeout"] == 7.0
    queue.configure(delay=1)  # the next change goes past the torn one
    fresh = vsqs.Queue(queue.path).settings
    assert (fresh["visibility_timeout"], fresh["delay"]) == (7.0, 1.0)


def test_other_handles_see_changes_within_a_second(queue):
    other = vsqs.Queue(queue.path)
    assert other.settings["visibility_timeout"] == 30.0
    queue.configure(visibility_timeout=9)
    time.sleep(1.05)
    assert other.settings["visibility_timeout"] == 9.0


def test_default_visibility_timeout_and_delay(queue):
    queue.configure(visibility_timeout=0.1, delay=0.2)
    queue.publish(b"x")
    assert queue.receive() is None  # delayed by default
    time.sleep(0.25)
    m = queue.receive()
    assert m is not None
    time.sleep(0.15)
    assert queue.receive().id == m.id  # default lease of 0.1 s ran out
    assert queue.publish(b"now", delay=0) and queue.receive().body == b"now"


def test_max_message_bytes(queue):
    queue.configure(max_message_bytes=10)
    queue.publish(b"0123456789")
    with pytest.raises(vsqs.MessageTooLarge, match="11 bytes is over the queue's max_message_bytes"):
        queue.publish(b"0123456789!")
    with pytest.raises(vsqs.MessageTooLarge):
        queue.publish_batch([b"ok", b"x" * 11])
    assert queue.stats().ready == 1  # the batch published nothing


def test_max_messages_is_back_pressure(queue):
    queue.configure(max_messages=3)
    queue.publish_batch([b"1", b"2"])
    with pytest.raises(vsqs.QueueFull, match="max_messages is 3"):
        queue.publish_batch([b"3", b"4"])
    queue.publish(b"3")
    with pytest.raises(vsqs.QueueFull):
        queue.publish(b"4")
    queue.receive().delete()
    time.sleep(1.05)  # the count is refreshed at most every second
    queue.publish(b"4")
    assert queue.stats().total == 3


@given(st.text(min_size=1, max_size=100))
def test_no_queue_name_leaves_the_spool(name):
    from vsqs._core.rules import check_queue_name

    try:
        checked = check_queue_name(name)
    except vsqs.InvalidArgument:
        return
    assert "/" not in checked and "\x00" not in checked and ".." not in checked
    assert not checked.startswith((".", "-")) and os.path.basename(checked) == checked
