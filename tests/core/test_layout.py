"""``layout``: where a queue's files live, constructed directly on real
directories (no Queue): the flat and the sharded strategy, the receive
round and its cursor, fsync, strays, orphans and ``move_into``."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
import time

import pytest

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import layout as _layout
from vsqs._core.errors import QueueNotFound, StorageError
from vsqs._core.layout import Layout, ShardedLayout, layout_for, move_into

SHARDS = 4


def key_in(shard: int, sent: int = 1_000_000, priority: int = 0) -> str:
    """A message key whose RAND maps to ``shard`` (of up to 256 shards)."""
    return f"{_format.MAX_PRIORITY - priority}-{sent:016d}-{shard:02x}{sent:014x}"


def make_queue(path, shards: int) -> Layout:
    """A queue directory with its metadata (and shards), and its layout."""
    os.makedirs(path)
    Layout.make(str(path), shards, None)
    (path / _format.METADATA_NAME).write_bytes(_format.encode_metadata("0badcafe", shards))
    return layout_for(str(path), shards)


def touch(path: str, data: bytes = b"") -> str:
    with open(path, "wb") as file:
        file.write(data)
    return path


def content(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def age(path: str, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.fixture
def flat(tmp_path) -> Layout:
    return make_queue(tmp_path / "q", 1)


@pytest.fixture
def sharded(tmp_path) -> ShardedLayout:
    layout = make_queue(tmp_path / "q", SHARDS)
    assert isinstance(layout, ShardedLayout)
    return layout


# -- layout_for and make ------------------------------------------------------


def test_layout_for_picks_the_strategy_by_shard_count(tmp_path):
    flat = make_queue(tmp_path / "a", 1)
    sharded = make_queue(tmp_path / "b", 8)
    assert type(flat) is Layout and flat.shards == 1 and flat.locate is None
    assert type(sharded) is ShardedLayout and sharded.shards == 8 and sharded.locate is not None


def test_make_a_flat_queue_makes_no_directory(tmp_path):
    Layout.make(str(tmp_path), 1, None)
    assert os.listdir(tmp_path) == []


def test_make_makes_every_shard_with_the_mode(tmp_path):
    Layout.make(str(tmp_path), SHARDS, 0o640)
    shards = tmp_path / _format.SHARDS_DIR
    assert sorted(os.listdir(shards)) == [f"{i:02x}" for i in range(SHARDS)]
    for directory in [shards, *shards.iterdir()]:
        assert stat.S_IMODE(os.stat(directory).st_mode) == _fs.dir_mode(0o640) == 0o750


# -- the flat layout -----------------------------------------------------------


def test_flat_paths(flat):
    assert flat.file(_format.METADATA_NAME) == os.path.join(flat.path, _format.METADATA_NAME)
    assert flat.message_file(key_in(3)) == os.path.join(flat.path, key_in(3))
    assert flat.prefix + key_in(3) == flat.message_file(key_in(3))  # what the hot paths build inline
    assert flat.message_dirs() == [flat.path]


def test_flat_names_are_the_parsed_message_names_only(flat):
    ready, hidden, writing = key_in(1, 1), _format.hidden_name(key_in(2, 2), 5, 1), _format.writing_name(key_in(3, 3))
    for name in (ready, hidden, writing, "junk", "9-not-a-key"):
        touch(flat.message_file(name))
    os.mkdir(flat.file(".settings"))
    names = {str(name): name for name in flat.names()}
    assert set(names) == {ready, hidden, writing}
    assert names[hidden].state is _format.State.HIDDEN and names[writing].state is _format.State.WRITING
    assert {str(name) for name in flat.names(beside=ready)} == set(names)  # one directory: all of it


def test_flat_entries_are_everything_unparsed(flat):
    touch(flat.message_file(key_in(1)))
    touch(flat.file("junk"))
    assert sorted(name for name, _ in flat.entries()) == sorted([_format.METADATA_NAME, key_in(1), "junk"])


def test_flat_receive_round_is_one_listing_of_the_queue(flat):
    touch(flat.message_file(key_in(1)))
    rounds = list(flat.receive_round())
    assert len(rounds) == 1
    names, is_home = rounds[0]
    assert sorted(names) == sorted([_format.METADATA_NAME, key_in(1)]) and is_home is None


def test_flat_fsync_is_the_queue_directory_once(flat, monkeypatch):
    synced = []
    monkeypatch.setattr(_fs, "fsync_dir", synced.append)
    flat.fsync([key_in(0), key_in(1), key_in(2)])
    assert synced == [flat.path]


def test_flat_has_no_strays(flat):
    touch(flat.message_file(key_in(1)))
    assert flat.rehome_strays(None) == 0
    assert os.path.exists(flat.message_file(key_in(1)))


# -- orphans (.new files of publishers that died) -------------------------------


@pytest.mark.parametrize("shards", [1, SHARDS])
def test_remove_orphan_goes_by_the_cutoff(tmp_path, shards):
    layout = make_queue(tmp_path / "q", shards)
    old, young = _format.writing_name(key_in(1, 1)), _format.writing_name(key_in(2, 2))
    touch(layout.message_file(old))
    touch(layout.message_file(young))
    age(layout.message_file(old), 100)
    age(layout.message_file(young), 10)
    cutoff = time.time() - 50
    assert layout.remove_orphan(young, cutoff) == 0
    assert layout.remove_orphan(old, cutoff) == 1
    assert layout.remove_orphan(old, cutoff) == 0  # gone already: nothing to count
    assert os.path.exists(layout.message_file(young)) and not os.path.exists(layout.message_file(old))


# -- the sharded layout --------------------------------------------------------


def test_sharded_message_file_is_in_the_shard_its_name_maps_to(sharded):
    for shard in range(SHARDS):
        for name in (key_in(shard), _format.hidden_name(key_in(shard), 7, 2), _format.writing_name(key_in(shard))):
            expected = os.path.join(sharded.shown, _format.shard_dir_name(shard), name)
            assert _fs.shown(sharded.message_file(name)) == expected
            assert sharded.locate is not None and _fs.shown(sharded.locate(name) + name) == expected


def test_a_group_lives_in_the_shard_of_its_group_hash(sharded):
    group = _format.group_hash("orders")
    names = [_format.make_stem(key_in(shard), group_hash=group) for shard in range(SHARDS)]
    homes = {_fs.shown(os.path.dirname(sharded.message_file(name))) for name in names}
    assert homes == {os.path.join(sharded.shown, _format.shard_dir_name(_format.shard_of(names[0], SHARDS)))}


def test_sharded_message_dirs(sharded):
    assert [_fs.shown(directory) for directory in sharded.message_dirs()] == [
        os.path.join(sharded.shown, _format.shard_dir_name(index)) for index in range(SHARDS)
    ]


def test_sharded_names_are_every_shard_without_strays(sharded):
    homes = [key_in(shard, sent=shard + 1) for shard in range(SHARDS)]
    for name in homes:
        touch(sharded.message_file(name))
    stray_in_root = key_in(1, sent=50)
    stray_elsewhere = key_in(2, sent=60)
    touch(sharded.file(stray_in_root))
    touch(os.path.join(sharded.message_dirs()[3], stray_elsewhere))
    touch(os.path.join(sharded.message_dirs()[0], "junk"))
    assert sorted(str(name) for name in sharded.names()) == sorted(homes)


def test_names_beside_lists_only_that_shard(sharded, monkeypatch):
    for shard in range(SHARDS):
        touch(sharded.message_file(key_in(shard, sent=10 + shard)))
        touch(sharded.message_file(key_in(shard, sent=20 + shard)))
    listed = []
    real = _fs.list_names
    monkeypatch.setattr(_fs, "list_names", lambda directory: listed.append(directory) or real(directory))
    beside = _format.hidden_name(key_in(2, sent=99), 5, 1)
    assert sorted(str(name) for name in sharded.names(beside=beside)) == [key_in(2, sent=12), key_in(2, sent=22)]
    assert listed == [sharded.message_dirs()[2]]


def test_sharded_entries_are_the_queue_directory_and_every_shard(sharded):
    for shard in range(SHARDS):
        touch(sharded.message_file(key_in(shard)))
    touch(sharded.file("junk"))
    expected = [_format.METADATA_NAME, _format.SHARDS_DIR, "junk"] + [key_in(shard) for shard in range(SHARDS)]
    assert sorted(name for name, _ in sharded.entries()) == sorted(expected)


def test_a_sharded_fsync_syncs_each_shard_written_once(sharded, monkeypatch):
    synced = []
    monkeypatch.setattr(_fs, "fsync_dir", synced.append)
    sharded.fsync([key_in(3), key_in(1, sent=2), _format.hidden_name(key_in(3, sent=3), 9, 1), key_in(1, sent=4)])
    assert synced == [sharded.message_dirs()[1], sharded.message_dirs()[3]]


# -- the receive round -----------------------------------------------------------


def mark_shards(layout: ShardedLayout) -> dict[str, int]:
    """One message in each shard; which shard each one is in."""
    marks = {key_in(shard, sent=shard + 1): shard for shard in range(layout.shards)}
    for name in marks:
        touch(layout.message_file(name))
    return marks


@pytest.mark.parametrize("start", range(SHARDS))
def test_a_round_visits_every_shard_once_from_the_cursor(sharded, start):
    marks = mark_shards(sharded)
    sharded.cursor = start
    visited = []
    for names, is_home in sharded.receive_round():
        assert len(names) == 1 and is_home is not None
        visited.append(marks[names[0]])
    assert visited == [(start + step) % SHARDS for step in range(SHARDS)]
    assert sharded.cursor == start  # a whole round comes back to where it started


def test_a_round_stopped_early_goes_on_where_it_stopped(sharded):
    marks = mark_shards(sharded)
    sharded.cursor = 3
    seen = []
    for names, _ in sharded.receive_round():
        seen.append(marks[names[0]])
        if len(seen) == 2:
            break
    assert seen == [3, 0] and sharded.cursor == 1
    next_round = [marks[names[0]] for names, _ in sharded.receive_round()]
    assert next_round == [1, 2, 3, 0]


def test_is_home_tells_the_names_of_the_shard_listed(sharded):
    mark_shards(sharded)
    sharded.cursor = 0
    for index, (_, is_home) in enumerate(sharded.receive_round()):
        assert is_home is not None
        assert is_home(key_in(index, sent=77))
        assert is_home(_format.hidden_name(key_in(index, sent=77), 5, 1))
        assert not is_home(key_in((index + 1) % SHARDS, sent=77))


def test_the_cursor_starts_at_random(tmp_path, monkeypatch):
    make_queue(tmp_path / "q", SHARDS)
    monkeypatch.setattr(_layout.random, "randrange", lambda n: n - 1)
    assert ShardedLayout(str(tmp_path / "q"), SHARDS).cursor == SHARDS - 1


def test_after_a_fork_the_round_starts_at_a_new_random_shard(sharded, monkeypatch):
    marks = mark_shards(sharded)
    sharded.cursor = 0
    monkeypatch.setattr(_layout.random, "randrange", lambda n: 2)
    pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: pid + 1)  # as in a forked child
    assert [marks[names[0]] for names, _ in sharded.receive_round()] == [2, 3, 0, 1]
    monkeypatch.setattr(_layout.random, "randrange", lambda n: 1)
    assert [marks[names[0]] for names, _ in sharded.receive_round()] == [2, 3, 0, 1]  # once per process


def test_a_missing_shard_is_passed_over_with_a_warning(sharded, caplog):
    marks = mark_shards(sharded)
    shutil.rmtree(_fs.shown(sharded.message_dirs()[1]))
    sharded.cursor = 0
    with caplog.at_level(logging.WARNING, logger="vsqs"):
        listings = [names for names, _ in sharded.receive_round()]
    assert [[marks[name] for name in names] for names in listings] == [[0], [], [2], [3]]
    assert "shards/01 is missing" in caplog.text
    assert sharded.list_shard(1) == []


def test_a_gone_queue_is_not_a_missing_shard(sharded):
    shutil.rmtree(sharded.shown)
    with pytest.raises(QueueNotFound):
        sharded.list_shard(0)
    with pytest.raises(QueueNotFound):
        list(sharded.receive_round())


def test_a_symlinked_shard_is_refused(tmp_path):
    layout = make_queue(tmp_path / "q", SHARDS)
    outside = tmp_path / "outside"
    outside.mkdir()
    touch(str(outside / key_in(2)))
    shard = _fs.shown(layout.message_dirs()[2])
    os.rmdir(shard)
    os.symlink(outside, shard)
    with pytest.raises(StorageError, match="not a directory of the queue") as caught:
        ShardedLayout(layout.path, SHARDS)
    assert caught.value.errno == errno.ENOTDIR
    with pytest.raises(StorageError, match="not a directory of the queue"):
        layout.list_shard(2)  # a layout made before the link was planted
    with pytest.raises(StorageError, match="not a directory of the queue"):
        layout.names()


def test_a_shard_that_is_a_file_is_refused(tmp_path):
    layout = make_queue(tmp_path / "q", SHARDS)
    os.rmdir(_fs.shown(layout.message_dirs()[0]))
    touch(_fs.shown(layout.message_dirs()[0]))
    with pytest.raises(StorageError, match="not a directory of the queue"):
        ShardedLayout(layout.path, SHARDS)


# -- strays ---------------------------------------------------------------------


def test_rehome_strays_moves_them_into_their_shards(sharded):
    at_home = key_in(0, sent=1)
    in_root = _format.hidden_name(key_in(1, sent=2), 5, 1)
    elsewhere = key_in(2, sent=3)
    touch(sharded.message_file(at_home), b"home")
    touch(sharded.file(in_root), b"root")
    touch(os.path.join(sharded.message_dirs()[3], elsewhere), b"elsewhere")
    touch(os.path.join(sharded.message_dirs()[3], "junk"))
    assert sharded.rehome_strays(None) == 2
    assert content(sharded.message_file(in_root)) == b"root"
    assert content(sharded.message_file(elsewhere)) == b"elsewhere"
    assert content(sharded.message_file(at_home)) == b"home"
    assert sorted(os.listdir(sharded.message_dirs()[3])) == ["junk"]
    assert sorted(str(name) for name in sharded.names()) == sorted([at_home, in_root, elsewhere])
    assert sharded.rehome_strays(None) == 0


def test_rehome_strays_makes_a_missing_shard_again(sharded):
    shutil.rmtree(_fs.shown(sharded.message_dirs()[2]))
    stray = key_in(2)
    touch(sharded.file(stray))
    assert sharded.rehome_strays(None) == 1
    assert os.path.isfile(sharded.message_file(stray))


def test_rehome_strays_of_a_deleted_queue_makes_nothing(sharded):
    shutil.rmtree(sharded.shown)
    with pytest.raises(QueueNotFound):
        sharded.rehome_strays(None)
    assert not os.path.exists(sharded.shown)


# -- move_into --------------------------------------------------------------------


def test_move_into_moves_a_file_into_another_directory(tmp_path):
    source, target = tmp_path / "a", tmp_path / "b"
    source.mkdir()
    target.mkdir()
    touch(str(source / "m"), b"x")
    assert move_into(str(source / "m"), str(target / "n")) is True
    assert os.listdir(source) == [] and (target / "n").read_bytes() == b"x"


def test_move_into_of_a_gone_file_is_a_lost_race(tmp_path):
    assert move_into(str(tmp_path / "gone"), str(tmp_path / "n")) is False


def test_move_into_a_gone_directory_is_an_error_that_names_it(tmp_path):
    touch(str(tmp_path / "m"), b"x")
    with pytest.raises(QueueNotFound, match="queue directory is gone: .*missing"):
        move_into(str(tmp_path / "m"), str(tmp_path / "missing" / "m"))
    assert (tmp_path / "m").read_bytes() == b"x"  # it stays where it was
