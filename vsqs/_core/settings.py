"""Queue settings: the schema, validation and encoding (no I/O).

Settings live in the queue directory as numbered versions,
``.settings/000000001.json``, ``.settings/000000002.json``, ...; the newest
version that parses wins. A change writes the next number with an exclusive
create, so two writers never overwrite each other and a writer that dies
half-way leaves a version that readers skip.

Each setting has one stored form, FORMAT.md's grammar (``Setting.read``), which
a reader checks strictly: a version holding a value outside it is skipped as a
whole. Input (the API, the CLI, the gateway) may be friendlier ("100/2" for a
throttle, "yes" for a flag): ``Setting.parse`` turns it into the stored form,
which ``read`` then checks, so what is written is always what is read.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

from vsqs._core import limits
from vsqs._core.errors import IncompatibleFormat, InvalidArgument, QueueSuspended
from vsqs._core.limits import MAX_JSON_DEPTH
from vsqs._core.rules import is_queue_name, load_json

SETTINGS_DIR = ".settings"
_VERSION_RE = re.compile(r"([0-9]{9})\.json")

MAX_VISIBILITY_TIMEOUT = limits.MAX_VISIBILITY_TIMEOUT
MAX_DELAY = limits.MAX_DELAY


Check = Callable[[str, Any], Any]


class Setting(NamedTuple):
    """One queue setting, declared once. The rest is made from the declarations:
    the check of its stored form (FORMAT.md's grammar, where its limits are
    written once), the parser of friendlier input (the API, the CLI, the
    gateway), the native API's model and the console's rows (``editable``),
    the text the CLI shows and takes back, and FORMAT.md's tables (a test
    holds them to these declarations)."""

    kind: str  # the kind of its stored value: a row of FORMAT.md's grammar table
    default: Any
    doc: str  # what it does, in one line (FORMAT.md's table of settings)
    read: Check  # the stored JSON value -> the value; InvalidArgument outside the grammar
    parse: Check  # an input -> a stored JSON value, which ``read`` then checks
    type: Any  # the Python type of its value (the native API's model)
    bounds: tuple[float, float] | None = None  # lowest and highest (seconds and counts)
    positive: bool = False  # the lowest bound excluded: above 0
    choices: tuple[str, ...] = ()
    editable: bool = True  # by the native API and the console
    obeyed: bool = True  # False: kept for clients of the SQS face; no part of vsqs acts on it

    def text(self, value: Any) -> str:
        """``value`` as the CLI shows it and takes it back: "none" when unset, a
        throttle as N/seconds, operations separated by commas, tags as JSON."""
        if value is None or value == [] or value == {}:
            return "none"
        if isinstance(value, dict):
            return json.dumps(value, sort_keys=True)
        if isinstance(value, list):
            if all(isinstance(v, str) for v in value):
                return ",".join(value)
            return "/".join(number_text(v) for v in value)
        return number_text(value) if isinstance(value, float) else str(value)


def number_text(value: float) -> str:
    """A number exactly, as input takes it back: a whole one without a fraction
    (1209600), any other to its last digit (0.1234567, 1e-05), never rounded."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seconds(maximum: float, *, positive: bool = False) -> Check:
    """A JSON number of seconds, 0 (or above 0) up to ``maximum``."""

    def read(name: str, value: Any) -> float:
        if not _is_number(value) or (isinstance(value, float) and math.isnan(value)):
            raise InvalidArgument(f"{name} must be a number of seconds, not {value!r}")
        if value < 0 or (positive and value == 0):
            raise InvalidArgument(f"{name} must be {'>' if positive else '>='} 0 seconds, not {value!r}")
        if value > maximum:
            raise InvalidArgument(f"{name} must be at most {maximum:g} seconds, not {value!r}")
        return float(value)

    return read


def _count(minimum: int, maximum: int) -> Check:
    """A JSON integer (no fraction, no exponent) from ``minimum`` to ``maximum``."""

    def read(name: str, value: Any) -> int:
        if type(value) is not int:
            raise InvalidArgument(f"{name} must be a whole number, not {value!r}")
        if not minimum <= value <= maximum:
            raise InvalidArgument(f"{name} must be {minimum}..{maximum}, not {value}")
        return value

    return read


