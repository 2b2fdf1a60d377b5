"""JSON planted in the spool: metadata, a settings version, a message's header.

Whoever can write the spool can write a document nested thousands deep (the
parser's recursion limit then escapes as RecursionError), or one of the
right shape with values of the wrong types. Each is read as damaged: the
queue or the message it belongs to is reported, the rest go on."""

from __future__ import annotations

import os

import pytest

import vsqs
from tests.conftest import message_names, message_path
from vsqs._core import format as _format
from vsqs._core import settings as _settings
from vsqs._core.limits import MAX_JSON_DEPTH
from vsqs._core.rules import load_json

NESTED = b"[" * 5000 + b"]" * 5000  # 10 KB: under every size bound, far over the parser's depth


def test_load_json_refuses_what_is_not_json_or_nested_too_deep():
    assert load_json(b'{"a": [1, {"b": "c"}]}') == {"a": [1, {"b": "c"}]}
    assert load_json(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH) is not None
    for bad in (NESTED, b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1), b"\xff\xfe\x00", b"{nope"):
        with pytest.raises(ValueError):
            load_json(bad)


def test_nested_metadata_makes_only_that_queue_unreadable(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    broken, fine = spool.create_queue("a-broken"), spool.create_queue("b-fine")
    fine.publish(b"x")
    with open(os.path.join(broken.path, _format.METADATA_NAME), "wb") as f:
        f.write(NESTED)
    with pytest.raises(vsqs.IncompatibleFormat, match="unreadable queue metadata"):
        vsqs.Queue(broken.path)
    assert sorted(spool.queues()) == ["a-broken", "b-fine"]
    assert spool.queue("b-fine").stats().ready == 1


def test_a_nested_settings_version_is_skipped_like_a_torn_one(queue):
    queue.configure(visibility_timeout=7)
    directory = os.path.join(queue.path, _settings.SETTINGS_DIR)
    newest = max(v for v in map(_settings.parse_version, os.listdir(directory)) if v is not None)
    with open(os.path.join(directory, _settings.version_name(newest + 1)), "wb") as f:
        f.write(b'{"format": 3, "settings": ' + NESTED + b"}")
    fresh = vsqs.Queue(queue.path)
    assert fresh.settings["visibility_timeout"] == 7
    fresh.publish(b"x")
    assert fresh.receive().body == b"x"


def test_a_nested_policy_is_refused_as_a_bad_setting(queue):
    with pytest.raises(vsqs.InvalidArgument, match="policy is not JSON"):
        queue.configure(policy=NESTED.decode())


@pytest.mark.parametrize("header", [
    b'{"attributes": 5}', b'{"attributes": null}', b'{"attributes": ["a"]}', b'{"attributes": {"a": 1}}',
    b'{"group": 5}', b"[1]", NESTED,
], ids=["number", "null", "list", "value", "group", "not-object", "nested"])
def test_a_header_of_the_wrong_types_is_a_damaged_message(flat_queue, header):
    planted = flat_queue.publish(b"planted", attributes={"k": "v"}, priority=9)
    [name] = [n for n in message_names(flat_queue.path) if n.startswith(planted[:_format.KEY_LENGTH])]
    with open(message_path(flat_queue, name), "wb") as f:
        f.write(header + b"\nplanted")
    flat_queue.publish(b"fine")
    got = flat_queue.receive_batch(10)
    assert [m.body for m in got] == [b"fine"]  # the damaged one stays, hidden, and goes on to the DLQ
    assert got[0].attributes == {}
    assert flat_queue.stats().in_flight == 2


def test_a_header_line_over_its_bound_is_a_damaged_message_not_parsed(flat_queue):
    from vsqs._core.limits import MAX_HEADER_BYTES

    planted = flat_queue.publish(b"planted", attributes={"k": "v"}, priority=9)
    [name] = [n for n in message_names(flat_queue.path) if n.startswith(planted[:_format.KEY_LENGTH])]
    with open(message_path(flat_queue, name), "wb") as f:
        f.write(b'{"attributes": {"k": "' + b"v" * MAX_HEADER_BYTES + b'"}}\nplanted')
    flat_queue.publish(b"fine")
    assert [m.body for m in flat_queue.receive_batch(10)] == [b"fine"]


@pytest.mark.parametrize("document", [b"[1]", b'"settings"', b"5", b"null"])
def test_a_settings_version_that_is_no_object_is_skipped(queue, document):
    queue.configure(visibility_timeout=7)
    directory = os.path.join(queue.path, _settings.SETTINGS_DIR)
    newest = max(v for v in map(_settings.parse_version, os.listdir(directory)) if v is not None)
    with open(os.path.join(directory, _settings.version_name(newest + 1)), "wb") as f:
        f.write(document)
    fresh = vsqs.Queue(queue.path)
    assert fresh.settings["visibility_timeout"] == 7
    fresh.publish(b"x")
