"""Executors as queue workers: :func:`process_queue` and its result.

The job is DataFrame API only, so that it runs alike on a classic session
and over Spark Connect: ``spark.range(tasks)`` in ``tasks`` partitions of one
row each, mapped by a non-deterministic plain Python UDF (not Arrow: on a
classic session that would need pandas on the client), so one call per task
attempt. Each attempt drains the shared queue (burst): one message at a
time through a :class:`vsqs.Worker`, or ``batch_size`` at a time through
:class:`_BatchLoop`. Both keep the leases of the messages being handled with
the engine's one :class:`~vsqs._core.leases.LeaseKeeper`. An attempt returns
its counts as its row, and keeps them running in the queue's directory for
the case it dies (:mod:`vsqs._spark.attempts`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from vsqs import InvalidArgument, Message, Queue, VsqsError, Worker
from vsqs._core.leases import LeaseKeeper
from vsqs._core.limits import MAX_BATCH, MAX_VISIBILITY_TIMEOUT, MAX_WAIT
from vsqs._spark.attempts import FIELDS, AttemptReport, AttemptReporter, read_reports, remove_run
from vsqs._spark.checks import seconds_fault

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("vsqs.spark")


@dataclass(frozen=True)
class ProcessResult:
    """What :func:`process_queue` did, summed over every task attempt: those
    that returned, and those that died (a killed worker, a lost executor, a
    losing speculative copy), counted up to their death (docs/spark.md)."""

    processed: int = 0  # fn succeeded (its results published) and the message was deleted
    failed: int = 0  # fn raised: the message stays in the queue (hidden for retry_delay)
    redelivered: int = 0  # messages received that had been received before (receive_count > 1)
    lost: int = 0  # lease lost before the delete: the message will be delivered again
    published: int = 0  # results published to the output queue
    tasks: int = 0  # task attempts whose counts are included
    died: int = 0  # of these, attempts that never returned (their counts: up to their death)

    def __add__(self, other: ProcessResult) -> ProcessResult:
        return ProcessResult(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


Body = bytes | str


def _results(value: object) -> list[Body]:
    """fn's return value as the list of bodies to publish."""
    if value is None:
        return []
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return [bytes(value) if not isinstance(value, str) else value]
    if isinstance(value, Iterable):
        out: list[Body] = []
        for item in value:
            if item is None:
                continue
            if not isinstance(item, (bytes, bytearray, memoryview, str)):
                kind = type(item).__name__
                raise TypeError(f"fn must return bytes, str, None or a list of them, not a list holding {kind}")
            out.append(bytes(item) if not isinstance(item, str) else item)
        return out
    raise TypeError(f"fn must return bytes, str, None or a list of them, not {type(value).__name__}")


class _Counts:
    """Thread-safe counters of one task attempt; each change is reported to
    the driver (``reporter``), so that what an attempt did counts even if it
    dies. A dead attempt's counts are what it reports: ``done`` (fn
    succeeded, results published: the delete may not have followed) as
    processed, ``tried_failed`` (fn raised) as failed."""

    def __init__(self, reporter: AttemptReporter | None = None) -> None:
        self.lock = threading.Lock()
        self.reporter = reporter
        self.redelivered = 0
        self.published = 0
        self.processed = 0
        self.done = 0
        self.tried_failed = 0
        self.failed = 0
        self.lost = 0

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)
            if self.reporter is not None:
                self.reporter.report({
                    "processed": self.done, "failed": self.tried_failed, "redelivered": self.redelivered,
                    "lost": self.lost, "published": self.published,
                })


@dataclass(frozen=True)
class _TaskSpec:
    """Everything one process_queue task needs (pickled to the executors)."""

    queue: Queue  # a Queue pickles as its path and options
    output: Queue | None
    fn: Callable[[Any], Any]
    batch_size: int | None
    visibility_timeout: float
    wait: float
    concurrency: int
    retry_delay: float
    max_messages: int | None
    run: str = ""  # the call of process_queue: where its attempts keep their running counts


