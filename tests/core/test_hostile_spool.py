"""The library on a hostile or damaged spool.

Whoever can write the spool can plant anything in it: a FIFO, a directory or
a huge sparse file named like a message, a symlink named like a queue, a
forged ``.sources`` entry. vsqs must never block on one, read or write
outside the spool through one, run out of memory on one, or fail every call
because of one; and no message may be lost. Each test plants the damage on a
real directory and calls the public API.

A call that would block forever on the unfixed code runs in a thread with a
watchdog (``_returns``): the test waits as long as it must, and the watchdog
only turns a hang into a failure, so nothing here rests on timing.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import vsqs
from tests.conftest import message_names, message_path
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.limits import MAX_BODY_BYTES, MAX_MESSAGE_FILE, MAX_RECEIVE_BYTES

_WATCHDOG = 60.0  # seconds before a call that should return at once is declared hung


def _returns(call: Callable[[], Any], unblock: Callable[[], None] | None = None) -> Any:
    """Run ``call`` in a thread and return what it returns. If it has not
    returned within the watchdog's time it is hung (on the unfixed code: an
    open waiting for a FIFO's writer): ``unblock`` frees the thread and the
    test fails."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(_WATCHDOG)
    if thread.is_alive():
        if unblock is not None:
            unblock()
            thread.join(_WATCHDOG)
        pytest.fail("the call blocked: it waited on a special file of the spool")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _open_writer(fifo: str) -> Callable[[], None]:
    """What frees a reader blocked on ``fifo``'s open: a writer that comes and goes."""

    def unblock() -> None:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)

    return unblock


def _planted_name(queue: vsqs.Queue, *, priority: int = 9) -> str:
    """A fresh name of the message grammar for ``queue`` (a message published
    and taken away again), and its path: where the damage is planted."""
    queue.publish(b"placeholder", priority=priority)
    (name,) = [n for n in message_names(queue.path) if _format.parse_name(n) is not None]
    os.unlink(message_path(queue, name))
    return name


def _old_name(priority_digit: str = "9") -> str:
    """A ready message name sent long ago (for retention)."""
    return f"{priority_digit}-{1_000_000_000_000_000:016d}-00000000000000ab"


def _damage_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is not a message" in r.getMessage()]


# -- item 8: special files never block ------------------------------------------


def test_a_fifo_named_like_a_message_is_skipped_and_never_blocks_receive(queue, caplog):
    name = _planted_name(queue)
    fifo = message_path(queue, name)
    os.mkfifo(fifo)
    queue.publish(b"real", priority=0)  # sorts after the FIFO's priority 9
    caplog.set_level(logging.WARNING, logger="vsqs")

    got = _returns(lambda: queue.receive_batch(10), _open_writer(fifo))

    assert [m.body for m in got] == [b"real"]
    got[0].delete()
    # left in place (under the name its claim gave it), never deleted, never a message
    (claimed,) = [n for n in message_names(queue.path) if n.startswith(name[: _format.KEY_LENGTH])]
    assert stat.S_ISFIFO(os.lstat(message_path(queue, claimed)).st_mode)
    assert len(_damage_warnings(caplog)) == 1
    # its lease runs out (the rename a clock would make true): skipped again, reported once per handle
    parsed = _format.parse_name(claimed)
    expired = _format.hidden_name(parsed.stem, 1, parsed.receive_count)
    os.rename(message_path(queue, claimed), message_path(queue, expired))
    assert _returns(lambda: queue.receive_batch(10), _open_writer(message_path(queue, expired))) == []
    assert not os.path.lexists(message_path(queue, expired))  # claimed again, and skipped
    assert len(_damage_warnings(caplog)) == 1


@pytest.mark.parametrize("kind", ["directory", "symlink"])
def test_other_entries_named_like_messages_are_skipped_by_receive(queue, tmp_path, kind, caplog):
    name = _planted_name(queue)
    target = tmp_path / "outside"
    target.write_bytes(b"secret")
    if kind == "directory":
        os.mkdir(message_path(queue, name))
    else:
        os.symlink(target, message_path(queue, name))
    queue.publish(b"real", priority=0)
    caplog.set_level(logging.WARNING, logger="vsqs")
    assert [m.body for m in queue.receive_batch(10)] == [b"real"]  # no StorageError, no secret
    assert len(_damage_warnings(caplog)) == 1
    assert target.read_bytes() == b"secret"


