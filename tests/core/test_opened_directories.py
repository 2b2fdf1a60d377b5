"""A handle stays in the queue it opened, whatever is done to the path later.

Whoever can write the spool can swap an opened queue's directory (or a shard,
or a directory of the queue's own) for a symbolic link to somewhere else: a
file of their choosing would be written there, another spool's messages read
or deleted. A handle holds the directories it opened (see ``fs.Pin``), so a
directory renamed away goes on being served where it is now, and a link put
in its place is never followed. A queue deleted and made again is served
again, opened as any queue is: its path must lead to a directory, not a link.
Each test plants the swap on real directories and calls the public API.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core import layout as _layout
from vsqs._core import settings as _settings


def _files(directory: Path) -> list[str]:
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


@pytest.fixture
def looking_each_time(monkeypatch):
    """Handles look at whether their directories are still those at their paths before each
    operation, not once a second (CHECK_EVERY): what a second later is, at once."""
    monkeypatch.setattr(_layout, "CHECK_EVERY", 0.0, raising=False)


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def spools(request, tmp_path):
    """(queue ``q`` of a spool holding "mine", a queue of another spool holding "theirs")."""
    queue = vsqs.Spool(tmp_path / "spool", create=True).create_queue("q", shards=request.param)
    queue.publish(b"mine")
    victim = vsqs.Queue(tmp_path / "other" / "victim", create=True, mode="0600")
    victim.publish(b"theirs")
    return queue, victim


def _swap_for_a_link(directory: str, target: str, *, keep: bool) -> None:
    """Put a link to ``target`` where ``directory`` was (the directory renamed away, or removed)."""
    if keep:
        os.rename(directory, directory + ".moved")
    else:
        shutil.rmtree(directory)
    os.symlink(target, directory)


def test_until_it_looks_again_a_handle_serves_its_directory_renamed_away_and_replaced_by_a_link(spools):
    queue, victim = spools
    before = _files(Path(victim.path))
    _swap_for_a_link(queue.path, victim.path, keep=True)

    queue.publish(b"attack")
    assert sorted(m.body for m in queue.receive_batch(10, visibility_timeout=60)) == [b"attack", b"mine"]
    assert queue.stats().total == 2
    assert queue.purge() == 2
    assert _files(Path(victim.path)) == before  # nothing written, read or removed there
    assert [m.body for m in victim.receive_batch(10)] == [b"theirs"]


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "renamed-away"])
def test_a_queue_directory_replaced_by_a_link_is_not_a_queue_any_more(looking_each_time, spools, keep):
    queue, victim = spools
    before = _files(Path(victim.path))
    _swap_for_a_link(queue.path, victim.path, keep=keep)

    with pytest.raises(vsqs.QueueNotFound):
        queue.publish(b"attack")
    with pytest.raises(vsqs.QueueNotFound):
        queue.receive_batch(10)
    with pytest.raises(vsqs.QueueNotFound):
        queue.purge()
    assert _files(Path(victim.path)) == before
    assert [m.body for m in victim.receive_batch(10)] == [b"theirs"]


def test_a_handle_of_a_deleted_queue_publishes_nothing_into_it(tmp_path, looking_each_time):
    spool = vsqs.Spool(tmp_path, create=True)
    old = spool.create_queue("q")
    for _ in range(20):
        old.publish(b"before")
    spool.delete_queue("q")
    with pytest.raises(vsqs.QueueNotFound):
        old.publish(b"after")
    assert os.listdir(tmp_path) == [".deleted"]  # the deleted directory went whole (the deletion's record stays)
    spool.create_queue("q")
    old.publish(b"into the queue made again")
    assert [m.body for m in spool.queue("q").receive_batch(10)] == [b"into the queue made again"]


def test_a_queue_deleted_and_made_again_is_served_by_a_handle_of_the_old_one(tmp_path, looking_each_time):
    spool = vsqs.Spool(tmp_path, create=True)
    old = spool.create_queue("q")
    old.publish(b"lost with its queue")
    spool.delete_queue("q")
    spool.create_queue("q").publish(b"new")
    assert old.receive().body == b"new"
    old.publish(b"through the old handle")
    assert [m.body for m in spool.queue("q").receive_batch(10)] == [b"through the old handle"]


def test_a_shard_removed_and_made_again_is_held_again(tmp_path, looking_each_time):
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=4)
    for index in range(4):
        shutil.rmtree(os.path.join(queue.path, _format.shard_dir_name(index)))
    assert queue.collect_garbage() == 0  # makes the shards again
    ids = [queue.publish(b"x") for _ in range(16)]
    assert sorted(m.id for m in queue.receive_batch(16)) == sorted(ids)


def test_a_source_goes_on_after_its_dead_letter_queue_was_deleted_and_made_again(tmp_path, looking_each_time):
    spool = vsqs.Spool(tmp_path, create=True)
    queue = spool.create_queue("q", max_receives=1)
    for round_ in range(2):
        queue.publish(b"%d" % round_)
        assert queue.receive(visibility_timeout=0) is not None
        assert queue.receive() is None  # dead-lettered: into q.dlq, made on demand
        assert [m.body for m in spool.queue("q.dlq").receive_batch(10)] == [b"%d" % round_]
        spool.delete_queue("q.dlq")


def test_a_shard_swapped_for_a_link_is_never_followed(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=4)
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = _format.ready_name(_format.make_stem(_format.new_key()))
    (outside / planted).write_bytes(b"theirs")
    for index in range(4):  # every shard: wherever the next publish and receive go
        shard = os.path.join(queue.path, _format.shard_dir_name(index))
        _swap_for_a_link(shard, str(outside), keep=True)

    for _ in range(8):
        queue.publish(b"attack")
    assert sorted({m.body for m in queue.receive_batch(10)}) == [b"attack"]
    assert queue.stats().total == 8
    assert _files(outside) == [planted]


@pytest.mark.parametrize("directory", [_format.GROUPS_DIR, _settings.SETTINGS_DIR])
def test_a_directory_of_the_queue_swapped_for_a_link_after_use_is_never_followed(tmp_path, directory):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.configure(visibility_timeout=60)
    queue.publish_batch([b"1", b"2"], group="g")
    queue.receive().delete()  # .groups made and used
    outside = tmp_path / "outside"
    outside.mkdir()
    _swap_for_a_link(os.path.join(queue.path, directory), str(outside), keep=True)

    with pytest.raises(vsqs.StorageError):  # a lease, or a settings version, would be written there
        if directory == _format.GROUPS_DIR:
            queue.receive()
        else:
            queue.configure(visibility_timeout=5)
    assert _files(outside) == []


def test_a_dead_letter_queue_swapped_for_a_link_after_use_is_never_followed(tmp_path):
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    queue = spool.create_queue("q", max_receives=1)
    queue.publish(b"first")
    assert queue.receive(visibility_timeout=0) is not None
    assert queue.receive() is None  # the first dead letter: q.dlq made, and held by the handle
    queue.publish(b"second")
    assert queue.receive(visibility_timeout=0) is not None
    victim = vsqs.Queue(tmp_path / "other" / "victim", create=True)
    dead_letters = str(tmp_path / "spool" / "q.dlq")
    _swap_for_a_link(dead_letters, victim.path, keep=True)

    with pytest.raises(vsqs.StorageError, match="symbolic link"):  # a dead-letter queue is made, never followed
        queue.receive()
    assert victim.stats().total == 0
    assert vsqs.Queue(dead_letters + ".moved").stats().total == 1
    assert queue.stats().total == 1  # the second dead letter stays where it was