def _attempt() -> str:
    """This task attempt's name: partition, attempt number, Spark's attempt id."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # pragma: no cover - always run in a task
        return f"x.{os.getpid()}.{threading.get_ident()}"
    return f"{context.partitionId()}.{context.attemptNumber()}.{context.taskAttemptId()}"


def _run_task(spec: _TaskSpec, attempt: str) -> ProcessResult:
    """One task attempt: drain the queue (burst), calling fn; runs on an executor."""
    reporter = AttemptReporter(spec.queue, spec.run, attempt) if spec.run else None
    try:
        result = _drain(spec, _Counts(reporter))
    finally:
        if reporter is not None:
            reporter.close()  # after finish(): an attempt that raised reports no end
    return result


def _drain(spec: _TaskSpec, counts: _Counts) -> ProcessResult:
    queue, output = spec.queue, spec.output
    if spec.batch_size is None:

        def handle(message: Message) -> None:
            if message.receive_count > 1:
                counts.add(redelivered=1)
            try:
                bodies = _results(spec.fn(message.body))
            except Exception:
                counts.add(tried_failed=1)
                raise
            if output is not None and bodies:
                output.publish_batch(bodies)  # durable, before the input is deleted
            counts.add(published=len(bodies) if output is not None else 0, done=1)

        stats = Worker(
            queue,
            handle,
            visibility_timeout=spec.visibility_timeout,
            wait=spec.wait,
            concurrency=spec.concurrency,
            max_messages=spec.max_messages,
            burst=True,
            retry_delay=spec.retry_delay,
        ).work()
        with counts.lock:  # the worker's own counts are the final ones
            counts.processed, counts.failed, counts.lost = stats.processed, stats.failed, stats.lost
    else:
        _BatchLoop(queue, output, spec, counts).run()
    result = ProcessResult(
        processed=counts.processed,
        failed=counts.failed,
        redelivered=counts.redelivered,
        lost=counts.lost,
        published=counts.published,
        tasks=1,
    )
    if counts.reporter is not None:  # the final counts, as the row has them
        counts.reporter.finish({name: getattr(result, name) for name in FIELDS})
    return result


class _BatchLoop:
    """Batch mode: receive up to batch_size messages, call fn(list of bodies),
    publish the results in one batch, then delete the inputs. While fn runs, a
    lease keeper extends the batch's visibility; a failed batch stays hidden
    until the task ends (each message is tried once per run), then is given
    back after retry_delay, as the Worker does."""

    def __init__(self, queue: Queue, output: Queue | None, spec: _TaskSpec, counts: _Counts) -> None:
        self.queue = queue
        self.output = output
        self.spec = spec
        self.counts = counts
        self.keeper = LeaseKeeper(spec.visibility_timeout)
        self.lock = threading.Lock()  # guards taken and parked
        self.parked: list[Message] = []
        self.taken = 0

    def run(self) -> None:
        errors: list[BaseException] = []

        def loop() -> None:
            try:
                self._loop()
            except BaseException as exc:  # noqa: BLE001 - re-raised by run()
                errors.append(exc)

        with self.keeper:
            threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.spec.concurrency)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for message in self.parked:
                self._settle(message, give_back=True)
        if errors:
            raise errors[0]

    def _take(self) -> int:
        with self.lock:
            if self.spec.max_messages is None:
                return self.spec.batch_size or 1
            left = self.spec.max_messages - self.taken
            return max(0, min(left, self.spec.batch_size or 1))

    def _loop(self) -> None:
        while True:
            wanted = self._take()
            if wanted == 0:
                return
            messages = self.queue.receive_batch(
                wanted, visibility_timeout=self.spec.visibility_timeout, wait=self.spec.wait
            )
            if not messages:
                return
            with self.lock:
                self.taken += len(messages)
            for message in messages:
                self.keeper.hold(message)
            self.counts.add(redelivered=sum(1 for m in messages if m.receive_count > 1))
            try:
                results = self.spec.fn([m.body for m in messages])
                if results is None:
                    results = [None] * len(messages)
                results = list(results)
                if len(results) != len(messages):
                    raise TypeError(
                        f"a batch fn must return one result per body: got {len(results)} "
                        f"for {len(messages)}"
                    )
                bodies = [body for result in results for body in _results(result)]
            except Exception as exc:  # noqa: BLE001 - fn failed: the batch stays for a retry
                log.info("batch of %d failed: %s", len(messages), exc)
                with self.lock:
                    self.parked.extend(messages)
                self.counts.add(tried_failed=len(messages))
                continue
            if self.output is not None and bodies:
                self.output.publish_batch(bodies)  # durable, before the inputs are deleted
            self.counts.add(published=len(bodies) if self.output is not None else 0, done=len(messages))
            for message in messages:
                self._settle(message, give_back=False)

    def _settle(self, message: Message, *, give_back: bool) -> None:
        action: Callable[[], object]
        if not give_back:
            action = message.delete
        elif self.spec.retry_delay:
            action = functools.partial(message.change_visibility, self.spec.retry_delay)
        else:
            action = message.release
        if self.keeper.settle(message, action):
            self.counts.add(**{"failed" if give_back else "processed": 1})
        else:
            self.counts.add(lost=1)


def _seconds(name: str, value: object, maximum: float, *, positive: bool = False) -> float:
    fault = seconds_fault(value, maximum, positive=positive)
    if fault == "type":
        raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
    if fault == "low":
        raise InvalidArgument(f"{name} must be {'> 0' if positive else '>= 0'} seconds, not {value!r}")
    if fault == "high":
        raise InvalidArgument(f"{name} must be at most {maximum:g} seconds, not {value!r}")
    return float(value)  # type: ignore[arg-type]


def _count(name: str, value: object, *, allow_none: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{name} must be an int >= 1{' or None' if allow_none else ''}, not {value!r}")
    return value


def _task_spec(
    queue: Queue,
    output: Queue | None,
    fn: Callable[[Any], Any],
    tasks: int,
    *,
    concurrency: object,
    batch_size: object,
    visibility_timeout: object,
    wait: object,
    retry_delay: object,
    max_messages: object,
    run: str = "",
) -> _TaskSpec:
    """process_queue's arguments, checked, as what each of its ``tasks`` tasks runs."""
    threads: int = _count("concurrency", concurrency)
    size: int | None = _count("batch_size", batch_size, allow_none=True)
    if size is not None and size > MAX_BATCH:
        raise InvalidArgument(f"batch_size must be at most {MAX_BATCH}, not {size}")
    timeout = _seconds("visibility_timeout", visibility_timeout, MAX_VISIBILITY_TIMEOUT, positive=True)
    waited = _seconds("wait", wait, MAX_WAIT)
    delay = timeout if retry_delay is None else _seconds("retry_delay", retry_delay, MAX_VISIBILITY_TIMEOUT)
    most = None if max_messages is None else _count("max_messages", max_messages)
    return _TaskSpec(
        queue=queue,
        output=output,
        fn=fn,
        batch_size=size,
        visibility_timeout=timeout,
        wait=waited,
        concurrency=threads,
        retry_delay=delay,
        max_messages=None if most is None else math.ceil(most / tasks),  # a task's share
        run=run,
    )