def test_metadata_that_is_a_fifo_is_refused_at_once(tmp_path):
    path = tmp_path / "q"
    path.mkdir()
    meta = str(path / _format.METADATA_NAME)
    os.mkfifo(meta)
    with pytest.raises(vsqs.IncompatibleFormat):
        _returns(lambda: vsqs.Queue(path), _open_writer(meta))


def test_empty_metadata_of_an_old_queue_is_refused_without_waiting(tmp_path):
    path = tmp_path / "q"
    path.mkdir()
    meta = path / _format.METADATA_NAME
    meta.write_bytes(b"")
    os.utime(meta, (1_000_000_000, 1_000_000_000))  # written in 2001: no creator is still at it
    with mock.patch("vsqs._core.metadata.time.sleep", side_effect=AssertionError("waited for the metadata")):
        with pytest.raises(vsqs.IncompatibleFormat):
            vsqs.Queue(path)


def test_empty_metadata_being_written_is_waited_for(tmp_path):
    # a racing creator: the metadata is empty (and young) at the first read, whole at the next
    path = tmp_path / "q"
    path.mkdir()
    meta = path / _format.METADATA_NAME
    meta.write_bytes(b"")
    written = []

    def creator_finishes(_seconds: float) -> None:
        if not written:
            meta.write_bytes(_format.encode_metadata(_format.new_queue_id()))
            written.append(True)

    with mock.patch("vsqs._core.metadata.time.sleep", side_effect=creator_finishes):
        assert vsqs.Queue(path).shards == 1
    assert written


def test_a_settings_version_that_is_a_fifo_is_skipped(queue):
    queue.configure(visibility_timeout=7)
    settings = os.path.join(queue.path, _settings.SETTINGS_DIR)
    newest = max(v for v in map(_settings.parse_version, os.listdir(settings)) if v is not None)
    fifo = os.path.join(settings, _settings.version_name(newest + 1))
    os.mkfifo(fifo)  # the newest version: read first
    fresh = vsqs.Queue(queue.path)
    assert _returns(lambda: fresh.settings["visibility_timeout"], _open_writer(fifo)) == 7


# -- item 9: links out of the spool are never followed ----------------------------


def test_a_symlink_planted_in_a_spool_is_not_adopted_as_a_queue(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, tmp_path / "spool" / "evil")
    with pytest.raises(vsqs.StorageError):
        spool.create_queue("evil")
    with pytest.raises(vsqs.QueueNotFound):
        spool.queue("evil")
    with pytest.raises(vsqs.StorageError):
        vsqs.Queue(tmp_path / "spool" / "evil", create=True)
    assert list(outside.iterdir()) == []  # no metadata, no message written there


def test_a_symlink_to_a_real_queue_is_not_a_queue_of_the_spool(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    elsewhere = vsqs.Queue(tmp_path / "elsewhere", create=True)
    os.symlink(elsewhere.path, tmp_path / "spool" / "evil")
    assert spool.queues() == [] and "evil" not in spool
    with pytest.raises(vsqs.QueueNotFound):
        spool.queue("evil")
    with pytest.raises(vsqs.QueueNotFound):
        spool.delete_queue("evil")
    assert os.path.islink(tmp_path / "spool" / "evil") and vsqs.Queue(elsewhere.path).id == elsewhere.id


@pytest.mark.parametrize("where", [".settings", ".dedup", ".stage.s"])
def test_a_symlinked_directory_inside_a_queue_is_not_followed(queue, tmp_path, where):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(queue.path, where))
    with pytest.raises(vsqs.StorageError, match="symlink"):
        if where == ".settings":
            queue.configure(visibility_timeout=5)
        elif where == ".dedup":
            queue.publish(b"x", dedup_id="once")
        else:
            queue.publish_staged([b"x"], stage="s")
    assert list(outside.iterdir()) == []


def _dead_letter_one(spool: vsqs.Spool) -> tuple[vsqs.Queue, vsqs.Queue, str]:
    """A queue ``q`` with one message in its dead-letter queue; (q, dlq, the .sources entry)."""
    q = spool.create_queue("q", max_receives=1)
    q.publish(b"precious")
    assert q.receive(visibility_timeout=0) is not None
    assert q.receive() is None  # the second receive moves it to q.dlq
    dlq = spool.queue("q.dlq")
    assert [m.body for m in dlq.messages(bodies=True)] == [b"precious"]
    return q, dlq, os.path.join(dlq.path, ".sources", q.id)