def _number_input(name: str, value: object) -> object:
    """Seconds given as text ("2.5") as a number."""
    return _parse_number(name, value) if isinstance(value, str) else value


def _whole_input(name: str, value: object) -> object:
    """A count given as text ("5") or as a whole float (5.0) as an int."""
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            value = _parse_number(name, value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def means_unset(value: object) -> bool:
    """Whether ``value`` is a word that unsets a setting on input: blank, or
    "none" in any case (with white space around it or not). No stored value
    is such a word: a reader refuses it where a string may hold it."""
    return isinstance(value, str) and value.strip().lower() in ("", "none")


def _queue_ref(name: str, value: Any) -> str:
    """A queue beside this one (a plain name) or an absolute path; not "none" in any case."""
    if means_unset(value):
        raise InvalidArgument(f"{name} {value!r} unsets {name} on input: it names no queue")
    if isinstance(value, str) and "\x00" not in value and len(value) <= MAX_DEAD_LETTER_PATH:
        if is_queue_name(value):
            return value
        if value.startswith("/") and ".." not in value.split("/"):
            return value
    raise InvalidArgument(
        f"{name} must be the name of a queue beside this one or an absolute path, not {value!r}"
    )


_THROTTLE_COUNT, _THROTTLE_WINDOW = _count(1, 10**9), _seconds(86400.0, positive=True)
MIN_THROTTLE_WINDOW = 0.001


def _throttle(name: str, value: Any) -> list[Any]:
    """``[N, seconds]``: a JSON array of an integer 1..10^9 and a number 0.001..86400."""
    if not isinstance(value, list) or len(value) != 2:
        raise InvalidArgument(f"{name} must be (receives, seconds), e.g. (100, 1), not {value!r}")
    count, window = _THROTTLE_COUNT(name, value[0]), _THROTTLE_WINDOW(name, value[1])
    if window < MIN_THROTTLE_WINDOW:
        raise InvalidArgument(f"{name}: the window must be at least {MIN_THROTTLE_WINDOW} seconds, not {window!r}")
    return [count, window]


def _throttle_input(name: str, value: object) -> object:
    """``"100/2"``, ``"100,2"`` or a pair of numbers."""
    if isinstance(value, str):
        value = value.replace("/", ",").split(",")
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return [_whole_input(name, value[0]), _number_input(name, value[1])]
    return value


_FILE_MODE_RE = re.compile(r"[0-7]{4}")


def _file_mode(name: str, value: Any) -> str:
    """Four octal digits, the first 0 (no setuid, setgid or sticky bit),
    letting the owner read and write: "0600".."0777"."""
    if not isinstance(value, str) or not _FILE_MODE_RE.fullmatch(value):
        raise InvalidArgument(f"{name} must be an octal mode of four digits such as 0660, not {value!r}")
    if value[0] != "0":
        raise InvalidArgument(f"{name} {value}: the setuid, setgid and sticky bits are not kept")
    if int(value, 8) & 0o600 != 0o600:
        raise InvalidArgument(f"{name} {value} must let the owner read and write")
    return value


def _file_mode_input(name: str, value: object) -> object:
    """An octal mode as text ("660", "0o660") or as a number (0o660)."""
    if isinstance(value, str):
        try:
            value = int(value.strip().lower().removeprefix("0o"), 8)
        except ValueError:
            raise InvalidArgument(f"{name} must be an octal mode such as 660, not {value!r}") from None
    return f"{value:04o}" if isinstance(value, int) and not isinstance(value, bool) else value


def _flag(name: str, value: Any) -> bool:
    """JSON ``true`` or ``false``."""
    if isinstance(value, bool):
        return value
    raise InvalidArgument(f"{name} must be true or false, not {value!r}")


def _flag_input(name: str, value: object) -> object:
    """Also the words true/yes/on/1 and false/no/off/0, in any case."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "yes", "on", "1"):
            return True
        if text in ("false", "no", "off", "0"):
            return False
    return value


def _choice(*choices: str) -> Check:
    """One of ``choices``, exactly."""

    def read(name: str, value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise InvalidArgument(f"{name} must be one of {', '.join(choices)}, not {value!r}")

    return read


def _choice_input(name: str, value: object) -> object:
    """A choice in any case, with spaces around it."""
    return value.strip().lower() if isinstance(value, str) else value


def file_mode_of(settings: Mapping[str, Any]) -> int | None:
    mode = settings.get("file_mode")
    return int(mode, 8) if mode else None


OPERATIONS = ("publish", "receive", "delete")


def retained_from_us(retention: float | None, now_us: int, skew_us: int = 0) -> int | None:
    """The oldest SENT (epoch µs) a queue whose ``retention`` is that many seconds
    keeps at ``now_us``; ``None`` for a queue without retention (it keeps all). A
    message whose SENT is below it is past retention: never delivered, removed
    (docs/FORMAT.md, Retention). ``skew_us``, the reader's clock-skew allowance, is
    taken in the message's favour: a clock running ahead removes nothing early."""
    if retention is None:
        return None
    return now_us - round(retention * 1_000_000) - skew_us


def _operations(name: str, value: Any) -> list[str]:
    """A JSON array of operation names, in any order, repeats meaning nothing; read as sorted and distinct."""
    if not isinstance(value, list):
        raise InvalidArgument(f"{name} must be a list of {', '.join(OPERATIONS)}, not {value!r}")
    for op in value:
        if not isinstance(op, str) or op not in OPERATIONS:
            raise InvalidArgument(f"{name}: unknown operation {op!r} (known: {', '.join(OPERATIONS)})")
    return sorted(set(value))


def _operations_input(name: str, value: object) -> object:
    """Also a comma-separated text, a tuple or a set."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return list(value) if isinstance(value, (tuple, set, frozenset)) else value


MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 50, 128, 256  # Amazon's limits on a queue's tags
MAX_POLICY_BYTES = 20480  # a policy document, as JSON text
MAX_KMS_KEY_ID = 2048
MAX_DEAD_LETTER_PATH = 4096  # characters of a dead_letter path


def _tags(name: str, value: Any) -> dict[str, str]:
    """A queue's tags: at most 50, keys 1-128 characters, values 0-256 (Amazon's limits)."""
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise InvalidArgument(f"{name} must be a mapping of strings to strings, not {value!r}")
    if len(value) > MAX_TAGS:
        raise InvalidArgument(f"{name}: at most {MAX_TAGS} tags, not {len(value)}")
    for key, text in value.items():
        if not 1 <= len(key) <= MAX_TAG_KEY:
            raise InvalidArgument(f"{name}: a tag key has 1-{MAX_TAG_KEY} characters, not {len(key)} ({key[:40]!r})")
        if len(text) > MAX_TAG_VALUE:
            raise InvalidArgument(f"{name}: the value of tag {key[:40]!r} has more than {MAX_TAG_VALUE} characters")
    return dict(sorted(value.items()))


def _tags_input(name: str, value: object) -> object:
    """Also a mapping of any kind, or its JSON text."""
    if isinstance(value, str):
        try:
            return load_json(value, strict=True)
        except ValueError:
            raise InvalidArgument(f"{name} must be a JSON object of strings, not {value[:40]!r}") from None
    return dict(value) if isinstance(value, Mapping) else value


def _policy(name: str, value: Any) -> str:
    """An access policy, stored, never enforced: the text of a JSON object (strict
    JSON, nested at most MAX_JSON_DEPTH deep) of at most MAX_POLICY_BYTES."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a JSON object's text, not {value!r}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_POLICY_BYTES:
        raise InvalidArgument(f"{name} is over {MAX_POLICY_BYTES} bytes")
    try:
        doc = load_json(value, strict=True)
    except ValueError as exc:
        raise InvalidArgument(f"{name} is not JSON of at most {MAX_JSON_DEPTH} levels ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument(f"{name} must be a JSON object")
    return value


def _policy_input(name: str, value: object) -> object:
    """Also a mapping (written as compact JSON)."""
    if isinstance(value, Mapping):
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"{name} cannot be written as JSON ({exc})") from None
    return value


