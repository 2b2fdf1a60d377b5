"""SKETCH (not wired into vsqs.spark yet): process_queue on the DataFrame API,
so that it runs over Spark Connect as on a classic session.

    spark.range(0, tasks, 1, numPartitions=tasks).select(udf("id")).collect()

(a plain Python UDF, not Arrow, one row per partition, non-deterministic):
one call per task attempt. Not ``mapInArrow``: on a classic session that
goes through ``pandas_udf`` and needs pandas on the client ("[PACKAGE_NOT_
INSTALLED] Pandas >= 2.2.0 must be installed"), which vsqs[spark] does not
install; over Connect both work.

Each partition is one task; each task attempt drains the queue exactly as
``process.py``'s tasks do (the same ``_drain``: a Worker, or the batch loop),
so the guarantees are those of process_queue: a message is deleted only
after ``fn`` succeeded and its results were published; one held by an
attempt that dies, is retried or runs speculatively comes back after its
visibility timeout.

What differs is how the counts come back. No socket to the client (the
client may be on another host than the driver, behind Connect's gRPC):

- an attempt that returns yields one row: its name and its counts;
- every attempt also appends a line of its running counts to its own file
  in the queue's ``.spark/process/RUN/`` (one ``write`` with ``O_APPEND``
  per change, no fsync: it outlives the process, as the socket's bytes
  did, though not the host), and ``end`` when it returns. The client,
  which reaches the queue's directory anyway, reads them after the job:
  an attempt with no row is counted as it reported (``died`` when it never
  wrote ``end``; a speculative copy whose row Spark dropped otherwise), as
  ``process._total`` does with the socket's reports. Then it removes RUN.

Open points (for the session that finishes this): the default parallelism
over Connect (no ``sparkContext.defaultParallelism``: read
``spark.default.parallelism`` or ask for ``parallelism``); the job's
description (``spark.addTag``?); a per-message ``write`` costs a syscall per
message (batch them by time, keeping "counts up to the death" honest to a
bound); RUN directories of a client that died are never removed (gc them
by age, as manifests are).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vsqs import InvalidArgument, Queue
from vsqs._spark import area
from vsqs._spark.process import (
    ProcessResult,
    _attempt,
    _count,
    _Counts,
    _drain,
    _task_spec,
    _TaskSpec,
)
from vsqs._spark.progress import FIELDS

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PROCESS_AREA = "process"  # .spark/process/RUN/ATTEMPT: the attempts' running counts
MAX_REPORT = 1 << 22  # bytes of one attempt's report file read at most
RESULT_TYPE = "struct<attempt: string, " + ", ".join(
    f"{f.name}: bigint" for f in dataclasses.fields(ProcessResult)
) + ">"
_APPEND_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class SpoolReporter:
    """In a task attempt: appends its counts to its file in the queue's
    ``.spark/process/RUN/`` after each change (the interface of
    progress.ProgressReporter)."""

    def __init__(self, queue: Queue, run: str, attempt: str) -> None:
        self._lock = threading.Lock()
        self._fd: int | None = None
        try:
            with area.opened(queue, [PROCESS_AREA, run], create=True) as directory:
                assert directory is not None
                self._fd = os.open(attempt, _APPEND_FLAGS, 0o644, dir_fd=directory)
        except OSError:
            self._fd = None  # counted from its row only, if it returns

    def report(self, counts: dict[str, int]) -> None:
        self._write(" ".join(str(counts[name]) for name in FIELDS) + "\n")

    def finish(self) -> None:
        self._write("end\n")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self._fd)
                self._fd = None

    def _write(self, line: str) -> None:
        with self._lock:
            if self._fd is None:
                return
            try:
                os.write(self._fd, line.encode())
            except OSError:
                self.close_unlocked()

    def close_unlocked(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def _run_attempt(spec: _TaskSpec, run: str) -> tuple[str, ProcessResult]:
    attempt = _attempt()
    reporter = SpoolReporter(spec.queue, run, attempt)
    try:
        return attempt, _drain(spec, _Counts(reporter))  # type: ignore[arg-type]
    finally:
        reporter.close()


def _reports(queue: Queue, run: str) -> dict[str, tuple[dict[str, int], bool]]:
    """Each attempt's last counts in RUN, and whether it wrote ``end``."""
    out: dict[str, tuple[dict[str, int], bool]] = {}
    with area.opened(queue, [PROCESS_AREA, run]) as directory:
        if directory is None:
            return out
        for name in area.names(directory):
            data = area.read_file(directory, name, MAX_REPORT) or b""
            counts = dict.fromkeys(FIELDS, 0)
            finished = False
            for line in data.decode(errors="replace").split("\n")[:-1]:  # complete lines only
                if line == "end":
                    finished = True
                    continue
                words = line.split()
                if len(words) == len(FIELDS) and all(w.isdigit() for w in words):
                    counts = dict(zip(FIELDS, map(int, words), strict=True))
            out[name] = (counts, finished)
    return out