def process_queue(
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
    """Drain the queue at ``path`` with ``parallelism`` Spark tasks; return the counts.

    Each task receives messages from the shared queue and calls
    ``fn(body)`` (bytes); with ``batch_size=N`` it calls ``fn(bodies)`` with a
    list of up to N bodies instead and expects a list of as many results. A
    result (bytes, str, a list of them, or None for nothing) is published to
    ``output`` durably; only then is the input message deleted. A message
    whose ``fn`` raised stays in the queue, hidden for ``retry_delay`` seconds
    (default: ``visibility_timeout``) after the task ends, with its receive
    count raised. A long ``fn`` keeps its message hidden: its lease is
    extended while it runs.

    The tasks stop when the queue has nothing visible for ``wait`` seconds
    (or after ``max_messages`` in all). A task that dies, is retried or is
    run speculatively re-delivers the messages it held when their lease runs
    out; nothing is lost, and a message may be handled twice (at-least-once).
    The counts include every attempt, those that died too (up to their
    death: see :class:`ProcessResult` and docs/spark.md).
    """
    from pyspark.sql import functions as F

    queue = path if isinstance(path, Queue) else Queue(path)
    out = None if output is None else output if isinstance(output, Queue) else Queue(output, create=True)
    if not callable(fn):
        raise InvalidArgument(f"fn must be callable, not {fn!r}")
    tasks = _count("parallelism", parallelism if parallelism is not None else _default_parallelism(spark))
    spec = _task_spec(
        queue,
        out,
        fn,
        tasks,
        concurrency=concurrency,
        batch_size=batch_size,
        visibility_timeout=visibility_timeout,
        wait=wait,
        retry_delay=retry_delay,
        max_messages=max_messages,
        run=uuid.uuid4().hex,
    )
    names = [f.name for f in fields(ProcessResult)]

    def task(_number: int) -> tuple[Any, ...]:
        attempt = _attempt()
        result = _run_task(spec, attempt)
        return (attempt, *(getattr(result, name) for name in names))

    # non-deterministic: the optimizer never runs it twice nor folds it away
    udf = F.udf(task, RESULT_TYPE, useArrow=False).asNondeterministic()
    job = spark.range(0, tasks, 1, numPartitions=tasks).select(udf("id").alias("r")).select("r.*")
    try:
        with _described(spark, f"vsqs.process_queue {queue.path}"):
            try:
                rows = [row.asDict() for row in job.collect()]
            except Exception as exc:
                if _NO_VSQS in str(exc):
                    exc.add_note(MISSING_ON_EXECUTORS)
                raise
        try:
            reports = read_reports(queue, spec.run, tasks)
        except (OSError, VsqsError) as exc:  # the work is done: the returned rows still count
            log.warning("process_queue: cannot read the attempts' reports (%s): attempts that died are not counted",
                        exc)
            reports = {}
    finally:
        remove_run(queue, spec.run)
    returned = [(row["attempt"], ProcessResult(**{name: row[name] for name in names})) for row in rows]
    return _total(returned, reports)


RESULT_TYPE = "struct<attempt: string, " + ", ".join(f"{f.name}: bigint" for f in fields(ProcessResult)) + ">"
JOB_TAG = "vsqs-process-queue"  # every process_queue job carries it: spark.interruptTag(JOB_TAG) stops them
_NO_VSQS = "No module named 'vsqs'"
MISSING_ON_EXECUTORS = (
    "vsqs.spark.process_queue: the executors' Python cannot import vsqs; install vsqs into the "
    "Python the Spark workers run (PYSPARK_PYTHON on the cluster, or the Spark Connect server's), "
    "or ship it with spark.addArtifacts(..., pyfile=True)"
)


def _is_connect(spark: SparkSession) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _default_parallelism(spark: SparkSession) -> int:
    """The session's default parallelism; over Connect, which does not tell it,
    the number of partitions of a ``spark.range`` (the same default: one
    short job)."""
    if not _is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    from pyspark.sql import functions as F

    partitions = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("partition"))
    row = partitions.agg(F.max("partition")).first()
    return 1 if row is None or row[0] is None else int(row[0]) + 1