def _kms_key(name: str, value: Any) -> str:
    """A KMS key id, alias or ARN, neither blank nor "none" in any case (stored
    and reported; the spool's filesystem protects the bodies)."""
    if means_unset(value):
        raise InvalidArgument(f"{name} {value!r} unsets {name} on input: it names no key")
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_KMS_KEY_ID or "\x00" in value:
        raise InvalidArgument(f"{name} must be a key id, alias or ARN of 1-{MAX_KMS_KEY_ID} characters, not {value!r}")
    return value


def _parse_number(name: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number, not {text!r}") from None


def _one_of(choices: tuple[str, ...]) -> Any:
    """The type of a value that is one of ``choices``."""
    return Literal[choices]


def _list_of(item: Any) -> Any:
    """The type of a list of ``item``s."""
    return list[item]


def _as_given(name: str, value: object) -> object:
    """Input taken as it is: the stored form's check is the whole rule."""
    return value


def _seconds_setting(default: Any, maximum: float, doc: str, *, positive: bool = False) -> Setting:
    return Setting("seconds", default, doc, _seconds(maximum, positive=positive), _number_input, float,
                   (0, maximum), positive=positive)


def _count_setting(default: Any, minimum: int, maximum: int, doc: str) -> Setting:
    return Setting("count", default, doc, _count(minimum, maximum), _whole_input, int, (minimum, maximum))


def _choice_setting(default: Any, choices: tuple[str, ...], doc: str, *, editable: bool = True) -> Setting:
    return Setting("choice", default, doc, _choice(*choices), _choice_input, _one_of(choices), choices=choices,
                   editable=editable)


def _flag_setting(default: Any, doc: str) -> Setting:
    return Setting("flag", default, doc, _flag, _flag_input, bool)


def _kept(setting: Setting) -> Setting:
    """A setting kept for clients of the SQS face (docs/gateway.md, queue attributes):
    stored, checked and reported, never acted on by vsqs, nor edited by the native API."""
    return setting._replace(editable=False, obeyed=False)

# name -> Setting; a default of None means "not set". Their order is that of Queue.settings, of the
# native API's JSON and of its body's fields (so which of two bad fields a refusal names): a new one
# goes last. The console shows the ones it edits in an order of its own (console/forms.py).
SCHEMA: dict[str, Setting] = {
    "visibility_timeout": _seconds_setting(
        30.0, MAX_VISIBILITY_TIMEOUT, "seconds a received message stays hidden, when the receiver does not say"),
    "delay": _seconds_setting(
        0.0, MAX_DELAY, "seconds a published message stays hidden, when the publisher does not say"),
    "retention": _seconds_setting(
        None, 10 * 366 * 86400.0,
        "messages sent longer ago than this are never delivered: receives and gc remove them", positive=True,
    ),
    "max_messages": _count_setting(
        None, 1, 10**12,
        "publish fails (`QueueFull`) if the queue would hold more messages than this (see Back-pressure)"),
    "max_message_bytes": _count_setting(None, 1, 2**40, "publish fails (`MessageTooLarge`) for a larger body"),
    "max_receives": _count_setting(
        None, 1, 10**6, "a message received this many times goes to the dead-letter queue"),
    "dead_letter": Setting("queue", None, "the dead-letter queue: a name beside this queue, or a path "
                           "(unset: `NAME.dlq`)", _queue_ref, _as_given, str),
    "group_concurrency": _count_setting(1, 1, 10**6, "messages of one group in flight at once"),
    "dedup_window": _seconds_setting(
        0.0, 366 * 86400.0, "seconds a de-duplication id stays reserved after its message is gone"),
    "content_dedup": _flag_setting(False, "a publish without a de-duplication id uses the SHA-256 of its body as "
                                   'one (as `dedup="content"`)'),
    "dedup_scope": _choice_setting(
        "group", ("group", "queue"), "what a de-duplication id is unique in: its message group (`\"group\"`: the "
        "id is hashed with the group name) or the whole queue (`\"queue\"`: the id alone)", editable=False),
    "throughput_limit": _kept(_choice_setting(
        None, ("queue", "group"), "SQS's `FifoThroughputLimit` (`\"queue\"`: perQueue, `\"group\"`: "
        "perMessageGroupId), kept for the gateway to report; it changes nothing")),
    "receive_wait": _seconds_setting(0.0, 20.0, "seconds a receive long-polls, when the receiver does not say"),
    "throttle": Setting("throttle", None, "`[N, seconds]`: at most N receives per window", _throttle,
                        _throttle_input, tuple[int, float]),
    "suspended": Setting("operations", [], "operations (`publish`, `receive`, `delete`) that fail with "
                         "`QueueSuspended`", _operations, _operations_input, _list_of(_one_of(OPERATIONS))),
    "file_mode": Setting("file mode", None, 'octal string, e.g. `"0660"`: the mode set on every file made in the '
                         "queue (see Modes)", _file_mode, _file_mode_input, str, editable=False),
    "tags": _kept(Setting("tags", {}, "labels kept for SQS clients (TagQueue); vsqs obeys none", _tags,
                          _tags_input, dict[str, str])),
    "policy": _kept(Setting("policy", None, "an access policy kept for SQS clients (the Policy attribute); stored, "
                            "not enforced", _policy, _policy_input, str)),
    "kms_master_key_id": _kept(Setting("key id", None, "kept for SQS clients; vsqs encrypts nothing (the filesystem "
                                       "protects the bodies)", _kms_key, _as_given, str)),
    "kms_data_key_reuse_period": _kept(_count_setting(
        None, 60, 86400, "kept for SQS clients (KmsDataKeyReusePeriodSeconds)")),
    "sqs_managed_sse": _kept(_flag_setting(
        None, "kept for SQS clients (SqsManagedSseEnabled; none reads as Amazon's default)")),
}
DEFAULTS: dict[str, Any] = {key: setting.default for key, setting in SCHEMA.items()}


def _default(key: str) -> Any:
    """The default of setting ``key``, a fresh copy (its lists and mappings are not shared)."""
    default = SCHEMA[key].default
    return type(default)(default) if isinstance(default, (list, dict)) else default


def defaults() -> dict[str, Any]:
    """A fresh copy of DEFAULTS."""
    return {key: _default(key) for key in SCHEMA}


def validate(changes: Mapping[str, object]) -> dict[str, Any]:
    """Check ``changes`` given as input (the API, the CLI, the gateway) and
    return them in their stored form; ``None`` (or "none"/"") unsets a setting."""
    clean: dict[str, Any] = {}
    for key, value in changes.items():
        if key not in SCHEMA:
            known = ", ".join(sorted(SCHEMA))
            raise InvalidArgument(f"unknown queue setting {key!r} (known: {known})")
        if value is None or means_unset(value):
            clean[key] = _default(key)
        else:
            setting = SCHEMA[key]
            clean[key] = setting.read(key, setting.parse(key, value))
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
    """A version file: the settings (in their stored form) as FORMAT.md says vsqs writes them."""
    doc = {"format": format_version, "settings": dict(settings)}
    return (json.dumps(doc, sort_keys=True, allow_nan=False) + "\n").encode()


def decode(data: bytes, format_version: int) -> dict[str, Any]:
    """The settings of a version file, checked against FORMAT.md's grammar:
    :class:`InvalidArgument` (saying why) if it does not parse, so is to be
    skipped; :class:`IncompatibleFormat` if its ``format`` is above ``format_version``."""
    try:
        doc = load_json(data, strict=True)
    except ValueError as exc:
        raise InvalidArgument(f"not a JSON document ({exc})") from None
    if not isinstance(doc, dict):
        raise InvalidArgument("not a JSON object")
    version = doc.get("format")
    if type(version) is not int or version < 1:
        raise InvalidArgument(f"format must be an integer of at least 1, not {version!r}")
    if version > format_version:
        raise IncompatibleFormat(f"queue settings of format {version}, this vsqs reads format {format_version}")
    stored = doc.get("settings")
    if not isinstance(stored, dict):
        raise InvalidArgument(f"settings must be an object, not {type(stored).__name__}")
    settings = defaults()
    for key, value in stored.items():
        if key in SCHEMA and value is not None:
            settings[key] = SCHEMA[key].read(key, value)
    return settings