def _remove_run(queue: Queue, run: str) -> None:
    with contextlib.suppress(OSError), area.opened(queue, [PROCESS_AREA]) as parent:
        if parent is None:
            return
        with area.subdirectory(parent, run) as directory:
            if directory is not None:
                for name in area.names(directory):
                    with contextlib.suppress(OSError):
                        os.unlink(name, dir_fd=directory)
        try:
            os.rmdir(run, dir_fd=parent)
        except OSError as exc:  # pragma: no cover - a straggler still writing
            if exc.errno not in (errno.ENOTEMPTY, errno.ENOENT):
                raise


def _default_parallelism(spark: SparkSession) -> int:
    conf = spark.conf.get("spark.default.parallelism", None)
    if conf:
        return int(conf)
    try:
        return spark.sparkContext.defaultParallelism  # classic only
    except Exception as exc:  # noqa: BLE001 - Connect: no sparkContext
        raise InvalidArgument(
            "over Spark Connect, give parallelism= (the number of tasks): the session "
            "does not tell its default parallelism"
        ) from exc


def process_queue_df(
    spark: SparkSession,
    path: str | os.PathLike[str] | Queue,
    fn: Callable[[Any], Any],
    *,
    output: str | os.PathLike[str] | Queue | None = None,
    parallelism: int | None = None,
    concurrency: int = 1,
    batch_size: int | None = None,
    visibility_timeout: float = 60.0,
    wait: float = 1.0,
    retry_delay: float | None = None,
    max_messages: int | None = None,
) -> ProcessResult:
    """process_queue (same arguments, same result) on the DataFrame API."""
    from pyspark.sql import functions as F

    queue = path if isinstance(path, Queue) else Queue(path)
    out = None if output is None else output if isinstance(output, Queue) else Queue(output, create=True)
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, not {fn!r}")
    tasks = _count("parallelism", parallelism if parallelism is not None else _default_parallelism(spark))
    spec = _task_spec(
        queue, out, fn, tasks,
        concurrency=concurrency, batch_size=batch_size, visibility_timeout=visibility_timeout,
        wait=wait, retry_delay=retry_delay, max_messages=max_messages,
    )
    run = uuid.uuid4().hex
    names = [f.name for f in dataclasses.fields(ProcessResult)]

    def task(_number: int) -> tuple[Any, ...]:
        attempt, result = _run_attempt(spec, run)
        return (attempt, *(getattr(result, name) for name in names))

    # one row per partition, so one call per task attempt; non-deterministic, so
    # that the optimizer never runs it twice nor folds it away
    udf = F.udf(task, RESULT_TYPE, useArrow=False).asNondeterministic()
    try:
        rows = spark.range(0, tasks, 1, numPartitions=tasks).select(udf("id").alias("r")).select("r.*").collect()
        reports = _reports(queue, run)
    finally:
        _remove_run(queue, run)
    total = ProcessResult()
    returned = set()
    for row in rows:
        values = row.asDict()
        returned.add(values["attempt"])
        total += ProcessResult(**{name: values[name] for name in names})
    for attempt, (counts, finished) in reports.items():
        if attempt not in returned:  # died, or a speculative copy whose row Spark dropped
            total += ProcessResult(**counts, tasks=1, died=0 if finished else 1)
    return total
