"""gc of ``.spark/``, the area reserved for the Spark adapter (``adapter_area``):
trees untouched for the stage grace go whole, files being written and empty
directories go after the grace, and anything that is not a plain file or
directory of the expected shape is reported and left, at bounded cost."""

from __future__ import annotations

import logging
import os
import time

import pytest

from vsqs._core import adapter_area
from vsqs._core.adapter_area import collect_area

DAY = 86400.0


def _tree(root: str, query: str, files: dict[str, bytes]) -> str:
    """Make ``.spark/stream/QUERY/`` with ``files`` (paths relative to it)."""
    tree = os.path.join(root, ".spark", "stream", query)
    for relative, content in files.items():
        path = os.path.join(tree, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as stream:
            stream.write(content)
    return tree


def _age(tree: str, seconds_ago: float) -> None:
    """Set every entry of ``tree`` (and itself) to ``seconds_ago``, children first."""
    when = time.time() - seconds_ago
    for directory, dirs, files in os.walk(tree, topdown=False):
        for name in files + dirs:
            os.utime(os.path.join(directory, name), (when, when), follow_symlinks=False)
        os.utime(directory, (when, when))


MANIFEST = {"3/p0/0.0.json": b'{"v":1,"receipts":[]}', "3/p0/0.end.json": b'{"v":1,"chunks":1}',
            "3/p1/0.0.json": b'{"v":1,"receipts":[]}'}


def test_a_tree_untouched_for_the_tree_grace_goes_whole(tmp_path):
    old = _tree(str(tmp_path), "a" * 16, MANIFEST)
    _age(old, 8 * DAY)
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees, sweep.reported, sweep.complete) == (3, 1, [], True)
    assert os.listdir(tmp_path / ".spark" / "stream") == []


def test_a_tree_with_one_recent_entry_is_kept(tmp_path):
    tree = _tree(str(tmp_path), "b" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    os.utime(os.path.join(tree, "3", "p1", "0.0.json"))  # one file written now: the query lives
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees) == (0, 0)
    assert sorted(os.listdir(os.path.join(tree, "3"))) == ["p0", "p1"]


def test_files_being_written_and_empty_directories_go_after_the_grace(tmp_path):
    tree = _tree(str(tmp_path), "c" * 16, {**MANIFEST, "3/p0/.tmp-0123456789abcdef": b"{half",
                                           "4/p0/.tmp-fedcba9876543210": b""})
    _age(os.path.join(tree, "4"), 1000)  # batch 4: only a half-written file, 1000 s old
    old_tmp = os.path.join(tree, "3", "p0", ".tmp-0123456789abcdef")
    os.utime(old_tmp, (time.time() - 1000,) * 2)
    os.makedirs(os.path.join(tree, "5", "p0"))  # empty, but new: a writer may be about to write there
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees) == (2, 0)
    assert not os.path.exists(old_tmp) and not os.path.exists(os.path.join(tree, "4"))
    assert sorted(os.listdir(os.path.join(tree, "3", "p0"))) == ["0.0.json", "0.end.json"]  # recorded: kept
    assert os.path.isdir(os.path.join(tree, "5", "p0"))


