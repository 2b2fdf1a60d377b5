"""Claim manifests stay inside the queue: a ``.spark``
directory (or one below it) that is a symbolic link is never followed, and
a queue directory swapped, after a handle opened it, for a link or for
another queue is refused: no manifest is written, read from or removed
outside. No Spark session: the executors' and the driver's code is called
directly, on paths that touch no message (a re-read of a chunk without
receipts, the settling of one), so that only the manifest code acts."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import vsqs

pytest.importorskip("pyspark", reason="the adapter's executor code imports pyspark")

from pyspark.sql.streaming.datasource import ReadMaxRows  # noqa: E402

from vsqs._spark import manifest as manifests  # noqa: E402
from vsqs._spark.claims import Settler, StreamPartition, _claimed  # noqa: E402
from vsqs._spark.options import Options  # noqa: E402
from vsqs._spark.schema import SCHEMA, read_columns  # noqa: E402
from vsqs._spark.stream import ClaimingStreamReader  # noqa: E402

QUERY = "0123456789abcdef"
OPTIONS = SimpleNamespace(visibility_timeout=300)
# where a link is planted, and what the queue's .spark/ holds below it
LEVELS = [".spark", ".spark/stream", f".spark/stream/{QUERY}", f".spark/stream/{QUERY}/1",
          f".spark/stream/{QUERY}/1/p0"]
PARTITION = f".spark/stream/{QUERY}/1/p0"


def _plant(directory: Path, below: str = PARTITION) -> None:
    """Partition 0 of batch 1's manifest at ``directory/below``: chunk 0, no
    receipts (re-reading or settling it touches no message)."""
    partition = directory / below
    partition.mkdir(parents=True, exist_ok=True)
    (partition / "0.0.json").write_bytes(manifests.encode({"receipts": []}))


def _tree(directory: Path) -> list[str]:
    """Every entry below ``directory``, as relative paths."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*"))


def _outside_at(queue: vsqs.Queue, tmp_path: Path, level: str) -> Path:
    """A directory outside the queue holding what the queue's ``level``
    would hold (a partition's manifest), and ``level`` a link to it."""
    outside = tmp_path / "outside"
    _plant(outside, os.path.relpath(PARTITION, level))
    link = Path(queue.path, level)
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(outside, link)
    return outside


def _re_read(queue: vsqs.Queue) -> list:
    """A replay of partition 0 of batch 1: it re-reads the manifest and seals it."""
    return list(_claimed(queue, OPTIONS, StreamPartition(QUERY, 1, 0, 10, [], replay=True), True))


def _settle(queue: vsqs.Queue) -> None:
    """Batch 2 settles partition 0 of batch 1: it removes its manifest."""
    settler = Settler(queue, StreamPartition(QUERY, 2, 0, 0, [(1, 0)]))
    settler.start()
    settler.finish()


def _reader(queue: vsqs.Queue) -> ClaimingStreamReader:
    return ClaimingStreamReader(Options.parse({"path": queue.path}), read_columns(SCHEMA), SCHEMA)


def test_a_claim_never_follows_a_spark_area_that_is_a_link(flat_queue, tmp_path):
    """No swap: `.spark` planted as a link is refused before anything is claimed."""
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, os.path.join(flat_queue.path, ".spark"))
    flat_queue.publish_batch(["a", "b", "c"])
    with pytest.raises(vsqs.StorageError, match="symbolic link"):
        list(_claimed(flat_queue, OPTIONS, StreamPartition(QUERY, 1, 0, 3, []), True))
    assert _tree(outside) == []
    assert flat_queue.stats().in_flight == 0  # refused before claiming: nothing waits for its lease


@pytest.mark.parametrize("level", LEVELS)
def test_a_re_read_never_follows_a_link_in_the_spark_area(flat_queue, tmp_path, level):
    """A link above the partition refuses the task; a partition's directory
    that is a link reads as no manifest (a replay then claims nothing)."""
    outside = _outside_at(flat_queue, tmp_path, level)
    before = _tree(outside)
    if level == PARTITION:
        assert _re_read(flat_queue) == []
    else:
        with pytest.raises(vsqs.StorageError, match="symbolic link"):
            _re_read(flat_queue)
    assert _tree(outside) == before  # no seal written there