@pytest.mark.parametrize("planted", ["outside", "through_a_link"])
def test_redrive_never_follows_a_planted_source_outside_the_spool(tmp_path, planted, caplog):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    q, dlq, source = _dead_letter_one(spool)
    victim = vsqs.Queue(tmp_path / "outside" / "victim", create=True)
    if planted == "outside":
        forged = victim.path
    else:  # a path in the spool's text, through a symlinked directory planted there
        os.symlink(tmp_path / "outside", tmp_path / "spool" / "link")
        forged = str(tmp_path / "spool" / "link" / "victim")
    os.unlink(source)
    Path(source).write_text(forged)
    caplog.set_level(logging.WARNING, logger="vsqs")

    assert dlq.redrive() == 0
    assert list(victim.messages()) == [] and [m.body for m in dlq.messages(bodies=True)] == [b"precious"]
    assert any("not followed" in r.getMessage() for r in caplog.records)
    # the operator may still choose the queue explicitly
    assert dlq.redrive(to=victim) == 1
    assert [m.body for m in victim.messages(bodies=True)] == [b"precious"]


def test_redrive_home_inside_the_spool_still_works(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    q, dlq, _ = _dead_letter_one(spool)
    assert dlq.redrive() == 1
    assert [m.body for m in q.messages(bodies=True)] == [b"precious"]


# -- item 10: sizes are checked before reading ------------------------------------


def test_a_huge_sparse_message_file_is_refused_without_reading_it(queue, caplog):
    name = _planted_name(queue)
    huge = message_path(queue, name)
    with open(huge, "wb") as f:
        f.truncate(MAX_MESSAGE_FILE + 1)  # sparse: no disk, but read whole it is 256 MiB of memory
    queue.publish(b"real", priority=0)
    caplog.set_level(logging.WARNING, logger="vsqs")
    assert [m.body for m in queue.receive_batch(10)] == [b"real"]
    assert len(_damage_warnings(caplog)) == 1
    moved = [n for n in message_names(queue.path) if n.startswith(name[: _format.KEY_LENGTH])]
    assert len(moved) == 1 and os.path.getsize(message_path(queue, moved[0])) == MAX_MESSAGE_FILE + 1


def test_a_receive_batch_holds_a_bounded_amount_of_bodies(queue):
    mib = 1024 * 1024
    count = MAX_RECEIVE_BYTES // mib + 2
    queue.publish_batch([bytes([i]) * mib for i in range(count)], durable=False)
    first = queue.receive_batch(count)
    assert 1 <= len(first) < count
    assert sum(len(m.body) for m in first) <= MAX_RECEIVE_BYTES + mib  # the budget plus one message
    rest: list[vsqs.Message] = []
    while batch := queue.receive_batch(count):  # (bounded: each call takes at least one)
        rest += batch
        assert len(rest) <= count
    assert sorted(m.body[0] for m in first + rest) == list(range(count))  # none lost


def test_a_body_over_the_hard_cap_is_refused_at_publish(flat_queue):
    # what no reader would take is never written: a larger body is refused
    # whatever the queue's max_message_bytes (here: unset)
    body = bytes(MAX_BODY_BYTES + 1)
    with pytest.raises(vsqs.MessageTooLarge):
        flat_queue.publish(body)
    with pytest.raises(vsqs.MessageTooLarge):
        flat_queue.publish_batch([b"ok", body])
    assert list(flat_queue.messages()) == []


# -- item 11: file_mode from the first system call ----------------------------------


def test_files_and_directories_are_never_more_open_than_file_mode(tmp_path, monkeypatch):
    root = str(tmp_path / "spool")
    seen: list[tuple[str, int, int]] = []  # (path, mode right after creation, the most it may be)
    real_open, real_mkdir = os.open, os.mkdir

    def watched_open(path, flags, mode=0o777, **kwargs):
        fd = real_open(path, flags, mode, **kwargs)
        if flags & os.O_CREAT and str(path).startswith(root + os.sep):
            seen.append((str(path), stat.S_IMODE(os.fstat(fd).st_mode), 0o600))
        return fd

    def watched_mkdir(path, mode=0o777, **kwargs):
        real_mkdir(path, mode, **kwargs)
        if str(path).startswith(root + os.sep):
            seen.append((str(path), stat.S_IMODE(os.lstat(path).st_mode) & 0o777, 0o700))

    old_umask = os.umask(0)  # the most permissive umask: only vsqs's own modes narrow anything
    try:
        spool = vsqs.Spool(root, create=True)
        monkeypatch.setattr(os, "open", watched_open)
        monkeypatch.setattr(os, "mkdir", watched_mkdir)
        for shards in (1, 4):
            q = spool.create_queue(f"q{shards}", shards=shards, file_mode="0600", max_receives=1)
            q.publish(b"a", group="g", dedup_id="d")
            q.publish_staged([b"b"], stage="s")
            q.commit_stage("s")
            q.configure(throttle=[100, 1])
            assert q.receive(visibility_timeout=0) is not None
            while q.receive() is not None:  # the rest, and the dead-letter queue on the way
                pass
    finally:
        os.umask(old_umask)
    assert len(seen) > 10
    wider = [(path, oct(mode)) for path, mode, most in seen if mode & ~most]
    assert wider == []
    # and every one of them ends at the exact mode
    for path, _, most in seen:
        if os.path.lexists(path):
            assert stat.S_IMODE(os.lstat(path).st_mode) & 0o777 == most, path


# -- item 12: entries that are not what their names say -----------------------------


def test_a_directory_named_like_a_message_does_not_break_purge(queue, caplog):
    name = _planted_name(queue)
    os.mkdir(message_path(queue, name))
    queue.publish_batch([b"a", b"b"])
    caplog.set_level(logging.WARNING, logger="vsqs")
    assert queue.purge() == 2
    assert queue.purge() == 0
    assert os.path.isdir(message_path(queue, name))
    assert queue.stats().ready == 0  # not counted as a message either
    assert len(_damage_warnings(caplog)) == 1


def test_purge_stats_and_messages_leave_a_fifo_alone(queue):
    name = _planted_name(queue)
    fifo = message_path(queue, name)
    os.mkfifo(fifo)
    queue.publish(b"a")
    assert queue.stats().ready == 1
    assert _returns(lambda: [m.body for m in queue.messages(bodies=True)], _open_writer(fifo)) == [b"a"]
    assert queue.purge() == 1
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_purge_leaves_a_file_too_large_for_a_message(queue, caplog):
    key = queue.publish(b"x")
    [name] = [n for n in message_names(queue.path) if n.startswith(key)]
    os.truncate(message_path(queue, name), MAX_MESSAGE_FILE + 1)  # sparse: damage (docs/FORMAT.md, Damage)
    queue.publish(b"a")
    caplog.set_level(logging.WARNING, logger="vsqs")
    assert queue.purge() == 1
    assert os.path.getsize(message_path(queue, name)) == MAX_MESSAGE_FILE + 1
    assert queue.purge([key]) == 0
    assert len(_damage_warnings(caplog)) == 1


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_gc_skips_entries_that_are_not_messages(queue, kind):
    name = _old_name()
    path = message_path(queue, name)
    if kind == "directory":
        os.mkdir(path)
    else:
        os.mkfifo(path)
    writing = _format.writing_name(_old_name("8")[:_format.KEY_LENGTH])
    os.mkdir(message_path(queue, writing))  # a ".new" that is a directory, long untouched
    os.utime(message_path(queue, writing), (1_000_000_000, 1_000_000_000))
    queue.configure(retention=60)
    queue.publish(b"fresh")
    assert queue.collect_garbage(grace=0) == 0
    assert os.path.lexists(path) and os.path.lexists(message_path(queue, writing))
    assert [m.body for m in queue.messages(bodies=True)] == [b"fresh"]


def test_delete_queue_of_a_plain_file_leaves_it_alone(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    plain = tmp_path / "spool" / "q"
    plain.write_bytes(b"not a queue")
    with pytest.raises(vsqs.QueueNotFound):
        spool.delete_queue("q")
    with pytest.raises(vsqs.QueueNotFound):
        spool.queue("q")
    with pytest.raises(vsqs.QueueNotFound):
        vsqs.Queue(plain)
    assert plain.read_bytes() == b"not a queue" and spool.queues() == []


def test_delete_queue_counts_only_messages(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    q = spool.create_queue("q")
    name = _planted_name(q)
    os.mkfifo(message_path(q, name))
    q.publish(b"a")
    assert spool.delete_queue("q") == 1
    assert not os.path.lexists(q.path)


def test_fs_inside(tmp_path):
    root = tmp_path / "spool"
    (root / "sub").mkdir(parents=True)
    os.symlink(tmp_path, root / "up")
    real = os.path.realpath(root)
    assert _fs.inside(str(root / "q"), str(root)) == os.path.join(real, "q")
    assert _fs.inside(str(root / "sub" / "q"), str(root)) == os.path.join(real, "sub", "q")
    for bad in [str(tmp_path / "q"), str(root / "up" / "q"), str(root / ".." / "q"), "q", str(root), ""]:
        assert _fs.inside(bad, str(root)) is None, bad