def test_hostile_entries_are_reported_and_left(tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_bytes(b"x")
    queue = tmp_path / "q"
    tree = _tree(str(queue), "d" * 16, MANIFEST)
    os.symlink(outside / "precious", os.path.join(tree, "3", "p0", "1.0.json"))
    os.symlink(outside, os.path.join(tree, "3", "p2"))  # a link where a partition directory belongs
    os.mkfifo(os.path.join(tree, "3", "p1", "0.1.json"))
    os.makedirs(os.path.join(tree, "3", "p1", "0.2.json", "x"))  # a directory where a file belongs
    with open(os.path.join(tree, "3", "p0", "0.1.json"), "wb") as stream:
        stream.truncate(adapter_area.MAX_ADAPTER_FILE + 1)  # huge (sparse): never read, left
    os.symlink(outside, queue / ".spark" / "other")  # a link where a KIND belongs
    _age(tree, 8 * DAY)
    with caplog.at_level(logging.WARNING, "vsqs"):
        sweep = collect_area(str(queue), time.time(), 900, 7 * DAY)
    assert sweep.files == 0 and sweep.trees == 0  # a tree holding damage is never removed whole
    assert len(sweep.reported) == 6
    assert sorted(os.listdir(os.path.join(tree, "3", "p0"))) == ["0.0.json", "0.1.json", "0.end.json", "1.0.json"]
    assert os.path.islink(os.path.join(tree, "3", "p2")) and os.path.isdir(os.path.join(tree, "3", "p1", "0.2.json"))
    assert (outside / "precious").read_bytes() == b"x" and os.listdir(outside) == ["precious"]
    assert "FIFO" in caplog.text and "symbolic link" in caplog.text and "too deep" in caplog.text


def test_the_area_itself_a_link_is_left_alone(tmp_path):
    outside = tmp_path / "outside"
    _tree(str(outside), "e" * 16, MANIFEST)
    _age(str(outside / ".spark"), 8 * DAY)
    queue = tmp_path / "q"
    queue.mkdir()
    os.symlink(outside / ".spark", queue / ".spark")
    sweep = collect_area(str(queue), time.time(), 0, 0)
    assert (sweep.files, sweep.reported) == (0, [str(queue / ".spark")])
    assert len(list((outside / ".spark").rglob("*.json"))) == 3


def test_a_pass_stops_at_its_entry_budget(tmp_path, monkeypatch):
    for n in range(30):
        _age(_tree(str(tmp_path), f"{n:016x}", {"0/p0/0.0.json": b"{}"}), 8 * DAY)
    monkeypatch.setattr(adapter_area, "MAX_ADAPTER_ENTRIES", 40)
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert not sweep.complete and 0 < sweep.files < 30  # each entry listed counts: at most 40 looked at
    while not sweep.complete:  # ... and the next passes go on
        sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert os.listdir(tmp_path / ".spark" / "stream") == []


@pytest.mark.parametrize("stage_grace, kept", [(float("inf"), True), (7 * DAY, False)])
def test_queue_gc_counts_the_area(queue, stage_grace, kept):
    tree = _tree(queue.path, "f" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    removed = queue.collect_garbage(stage_grace=stage_grace)
    assert os.path.exists(tree) is kept and removed == (0 if kept else 3)


def test_a_tree_a_dead_gc_left_half_removed_goes_next_time(tmp_path):
    """An abandoned tree first leaves the adapter's sight by one rename; one
    that a gc left behind half-way (``.gc-*``) is removed by the next, whatever its age."""
    _tree(str(tmp_path), ".gc-0123456789abcdef", {"3/p0/0.0.json": b"{}"})  # fresh mtimes
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees) == (1, 1)
    assert os.listdir(tmp_path / ".spark" / "stream") == []


def test_an_abandoned_tree_is_out_of_sight_before_its_files_go(tmp_path, monkeypatch):
    tree = _tree(str(tmp_path), "9" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    seen = []
    monkeypatch.setattr(adapter_area, "_unlink", lambda base, path: seen.append(os.path.exists(tree)) or False)
    collect_area(str(tmp_path), time.time(), 900, 7 * DAY)  # (a gc that dies at its first unlink)
    assert seen and not any(seen)
    assert [name[:4] for name in os.listdir(tmp_path / ".spark" / "stream")] == [".gc-"]
    monkeypatch.undo()
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees) == (3, 1)


def test_a_tree_larger_than_a_pass_still_goes_a_part_per_pass(tmp_path, monkeypatch):
    """A ``.gc-*`` tree (or a junk directory) holding more entries than one pass
    may look at: each pass lists only its budget's worth (bounded memory) and
    removes what it saw, so the tree goes after a few passes (it used to make
    every pass stop at that listing, removing nothing there, for ever)."""
    _tree(str(tmp_path), ".gc-0123456789abcdef", {f"3/p0/0.{k}.json": b"{}" for k in range(100)})
    monkeypatch.setattr(adapter_area, "MAX_ADAPTER_ENTRIES", 40)
    listed = []
    real_listing = adapter_area._listing
    monkeypatch.setattr(adapter_area, "_listing", lambda d, b: listed.append(real_listing(d, b)) or listed[-1])
    passes = 0
    while os.listdir(tmp_path / ".spark" / "stream") and passes < 10:
        collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
        passes += 1
    assert os.listdir(tmp_path / ".spark" / "stream") == []
    assert max(len(names or []) for names in listed) <= 40  # never more names than the budget held at once


def test_a_huge_tree_not_seen_whole_is_never_removed_whole_and_is_reported(tmp_path, monkeypatch):
    tree = _tree(str(tmp_path), "8" * 16, {f"3/p0/0.{k}.json": b"{}" for k in range(100)})
    _age(tree, 8 * DAY)
    monkeypatch.setattr(adapter_area, "MAX_ADAPTER_ENTRIES", 40)
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert not sweep.complete and (sweep.files, sweep.trees) == (0, 0)  # its age is unknown: kept
    assert sweep.reported == [tree]
    assert len(os.listdir(os.path.join(tree, "3", "p0"))) == 100


def test_a_directory_that_cannot_be_listed_keeps_its_tree(tmp_path, monkeypatch):
    """What an unreadable directory holds is unknown (a file written now,
    perhaps): its tree is reported and kept, not judged by what could be seen."""
    tree = _tree(str(tmp_path), "7" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    hidden = os.path.join(tree, "3", "p1")

    def refuse(real):
        def listing(path="."):
            if os.fspath(path) == hidden:
                raise PermissionError(13, "Permission denied", hidden)
            return real(path)
        return listing

    monkeypatch.setattr(os, "scandir", refuse(os.scandir))
    monkeypatch.setattr(os, "listdir", refuse(os.listdir))
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert sweep.trees == 0 and sweep.reported == [hidden]
    assert os.path.isdir(hidden) and os.listdir(os.path.join(tree, "3", "p0"))


def test_a_directory_swapped_for_a_link_after_the_scan_is_not_followed(tmp_path, monkeypatch):
    """Someone swaps a directory of an abandoned tree for a symbolic link to
    another directory between gc's scan and its unlinks: the files of the same
    names there stay (every unlink walks down with O_NOFOLLOW opens)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("0.0.json", "0.end.json"):
        (outside / name).write_bytes(b"precious")
    queue = tmp_path / "q"
    tree = _tree(str(queue), "6" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    real_rename = os.rename

    def rename_then_swap(*args, **kwargs):
        real_rename(*args, **kwargs)
        gone = next(p for p in (queue / ".spark" / "stream").iterdir() if p.name.startswith(".gc-"))
        for name in os.listdir(gone / "3" / "p0"):
            os.unlink(gone / "3" / "p0" / name)
        os.rmdir(gone / "3" / "p0")
        os.symlink(outside, gone / "3" / "p0")

    monkeypatch.setattr(os, "rename", rename_then_swap)
    collect_area(str(queue), time.time(), 900, 7 * DAY)
    assert sorted(os.listdir(outside)) == ["0.0.json", "0.end.json"]


def test_a_tree_written_to_during_the_scan_is_kept(tmp_path, monkeypatch):
    """A query restarted after the grace writes into its old tree while gc
    scans it: the tree's directories changed, so gc leaves it (it used to take
    the tree away with the new file in it)."""
    tree = _tree(str(tmp_path), "5" * 16, MANIFEST)
    _age(tree, 8 * DAY)
    real_scan = adapter_area._scan
    levels = []

    def scan_then_write(*args, **kwargs):
        levels.append(1)
        newest = real_scan(*args, **kwargs)
        levels.pop()
        if not levels:  # the whole tree scanned (and found old)
            with open(os.path.join(tree, "3", "p1", "1.0.json"), "wb") as stream:  # a replay's next generation
                stream.write(b"{}")
        return newest

    monkeypatch.setattr(adapter_area, "_scan", scan_then_write)
    sweep = collect_area(str(tmp_path), time.time(), 900, 7 * DAY)
    assert (sweep.files, sweep.trees) == (0, 0)
    assert sorted(os.listdir(os.path.join(tree, "3", "p1"))) == ["0.0.json", "1.0.json"]
