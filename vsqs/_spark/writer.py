"""Batch and streaming writes: each row a message.

Every task attempt stages its rows (``Queue.publish_staged``) as they
arrive; the driver's commit publishes exactly the stages of the attempts
Spark committed and drops the job's others, so a retried or speculative task
publishes each row once. A streaming write does the same per micro-batch.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from vsqs import InvalidArgument, Outgoing, Queue
from vsqs._spark.columns import WriteColumns
from vsqs._spark.options import Options

try:  # pyspark >= 4.1: streaming writes get Arrow batches, staged as they come
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _ARROW_STREAM_WRITES = True
except ImportError:  # pragma: no cover - pyspark 4.0: rows, staged in chunks
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _ARROW_STREAM_WRITES = False

log = logging.getLogger("vsqs.spark")

STAGE_CHUNK_ROWS = 1000  # rows per publish_staged call (one directory fsync each)
STAGE_CHUNK_BYTES = 16 << 20
COMMIT_THREADS = 8  # stages the driver's commit publishes at once
STAGE_IN_FLIGHT = 2  # chunks a task stages at once


@dataclass
class StagedCommit(WriterCommitMessage):
    """What one successful task attempt staged."""

    stage: str | None  # None when the partition had no rows
    rows: int


def _task_stage(prefix: str) -> str:
    """A stage name unique to this task attempt, under the job's ``prefix``."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - write() always runs in a task
        return f"{prefix}-x-{secrets.token_hex(6)}"
    # the random suffix keeps names unique across Spark restarts (task attempt ids restart)
    return (
        f"{prefix}-{context.partitionId()}-{context.attemptNumber()}"
        f"-{context.taskAttemptId()}-{secrets.token_hex(3)}"
    )


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """Group messages (bodies or Outgoing) into chunks of at most
    STAGE_CHUNK_ROWS rows / STAGE_CHUNK_BYTES."""
    chunk: list[Any] = []
    size = 0
    for item in items:
        chunk.append(item)
        if isinstance(item, Outgoing):  # its attributes count too (up to 64 KiB a message)
            size += len(item.body) + sum(len(name) + len(value) for name, value in (item.attributes or {}).items())
        else:
            size += len(item) if item is not None else 0
        if len(chunk) >= STAGE_CHUNK_ROWS or size >= STAGE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _stage_rows(open_queue: Callable[[], Queue], stage_prefix: str, chunks: Iterable[list[Any]]) -> StagedCommit:
    """Stage every message of one task attempt, chunk by chunk, as the rows
    arrive; nothing is visible to receivers until the driver commits the stage.

    Up to STAGE_IN_FLIGHT chunks are staged at once, each by a handle of its
    own (``open_queue()``): a chunk's publish ends waiting for its slowest
    fsync, then renames and syncs the stage directory, and the next chunk's
    files are written and flushed meanwhile. A chunk starts writing only once
    the chunk before has written its files (taken its keys), so the task's
    messages keep the order of its rows (a group's order, FIFO per producer).
    The task returns (or raises) only once every chunk it started is staged
    (or has failed)."""
    stage: str | None = None
    rows = 0
    with ThreadPoolExecutor(STAGE_IN_FLIGHT, thread_name_prefix="vsqs-stage") as pool:
        in_flight: deque[Future[list[str]]] = deque()
        turn: threading.Event | None = None  # set once the chunk before has written its files, or ended
        try:
            for chunk in chunks:
                if not chunk:
                    continue
                if any(item is None for item in chunk):
                    raise InvalidArgument("vsqs cannot write a row whose 'body' is null")
                stage = stage or _task_stage(stage_prefix)
                while len(in_flight) >= STAGE_IN_FLIGHT:
                    rows += len(in_flight.popleft().result())
                written = threading.Event()
                future = pool.submit(_stage_chunk, open_queue, chunk, stage, turn, written)
                # a chunk that failed or was cancelled before writing passes the turn on as well
                future.add_done_callback(functools.partial(_set_when_done, written))
                in_flight.append(future)
                turn = written
            while in_flight:
                rows += len(in_flight.popleft().result())
        finally:
            for future in in_flight:  # a failure: the chunks started end before the task does
                future.cancel()
            wait(in_flight)
    return StagedCommit(stage, rows)


def _stage_chunk(
    open_queue: Callable[[], Queue],
    chunk: list[Any],
    stage: str,
    turn: threading.Event | None,
    written: threading.Event,
) -> list[str]:
    """Stage one chunk through a handle of its own (one thread's), once the
    chunk before has written its files (``turn``); ``written`` is set once this one has."""
    queue = open_queue()
    if turn is not None:
        turn.wait()
    return queue.publish_staged(chunk, stage=stage, written=written.set)


