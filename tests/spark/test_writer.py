"""A write task's staging (``_stage_rows``) and the driver's commit
(``_commit_stages``) without Spark: chunks staged two at a time, a task
that ends only after every chunk it started, and crash points between the
steps of a task that lose nothing once the job commits a retry."""

from __future__ import annotations

import functools
import os
import threading

import pytest

import vsqs
from tests.system.test_crash import Crash, DyingOS
from vsqs._core import fs as _fs
from vsqs._core import synced as _synced
from vsqs._spark import writer as _writer

CHUNKS = [[b"a%d" % i for i in range(3)], [b"b%d" % i for i in range(3)], [b"c"], [b"d%d" % i for i in range(2)]]
ROWS = sorted(body for chunk in CHUNKS for body in chunk)


def _bodies(queue: vsqs.Queue) -> list[bytes]:
    return sorted(m.body for m in queue.receive_batch(100))


class MeetingQueue:
    """A queue whose ``publish_staged`` returns only once ``ways`` calls are
    in it at the same time (a barrier): staging one chunk after the other
    breaks the barrier instead of passing it."""

    def __init__(self, ways: int) -> None:
        self.barrier = threading.Barrier(ways, timeout=60)  # only so a broken writer fails, not hangs
        self.staged: list[bytes] = []
        self.lock = threading.Lock()

    def publish_staged(self, bodies, *, stage: str) -> list[str]:
        self.barrier.wait()
        with self.lock:
            self.staged.extend(bodies)
        return [str(i) for i in range(len(bodies))]


def test_a_task_stages_its_chunks_two_at_a_time(monkeypatch):
    monkeypatch.setattr(_writer, "STAGE_IN_FLIGHT", 2)
    queue = MeetingQueue(2)
    commit = _writer._stage_rows(lambda: queue, "spark-j", CHUNKS)
    assert commit.rows == len(ROWS)
    assert sorted(queue.staged) == ROWS


def test_a_failed_chunk_fails_the_task_only_after_the_chunk_beside_it_ended(tmp_path):
    path = str(tmp_path / "q")
    vsqs.Queue(path, create=True)
    second_started, first_failed = threading.Event(), threading.Event()
    ended: list[str] = []

    class Handle:
        def __init__(self) -> None:
            self.queue = vsqs.Queue(path)

        def publish_staged(self, bodies, *, stage: str) -> list[str]:
            if bodies is CHUNKS[0]:
                second_started.wait(60)
                first_failed.set()
                raise vsqs.StorageError(5, "injected", path)
            second_started.set()
            first_failed.wait(60)  # still staging when the first chunk fails
            ids = self.queue.publish_staged(bodies, stage=stage)
            ended.append(stage)
            return ids

    with pytest.raises(vsqs.StorageError, match="injected"):
        _writer._stage_rows(Handle, "spark-j", CHUNKS)
    assert len(ended) == 1  # the second chunk had ended when the task failed
    queue = vsqs.Queue(path)
    assert _writer._commit_stages(lambda: vsqs.Queue(path), "spark-j", []) == 0  # the job drops the stage
    assert queue.stages() == [] and queue.stats().total == 0


def test_a_task_that_dies_at_any_step_loses_nothing_once_its_retry_commits(monkeypatch, tmp_path):
    """Every system call of a task in turn is where its process dies; Spark
    then runs the task again, and the job's commit publishes the retry's
    stage and drops the dead attempt's: every row once, whole."""
    monkeypatch.setattr(_synced, "SYNC_BATCH", 2)  # the threaded fsyncs too
    monkeypatch.setattr(_writer, "STAGE_IN_FLIGHT", 2)
    n = 1
    while True:
        path = str(tmp_path / f"q{n}")
        vsqs.Queue(path, create=True)
        open_queue = functools.partial(vsqs.Queue, path)
        dying = DyingOS(n)
        monkeypatch.setattr(_fs, "os", dying)
        completed = True
        try:
            first = _writer._stage_rows(open_queue, "spark-j", CHUNKS)
        except Crash:
            completed = False
        finally:
            monkeypatch.setattr(_fs, "os", os)
            dying.close_leaked()
        queue = vsqs.Queue(path)
        assert queue.stats().total == 0  # nothing is visible before the job commits
        winner = first if completed else _writer._stage_rows(open_queue, "spark-j", CHUNKS)
        assert _writer._commit_stages(open_queue, "spark-j", [winner]) == len(ROWS)
        assert _bodies(queue) == ROWS  # each row once, whole
        assert queue.stages() == []  # the dead attempt's stage was dropped
        if completed:
            break
        n += 1
    assert n > len(ROWS) * 5  # create, write, fsync, close, rename each, at least
