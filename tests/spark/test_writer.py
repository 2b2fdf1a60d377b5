"""A write task's staging (``_stage_rows``) and the driver's commit
(``_commit_stages``) without Spark: chunks staged two at a time, a task
that ends only after every chunk it started, and crash points between the
steps of a task that lose nothing once the job commits a retry."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time

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

    def publish_staged(self, bodies, *, stage: str, written) -> list[str]:
        written()  # its messages have their keys: the next chunk may take its own
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

        def publish_staged(self, bodies, *, stage: str, written) -> list[str]:
            if bodies is CHUNKS[0]:
                written()  # its files written, it fails while the second chunk stages
                second_started.wait(60)
                first_failed.set()
                raise vsqs.StorageError(5, "injected", path)
            second_started.set()
            first_failed.wait(60)  # still staging when the first chunk fails
            ids = self.queue.publish_staged(bodies, stage=stage, written=written)
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


def _blocked_before_publishing(thread_name: str) -> bool:
    """Whether the thread ``thread_name`` waits in the writer (for its turn)
    before it reached ``publish_staged``: a frame of the writer's, none of the queue's."""
    thread = next((t for t in threading.enumerate() if t.name == thread_name), None)
    frame = sys._current_frames().get(thread.ident) if thread is not None else None
    files = []
    while frame is not None:
        files.append(os.path.basename(frame.f_code.co_filename) + ":" + frame.f_code.co_name)
        frame = frame.f_back
    return any(f.startswith("threading.py:wait") for f in files) and not any("publish" in f for f in files)


def test_a_groups_messages_keep_the_order_of_the_rows_across_chunks_in_flight(monkeypatch, tmp_path):
    """A group is delivered in the order its messages were published; a task
    publishes its rows in order. The second chunk is made to write a file
    while the first is still writing its own (as two threads may): unless it
    waits for the first chunk's files to be written, its messages take keys
    (send times) before the first chunk's last ones, and the group's order breaks."""
    from vsqs._core import publishing

    monkeypatch.setattr(_writer, "STAGE_IN_FLIGHT", 2)
    path = str(tmp_path / "q")
    vsqs.Queue(path, create=True)
    chunks = [[vsqs.Outgoing(b"%d-%d" % (c, i), group="g") for i in range(3)] for c in range(3)]
    second_wrote = threading.Event()
    real_write_new = publishing.write_new

    def write_new(layout, entry, *args, **kwargs):
        if entry.body == b"0-1":  # the first chunk waits until the second wrote a file, or waits its turn
            deadline = time.monotonic() + 120  # only so a broken writer fails, not hangs
            while not second_wrote.is_set():
                names = [t.name for t in threading.enumerate() if t.name.startswith("vsqs-stage")]
                others = [n for n in names if n != threading.current_thread().name]
                if others and all(_blocked_before_publishing(n) for n in others):
                    break
                assert time.monotonic() < deadline, "the second chunk neither wrote nor waited"
                time.sleep(0.001)
        result = real_write_new(layout, entry, *args, **kwargs)
        if entry.body == b"1-0":
            second_wrote.set()
        return result

    monkeypatch.setattr(publishing, "write_new", write_new)
    commit = _writer._stage_rows(functools.partial(vsqs.Queue, path), "spark-j", chunks)
    monkeypatch.setattr(publishing, "write_new", real_write_new)
    assert _writer._commit_stages(functools.partial(vsqs.Queue, path), "spark-j", [commit]) == 9
    queue = vsqs.Queue(path)
    got = []
    while (message := queue.receive()) is not None:
        got.append(message.body)
        message.delete()
    assert got == [b"%d-%d" % (c, i) for c in range(3) for i in range(3)]


def _message_bytes(item) -> int:
    if isinstance(item, vsqs.Outgoing):
        return len(item.body) + sum(len(k) + len(v) for k, v in (item.attributes or {}).items())
    return len(item)


def test_a_chunk_holds_at_most_16_mb_of_messages_with_their_attributes():
    """Attributes (up to 64 KiB a message) count towards a chunk's bytes:
    1,000 messages of one byte and 60 KB of attributes are not one chunk of 60 MB."""
    rows = [vsqs.Outgoing(b"x", attributes={"note": "v" * 60_000}) for _ in range(1000)]
    chunks = list(_writer._chunks(rows))
    assert sum(len(chunk) for chunk in chunks) == len(rows)
    for chunk in chunks:  # at most the limit before its last message
        assert sum(_message_bytes(item) for item in chunk[:-1]) < _writer.STAGE_CHUNK_BYTES


def test_a_task_holds_three_chunks_of_rows_not_a_whole_arrow_batch(monkeypatch):
    """Rows are taken out of an Arrow batch a chunk at a time: the Python
    objects a task holds are those of the chunks staging and the one being
    read, not a whole batch of Spark's (10,000 rows by default) made into bytes."""
    import tracemalloc

    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from vsqs._spark.columns import write_columns

    monkeypatch.setattr(_writer, "STAGE_CHUNK_ROWS", 100)
    body = 10_000
    batch = pa.RecordBatch.from_pydict({"body": pa.array([bytes([i % 256]) * body for i in range(2000)])})
    columns = write_columns(StructType([StructField("body", BinaryType())]))

    class Discarding:
        def publish_staged(self, bodies, *, stage: str, written) -> list[str]:
            written()
            return [str(i) for i in range(len(bodies))]

    tracemalloc.start()
    try:
        commit = _writer._stage_rows(Discarding, "spark-j", _writer._arrow_chunks(iter([batch]), columns))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert commit.rows == 2000
    chunk_bytes = 100 * body
    assert peak < 8 * chunk_bytes  # three chunks (and some slack), not the batch's 20


def test_an_interrupted_task_returns_only_once_its_chunks_ended(monkeypatch):
    """KeyboardInterrupt (or any error) while the rows are read: the chunks
    already staging end before the task does, and no staging thread is left."""
    monkeypatch.setattr(_writer, "STAGE_IN_FLIGHT", 2)
    interrupted = threading.Event()
    ended: list[int] = []

    class Handle:
        def publish_staged(self, bodies, *, stage: str, written) -> list[str]:
            written()
            interrupted.wait(60)  # still staging when the task is interrupted
            ended.append(len(bodies))
            return [str(i) for i in range(len(bodies))]

    def rows():
        yield from CHUNKS[:2]
        interrupted.set()
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _writer._stage_rows(Handle, "spark-j", rows())
    assert sorted(ended) == [3, 3]
    assert not [t for t in threading.enumerate() if t.name.startswith("vsqs-stage")]
