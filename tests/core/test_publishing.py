"""``publishing``: options turned into what goes on disk (``prepare``,
``delay_of``, ``final_name``), the write of ``.new`` files (``write_new``,
``write_batch``), de-duplication lookups (``Presence``, ``reserve``) and
back-pressure (``Capacity``), called directly on real queue directories."""

from __future__ import annotations

import hashlib
import os
import time
from datetime import UTC, datetime, timedelta

import pytest

from vsqs._core import dedup as _dedup
from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import publishing
from vsqs._core import settings as _settings
from vsqs._core.dedup import Reservations
from vsqs._core.errors import InvalidArgument, MessageTooLarge, QueueFull, StorageError
from vsqs._core.format import State
from vsqs._core.layout import Layout
from vsqs._core.limits import MAX_DELAY
from vsqs._core.message import Outgoing
from vsqs._core.metadata import open_store
from vsqs._core.publishing import (
    NO_DEFAULTS,
    Capacity,
    Defaults,
    Presence,
    delay_of,
    final_name,
    prepare,
)

SETTINGS = dict(_settings.DEFAULTS)


def settings(**changes):
    return {**SETTINGS, **_settings.validate(changes)}


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def layout(request, tmp_path) -> Layout:
    return open_store(str(tmp_path / "q"), create=True, shards=request.param).layout


def defaults(**changes) -> Defaults:
    return NO_DEFAULTS._replace(**changes)


def names(layout: Layout) -> list[_format.Name]:
    return sorted(layout.names(), key=str)


# -- prepare -----------------------------------------------------------------------------


def test_a_bare_body_takes_the_defaults_and_the_queues_delay():
    entry = prepare("héllo", NO_DEFAULTS, settings(delay=3))
    assert entry == publishing.Prepared("héllo".encode(), {}, 0, "", 3.0, "")


def test_a_batchs_defaults_apply_to_a_bare_body():
    entry = prepare(b"x", defaults(delay=2, priority=7, attributes={"a": "1"}), SETTINGS)
    assert (entry.delay, entry.priority, entry.header) == (2.0, 7, {"attributes": {"a": "1"}})


def test_an_outgoings_own_options_win():
    batch = defaults(delay=9, priority=7, attributes={"a": "1"}, dedup_id="batch")
    entry = prepare(Outgoing(b"x", delay=0, priority=2, attributes={"b": "2"}, dedup_id="own"), batch, SETTINGS)
    assert (entry.delay, entry.priority, entry.header) == (0.0, 2, {"attributes": {"b": "2"}})
    assert entry.digest == _dedup.dedup_hash("own", None)
    inherited = prepare(Outgoing(b"x"), batch, SETTINGS)
    assert (inherited.delay, inherited.priority, inherited.header) == (9.0, 7, {"attributes": {"a": "1"}})
    assert inherited.digest == _dedup.dedup_hash("batch", None)


