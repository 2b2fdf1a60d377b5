"""The validation rules shared by the engine and the adapters: durations,
priorities, batch sizes, attributes, group names and queue names.

Each rule is written once, here; an adapter that must phrase the error its
own way (a Spark column, an SQS parameter) calls the ``is_*`` test or reuses
the pattern, never a copy of it. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard, cast

from vsqs._core import limits
from vsqs._core.errors import InvalidArgument

# an attribute's name: ASCII letters and digits, _ . -, and the Latin letters of Latin-1 and Latin Extended-A
# (U+00C0-U+017F but for the signs U+00D7 and U+00F7), which SQS takes though its reference lists only ASCII
ATTRIBUTE_NAME_CHARS = "A-Za-z0-9_.\\-\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u017f"
ATTRIBUTE_NAME_RE = re.compile(rf"[{ATTRIBUTE_NAME_CHARS}]{{1,{limits.MAX_ATTRIBUTE_NAME}}}")
QUEUE_NAME_RE = re.compile(rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{limits.MAX_QUEUE_NAME - 1}}}")


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("a name repeated in an object")
    return document


def load_json(data: bytes | str, *, strict: bool = False) -> Any:
    """A JSON document read from the spool (or from a client): hostile until checked.
    :class:`ValueError` if it is not JSON, or nested deeper than ``MAX_JSON_DEPTH``
    (the parser's own recursion limit otherwise escapes as :class:`RecursionError`).
    ``strict``: also if it holds NaN or Infinity (Python's, not JSON's) or an
    object that repeats a name (which other parsers read differently).
    The caller bounds its size (``fs.read_control``: 64 KiB) and checks its shape."""
    try:
        if strict:  # and in UTF-8 only (RFC 8259), where json.loads guesses UTF-16 and UTF-32 too
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            document = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_object_once)
        else:
            document = json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"JSON not in UTF-8: {exc.reason}") from None
    level = [document]
    for _ in range(limits.MAX_JSON_DEPTH):
        level = [inner for value in level if isinstance(value, (dict, list))
                 for inner in (value.values() if isinstance(value, dict) else value)]
        if not level:
            return document
    if any(isinstance(value, (dict, list)) for value in level):
        raise ValueError(f"JSON nested deeper than {limits.MAX_JSON_DEPTH}")
    return document


def check_seconds(value: object, name: str, maximum: float) -> float:
    """Validate a duration argument; the error names the argument."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
    if math.isnan(value) or value < 0:
        raise InvalidArgument(f"{name} must be >= 0 seconds, not {value!r}")
    if value > maximum:
        raise InvalidArgument(f"{name} must be at most {maximum:g} seconds, not {value!r}")
    return float(value)


def check_poll_interval(seconds: float | None) -> float | None:
    """Validate a handle's poll interval (None: the default)."""
    if seconds is None:
        return None
    checked = check_seconds(seconds, "poll_interval", limits.MAX_POLL_INTERVAL)
    if not checked:
        raise InvalidArgument("poll_interval must be more than 0 seconds")
    return checked


def check_share(index: object, count: object) -> tuple[int, int]:
    """Validate share ``index`` of ``count`` (Queue.prefer_share)."""
    if type(index) is not int or type(count) is not int or not 0 <= index < count <= limits.MAX_SHARES:
        raise InvalidArgument(f"share must be 0 <= index < count <= {limits.MAX_SHARES} (ints), "
                              f"not index={index!r}, count={count!r}")
    return index, count


def is_priority(value: object) -> bool:
    """Whether ``value`` is a priority: an int (not a bool) 0..9."""
    return (
        not isinstance(value, bool)
        and isinstance(value, int)
        and limits.MIN_PRIORITY <= value <= limits.MAX_PRIORITY
    )


def check_priority(priority: object) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidArgument(f"priority must be an int 0..{limits.MAX_PRIORITY}, not {priority!r}")
    if not limits.MIN_PRIORITY <= priority <= limits.MAX_PRIORITY:
        raise InvalidArgument(f"priority must be 0..{limits.MAX_PRIORITY}, not {priority}")
    return priority


def check_batch_size(max_messages: object) -> int:
    if isinstance(max_messages, bool) or not isinstance(max_messages, int):
        raise InvalidArgument(f"max_messages must be an int, not {max_messages!r}")
    if not 1 <= max_messages <= limits.MAX_BATCH:
        raise InvalidArgument(f"max_messages must be 1..{limits.MAX_BATCH}, not {max_messages}")
    return max_messages


def attributes_problem(attributes: object) -> str | None:
    """What is wrong with a message's attributes (``None``: nothing): names of
    A-Z a-z 0-9 _ . - and Latin letters (ATTRIBUTE_NAME_RE), string values, at
    most 50 and 64 KiB in all (UTF-8)."""
    if not isinstance(attributes, Mapping):
        return f"attributes must be a mapping of str to str, not {type(attributes).__name__}"
    if len(attributes) > limits.MAX_ATTRIBUTES:
        return f"attributes: at most {limits.MAX_ATTRIBUTES}, not {len(attributes)}"
    size = 0
    for name, value in attributes.items():
        if not isinstance(name, str) or not ATTRIBUTE_NAME_RE.fullmatch(name):
            return (f"attribute name {name!r} must be 1-{limits.MAX_ATTRIBUTE_NAME} of A-Z a-z 0-9 _ . - "
                    "and Latin letters (U+00C0-U+017F)")
        if not isinstance(value, str):
            return f"attribute {name!r} must be a str, not {type(value).__name__}"
        size += len(name.encode("utf-8")) + len(value.encode("utf-8"))
    if size > limits.MAX_ATTRIBUTE_BYTES:
        return f"attributes: {size} bytes in all, at most {limits.MAX_ATTRIBUTE_BYTES}"
    return None


def check_attributes(attributes: object) -> dict[str, str]:
    """The attributes as a plain dict, or :class:`InvalidArgument` saying what is wrong."""
    problem = attributes_problem(attributes)
    if problem is not None:
        raise InvalidArgument(problem)
    return dict(cast(Mapping[str, str], attributes))  # checked just above


def is_group(group: object) -> bool:
    """Whether ``group`` can name a message group: 1-128 characters, no NUL."""
    return isinstance(group, str) and 0 < len(group) <= limits.MAX_GROUP_LENGTH and "\x00" not in group


def check_group(group: object) -> str:
    if not is_group(group):
        raise InvalidArgument(f"group must be a str of 1-{limits.MAX_GROUP_LENGTH} characters, not {group!r}")
    return group  # type: ignore[return-value]


def is_dedup_id(dedup_id: object) -> TypeGuard[str]:
    """Whether ``dedup_id`` can be a de-duplication id: 1-128 characters, no NUL."""
    return (
        isinstance(dedup_id, str) and 0 < len(dedup_id) <= limits.MAX_DEDUP_ID and "\x00" not in dedup_id
    )


def is_queue_name(name: object) -> bool:
    """Whether ``name`` is a queue name: one plain path component of 1-80
    characters of A-Z a-z 0-9 _ . -, starting with a letter or digit, never ``..``."""
    return isinstance(name, str) and QUEUE_NAME_RE.fullmatch(name) is not None and ".." not in name


def check_queue_name(name: object) -> str:
    if not is_queue_name(name):
        raise InvalidArgument(
            f"bad queue name {name!r}: use 1-{limits.MAX_QUEUE_NAME} characters of A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit, without '..'"
        )
    return name  # type: ignore[return-value]