@pytest.mark.parametrize("level", LEVELS)
def test_settling_never_removes_through_a_link_in_the_spark_area(flat_queue, tmp_path, level, caplog):
    outside = _outside_at(flat_queue, tmp_path, level)
    before = _tree(outside)
    with caplog.at_level(logging.ERROR, logger="vsqs.spark"):
        _settle(flat_queue)
    assert _tree(outside) == before
    if level == PARTITION:  # moved aside, unfollowed, for gc to report
        [aside] = os.listdir(Path(flat_queue.path, level).parent)
        assert aside.startswith(".left-p0-") and os.path.islink(Path(flat_queue.path, level).parent / aside)
    else:
        assert "symbolic link" in caplog.text  # the settle failed, logged


@pytest.mark.parametrize("level", LEVELS[:3])
def test_the_driver_never_plans_from_a_spark_area_behind_a_link(flat_queue, tmp_path, level):
    _outside_at(flat_queue, tmp_path, level)
    start = {"v": 1, "query": QUERY, "seq": 5}
    with pytest.raises(vsqs.StorageError, match="symbolic link"):
        _reader(flat_queue).latestOffset(start, ReadMaxRows(100))


def test_the_driver_passes_over_a_batch_directory_that_is_a_link(flat_queue, tmp_path):
    """Batch 1 a link: no partition of it is found (gc reports the link), none planned."""
    outside = _outside_at(flat_queue, tmp_path, LEVELS[3])
    before = _tree(outside)
    start = {"v": 1, "query": QUERY, "seq": 5}
    assert _reader(flat_queue).latestOffset(start, ReadMaxRows(100)) == start
    assert manifests.claimed_in(flat_queue, QUERY, 1) is None
    assert _tree(outside) == before and os.path.islink(Path(flat_queue.path, LEVELS[3]))


def _swap(queue: vsqs.Queue, tmp_path: Path, replacement: Path, link: bool) -> None:
    """Move the queue's directory aside and put ``replacement`` at its path
    (a link to it, or the directory itself), as a spool writer could."""
    os.rename(queue.path, tmp_path / "aside")
    if link:
        os.symlink(replacement, queue.path)
    else:
        os.rename(replacement, queue.path)


def test_a_queue_directory_swapped_for_a_link_is_never_followed(flat_queue, tmp_path, caplog):
    queue = flat_queue
    _plant(Path(queue.path))
    inside = _tree(Path(queue.path, ".spark"))
    outside = tmp_path / "outside"
    _plant(outside)
    before = _tree(outside)
    _swap(queue, tmp_path, outside, link=True)
    with pytest.raises(vsqs.QueueNotFound, match="symbolic link"):
        _re_read(queue)
    with caplog.at_level(logging.ERROR, logger="vsqs.spark"):
        _settle(queue)
    assert "symbolic link" in caplog.text
    assert _tree(outside) == before  # nothing written there, nothing removed
    assert _tree(tmp_path / "aside" / ".spark") == inside  # nor in the queue, where the handle cannot go now


def test_a_queue_directory_swapped_for_another_queue_is_refused(flat_queue, tmp_path, caplog):
    queue = flat_queue
    other = vsqs.Queue(tmp_path / "other", create=True)
    _plant(Path(other.path))
    before = _tree(Path(other.path, ".spark"))
    _swap(queue, tmp_path, Path(other.path), link=False)
    with pytest.raises(vsqs.QueueNotFound, match="another queue"):
        _re_read(queue)
    with caplog.at_level(logging.ERROR, logger="vsqs.spark"):
        _settle(queue)
    assert "another queue" in caplog.text
    assert _tree(Path(queue.path, ".spark")) == before  # the other queue's manifest: untouched


def test_the_area_checks_the_queue_id_in_the_engines_metadata_file():
    from vsqs._core import format as _format
    from vsqs._spark import area

    assert area.METADATA == _format.METADATA_NAME