def test_an_outgoings_own_time_replaces_both_of_the_batchs(monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    future = datetime.fromtimestamp(1_700_003_600, UTC)
    entry = prepare(Outgoing(b"x", at=future), defaults(delay=5), SETTINGS)
    assert entry.delay == 3600.0  # not "delay and at": its own at replaced the batch's delay
    entry = prepare(Outgoing(b"x", delay=1), defaults(at=future), SETTINGS)
    assert entry.delay == 1.0


def test_a_group_goes_into_the_header_and_the_name():
    entry = prepare(b"x", defaults(group="orders"), SETTINGS)
    assert entry.group_hash == _format.group_hash("orders") and entry.header == {"group": "orders"}
    with pytest.raises(InvalidArgument, match="priority cannot be combined with group"):
        prepare(Outgoing(b"x", priority=3), defaults(group="orders"), SETTINGS)


@pytest.mark.parametrize("priority", [-1, 10, True, 1.0, "1"])
def test_a_bad_priority_is_refused(priority):
    with pytest.raises(InvalidArgument):
        prepare(Outgoing(b"x", priority=priority), NO_DEFAULTS, SETTINGS)


def test_bad_attributes_are_refused():
    with pytest.raises(InvalidArgument):
        prepare(Outgoing(b"x", attributes={"": "empty name"}), NO_DEFAULTS, SETTINGS)


def test_a_body_of_another_type_is_refused():
    with pytest.raises(TypeError, match="bytes or str"):
        prepare(123, NO_DEFAULTS, SETTINGS)  # type: ignore[arg-type]


def test_the_dedup_digest_of_an_id_of_the_content_or_none():
    assert prepare(b"x", NO_DEFAULTS, SETTINGS).digest == ""
    by_content = _dedup.dedup_hash(hashlib.sha256(b"x").hexdigest(), None)
    assert prepare(b"x", defaults(dedup_content=True), SETTINGS).digest == by_content
    assert prepare(b"x", NO_DEFAULTS, settings(content_dedup=True)).digest == by_content
    assert prepare(b"x", defaults(dedup_id="id", group="g"), SETTINGS).digest == _dedup.dedup_hash("id", "g")
    assert _dedup.dedup_hash("id", "g") != _dedup.dedup_hash("id", None)  # an id is per group


# -- delay_of and final_name ---------------------------------------------------------------


def test_delay_of():
    assert delay_of(None, None, settings(delay=4)) == 4.0
    assert delay_of(2, None, settings(delay=4)) == 2.0
    past = datetime.now(UTC) - timedelta(days=1)
    assert delay_of(None, past, SETTINGS) == 0.0
    far = datetime.now(UTC) + timedelta(days=400)
    assert delay_of(None, far, SETTINGS) == MAX_DELAY


@pytest.mark.parametrize(
    ("delay", "at", "match"),
    [
        (1, datetime.now(UTC), "delay or at, not both"),
        (None, "2030-01-01", "at must be a datetime"),
        (-1, None, "delay must be >= 0"),
        (MAX_DELAY + 1, None, "delay must be at most"),
        (float("nan"), None, "delay must be >= 0"),
    ],
)
def test_delay_of_refuses(delay, at, match):
    with pytest.raises(InvalidArgument, match=match):
        delay_of(delay, at, SETTINGS)


def test_final_name_is_ready_or_hidden_until_the_delay_ends(monkeypatch):
    monkeypatch.setattr(_format, "now_us", lambda: 1_000_000_000)
    stem = _format.new_key()
    assert final_name(stem, 0) == stem
    delayed = _format.parse_name(final_name(stem, 2.5))
    assert delayed is not None and delayed.state is State.HIDDEN
    assert (delayed.stem, delayed.until_us, delayed.receive_count) == (stem, 1_002_500_000, 0)


# -- write_new --------------------------------------------------------------------------------


def test_write_new_writes_a_new_file_where_the_message_lives(layout):
    entry = prepare(b"body", defaults(priority=3), SETTINGS)
    stem, path = publishing.write_new(layout, entry, durable=False, mode=None)
    assert path == layout.message_file(_format.writing_name(stem))
    assert _fs.read(path) == b"body"
    (name,) = names(layout)
    assert name.state is State.WRITING and name.priority == 3 and not name.envelope


def test_write_new_with_a_header_writes_an_envelope(layout):
    entry = prepare(b"body", defaults(group="g", attributes={"k": "v"}), SETTINGS)
    _, path = publishing.write_new(layout, entry, durable=True, mode=0o640)
    name = _format.parse_name(os.path.basename(path))
    assert name is not None and name.envelope and name.group_hash == _format.group_hash("g")
    assert _envelope.decode_envelope(_fs.read(path) or b"") == ({"attributes": {"k": "v"}, "group": "g"}, b"body")
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_write_new_into_a_stage(layout, tmp_path):
    stage = tmp_path / "stage"
    stage.mkdir()
    prepared = prepare(b"x", NO_DEFAULTS, SETTINGS)
    stem, path = publishing.write_new(layout, prepared, False, None, stage=f"{stage}{os.sep}")
    assert path == os.path.join(stage, _format.writing_name(stem))
    assert names(layout) == []


def test_write_new_tries_fresh_keys_then_gives_up(layout, monkeypatch):
    tried = []
    monkeypatch.setattr(_fs, "create_exclusive", lambda path, data, **kw: tried.append(path) and False)
    with pytest.raises(StorageError, match="no free message name after 8 tries"):
        publishing.write_new(layout, prepare(b"x", NO_DEFAULTS, SETTINGS), False, None)
    assert len(set(tried)) == 8


# -- Presence -----------------------------------------------------------------------------------


class Counting:
    """A layout whose listings are counted."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.listings = 0

    def names(self):
        self.listings += 1
        return self.layout.names()

    def message_file(self, name: str) -> str:
        return self.layout.message_file(name)


def touch(layout: Layout, name: str, seconds_ago: float = 0.0) -> None:
    path = layout.message_file(name)
    with open(path, "wb"):
        pass
    then = time.time() - seconds_ago
    os.utime(path, (then, then))


def test_presence_tells_live_writing_and_absent(layout):
    live, hidden, writing, dead = (_format.new_key() for _ in range(4))
    touch(layout, live)
    touch(layout, _format.hidden_name(hidden, 5, 1))
    touch(layout, _format.writing_name(writing))
    touch(layout, _format.writing_name(dead), seconds_ago=_dedup.WRITE_GRACE + 60)
    presence = Presence(layout)
    assert [presence(key) for key in (live, hidden, writing, dead, _format.new_key())] == [
        "live", "live", "writing", None, None
    ]


def test_presence_lists_again_only_for_what_it_has_not_seen_live(layout):
    first, second = _format.new_key(), _format.new_key()
    touch(layout, first)
    counting = Counting(layout)
    presence = Presence(counting)  # type: ignore[arg-type]
    assert presence(first) == "live" and counting.listings == 1
    assert presence(first) == "live" and counting.listings == 1  # seen live: no listing
    touch(layout, second)
    assert presence(second) == "live" and counting.listings == 2  # not seen: a fresh listing
    assert presence(_format.new_key()) is None and counting.listings == 3


def test_a_new_file_gone_since_the_listing_counts_as_writing(layout, monkeypatch):
    key = _format.new_key()
    touch(layout, _format.writing_name(key))
    monkeypatch.setattr(_fs, "mtime", lambda path: None)  # renamed away between listing and stat
    assert Presence(layout)(key) == "writing"


# -- reserve and write_batch -------------------------------------------------------------------


def test_reserve_reserves_once_per_batch(layout):
    reservations = Reservations(layout.path)
    reserved: dict = {}
    stem = _format.new_key()
    digest = _dedup.dedup_hash("id", None)
    presence = Presence(layout)
    assert publishing.reserve(reservations, digest, stem, SETTINGS, reserved, presence) is None
    assert reserved[digest][0] == stem[: _format.KEY_LENGTH]
    other = _format.new_key()
    assert publishing.reserve(reservations, digest, other, SETTINGS, reserved, presence) == stem  # the batch's own


def test_write_batch_writes_every_entry(layout):
    entries = [prepare(body, NO_DEFAULTS, SETTINGS) for body in (b"a", b"b", b"c")]
    written = publishing.write_batch(layout, entries, False, None, Reservations(layout.path), SETTINGS)
    assert [entry.body for entry, _, _ in written.files] == [b"a", b"b", b"c"]
    assert written.duplicates == {} and written.reserved == {}
    assert sorted(_fs.read(path) for _, _, path in written.files) == [b"a", b"b", b"c"]
    assert all(name.state is State.WRITING for name in names(layout))


def test_write_batch_leaves_out_duplicates(layout):
    reservations = Reservations(layout.path)
    first = publishing.write_batch(layout, [prepare(b"1", defaults(dedup_id="x"), SETTINGS)], False, None,
                                   reservations, SETTINGS)
    (entry, stem, path), = first.files
    os.rename(path, layout.message_file(stem))  # published
    digest = entry.digest
    reservations.confirm(digest, first.reserved[digest][1], stem)
    entries = [prepare(b"2", defaults(dedup_id="x"), SETTINGS), prepare(b"3", NO_DEFAULTS, SETTINGS),
               prepare(b"4", defaults(dedup_id="x"), SETTINGS)]
    written = publishing.write_batch(layout, entries, False, None, reservations, SETTINGS)
    assert written.duplicates == {0: stem, 2: stem}
    assert [entry.body for entry, _, _ in written.files] == [b"3"]
    assert sorted(name.state.value for name in names(layout)) == ["ready", "writing"]  # no .new left of 2 and 4


def test_a_batch_that_fails_to_write_leaves_no_new_file(layout, monkeypatch):
    real = _fs.create_exclusive
    made = []

    def create_exclusive(path, data, **kwargs):
        if len(made) == 2:
            raise StorageError(28, "disk full", path)
        made.append(path)
        return real(path, data, **kwargs)

    monkeypatch.setattr(_fs, "create_exclusive", create_exclusive)
    entries = [prepare(body, NO_DEFAULTS, SETTINGS) for body in (b"a", b"b", b"c")]
    with pytest.raises(StorageError, match="disk full"):
        publishing.write_batch(layout, entries, False, None, Reservations(layout.path), SETTINGS)
    assert len(made) == 2 and names(layout) == []


def test_a_batch_whose_reservation_fails_leaves_no_new_file(layout):
    # (the entry being reserved was once left behind: it joined the cleanup only after reserve returned)
    class Failing:
        def reserve(self, *args):
            raise StorageError(5, "disk trouble", "x")

    entries = [prepare(b"a", NO_DEFAULTS, SETTINGS), prepare(b"b", defaults(dedup_id="x"), SETTINGS)]
    with pytest.raises(StorageError, match="disk trouble"):
        publishing.write_batch(layout, entries, False, None, Failing(), SETTINGS)  # type: ignore[arg-type]
    assert names(layout) == []


# -- Capacity ------------------------------------------------------------------------------------


@pytest.fixture
def frozen(monkeypatch) -> list[float]:
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_max_message_bytes(layout):
    capacity = Capacity(layout)
    capacity.check([b"x" * 10], settings(max_message_bytes=10), layout.path)
    with pytest.raises(MessageTooLarge, match="11 bytes is over the queue's max_message_bytes \\(10\\)"):
        capacity.check([b"ok", b"x" * 11], settings(max_message_bytes=10), layout.path)


def test_max_messages_counts_the_messages_not_the_new_files(layout, frozen):
    for _ in range(3):
        touch(layout, _format.new_key())
    touch(layout, _format.writing_name(_format.new_key()))
    capacity = Capacity(layout)
    capacity.check([b"x"], settings(max_messages=4), layout.path)
    assert capacity.count == 3
    with pytest.raises(QueueFull, match="3 messages, max_messages is 4"):
        capacity.check([b"x", b"y"], settings(max_messages=4), layout.path)


def test_the_count_is_kept_for_its_ttl(layout, frozen):
    counting = Counting(layout)
    capacity = Capacity(counting)  # type: ignore[arg-type]
    capacity.check([b"x"], settings(max_messages=10), "q")
    touch(layout, _format.new_key())
    frozen[0] += publishing.COUNT_TTL * 0.99
    capacity.check([b"x"], settings(max_messages=10), "q")
    assert counting.listings == 1 and capacity.count == 0
    with capacity.lock:
        capacity.count += 10  # what the hot paths do after publishing
    with pytest.raises(QueueFull):
        capacity.check([b"x"], settings(max_messages=10), "q")
    frozen[0] += publishing.COUNT_TTL * 0.01
    capacity.check([b"x"], settings(max_messages=10), "q")  # counted again: 1 message
    assert counting.listings == 2 and capacity.count == 1


def test_without_limits_nothing_is_counted(layout):
    counting = Counting(layout)
    Capacity(counting).check([b"x" * 1000] * 100, SETTINGS, "q")  # type: ignore[arg-type]
    assert counting.listings == 0


# -- a publish whose rename was answered with an error after it took effect ----------


@pytest.mark.parametrize("shards", [1, 4])
def test_a_publish_claimed_before_its_retransmitted_rename_came_back_is_a_publish(tmp_path, shards, monkeypatch):
    """NFS answers a retransmitted, successful rename with ENOENT; a consumer may have claimed
    the new name meanwhile, so the destination is gone too. The publisher's own .new file was
    moved by no one else: the message is in the queue, and the publish succeeded."""
    import errno

    from vsqs import Queue

    queue = Queue(tmp_path / "q", create=True, shards=shards)
    consumer = Queue(queue.path)
    real_rename = os.rename

    def renamed_then_claimed(src, dst, *args, **kwargs):
        real_rename(src, dst, *args, **kwargs)
        if str(src).endswith(".new"):
            monkeypatch.setattr(os, "rename", real_rename)
            assert consumer.receive() is not None  # claimed before the answer came back
            raise OSError(errno.ENOENT, "No such file or directory", src)

    monkeypatch.setattr(os, "rename", renamed_then_claimed)
    sent = queue.publish(b"x", attributes={"a": "b"})
    assert consumer.stats().in_flight == 1
    assert [info.id for info in consumer.messages()] == [sent]


def test_a_publish_whose_new_file_vanished_says_so(tmp_path, monkeypatch):
    import errno

    from vsqs import Queue, StorageError

    queue = Queue(tmp_path / "q", create=True)

    def collected(src, dst, *args, src_dir_fd=None, **kwargs):  # garbage collection took the .new file first
        os.unlink(src, dir_fd=src_dir_fd)
        raise OSError(errno.ENOENT, "No such file or directory", src)

    monkeypatch.setattr(os, "rename", collected)
    with pytest.raises(StorageError, match="vanished before it was published"):
        queue.publish(b"x")


def test_a_rename_answered_gone_that_did_not_happen_is_no_publish(tmp_path, monkeypatch):
    import errno

    from vsqs import Queue, StorageError

    queue = Queue(tmp_path / "q", create=True)

    def stale(src, dst, *args, **kwargs):  # (ESTALE: the server says gone; the file is still there)
        raise OSError(errno.ESTALE, "Stale file handle", src)

    monkeypatch.setattr(os, "rename", stale)
    with pytest.raises(StorageError, match="not published"):
        queue.publish(b"x")
    monkeypatch.undo()
    assert queue.receive() is None
