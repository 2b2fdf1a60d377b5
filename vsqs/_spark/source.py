"""The ``vsqs`` data source for PySpark's Python Data Source API (pyspark >= 4.0).

Four modes, one class (:class:`VsqsDataSource`, short name ``vsqs``):

- batch read: a snapshot of a queue, one row per message, changing nothing;
- batch write: each row a message (a body, and optional delay, group,
  dedup_id, priority and attributes columns); every task attempt stages its
  rows and the driver publishes exactly the stages of the attempts Spark
  committed;
- streaming read: each micro-batch claims messages on the driver (the
  receipts go into the offset log) and deletes them once Spark committed
  the batch;
- streaming write: as the batch write, per micro-batch.

This module only uses the public vsqs API. Everything that Spark ships to
another process (the data source, readers, writers, partitions, commit
messages) pickles; queues are opened lazily where they are used. The
semantics are documented in ``docs/spark.md``.
"""

from __future__ import annotations

import datetime
import decimal
import difflib
import hashlib
import logging
import math
import re
import secrets
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "vsqs.spark needs pyspark >= 4.0 and pyarrow: pip install 'vsqs[spark]'"
    ) from exc

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from vsqs import InvalidArgument, Message, Outgoing, Queue, StaleReceipt

try:  # pyspark >= 4.1: streaming writes get Arrow batches, staged as they come
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _ARROW_STREAM_WRITES = True
except ImportError:  # pragma: no cover - pyspark 4.0: rows, staged in chunks
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _ARROW_STREAM_WRITES = False

