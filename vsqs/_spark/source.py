"""The ``vsqs`` data source for PySpark's Python Data Source API (pyspark >= 4.0).

Four modes, one class (:class:`VsqsDataSource`, short name ``vsqs``):

- batch read: a snapshot of a queue, one row per message, changing nothing
  (``reader.py``);
- batch write: each row a message (a body, and optional delay, group,
  dedup_id, priority and attributes columns); every task attempt stages its
  rows and the driver publishes exactly the stages of the attempts Spark
  committed (``writer.py``);
- streaming read: the driver plans each micro-batch (a few numbers in the
  offset log); executors claim its messages, recording them in manifests in
  the queue so that a replay re-reads them, and delete them once Spark
  committed the batch (``stream.py``, ``claims.py``, ``manifest.py``);
- streaming write: as the batch write, per micro-batch (``writer.py``).

This package only uses the public vsqs API (and the engine's shared limits
and rules). Everything that Spark ships to another process (the data source,
readers, writers, partitions, commit messages) pickles; queues are opened
lazily where they are used. The semantics are documented in ``docs/spark.md``.
"""

from __future__ import annotations

import hashlib
import uuid

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
)
from pyspark.sql.types import StructType

from vsqs import InvalidArgument
from vsqs._spark.columns import write_columns
from vsqs._spark.options import Options
from vsqs._spark.reader import SnapshotReader
from vsqs._spark.schema import SCHEMA, read_columns
from vsqs._spark.stream import HAVE_READ_LIMITS, ClaimingStreamReader
from vsqs._spark.writer import StagedStreamWriter, StagedWriter

NAME = "vsqs"


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
        columns = read_columns(schema)
        options.queue()  # fail now, on the driver, if there is no queue
        return SnapshotReader(options, columns)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        options = Options.parse(self.options)
        if overwrite:
            raise InvalidArgument(
                "a vsqs queue cannot be overwritten: use mode('append') (Queue.purge() empties a queue)"
            )
        columns = write_columns(schema)
        options.queue()
        return StagedWriter(options, columns, job=f"w{uuid.uuid4().hex[:16]}")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if not HAVE_READ_LIMITS:  # pragma: no cover - older pyspark
            raise InvalidArgument("streaming reads from vsqs need pyspark >= 4.2")
        options = Options.parse(self.options)
        columns = read_columns(schema)
        options.queue()
        return ClaimingStreamReader(options, columns, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = Options.parse(self.options)
        if overwrite:
            raise InvalidArgument(
                "a vsqs queue cannot be overwritten: use outputMode('append')"
            )
        columns = write_columns(schema)
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


__all__ = ["NAME", "VsqsDataSource"]