def _commit_stages(open_queue: Callable[[], Queue], prefix: str, messages: Sequence[WriterCommitMessage | None]) -> int:
    """Publish the stages named in ``messages``; drop this job's other stages
    (attempts that failed or lost to another attempt). Returns messages published.

    Up to COMMIT_THREADS stages are committed at once, each by a handle of
    its own (``open_queue()``): a commit is a rename per message, and on a
    network filesystem each rename is a round trip."""
    committed = [m.stage for m in messages if isinstance(m, StagedCommit) and m.stage is not None]
    if len(committed) > 1:
        with ThreadPoolExecutor(min(COMMIT_THREADS, len(committed)), thread_name_prefix="vsqs-commit") as pool:
            published = sum(pool.map(lambda stage: open_queue().commit_stage(stage), committed))
    else:
        published = sum(open_queue().commit_stage(stage) for stage in committed)
    _drop_stages(open_queue(), prefix, keep=set(committed))
    return published


def _drop_stages(queue: Queue, prefix: str, keep: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    dropped = 0
    for stage in queue.stages():
        if stage.startswith(prefix + "-") and stage not in keep:
            dropped += queue.abort_stage(stage)
    return dropped


def _arrow_chunks(batches: Iterator[Any], columns: WriteColumns) -> Iterator[list[Any]]:
    """Each Arrow batch Spark hands over is staged as it comes (in chunks),
    made into Python objects STAGE_CHUNK_ROWS rows at a time: a task holds
    the chunks staging and the one being read, not a whole batch as bytes."""
    for batch in batches:
        for start in range(0, batch.num_rows, STAGE_CHUNK_ROWS):
            part = batch.slice(start, STAGE_CHUNK_ROWS)  # no copy
            bodies = part.column(columns.body).to_pylist()
            if not columns.options:
                yield from _chunks(bodies)
                continue
            values = [part.column(name).to_pylist() for _, name in columns.options]
            yield from _chunks([columns.message(body, row) for body, *row in zip(bodies, *values, strict=True)])


def _row_chunks(rows: Iterator[Any], columns: WriteColumns) -> Iterator[list[Any]]:
    """The same for Row objects (pyspark 4.0 streaming writes)."""
    return _chunks(
        columns.message(row[columns.body], [row[name] for _, name in columns.options])
        for row in rows
    )


class StagedWriter(DataSourceArrowWriter):
    """Each task attempt stages its rows; the driver's commit publishes the stages
    of the attempts Spark committed, so a retried or speculative task publishes
    each row once."""

    def __init__(self, options: Options, columns: WriteColumns, job: str) -> None:
        self.options = options
        self.columns = columns
        self.job = job  # unique per write; the prefix of every stage of this write

    def write(self, iterator: Iterator[Any]) -> StagedCommit:
        return _stage_rows(self.options.queue, f"spark-{self.job}", _arrow_chunks(iterator, self.columns))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published = _commit_stages(self.options.queue, f"spark-{self.job}", messages)
        log.info("published %d messages to %s", published, self.options.path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _drop_stages(self.options.queue(), f"spark-{self.job}")


class StagedStreamWriter(_StreamWriterBase):
    """Streaming write: each micro-batch is staged per task attempt and
    published by the driver's commit of that batch. Stages are named
    ``spark-<query>-<batch>-<partition>-<attempt>-...``; the commit of a batch
    drops the batch's other stages (failed attempts, or a dead run's)."""

    def __init__(self, options: Options, columns: WriteColumns, job: str) -> None:
        self.options = options
        self.columns = columns
        self.job = job

    def _prefix(self, batch_id: object) -> str:
        return f"spark-{self.job}-{batch_id}"

    def write(self, iterator: Iterator[Any]) -> StagedCommit:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch_id = context.getLocalProperty("streaming.sql.batchId") if context else None
        if _ARROW_STREAM_WRITES:
            chunks = _arrow_chunks(iterator, self.columns)
        else:  # pragma: no cover - pyspark 4.0
            chunks = _row_chunks(iterator, self.columns)
        return _stage_rows(self.options.queue, self._prefix(batch_id if batch_id is not None else "x"), chunks)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published = _commit_stages(self.options.queue, self._prefix(batchId), messages)
        log.info("batch %s: published %d messages to %s", batchId, published, self.options.path)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _drop_stages(self.options.queue(), self._prefix(batchId))


def _set_when_done(event: threading.Event, _future: object) -> None:
    event.set()
