"""When a queue was deleted and when it was purged: the records the engine
keeps in the spool (``.deleted/NAME.WHEN`` in the spool's root,
``.purged/WHEN`` in a queue; docs/FORMAT.md, Spools and Purge records), read
with ``Spool.deleted_at`` and ``Queue.purged_at``. Every process and host
sharing the spool reads the same records, so the SQS face's optional
60-second rules hold across gateway processes, hosts and restarts.

The records are read from their names alone (no file is opened), so a
planted FIFO, link, directory or huge file named like one is ignored or
taken for its name only, and a time far ahead of the clock is ignored."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core.limits import DELETED_KEEP, RECORD_AHEAD

HOUR_US = int(DELETED_KEEP * 1_000_000)


def _deleted_dir(spool: vsqs.Spool) -> Path:
    return Path(spool.root) / _format.DELETED_DIR


def _purged_dir(queue: vsqs.Queue) -> Path:
    return Path(queue.path) / _format.PURGED_DIR


def _plant_deleted(spool: vsqs.Spool, name: str, when_us: int) -> Path:
    directory = _deleted_dir(spool)
    directory.mkdir(exist_ok=True)
    path = directory / _format.deleted_record(name, when_us)
    path.write_bytes(b"")
    return path


# -- names --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["jobs", "a", "jobs.fifo", "a.1234567890123456", "x_y-z.9", "A" * 80])
def test_a_deletion_record_name_gives_back_its_queue_and_time(name: str):
    entry = _format.deleted_record(name, 1_795_305_501_720_000)
    assert entry == f"{name}.1795305501720000"
    assert _format.parse_deleted_record(entry) == (name, 1_795_305_501_720_000)


@pytest.mark.parametrize("entry", [
    "jobs", "jobs.", "jobs.179530550172000", "jobs.17953055017200001", ".jobs.1795305501720000",
    "a..b.1795305501720000", "jobs.1795305501720000.tmp", "j/b.1795305501720000", "A" * 81 + ".1795305501720000",
])
def test_entries_that_are_no_deletion_record_are_none(entry: str):
    assert _format.parse_deleted_record(entry) is None


def test_a_purge_record_name_is_its_sixteen_digit_time():
    assert _format.purged_record(1_795_305_501_720_000) == "1795305501720000"
    assert _format.parse_purged_record("1795305501720000") == 1_795_305_501_720_000
    for entry in ("179530550172000", "17953055017200001", "1795305501720000.new", "x", ""):
        assert _format.parse_purged_record(entry) is None


def test_a_time_far_ahead_is_ignored_and_one_a_little_ahead_reads_as_now():
    now = 1_795_305_501_000_000
    ahead = int(RECORD_AHEAD * 1_000_000)
    assert _format.newest_time([], now) is None
    assert _format.newest_time([now - 5, now - 9], now) == now - 5
    assert _format.newest_time([now + ahead + 1], now) is None
    assert _format.newest_time([now - 5, now + ahead + 1], now) == now - 5
    assert _format.newest_time([now + ahead], now) == now


# -- deletions ------------------------------------------------------------------


def test_deleting_a_queue_records_when(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    spool.create_queue("jobs")
    assert spool.deleted_at("jobs") is None
    before = time.time()
    spool.delete_queue("jobs")
    after = time.time()
    deleted = vsqs.Spool(tmp_path).deleted_at("jobs")  # another handle: the record is on disk
    assert deleted is not None and before <= deleted <= after
    assert spool.deleted_at("other") is None
    assert [p.name for p in _deleted_dir(spool).iterdir()] == [_format.deleted_record("jobs", round(deleted * 1e6))]


def test_a_deletion_by_another_process_is_seen(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    spool.create_queue("jobs")
    code = f"import vsqs; vsqs.Spool({str(tmp_path)!r}).delete_queue('jobs')"
    package_root = os.path.dirname(os.path.dirname(vsqs.__file__))
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": package_root})
    assert spool.deleted_at("jobs") is not None


def test_a_deleted_queue_made_again_keeps_the_record_until_deleted_again(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    spool.create_queue("jobs")
    spool.delete_queue("jobs")
    first = spool.deleted_at("jobs")
    spool.create_queue("jobs")
    assert spool.deleted_at("jobs") == first  # the record tells of the deletion, not of the queue now
    time.sleep(0.01)
    spool.delete_queue("jobs")
    second = spool.deleted_at("jobs")
    assert first is not None and second is not None and second > first
    assert len(list(_deleted_dir(spool).iterdir())) == 2  # this handle swept a minute ago at most: kept
    other = vsqs.Spool(tmp_path)  # a handle's first deletion sweeps
    other.create_queue("other")
    other.delete_queue("other")
    assert sorted(p.name.split(".")[0] for p in _deleted_dir(spool).iterdir()) == ["jobs", "other"]
    assert spool.deleted_at("jobs") == second


def test_a_failed_deletion_records_nothing(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    (tmp_path / "plain").write_bytes(b"not a queue")
    with pytest.raises(vsqs.QueueNotFound):
        spool.delete_queue("plain")
    with pytest.raises(vsqs.QueueNotFound):
        spool.delete_queue("never")
    assert spool.deleted_at("plain") is None and spool.deleted_at("never") is None


def test_records_older_than_an_hour_read_as_none_and_the_next_deletion_sweeps_them(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    now = _format.now_us()
    old = _plant_deleted(spool, "old", now - HOUR_US - 1_000_000)
    recent = _plant_deleted(spool, "recent", now - 10_000_000)
    assert spool.deleted_at("old") is None
    assert spool.deleted_at("recent") == pytest.approx((now - 10_000_000) / 1e6)
    spool.create_queue("jobs")
    spool.delete_queue("jobs")
    assert not old.exists() and recent.exists()


def test_deleted_at_checks_the_name(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    for bad in ("", "../x", ".deleted", "a/b", "x" * 81):
        with pytest.raises(vsqs.InvalidArgument):
            spool.deleted_at(bad)


def test_hostile_entries_named_like_deletion_records_are_ignored(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    now = _format.now_us()
    directory = _deleted_dir(spool)
    directory.mkdir()
    os.mkfifo(directory / _format.deleted_record("fifo", now))
    (directory / _format.deleted_record("dir", now)).mkdir()
    (tmp_path / "elsewhere").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", directory / _format.deleted_record("link", now))
    (directory / "jobs.garbage").write_bytes(b"")
    far_ahead = _plant_deleted(spool, "ahead", now + int(RECORD_AHEAD * 1_000_000) + 60_000_000)
    assert spool.deleted_at("fifo") is None  # never opened, so never waits for a writer either
    assert spool.deleted_at("dir") is None
    assert spool.deleted_at("link") is None
    assert spool.deleted_at("ahead") is None
    _plant_deleted(spool, "soon", now + 5_000_000)
    soon = spool.deleted_at("soon")
    assert soon is not None and soon <= time.time()  # a little ahead: now, never later
    big = _plant_deleted(spool, "big", now - 1_000_000)
    with open(big, "r+b") as f:
        f.truncate(1 << 40)  # sparse: its content is never read, only its name
    assert spool.deleted_at("big") == pytest.approx((now - 1_000_000) / 1e6)
    spool.create_queue("jobs")
    spool.delete_queue("jobs")  # the sweep removes no entry that is not a regular file of the grammar
    assert (directory / _format.deleted_record("dir", now)).is_dir()
    assert (directory / _format.deleted_record("fifo", now)).exists()
    assert (directory / "jobs.garbage").exists()
    assert not far_ahead.exists()  # a record of the grammar too far ahead to be read is swept


@pytest.mark.parametrize("plant", ["file", "fifo", "link"])
def test_a_deleted_directory_that_is_none_is_ignored_and_reported(tmp_path: Path, plant: str, caplog):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / _format.deleted_record("jobs", _format.now_us())).write_bytes(b"")
    directory = _deleted_dir(spool)
    if plant == "file":
        directory.write_bytes(b"jobs")
    elif plant == "fifo":
        os.mkfifo(directory)
    else:
        os.symlink(target, directory)
    with caplog.at_level(logging.WARNING, "vsqs"):
        assert spool.deleted_at("jobs") is None  # a link is not followed to the records it leads to
        spool.create_queue("jobs")
        assert spool.delete_queue("jobs") == 0  # the queue goes all the same
    assert "jobs" not in spool.queues()
    assert "not a directory" in caplog.text and "not written" in caplog.text
    assert len(list(target.iterdir())) == 1  # nothing written through the link


def test_the_records_are_no_queue_of_the_spool(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    spool.create_queue("jobs")
    spool.delete_queue("jobs")
    assert spool.deleted_at("jobs") is not None and _deleted_dir(spool).is_dir()
    assert spool.queues() == [] and list(spool) == [] and "jobs" not in spool


# -- purges ---------------------------------------------------------------------


def test_purging_every_message_records_when(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "jobs", create=True)
    queue.publish(b"x")
    assert queue.purged_at is None
    before = time.time()
    assert queue.purge() == 1
    after = time.time()
    purged = vsqs.Queue(tmp_path / "jobs").purged_at  # another handle
    assert purged is not None and before <= purged <= after
    assert queue.purge() == 0  # an empty queue's purge is a purge too
    again = queue.purged_at
    assert again is not None and again >= purged
    assert len(list(_purged_dir(queue).iterdir())) == 1  # the older record went


def test_purging_chosen_messages_records_nothing(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "jobs", create=True)
    key = queue.publish(b"x")
    assert queue.purge([key]) == 1
    assert queue.purge([]) == 0
    assert queue.purged_at is None and not _purged_dir(queue).exists()


def test_a_purge_record_is_no_message_and_gc_leaves_it(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "jobs", create=True)
    queue.purge()
    purged = queue.purged_at
    queue.publish(b"x")
    assert queue.stats().ready == 1 and len(list(queue.messages())) == 1
    queue.collect_garbage(grace=0, stage_grace=0)
    assert queue.purged_at == purged
    assert queue.receive() is not None


def test_a_queue_made_again_after_its_deletion_was_never_purged(tmp_path: Path):
    spool = vsqs.Spool(tmp_path)
    spool.create_queue("jobs").purge()
    spool.delete_queue("jobs")
    assert spool.create_queue("jobs").purged_at is None


def test_hostile_entries_named_like_purge_records_are_ignored(tmp_path: Path):
    queue = vsqs.Queue(tmp_path / "jobs", create=True)
    now = _format.now_us()
    directory = _purged_dir(queue)
    directory.mkdir()
    os.mkfifo(directory / _format.purged_record(now))
    (directory / _format.purged_record(now - 1)).mkdir()
    os.symlink(tmp_path, directory / _format.purged_record(now - 2))
    (directory / "garbage").write_bytes(b"")
    assert queue.purged_at is None
    far = directory / _format.purged_record(now + int(RECORD_AHEAD * 1_000_000) + 60_000_000)
    far.write_bytes(b"")
    assert queue.purged_at is None  # far ahead: planted, ignored
    (directory / _format.purged_record(now + 5_000_000)).write_bytes(b"")
    soon = queue.purged_at
    assert soon is not None and soon <= time.time()  # a little ahead: now, never later
    queue.publish(b"x")
    assert queue.purge() == 1
    assert (directory / _format.purged_record(now - 1)).is_dir() and far.exists()
    assert (directory / _format.purged_record(now)).exists()


@pytest.mark.parametrize("plant", ["file", "fifo", "link"])
def test_a_purged_entry_that_is_no_directory_is_reported_and_the_purge_goes_on(tmp_path: Path, plant: str, caplog):
    queue = vsqs.Queue(tmp_path / "jobs", create=True)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / _format.purged_record(_format.now_us())).write_bytes(b"")
    directory = _purged_dir(queue)
    if plant == "file":
        directory.write_bytes(b"x")
    elif plant == "fifo":
        os.mkfifo(directory)
    else:
        os.symlink(target, directory)
    queue.publish(b"x")
    with caplog.at_level(logging.WARNING, "vsqs"):
        assert queue.purged_at is None  # a link is not followed to the records it leads to
        assert queue.purge() == 1
        assert queue.purged_at is None
    assert "not a directory" in caplog.text and "not written" in caplog.text
    assert len(list(target.iterdir())) == 1  # nothing written through the link
