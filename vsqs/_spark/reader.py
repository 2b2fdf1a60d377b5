"""Batch read: a snapshot of a queue, one row per message, changing nothing.

The driver lists the queue once; executors read their ids' state (and
bodies, if a content column is asked for).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceReader, InputPartition

from vsqs._spark.options import Options
from vsqs._spark.schema import row, timestamp, wants_content


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
        return [IdsPartition(chunk) for chunk in self.options.split(ids)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, IdsPartition)
        if not partition.ids:
            return
        queue = self.options.queue()
        content = wants_content(self.columns)
        for info in queue.messages(bodies=content, ids=partition.ids):
            values = {
                "id": info.id,
                "body": info.body,
                "state": info.state,
                "receive_count": info.receive_count,
                "sent_at": timestamp(info.sent_at),
                "priority": info.priority,
                "group": info.group,
                "attributes": info.attributes if content else None,
            }
            yield row(values, self.columns)