try:  # pyspark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    _HAVE_READ_LIMITS = True
except ImportError:  # pragma: no cover - older pyspark
    _HAVE_READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in so the class statement below works on pyspark < 4.2."""


log = logging.getLogger("vsqs.spark")

NAME = "vsqs"

# -- the schema --------------------------------------------------------------
#
# One schema for batch and streaming reads (a Python data source has one
# schema() for both). Columns are looked up by name everywhere, so a user may
# ask for any subset, in any order, with .schema("id string, state string")
# (and then bodies are not read unless body, group or attributes is asked
# for); columns added later are appended at the end.

COLUMNS: dict[str, DataType] = {
    "id": StringType(),
    "body": BinaryType(),
    "state": StringType(),
    "receive_count": IntegerType(),
    "sent_at": TimestampType(),
    "priority": IntegerType(),
    "group": StringType(),
    "attributes": MapType(StringType(), StringType()),
}
# Columns whose values live in the message file (read with the body).
CONTENT_COLUMNS = frozenset({"body", "group", "attributes"})
SCHEMA = StructType([StructField(name, dtype, nullable=True) for name, dtype in COLUMNS.items()])

# Columns a write accepts: the body, and optional per-message options (a
# null in a row means "no option": the queue's default). Any other column is
# refused with a clear error instead of being dropped silently.
OPTION_COLUMNS = ("delay", "group", "dedup_id", "priority", "attributes")
WRITE_COLUMNS = ("body", *OPTION_COLUMNS)

# -- options -----------------------------------------------------------------

DEFAULT_MAX_PER_TRIGGER = 1000
MAX_PER_TRIGGER = 100_000  # also the cap of a ReadAllAvailable (Trigger.Once) batch
DEFAULT_VISIBILITY_TIMEOUT = 300.0
MAX_VISIBILITY_TIMEOUT = 12 * 3600.0
MESSAGES_PER_PARTITION = 5000  # default split of reads: one partition per this many messages
STAGE_CHUNK_ROWS = 1000  # rows per publish_staged call (one directory fsync each)
STAGE_CHUNK_BYTES = 16 << 20
_CLAIM_CHUNK = 10_000  # Queue.receive_batch takes at most this many at once
_DELETE_THREADS = 8  # a committed batch is deleted by this many threads ...
_PARALLEL_DELETES_FROM = 64  # ... when it has at least this many messages

OPTIONS = {  # documented name -> what it is; keys arrive lower-cased
    "path": "the queue directory",
    "create": "create the queue if it does not exist (true/false)",
    "clockSkew": "clock-skew allowance in seconds (Queue(clock_skew=...))",
    "numPartitions": "how many partitions a read (or a micro-batch) is split into",
    "maxMessagesPerTrigger": "streaming read: messages claimed per micro-batch",
    "visibilityTimeout": "streaming read: seconds a micro-batch holds its messages",
}
_KNOWN = {name.lower(): name for name in OPTIONS}


def _fail(option: str, message: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"vsqs option {option!r} {message}, not {value!r}")


@dataclass(frozen=True)
class Options:
    """The data source options, parsed and validated (they arrive as strings)."""

    path: str
    create: bool = False
    clock_skew: float = 0.0
    num_partitions: int | None = None
    max_per_trigger: int = DEFAULT_MAX_PER_TRIGGER
    visibility_timeout: float = DEFAULT_VISIBILITY_TIMEOUT

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Options:
        raw = {str(key).lower(): value for key, value in options.items()}
        for key in raw:
            if key in _KNOWN:
                continue
            # Spark adds options of its own (checkpointLocation, ...), so an
            # unknown key is only an error when it looks like a typo of ours.
            close = difflib.get_close_matches(key, list(_KNOWN), n=1, cutoff=0.8)
            if close:
                raise InvalidArgument(
                    f"unknown vsqs option {key!r}: did you mean {_KNOWN[close[0]]!r}?"
                )
        if "paths" in raw and raw["paths"] not in ("", "[]"):
            raise InvalidArgument("vsqs reads or writes one queue: give a single path")
        path = raw.get("path")
        if not path:
            raise InvalidArgument(
                "vsqs needs the queue directory: .load(path) / .save(path) / .option('path', ...)"
            )
        return cls(
            path=str(path),
            create=_parse_bool("create", raw.get("create"), False),
            clock_skew=_parse_seconds("clockSkew", raw.get("clockskew"), 0.0, allow_zero=True, maximum=3600.0),
            num_partitions=_parse_int("numPartitions", raw.get("numpartitions"), None, 1, 100_000),
            max_per_trigger=_parse_int(
                "maxMessagesPerTrigger",
                raw.get("maxmessagespertrigger"),
                DEFAULT_MAX_PER_TRIGGER,
                1,
                MAX_PER_TRIGGER,
            ),
            visibility_timeout=_parse_seconds(
                "visibilityTimeout",
                raw.get("visibilitytimeout"),
                DEFAULT_VISIBILITY_TIMEOUT,
                allow_zero=False,
                maximum=MAX_VISIBILITY_TIMEOUT,
            ),
        )

    def queue(self) -> Queue:
        """Open (or, with ``create``, make) the queue; QueueNotFound names the path."""
        return Queue(self.path, create=self.create, clock_skew=self.clock_skew)


def _parse_bool(option: str, value: object, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off"):
        return False
    raise _fail(option, "must be true or false", value)


def _parse_int(option: str, value: object, default: int | None, low: int, high: int) -> Any:
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        raise _fail(option, "must be an integer", value) from None
    if not low <= number <= high:
        raise _fail(option, f"must be between {low} and {high}", value)
    return number


def _parse_seconds(
    option: str, value: object, default: float, *, allow_zero: bool, maximum: float
) -> float:
    if value is None:
        return default
    try:
        seconds = float(str(value).strip())
    except ValueError:
        raise _fail(option, "must be a number of seconds", value) from None
    if math.isnan(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise _fail(option, "must be a number of seconds " + (">= 0" if allow_zero else "> 0"), value)
    if seconds > maximum:
        raise _fail(option, f"must be at most {maximum:g} seconds", value)
    return seconds


def _read_columns(schema: StructType) -> list[str]:
    """The columns a read produces; a user-given schema may pick any subset."""
    names = []
    for column in schema.fields:
        expected = COLUMNS.get(column.name)
        if expected is None:
            raise InvalidArgument(
                f"vsqs has no column {column.name!r}; the columns are: {', '.join(COLUMNS)}"
            )
        if column.dataType != expected:
            raise InvalidArgument(
                f"vsqs column {column.name!r} is {expected.simpleString()}, "
                f"not {column.dataType.simpleString()}"
            )
        names.append(column.name)
    return names


_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)
_NUMERIC_TYPES = (*_INTEGER_TYPES, FloatType, DoubleType, DecimalType)
_COLUMN_TYPES = {  # what each write column must be, and how to say it
    "body": ((BinaryType, StringType), "binary or string"),
    "delay": (_NUMERIC_TYPES, "a number of seconds (int, bigint, double, decimal, ...)"),
    "group": ((StringType,), "string"),
    "dedup_id": ((StringType,), "string"),
    "priority": (_INTEGER_TYPES, "an integer (tinyint, smallint, int or bigint)"),
    "attributes": ((MapType,), "map<string,string>"),
}

# The limits of Queue.publish / vsqs.Outgoing, checked row by row here so that
# an error names the column (the queue checks them again when it stages).
MAX_DELAY = 366 * 86400.0
MAX_PRIORITY = 9
MAX_ID_LENGTH = 128  # group and dedup_id
MAX_ATTRIBUTES = 50
MAX_ATTRIBUTE_BYTES = 64 * 1024
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")


def _column_error(column: str, message: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"vsqs column {column!r} {message}, not {value!r}")


def _check_delay(column: str, value: object) -> float:
    if isinstance(value, decimal.Decimal):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _column_error(column, "must be a number of seconds", value)
    if math.isnan(value) or value < 0:
        raise _column_error(column, "must be a number of seconds >= 0 (or null)", value)
    if value > MAX_DELAY:
        raise _column_error(column, f"must be at most {MAX_DELAY:g} seconds (366 days)", value)
    return float(value)


def _check_text(column: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH or "\x00" in value:
        raise _column_error(column, f"must be a string of 1-{MAX_ID_LENGTH} characters (or null)", value)
    return value


def _check_priority(column: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PRIORITY:
        raise _column_error(column, f"must be 0..{MAX_PRIORITY} (or null)", value)
    return value


def _check_attributes(column: str, value: object) -> dict[str, str]:
    if isinstance(value, list):  # Arrow hands a map over as a list of (key, value) pairs
        value = dict(value)
    if not isinstance(value, dict):
        raise _column_error(column, "must be a map of string to string", value)
    if len(value) > MAX_ATTRIBUTES:
        raise _column_error(column, f"may hold at most {MAX_ATTRIBUTES} attributes", len(value))
    size = 0
    for name, text in value.items():
        if not isinstance(name, str) or not _ATTRIBUTE_NAME.fullmatch(name):
            raise _column_error(column, "must have attribute names of 1-256 of A-Z a-z 0-9 _ . -", name)
        if not isinstance(text, str):
            raise _column_error(column, f"must map attribute {name!r} to a string", text)
        size += len(name) + len(text.encode("utf-8"))
    if size > MAX_ATTRIBUTE_BYTES:
        raise _column_error(column, f"may hold at most {MAX_ATTRIBUTE_BYTES} bytes of attributes", size)
    return value


_CHECKS = {
    "delay": _check_delay,
    "group": _check_text,
    "dedup_id": _check_text,
    "priority": _check_priority,
    "attributes": _check_attributes,
}


@dataclass(frozen=True)
class WriteColumns:
    """The columns of a DataFrame being written: the name of its body column,
    and (option, column name) for each option column it has."""

    body: str
    options: tuple[tuple[str, str], ...] = ()

    def message(self, body: Any, values: Sequence[Any]) -> Any:
        """One row (its body and its option columns' values, in ``options``
        order) as what ``Queue.publish_staged`` takes: the body, or an
        Outgoing when the row has options; a bad value names its column."""
        if body is None:
            raise InvalidArgument(f"vsqs cannot write a row whose {self.body!r} is null")
        given: dict[str, Any] = {}
        for (option, column), value in zip(self.options, values):
            if value is not None:
                given[option] = _CHECKS[option](column, value)
        if not given:
            return body
        if given.get("priority") and "group" in given:
            names = dict(self.options)
            raise InvalidArgument(
                f"vsqs columns {names['priority']!r} and {names['group']!r}: a row with a group "
                f"must have a null (or 0) priority, as a group is delivered strictly in order; "
                f"not priority {given['priority']} with group {given['group']!r}"
            )
        return Outgoing(body, **given)


def _write_columns(schema: StructType) -> WriteColumns:
    """Check a DataFrame to be written; return its columns."""
    names = [column.name for column in schema.fields]
    found: dict[str, str] = {}  # lower-cased name -> the DataFrame's name
    for name in names:
        if name.lower() in found:
            raise InvalidArgument(f"vsqs column {name!r} is given twice ({found[name.lower()]!r})")
        found[name.lower()] = name
    if "body" not in found:
        raise InvalidArgument(
            "vsqs needs a 'body' column (binary or string) to write; "
            f"the DataFrame has: {', '.join(names) or 'no columns'}"
        )
    for name in names:
        if name.lower() not in WRITE_COLUMNS:
            raise InvalidArgument(
                f"vsqs cannot write column {name!r}: a message is its 'body' column "
                f"(binary or string), with optional columns {', '.join(OPTION_COLUMNS)}; "
                "select them, e.g. df.select('body')"
            )
    for key, name in found.items():
        dtype = schema[name].dataType
        types, wanted = _COLUMN_TYPES[key]
        ok = isinstance(dtype, types)
        if ok and isinstance(dtype, MapType):
            ok = isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType)
        if not ok:
            raise InvalidArgument(
                f"vsqs column {name!r} must be {wanted}, not {dtype.simpleString()}"
            )
    options = tuple((option, found[option]) for option in OPTION_COLUMNS if option in found)
    return WriteColumns(found["body"], options)


def _split(items: Sequence[Any], parts: int | None) -> list[list[Any]]:
    """Split into ``parts`` contiguous chunks (by default one per MESSAGES_PER_PARTITION)."""
    if parts is None:
        parts = math.ceil(len(items) / MESSAGES_PER_PARTITION)
    parts = max(1, min(parts, len(items)))
    size = math.ceil(len(items) / parts) if items else 0
    return [list(items[i * size : (i + 1) * size]) for i in range(parts)]


def _timestamp(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc)


# -- the data source -----------------------------------------------------------


class VsqsDataSource(DataSource):
    """``format("vsqs")``: read a queue as a table or a stream; write rows as messages."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        # called by load() when no schema was given: check the options early
        Options.parse(self.options).queue()
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = Options.parse(self.options)
        columns = _read_columns(schema)
        options.queue()  # fail now, on the driver, if there is no queue
        return SnapshotReader(options, columns)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        options = Options.parse(self.options)
        if overwrite:
            raise InvalidArgument(
                "a vsqs queue cannot be overwritten: use mode('append') (Queue.purge() empties a queue)"
            )
        columns = _write_columns(schema)
        options.queue()
        return StagedWriter(options, columns, job=f"w{uuid.uuid4().hex[:16]}")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if not _HAVE_READ_LIMITS:  # pragma: no cover - older pyspark
            raise InvalidArgument("streaming reads from vsqs need pyspark >= 4.2")
        options = Options.parse(self.options)
        columns = _read_columns(schema)
        options.queue()
        return ClaimingStreamReader(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = Options.parse(self.options)
        if overwrite:
            raise InvalidArgument(
                "a vsqs queue cannot be overwritten: use outputMode('append')"
            )
        columns = _write_columns(schema)
        options.queue()
        # Spark makes one writer for the tasks and another for the driver's
        # commit, from the same options: name the query by its checkpoint so
        # that both agree on the prefix of this query's stages.
        checkpoint = {k.lower(): v for k, v in self.options.items()}.get("checkpointlocation")
        if checkpoint:
            job = "s" + hashlib.sha256(str(checkpoint).encode()).hexdigest()[:16]
        else:  # no cleanup of failed attempts' stages by the commit; gc drops them later
            job = f"s{uuid.uuid4().hex[:16]}"
        return StagedStreamWriter(options, columns, job=job)


# -- batch read: a snapshot -----------------------------------------------------


class IdsPartition(InputPartition):
    """Message ids to read (a slice of one listing, in delivery order)."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids


class SnapshotReader(DataSourceReader):
    """Lists the queue once on the driver; executors read their ids' state and bodies."""

    def __init__(self, options: Options, columns: list[str]) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> list[InputPartition]:
        ids = [info.id for info in self.options.queue().messages()]
        return [IdsPartition(chunk) for chunk in _split(ids, self.options.num_partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdsPartition)
        if not partition.ids:
            return
        queue = self.options.queue()
        content = not CONTENT_COLUMNS.isdisjoint(self.columns)
        for info in queue.messages(bodies=content, ids=partition.ids):
            row = {
                "id": info.id,
                "body": info.body,
                "state": info.state,
                "receive_count": info.receive_count,
                "sent_at": _timestamp(info.sent_at),
                "priority": info.priority,
                "group": info.group,
                "attributes": info.attributes if content else None,
            }
            yield tuple(row[name] for name in self.columns)


# -- batch write: stage per task attempt, publish on the driver's commit -----------


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
        body = item.body if isinstance(item, Outgoing) else item
        size += len(body) if body is not None else 0
        if len(chunk) >= STAGE_CHUNK_ROWS or size >= STAGE_CHUNK_BYTES:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _stage_rows(queue: Queue, stage_prefix: str, chunks: Iterable[list[Any]]) -> StagedCommit:
    """Stage every message of one task attempt, chunk by chunk, as the rows
    arrive; nothing is visible to receivers until the driver commits the stage."""
    stage: str | None = None
    rows = 0
    for chunk in chunks:
        if not chunk:
            continue
        if any(item is None for item in chunk):
            raise InvalidArgument("vsqs cannot write a row whose 'body' is null")
        stage = stage or _task_stage(stage_prefix)
        rows += len(queue.publish_staged(chunk, stage=stage))
    return StagedCommit(stage, rows)


def _commit_stages(queue: Queue, prefix: str, messages: Sequence[WriterCommitMessage | None]) -> int:
    """Publish the stages named in ``messages``; drop this job's other stages
    (attempts that failed or lost to another attempt). Returns messages published."""
    committed = set()
    published = 0
    for message in messages:
        if isinstance(message, StagedCommit) and message.stage is not None:
            published += queue.commit_stage(message.stage)
            committed.add(message.stage)
    _drop_stages(queue, prefix, keep=committed)
    return published


def _drop_stages(queue: Queue, prefix: str, keep: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    dropped = 0
    for stage in queue.stages():
        if stage.startswith(prefix + "-") and stage not in keep:
            dropped += queue.abort_stage(stage)
    return dropped


class StagedWriter(DataSourceArrowWriter):
    """Each task attempt stages its rows; the driver's commit publishes the stages
    of the attempts Spark committed, so a retried or speculative task publishes
    each row once."""

    def __init__(self, options: Options, columns: WriteColumns, job: str) -> None:
        self.options = options
        self.columns = columns
        self.job = job  # unique per write; the prefix of every stage of this write

    def write(self, iterator: Iterator[Any]) -> StagedCommit:
        queue = self.options.queue()
        return _stage_rows(queue, f"spark-{self.job}", _arrow_chunks(iterator, self.columns))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        published = _commit_stages(self.options.queue(), f"spark-{self.job}", messages)
        log.info("published %d messages to %s", published, self.options.path)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _drop_stages(self.options.queue(), f"spark-{self.job}")


def _arrow_chunks(batches: Iterator[Any], columns: WriteColumns) -> Iterator[list[Any]]:
    """Each Arrow batch Spark hands over is staged as it comes (in chunks)."""
    for batch in batches:
        bodies = batch.column(columns.body).to_pylist()
        if not columns.options:
            yield from _chunks(bodies)
            continue
        values = [batch.column(name).to_pylist() for _, name in columns.options]
        # the whole batch is checked before any of it is staged
        yield from _chunks([columns.message(body, row) for body, *row in zip(bodies, *values)])


def _row_chunks(rows: Iterator[Any], columns: WriteColumns) -> Iterator[list[Any]]:
    """The same for Row objects (pyspark 4.0 streaming writes)."""
    return _chunks(
        columns.message(row[columns.body], [row[name] for _, name in columns.options])
        for row in rows
    )


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
        queue = self.options.queue()
        if _ARROW_STREAM_WRITES:
            chunks = _arrow_chunks(iterator, self.columns)
        else:  # pragma: no cover - pyspark 4.0
            chunks = _row_chunks(iterator, self.columns)
        return _stage_rows(queue, self._prefix(batch_id if batch_id is not None else "x"), chunks)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        published = _commit_stages(self.options.queue(), self._prefix(batchId), messages)
        log.info("batch %s: published %d messages to %s", batchId, published, self.options.path)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _drop_stages(self.options.queue(), self._prefix(batchId))


# -- streaming read: claim on the driver, read on executors, delete on commit ----------


class ClaimedPartition(InputPartition):
    """Claimed messages of one micro-batch: [id, receipt, receive_count, sent_at_us, priority]."""

    def __init__(self, messages: list[list[Any]]) -> None:
        self.messages = messages


class ClaimingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Each micro-batch claims messages on the driver in ``latestOffset``.

    An offset is ``{"seq": n, "messages": [[id, receipt, receive_count,
    sent_at_us, priority], ...]}``: the batch's messages, so that Spark's
    offset log fixes a batch's contents and a restarted query replays it.
    Executors read each message by its receipt (``Queue.read_message``). A
    batch's messages are deleted once Spark has committed it: in
    ``commit(end)``, and in ``latestOffset(start)``, which Spark calls only
    after the batch ending at ``start`` is in its commit log (it never calls
    ``commit`` for the last batch of a run).
    """

    def __init__(self, options: Options, columns: list[str]) -> None:
        self.options = options
        self.columns = columns
        self._settled: dict[int, None] = {}  # recent seqs whose messages this process deleted
        self._budget: int | None = None  # Trigger.AvailableNow: messages left to claim
        self._queue: Queue | None = None  # the driver's handle (keeps its cached listing)

    def _driver_queue(self) -> Queue:
        if self._queue is None:
            self._queue = self.options.queue()
        return self._queue

    # -- offsets (driver) --

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "messages": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        # "what is available now": as many messages as are visible now. The
        # query ends once that many were claimed, even if producers keep going.
        self._budget = self._driver_queue().stats().ready

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._settle(start)  # the batch ending at start is committed: delete it
        if isinstance(limit, ReadMaxRows):
            wanted = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            wanted = MAX_PER_TRIGGER
        else:
            wanted = self.options.max_per_trigger
        if self._budget is not None:
            wanted = min(wanted, self._budget)
        claimed = self._claim(wanted)
        if not claimed:
            return start
        if self._budget is not None:
            self._budget -= len(claimed)
        return {"seq": int(start["seq"]) + 1, "messages": claimed}

    def _claim(self, wanted: int) -> list[list[Any]]:
        queue = self._driver_queue()
        got: list[Message] = []
        while len(got) < wanted:
            batch = queue.receive_batch(
                min(wanted - len(got), _CLAIM_CHUNK),
                visibility_timeout=self.options.visibility_timeout,
                read_bodies=False,
            )
            if not batch:
                break
            got.extend(batch)
        return [[m.id, m.receipt, m.receive_count, round(m.sent_at * 1_000_000), m.priority] for m in got]

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if int(end["seq"]) == int(start["seq"]):
            return []
        messages = end.get("messages") or []
        return [ClaimedPartition(chunk) for chunk in _split(messages, self.options.num_partitions)]

    def commit(self, end: dict[str, Any]) -> None:
        self._settle(end)

    def _settle(self, offset: dict[str, Any]) -> None:
        """Delete the messages of a committed batch (idempotent)."""
        seq = int(offset.get("seq", 0))
        messages = offset.get("messages") or []
        if seq in self._settled or not messages:
            return
        queue = self._driver_queue()

        def delete(receipt: str) -> bool:
            try:
                queue.delete(receipt)
                return True
            except StaleReceipt:  # already deleted (replay), or re-received after the lease ran out
                return False

        receipts = [entry[1] for entry in messages]
        if len(receipts) < _PARALLEL_DELETES_FROM:
            stale = sum(1 for receipt in receipts if not delete(receipt))
        else:  # on NFS each unlink is a round trip: overlap them (a local disk gains little)
            with ThreadPoolExecutor(_DELETE_THREADS, thread_name_prefix="vsqs-delete") as pool:
                stale = sum(1 for done in pool.map(delete, receipts) if not done)
        self._settled[seq] = None
        while len(self._settled) > 64:  # forgetting one only costs a repeated, harmless delete
            del self._settled[next(iter(self._settled))]
        if stale:
            log.info(
                "batch %d: %d of %d messages were no longer held by their receipt "
                "(deleted already, or re-delivered after the visibility timeout)",
                seq,
                stale,
                len(messages),
            )

    # -- reading (executors) --

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, ClaimedPartition)
        queue = self.options.queue()
        content = not CONTENT_COLUMNS.isdisjoint(self.columns)
        skipped = 0
        for entry in partition.messages:
            # [id, receipt, receive_count, sent_at_us, priority]: all but the
            # receipt are in the receipt too (and in the message read by it)
            try:
                # reading also proves that the receipt still holds the message
                message = queue.read_message(entry[1])
            except StaleReceipt:
                # The lease ran out and another consumer received the message
                # (or it was deleted): it is theirs now; leave it out.
                skipped += 1
                continue
            row = {
                "id": message.id,
                "body": message.body,
                "state": "in_flight",
                "receive_count": message.receive_count,
                "sent_at": _timestamp(message.sent_at),
                "priority": message.priority,
                "group": message.group if content else None,
                "attributes": message.attributes if content else None,
            }
            yield tuple(row[name] for name in self.columns)
        if skipped:
            log.warning(
                "%d claimed messages were no longer held by this query (their lease ran out "
                "and another consumer received them); they are left out of this batch",
                skipped,
            )

    def stop(self) -> None:
        pass


__all__ = [
    "COLUMNS",
    "NAME",
    "OPTIONS",
    "SCHEMA",
    "WRITE_COLUMNS",
    "Options",
    "VsqsDataSource",
]
