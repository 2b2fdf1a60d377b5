"""What a read of a queue produces: one row per message, its columns typed.

One schema for batch and streaming reads (a Python data source has one
schema() for both). Columns are looked up by name everywhere, so a user may
ask for any subset, in any order, with .schema("id string, state string")
(and then bodies are not read unless body, group or attributes is asked
for); columns added later are appended at the end.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from vsqs import InvalidArgument

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


def read_columns(schema: StructType) -> list[str]:
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


def wants_content(columns: list[str]) -> bool:
    """Whether a read of ``columns`` must read the message files (bodies)."""
    return not CONTENT_COLUMNS.isdisjoint(columns)


def timestamp(epoch: float) -> datetime.datetime:
    """A ``sent_at`` value: epoch seconds as an aware UTC datetime."""
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)


def row(values: Mapping[str, Any], columns: list[str]) -> tuple[Any, ...]:
    """One row: the ``values`` of ``columns``, in their order."""
    return tuple(values[name] for name in columns)
