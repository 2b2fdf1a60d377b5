"""The options of the ``vsqs`` data source, parsed and checked (they arrive as
strings, their keys lower-cased), and how a read is split into partitions."""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vsqs import InvalidArgument, Queue
from vsqs._core.limits import MAX_CLOCK_SKEW, MAX_VISIBILITY_TIMEOUT
from vsqs._spark.checks import seconds_fault

DEFAULT_MAX_PER_TRIGGER = 20_000
MAX_PER_TRIGGER = 100_000  # also the cap of a ReadAllAvailable (Trigger.Once) batch
DEFAULT_VISIBILITY_TIMEOUT = 300.0
MAX_PARTITIONS = 100_000
MESSAGES_PER_PARTITION = 5000  # default split of reads: one partition per this many messages

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
            clock_skew=_parse_seconds(
                "clockSkew", raw.get("clockskew"), 0.0, allow_zero=True, maximum=MAX_CLOCK_SKEW
            ),
            num_partitions=_parse_int("numPartitions", raw.get("numpartitions"), None, 1, MAX_PARTITIONS),
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

    def split(self, items: Sequence[Any]) -> list[list[Any]]:
        """Split into ``num_partitions`` contiguous chunks (by default one per
        MESSAGES_PER_PARTITION items; never more chunks than items, at least one)."""
        parts = self.num_partitions
        if parts is None:
            parts = math.ceil(len(items) / MESSAGES_PER_PARTITION)
        parts = max(1, min(parts, len(items)))
        size = math.ceil(len(items) / parts) if items else 0
        return [list(items[i * size : (i + 1) * size]) for i in range(parts)]


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
    fault = seconds_fault(seconds, maximum, positive=not allow_zero)
    if fault == "low":
        raise _fail(option, "must be a number of seconds " + (">= 0" if allow_zero else "> 0"), value)
    if fault == "high":
        raise _fail(option, f"must be at most {maximum:g} seconds", value)
    return seconds
