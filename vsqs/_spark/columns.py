"""The columns a write takes, and the checks of their values row by row.

A row is a message: its ``body`` column (binary or string), and optional
per-message options (a null in a row means "no option": the queue's
default). Any other column is refused with a clear error instead of being
dropped silently. The values are checked here, against the engine's rules,
so that an error names the column (the queue checks them again when it
stages).
"""

from __future__ import annotations

import decimal
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    BinaryType,
    ByteType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from vsqs import InvalidArgument, Outgoing
from vsqs._core.limits import (
    MAX_ATTRIBUTE_BYTES,
    MAX_ATTRIBUTE_NAME,
    MAX_ATTRIBUTES,
    MAX_DEDUP_ID,
    MAX_DELAY,
    MAX_GROUP_LENGTH,
    MAX_PRIORITY,
    MIN_PRIORITY,
)
from vsqs._core.rules import (
    ATTRIBUTE_NAME_RE,
    attributes_problem,
    is_dedup_id,
    is_group,
    is_priority,
)
from vsqs._spark.checks import seconds_fault

OPTION_COLUMNS = ("delay", "group", "dedup_id", "priority", "attributes")
WRITE_COLUMNS = ("body", *OPTION_COLUMNS)

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


def _column_error(column: str, message: str, value: object) -> InvalidArgument:
    return InvalidArgument(f"vsqs column {column!r} {message}, not {value!r}")


def _check_delay(column: str, value: object) -> float:
    if isinstance(value, decimal.Decimal):
        value = float(value)
    fault = seconds_fault(value, MAX_DELAY)
    if fault == "type":
        raise _column_error(column, "must be a number of seconds", value)
    if fault == "low":
        raise _column_error(column, "must be a number of seconds >= 0 (or null)", value)
    if fault == "high":
        days = MAX_DELAY / 86400
        raise _column_error(column, f"must be at most {MAX_DELAY:g} seconds ({days:g} days)", value)
    return float(value)  # type: ignore[arg-type]


def _check_group(column: str, value: object) -> str:
    if not is_group(value):
        raise _column_error(column, f"must be a string of 1-{MAX_GROUP_LENGTH} characters (or null)", value)
    return value  # type: ignore[return-value]


def _check_dedup_id(column: str, value: object) -> str:
    if not is_dedup_id(value):
        raise _column_error(column, f"must be a string of 1-{MAX_DEDUP_ID} characters (or null)", value)
    return value


def _check_priority(column: str, value: object) -> int:
    if not is_priority(value):
        raise _column_error(column, f"must be {MIN_PRIORITY}..{MAX_PRIORITY} (or null)", value)
    return value  # type: ignore[return-value]


def _check_attributes(column: str, value: object) -> dict[str, str]:
    if isinstance(value, list):  # Arrow hands a map over as a list of (key, value) pairs
        value = dict(value)
    if not isinstance(value, dict):
        raise _column_error(column, "must be a map of string to string", value)
    if attributes_problem(value) is not None:
        raise _attributes_error(column, value)
    return value


def _attributes_error(column: str, value: dict[Any, Any]) -> InvalidArgument:
    """Say what ``rules.attributes_problem`` found, in the column's words."""
    if len(value) > MAX_ATTRIBUTES:
        return _column_error(column, f"may hold at most {MAX_ATTRIBUTES} attributes", len(value))
    for name, text in value.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME_RE.fullmatch(name):
            return _column_error(
                column, f"must have attribute names of 1-{MAX_ATTRIBUTE_NAME} of A-Z a-z 0-9 _ . - and Latin letters",
                name
            )
        if not isinstance(text, str):
            return _column_error(column, f"must map attribute {name!r} to a string", text)
    size = sum(len(name) + len(text.encode("utf-8")) for name, text in value.items())
    return _column_error(column, f"may hold at most {MAX_ATTRIBUTE_BYTES} bytes of attributes", size)


_CHECKS = {
    "delay": _check_delay,
    "group": _check_group,
    "dedup_id": _check_dedup_id,
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
        for (option, column), value in zip(self.options, values, strict=True):
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


def write_columns(schema: StructType) -> WriteColumns:
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
