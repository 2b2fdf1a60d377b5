"""The floor of ``scripts/bench_spark.py``: a Python streaming data source
that does everything the ``vsqs`` source does for Spark, and no queue work.

``format("vsqs_floor")`` with option ``count`` delivers that many rows of the
vsqs schema, planned as the vsqs source plans them (``maxMessagesPerTrigger``
rows a batch, one partition per 5,000 rows and at least two, Arrow record
batches of 50 rows doubling to 1,000, built by the source's own
``record_batches``), with ``Trigger.AvailableNow``. It lists, claims, reads, records
and deletes nothing: what the vsqs stream spends beyond it is the queue's
work; what it spends itself is Spark's (the query, its Python processes,
the batches' jobs and log writes, the rows' way from Python to the JVM).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from vsqs._spark.claims import CLAIM_CHUNK, CLAIM_FIRST
from vsqs._spark.options import DEFAULT_MAX_PER_TRIGGER, MESSAGES_PER_PARTITION
from vsqs._spark.schema import SCHEMA

NAME = "vsqs_floor"


class FloorPartition(InputPartition):
    def __init__(self, seq: int, index: int, each: int) -> None:
        self.seq, self.index, self.each = seq, index, each


class FloorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, count: int, per_trigger: int, body_size: int) -> None:
        self.count, self.per_trigger, self.body_size = count, per_trigger, body_size

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "done": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        wanted = limit.max_rows if isinstance(limit, ReadMaxRows) else self.per_trigger
        if start["done"] >= self.count:
            return start
        return {"seq": start["seq"] + 1, "done": min(self.count, start["done"] + wanted)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        rows = end["done"] - start["done"]
        if rows <= 0:
            return []
        parts = min(rows, max(2, math.ceil(rows / MESSAGES_PER_PARTITION)))
        share, extra = divmod(rows, parts)
        return [FloorPartition(end["seq"], index, share + (index < extra)) for index in range(parts)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from vsqs._spark.record_batches import record_batches

        assert isinstance(partition, FloorPartition)
        arrow = to_arrow_schema(SCHEMA, timezone="UTC")
        body = b"x" * self.body_size
        now = time.time()
        done, size = 0, CLAIM_FIRST
        while done < partition.each:
            n = min(size, partition.each - done)
            rows = [_Row(f"{partition.seq}-{partition.index}-{done + k}", body, now) for k in range(n)]
            yield from record_batches(rows, arrow, True)  # (built as the vsqs source builds its batches)
            done += n
            size = min(2 * size, CLAIM_CHUNK)


@dataclass
class _Row:
    """What a batch takes of a message."""

    id: str
    body: bytes
    sent_at: float
    receive_count: int = 1
    priority: int = 0
    group: str | None = None
    attributes: dict[str, str] = field(default_factory=dict)


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FloorStreamReader(
            int(self.options["count"]),
            int(self.options.get("maxMessagesPerTrigger", DEFAULT_MAX_PER_TRIGGER)),
            int(self.options.get("bodySize", 100)),
        )
