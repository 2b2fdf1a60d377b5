"""Queue settings: the schema, validation and encoding (no I/O).

Settings live in the queue directory as numbered versions,
``.settings/000000001.json``, ``.settings/000000002.json``, ...; the newest
version that parses wins. A change writes the next number with an exclusive
create, so two writers never overwrite each other and a writer that dies
half-way leaves a version that readers skip.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from vsqs._core import limits
from vsqs._core.errors import IncompatibleFormat, InvalidArgument, QueueSuspended
from vsqs._core.limits import MAX_JSON_DEPTH
from vsqs._core.rules import is_queue_name, load_json

SETTINGS_DIR = ".settings"
_VERSION_RE = re.compile(r"([0-9]{9})\.json")

MAX_VISIBILITY_TIMEOUT = limits.MAX_VISIBILITY_TIMEOUT
MAX_DELAY = limits.MAX_DELAY


def _seconds(maximum: float, *, positive: bool = False) -> Any:
    def check(name: str, value: object) -> float:
        if isinstance(value, str):
            value = _parse_number(name, value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
        if value < 0 or (positive and value == 0):
            raise InvalidArgument(f"{name} must be {'>' if positive else '>='} 0 seconds, not {value!r}")
        if value > maximum:
            raise InvalidArgument(f"{name} must be at most {maximum:g} seconds, not {value!r}")
        return float(value)

    return check


def _count(minimum: int, maximum: int) -> Any:
    def check(name: str, value: object) -> int:
        if isinstance(value, str):
            value = _parse_number(name, value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgument(f"{name} must be a whole number, not {value!r}")
        if not minimum <= value <= maximum:
            raise InvalidArgument(f"{name} must be {minimum}..{maximum}, not {value}")
        return value

    return check


def _queue_ref(name: str, value: object) -> str:
    """A queue beside this one (a plain name) or an absolute path."""
    if isinstance(value, str) and "\x00" not in value and len(value) <= 4096:
        if is_queue_name(value):
            return value
        if value.startswith("/") and ".." not in value.split("/"):
            return value
    raise InvalidArgument(
        f"{name} must be the name of a queue beside this one or an absolute path, not {value!r}"
    )


def _throttle(name: str, value: object) -> list[float]:
    if isinstance(value, str):
        parts = value.replace("/", ",").split(",")
        value = [_parse_number(name, part) for part in parts]
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise InvalidArgument(f"{name} must be (receives, seconds), e.g. (100, 1), not {value!r}")
    count = _count(1, 10**9)(name, value[0])
    window = _seconds(86400.0, positive=True)(name, value[1])
    if window < 0.001:
        raise InvalidArgument(f"{name}: the window must be at least 0.001 seconds, not {window!r}")
    return [count, window]


def _file_mode(name: str, value: object) -> str:
    """An octal file mode such as 660 (group members share the queue); the
    owner must be able to read and write."""
    if isinstance(value, str):
        text = value.strip().lower().removeprefix("0o")
        try:
            value = int(text, 8)
        except ValueError:
            raise InvalidArgument(f"{name} must be an octal mode such as 660, not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise InvalidArgument(f"{name} must be an octal mode such as 660, not {value!r}")
    if value & 0o600 != 0o600:
        raise InvalidArgument(f"{name} {value:04o} must let the owner read and write")
    return f"{value:04o}"


def _flag(name: str, value: object) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
    if isinstance(value, bool):
        return value
    raise InvalidArgument(f"{name} must be true or false, not {value!r}")


def _choice(*choices: str) -> Any:
    def check(name: str, value: object) -> str:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise InvalidArgument(f"{name} must be one of {', '.join(choices)}, not {value!r}")

    return check


def file_mode_of(settings: Mapping[str, Any]) -> int | None:
    mode = settings.get("file_mode")
    return int(mode, 8) if mode else None


OPERATIONS = ("publish", "receive", "delete")


def _operations(name: str, value: object) -> list[str]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise InvalidArgument(f"{name} must be a list of {', '.join(OPERATIONS)}, not {value!r}")
    for op in value:
        if op not in OPERATIONS:
            raise InvalidArgument(f"{name}: unknown operation {op!r} (known: {', '.join(OPERATIONS)})")
    return sorted(set(value))


MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 50, 128, 256  # Amazon's limits on a queue's tags
MAX_POLICY_BYTES = 20480  # a policy document, as JSON text
MAX_KMS_KEY_ID = 2048


def _tags(name: str, value: object) -> dict[str, str]:
    """A queue's tags: at most 50, keys 1-128 characters, values 0-256 (Amazon's limits)."""
    if isinstance(value, str):
        try:
            value = load_json(value)
        except ValueError:
            raise InvalidArgument(f"{name} must be a JSON object of strings, not {value[:40]!r}") from None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgument(f"{name} must be a mapping of strings to strings, not {value!r}")
    if len(value) > MAX_TAGS:
        raise InvalidArgument(f"{name}: at most {MAX_TAGS} tags, not {len(value)}")
    for key, text in value.items():
        if not 1 <= len(key) <= MAX_TAG_KEY:
            raise InvalidArgument(f"{name}: a tag key has 1-{MAX_TAG_KEY} characters, not {len(key)} ({key[:40]!r})")
        if len(text) > MAX_TAG_VALUE:
            raise InvalidArgument(f"{name}: the value of tag {key[:40]!r} has more than {MAX_TAG_VALUE} characters")
    return dict(sorted(value.items()))


def _policy(name: str, value: object) -> str:
    """An access policy: the text of a JSON object, at most MAX_POLICY_BYTES (stored, not enforced)."""
    if isinstance(value, Mapping):
        value = json.dumps(value, separators=(",", ":"))
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a JSON object's text, not {value!r}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES:
        raise InvalidArgument(f"{name} is over {MAX_POLICY_BYTES} bytes")
    try:
        doc = load_json(value)
    except ValueError as exc:
        raise InvalidArgument(f"{name} is not JSON of at most {MAX_JSON_DEPTH} levels ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{name} must be a JSON object")
    return value


def _kms_key(name: str, value: object) -> str:
    """A KMS key id, alias or ARN (stored and reported; the spool's filesystem protects the bodies)."""
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_KMS_KEY_ID or "\x00" in value:
        raise InvalidArgument(f"{name} must be a key id, alias or ARN of 1-{MAX_KMS_KEY_ID} characters, not {value!r}")
    return value


def _parse_number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number, not {text!r}") from None


# name -> (default, validator); None means "not set" for optional limits
SCHEMA: dict[str, tuple[Any, Any]] = {
    "visibility_timeout": (30.0, _seconds(MAX_VISIBILITY_TIMEOUT)),
    "delay": (0.0, _seconds(MAX_DELAY)),
    "retention": (None, _seconds(10 * 366 * 86400.0, positive=True)),
    "max_messages": (None, _count(1, 10**12)),
    "max_message_bytes": (None, _count(1, 2**40)),
    "max_receives": (None, _count(1, 10**6)),
    "dead_letter": (None, _queue_ref),
    "group_concurrency": (1, _count(1, 10**6)),
    "dedup_window": (0.0, _seconds(366 * 86400.0)),
    "content_dedup": (False, _flag),
    # what a dedup id is unique in: its message group ("group") or the whole queue
    "dedup_scope": ("group", _choice("group", "queue")),
    # SQS's FifoThroughputLimit (perQueue / perMessageGroupId): kept and reported, no effect here
    "throughput_limit": (None, _choice("queue", "group")),
    "receive_wait": (0.0, _seconds(20.0)),
    "throttle": (None, _throttle),
    "suspended": ([], _operations),
    "file_mode": (None, _file_mode),
    # kept for SQS clients (the gateway's TagQueue, Policy, KMS attributes); vsqs itself obeys none of them
    "tags": ({}, _tags),
    "policy": (None, _policy),
    "kms_master_key_id": (None, _kms_key),
    "kms_data_key_reuse_period": (None, _count(60, 86400)),
    "sqs_managed_sse": (None, _flag),
}
DEFAULTS: dict[str, Any] = {key: default for key, (default, _) in SCHEMA.items()}


def defaults() -> dict[str, Any]:
    """A fresh copy of DEFAULTS (its lists and mappings are not shared)."""
    return {key: type(v)(v) if isinstance(v, (list, dict)) else v for key, v in DEFAULTS.items()}


def validate(changes: Mapping[str, object]) -> dict[str, Any]:
    """Check ``changes`` against the schema; ``None`` (or "none"/"") unsets a setting."""
    clean: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in SCHEMA:
            known = ", ".join(sorted(SCHEMA))
            raise InvalidArgument(f"unknown queue setting {key!r} (known: {known})")
        default, check = SCHEMA[key]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            clean[key] = type(default)(default) if isinstance(default, (list, dict)) else default
        else:
            clean[key] = check(key, value)
    return clean


def check_suspended(operation: str, settings: Mapping[str, Any], where: str) -> None:
    """:class:`QueueSuspended` if ``operation`` is suspended in ``settings`` (of the queue at ``where``)."""
    if operation in settings["suspended"]:
        raise QueueSuspended(f"{operation} is suspended on queue {where} (resume it to go on)")


def version_name(version: int) -> str:
    return f"{version:09d}.json"


def parse_version(name: str) -> int | None:
    m = _VERSION_RE.fullmatch(name)
    return int(m[1]) if m else None


def encode(settings: Mapping[str, Any], format_version: int) -> bytes:
    doc = {"format": format_version, "settings": dict(settings)}
    return (json.dumps(doc, sort_keys=True) + "\n").encode()


def decode(data: bytes, format_version: int) -> dict[str, Any] | None:
    """The settings in a version file; ``None`` if it is unreadable (being written, or torn)."""
    try:
        doc = load_json(data)
        if not isinstance(doc, dict):
            return None
        if isinstance(doc.get("format"), int) and doc["format"] > format_version:
            raise IncompatibleFormat(
                f"queue settings of format {doc['format']}, this vsqs reads format {format_version}"
            )
        stored = doc["settings"]
        if not isinstance(stored, dict):
            return None
        known = {key: value for key, value in stored.items() if key in SCHEMA}
        return {**defaults(), **validate(known)}
    except (ValueError, TypeError, KeyError, InvalidArgument):
        return None