@contextlib.contextmanager
def _described(spark: SparkSession, description: str) -> Iterator[None]:
    """The job tagged with :data:`JOB_TAG`, and described in the UI on a classic session."""
    context = None if _is_connect(spark) else spark.sparkContext
    spark.addTag(JOB_TAG)
    if context is not None:
        context.setJobDescription(description)
    try:
        yield
    finally:
        if context is not None:
            context.setJobDescription(None)  # type: ignore[arg-type]
        spark.removeTag(JOB_TAG)


def _total(results: list[tuple[str, ProcessResult]], reports: Mapping[str, AttemptReport]) -> ProcessResult:
    """The returned attempts' results, plus what the others reported before they died."""
    total = ProcessResult()
    returned = set()
    for attempt, result in results:
        total += result
        returned.add(attempt)
    for attempt, report in reports.items():
        if attempt not in returned:  # died, or a speculative copy whose row Spark dropped
            if not report.finished:
                _announce_death(attempt, report.counts)
            total += ProcessResult(**report.counts, tasks=1, died=0 if report.finished else 1)
    return total


def _announce_death(attempt: str, counts: Mapping[str, int]) -> None:
    partition, _, rest = attempt.partition(".")
    log.warning(
        "process_queue: task %s (attempt %s) died after processing %d message(s); "
        "the message(s) it held come back after their visibility timeout",
        partition, rest.partition(".")[0], counts["processed"],
    )
