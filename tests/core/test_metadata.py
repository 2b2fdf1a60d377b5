"""``metadata``: open a queue by its ``.vsqs.json``, create one so that it
appears whole (or adopt a directory), and ``Store``; called directly."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import IncompatibleFormat, QueueNotFound
from vsqs._core.layout import Layout, ShardedLayout
from vsqs._core.metadata import Store, open_queue, open_store


def leftovers(parent) -> list[str]:
    """Private directories of creators, left in ``parent``."""
    return [entry for entry in os.listdir(parent) if ".creating-" in entry]


@pytest.mark.parametrize("shards", [1, 8])
def test_create_makes_the_queue_and_says_what_it_fixed(tmp_path, shards):
    path = str(tmp_path / "deep" / "q")
    meta = open_queue(path, create=True, shards=shards)
    assert _format.is_queue_id(meta.queue_id) and meta.shards == shards
    assert open_queue(path, create=False) == meta  # read back as written
    with open(os.path.join(path, _format.METADATA_NAME), "rb") as file:
        assert _format.decode_metadata(file.read(), "") == meta
    assert os.path.isdir(os.path.join(path, _format.SHARDS_DIR)) == (shards > 1)
    assert leftovers(tmp_path / "deep") == []


@pytest.mark.parametrize("shards", [1, 4])
def test_a_new_queue_appears_whole(tmp_path, monkeypatch, shards):
    path = str(tmp_path / "q")
    seen = []
    real = _fs.rename_dir

    def rename_dir(src: str, dst: str) -> bool:
        # the moment the queue appears: everything is in place before it
        seen.append((os.path.exists(dst), sorted(os.listdir(src))))
        assert _format.decode_metadata(_fs.read(os.path.join(src, _format.METADATA_NAME)) or b"", src)
        if shards > 1:
            assert sorted(os.listdir(os.path.join(src, _format.SHARDS_DIR))) == [f"{i:02x}" for i in range(shards)]
        return real(src, dst)

    monkeypatch.setattr(_fs, "rename_dir", rename_dir)
    open_queue(path, create=True, shards=shards)
    expected = sorted([_format.METADATA_NAME] + ([_format.SHARDS_DIR] if shards > 1 else []))
    assert seen == [(False, expected)]


def test_an_existing_queue_is_opened_not_made_again(tmp_path, monkeypatch):
    path = str(tmp_path / "q")
    first = open_queue(path, create=True, shards=4)
    monkeypatch.setattr(_fs, "create_exclusive", lambda *a, **k: pytest.fail("wrote again"))
    assert open_queue(path, create=True, shards=1) == first  # the shard count is the metadata's


def test_a_missing_queue_is_not_found(tmp_path):
    with pytest.raises(QueueNotFound, match="no queue at"):
        open_queue(str(tmp_path / "q"), create=False)
    assert os.listdir(tmp_path) == []


def test_a_directory_without_metadata_is_not_a_queue(tmp_path):
    with pytest.raises(QueueNotFound, match="not a vsqs queue"):
        open_queue(str(tmp_path), create=False)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shards", [1, 4])
def test_create_adopts_an_existing_directory(tmp_path, shards):
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "keep.txt").write_bytes(b"mine")
    meta = open_queue(str(tmp_path / "q"), create=True, shards=shards)
    assert meta.shards == shards
    assert (tmp_path / "q" / "keep.txt").read_bytes() == b"mine"
    assert (tmp_path / "q" / _format.METADATA_NAME).is_file()
    shards_dir = tmp_path / "q" / _format.SHARDS_DIR
    if shards > 1:
        assert sorted(os.listdir(shards_dir)) == [f"{i:02x}" for i in range(shards)]
    else:
        assert not shards_dir.exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("shards", [1, 4])
def test_a_racing_creator_wins_and_both_agree(tmp_path, monkeypatch, shards):
    path = str(tmp_path / "q")
    winner = str(tmp_path / "winner")
    real = _fs.rename_dir
    raced = []

    def rename_dir(src: str, dst: str) -> bool:
        if not raced:
            raced.append(src)
            # another creator made the queue meanwhile (with its own private directory)
            os.mkdir(winner)
            Layout.make(winner, shards, None)
            with open(os.path.join(winner, _format.METADATA_NAME), "wb") as file:
                file.write(_format.encode_metadata("0badcafe", shards))
            assert real(winner, dst)
        return real(src, dst)

    monkeypatch.setattr(_fs, "rename_dir", rename_dir)
    meta = open_queue(path, create=True, shards=shards)
    assert meta == _format.Metadata("0badcafe", shards, True)  # the winner's queue
    assert raced and sorted(os.listdir(tmp_path)) == ["q"]  # the loser's private directory is gone


def test_a_creator_still_writing_the_metadata_is_waited_for(tmp_path, monkeypatch):
    path = tmp_path / "q"
    path.mkdir()
    (path / _format.METADATA_NAME).write_bytes(b"")  # created, not yet written
    naps = []

    def sleep(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 3:
            (path / _format.METADATA_NAME).write_bytes(_format.encode_metadata("0badcafe", 2))

    monkeypatch.setattr(time, "sleep", sleep)
    assert open_queue(str(path), create=False) == _format.Metadata("0badcafe", 2, True)
    assert len(naps) == 3


def test_metadata_left_empty_is_an_incompatible_format_in_the_end(tmp_path, monkeypatch):
    path = tmp_path / "q"
    path.mkdir()
    (path / _format.METADATA_NAME).write_bytes(b"")
    clock = [0.0]

    def monotonic() -> float:
        clock[0] += 1.0  # a second per look: the wait runs out without a real wait
        return clock[0]

    monkeypatch.setattr(time, "monotonic", monotonic)
    monkeypatch.setattr(time, "sleep", lambda seconds: None)
    with pytest.raises(IncompatibleFormat, match="unreadable queue metadata"):
        open_queue(str(path), create=False)
    assert clock[0] < 100  # it gave up: a bounded wait


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"{not json", "unreadable queue metadata"),
        (b'{"queue_id": "0badcafe"}', "unreadable queue metadata"),
        (b'{"format": 4, "queue_id": "0badcafe", "shards": 1}', "queue format 4"),
        (b'{"format": 3, "queue_id": "0badcafe"}', "unreadable queue metadata"),  # format 3 says its shards
        (b'{"format": 1, "queue_id": "../etc"}', "bad queue_id"),
        (b'{"format": 2, "queue_id": "0badcafe", "shards": 3}', "bad shards"),
        (b'{"format": 2, "queue_id": "0badcafe", "shards": 1}', "bad shards"),
    ],
)
def test_bad_metadata_is_an_incompatible_format(tmp_path, content, match):
    (tmp_path / _format.METADATA_NAME).write_bytes(content)
    for create in (False, True):
        with pytest.raises(IncompatibleFormat, match=match):
            open_queue(str(tmp_path), create=create)
    assert (tmp_path / _format.METADATA_NAME).read_bytes() == content  # never repaired by a create


def test_create_gives_the_new_files_the_mode(tmp_path):
    path = tmp_path / "q"
    open_queue(str(path), create=True, shards=2, mode=0o640)
    assert stat.S_IMODE(os.stat(path / _format.METADATA_NAME).st_mode) == 0o640
    for directory in (path, path / _format.SHARDS_DIR, path / _format.shard_dir_name(1)):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o750


def test_open_store_is_the_id_and_the_layout(tmp_path):
    flat = open_store(str(tmp_path / "a"), create=True)
    sharded = open_store(str(tmp_path / "b"), create=True, shards=4)
    assert isinstance(flat, Store) and type(flat.layout) is Layout and flat.layout.shown == str(tmp_path / "a")
    assert isinstance(sharded.layout, ShardedLayout) and sharded.layout.shards == 4
    queue_id, layout = sharded.id, sharded.layout
    with open(os.path.join(layout.path, _format.METADATA_NAME)) as file:
        assert json.load(file)["queue_id"] == queue_id
    assert open_store(str(tmp_path / "b")).id == queue_id
    with pytest.raises(QueueNotFound):
        open_store(str(tmp_path / "c"))


@pytest.mark.parametrize("shards", [1, 4])
def test_the_store_says_whether_receives_record_the_first_one(tmp_path, shards):
    """Format 3 (every new queue) records it; a queue of format 1 or 2, which
    older vsqs share, does not (for them a -rFIRST name is foreign)."""
    assert open_store(str(tmp_path / "new"), create=True, shards=shards).first_receive is True
    old = tmp_path / "old"
    old.mkdir()
    Layout.make(str(old), shards, None)
    (old / _format.METADATA_NAME).write_bytes(_format.encode_metadata("0badcafe", shards, first_receive=False))
    store = open_store(str(old))
    assert store.first_receive is False and store.id == "0badcafe" and store.layout.shards == shards
