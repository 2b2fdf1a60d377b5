"""Attributes, both kinds: SQS queue attributes as vsqs settings (and back),
and SQS message attributes as vsqs attributes (and back), with the MD5
digests SQS computes over them."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from vsqs import InvalidArgument, Queue
from vsqs._core.rules import ATTRIBUTE_NAME_RE, check_queue_name, load_json
from vsqs._core.settings import number_text
from vsqs._gateway.json_body import BodyRefused, parse_json
from vsqs._gateway.limits import (
    MAX_ATTRIBUTE_NAME,
    MAX_DELAY_SECONDS,
    MAX_MESSAGE_ATTRIBUTES,
    MAX_RECEIVE_COUNT,
    MAX_RETENTION,
    MAX_SMALL_JSON_VALUES,
    MAX_VISIBILITY_TIMEOUT,
    MAX_WAIT_SECONDS,
    MIN_MESSAGE_BYTES,
    MIN_RETENTION,
    SQS_DEFAULT_RETENTION,
    SQS_MAX_MESSAGE_BYTES,
)
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.parameters import is_fifo
from vsqs._gateway.sqs.protocol import SqsError, invalid_attribute_value, invalid_parameter_value
from vsqs._gateway.sqs.security import SECURITY_ATTRIBUTES, security_attributes, security_settings

TYPES_ATTRIBUTE = "sqs.types"  # JSON {name: DataType} of the attributes that are not String
DEDUP_ATTRIBUTE = "sqs.dedup_id"
TRACE_ATTRIBUTE = "sqs.trace"
RESERVED_PREFIX = "sqs."

_DATA_TYPE_RE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]+)?")
_COUNT_RE = re.compile(r"[0-9]{1,9}")  # maxReceiveCount given as a string
_NUMBER_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_BAD_TEXT_RE = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


# -- MD5 digests as SQS computes them ----------------------------------------------


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def md5_of_attributes(attributes: Mapping[str, Mapping[str, Any]]) -> str:
    """MD5OfMessageAttributes: for each name in order, its length-prefixed name,
    DataType, a transport byte (1 text, 2 binary) and length-prefixed value."""
    digest = hashlib.md5(usedforsecurity=False)

    def chunk(data: bytes) -> None:
        digest.update(struct.pack(">I", len(data)) + data)

    for name in sorted(attributes):
        value = attributes[name]
        chunk(name.encode("utf-8"))
        chunk(value["DataType"].encode("utf-8"))
        if "BinaryValue" in value:
            digest.update(b"\x02")
            chunk(base64.b64decode(value["BinaryValue"]))
        else:
            digest.update(b"\x01")
            chunk(value["StringValue"].encode("utf-8"))
    return digest.hexdigest()


# -- queue attributes <-> settings ------------------------------------------------

# attribute -> (setting, lowest, highest) for the whole-number ones
_NUMERIC_ATTRIBUTES: dict[str, tuple[str, int, int]] = {
    "VisibilityTimeout": ("visibility_timeout", 0, MAX_VISIBILITY_TIMEOUT),
    "DelaySeconds": ("delay", 0, MAX_DELAY_SECONDS),
    "MessageRetentionPeriod": ("retention", MIN_RETENTION, MAX_RETENTION),
    "MaximumMessageSize": ("max_message_bytes", MIN_MESSAGE_BYTES, SQS_MAX_MESSAGE_BYTES),
    "ReceiveMessageWaitTimeSeconds": ("receive_wait", 0, MAX_WAIT_SECONDS),
}
_FIFO_ATTRIBUTES = frozenset({"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"})
# attribute -> (setting, {SQS value: setting value}, value reported when the setting is unset)
_FIFO_CHOICES: dict[str, tuple[str, dict[str, str], str]] = {
    "DeduplicationScope": ("dedup_scope", {"queue": "queue", "messageGroup": "group"}, "messageGroup"),
    "FifoThroughputLimit": ("throughput_limit", {"perQueue": "queue", "perMessageGroupId": "group"}, "perQueue"),
}
_READ_ONLY = frozenset({"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed", "QueueArn", "CreatedTimestamp",
                        "LastModifiedTimestamp"})
_UNSUPPORTED = frozenset({"RedriveAllowPolicy"})
QUEUE_ATTRIBUTE_NAMES = frozenset({"All", "RedrivePolicy", *_NUMERIC_ATTRIBUTES, *_FIFO_ATTRIBUTES,
                                    *_READ_ONLY, *_UNSUPPORTED, *SECURITY_ATTRIBUTES})


# attribute -> the settings it sets, of every table above and security.py's
SETTINGS_OF_ATTRIBUTE: dict[str, tuple[str, ...]] = {
    **{attribute: (setting,) for attribute, (setting, _, _) in _NUMERIC_ATTRIBUTES.items()},
    "RedrivePolicy": ("dead_letter", "max_receives"),
    "ContentBasedDeduplication": ("content_dedup",),
    **{attribute: (setting,) for attribute, (setting, _, _) in _FIFO_CHOICES.items()},
    **{attribute: (setting,) for attribute, setting in SECURITY_ATTRIBUTES.items()},
}
# the queue attribute that sets each setting (QueueNameExists names it, as Amazon does)
ATTRIBUTE_OF_SETTING: dict[str, str] = {
    setting: attribute for attribute, settings in SETTINGS_OF_ATTRIBUTE.items() for setting in settings
}
# the settings no queue attribute sets: TagQueue sets tags; the others have no SQS counterpart
NO_ATTRIBUTE = frozenset({"max_messages", "group_concurrency", "dedup_window", "throttle", "suspended",
                          "file_mode", "tags"})

# settings a queue that sets none reports with Amazon's default (and CreateQueue takes as equal to it)
REPORTED_DEFAULTS: dict[str, Any] = {"retention": SQS_DEFAULT_RETENTION}


def wants_all(names: Iterable[str]) -> bool:
    """Whether ``names`` holds ``All``, in any case (kombu sends ``ALL``)."""
    return any(name.lower() == "all" for name in names)


def unknown_attribute(name: str) -> SqsError:
    return SqsError("InvalidAttributeName", f"Unknown Attribute {name[:100]}.")


def fifo_only_attribute(name: str) -> SqsError:
    """Amazon's answer to DeduplicationScope or FifoThroughputLimit given for a standard queue."""
    return SqsError("InvalidAttributeName", f"You can specify the {name} only when FifoQueue is set to true.")


def unknown_queue_attributes(names: Iterable[str]) -> list[str]:
    """The names GetQueueAttributes does not know (``All`` in any case is known)."""
    return sorted(name for name in names if name not in QUEUE_ATTRIBUTE_NAMES and name.lower() != "all")


def settings_of(attributes: Mapping[str, str], queue_name: str) -> dict[str, Any]:
    """vsqs settings for SQS queue attributes (checked here; RedrivePolicy's
    target is checked against the spool by the caller)."""
    fifo = is_fifo(queue_name)
    settings: dict[str, Any] = security_settings(attributes)  # Policy, KMS (security.py)
    for name, text in attributes.items():
        if name in SECURITY_ATTRIBUTES:
            continue
        if name in _NUMERIC_ATTRIBUTES:
            setting, low, high = _NUMERIC_ATTRIBUTES[name]
            if not re.fullmatch(r"[0-9]{1,12}", text) or not low <= int(text) <= high:
                raise invalid_attribute_value(name)
            settings[setting] = int(text)
        elif name == "RedrivePolicy":
            settings.update(_redrive_settings(text, queue_name))
        elif name in _FIFO_CHOICES and not fifo:
            raise fifo_only_attribute(name)
        elif name in _FIFO_ATTRIBUTES and not fifo:
            raise unknown_attribute(name)  # Amazon: FifoQueue, ContentBasedDeduplication unknown to a standard queue
        elif name == "FifoQueue":
            if text.lower() != "true":
                raise invalid_attribute_value(name, "Modifying queue type is not supported.")
        elif name == "ContentBasedDeduplication":
            if text.lower() not in ("true", "false"):
                raise invalid_attribute_value(name)
            settings["content_dedup"] = text.lower() == "true"
        elif name in _FIFO_CHOICES:
            setting, choices, _ = _FIFO_CHOICES[name]
            if text not in choices:
                raise invalid_attribute_value(name)
            settings[setting] = choices[text]
        elif name in _READ_ONLY:
            raise unknown_attribute(name)  # Amazon's answer to setting a read-only one
        elif name in _UNSUPPORTED:
            raise SqsError("InvalidAttributeName", f"{name} is not supported by vsqs.")
        else:
            raise unknown_attribute(name)
    return settings


def _redrive_settings(text: str, queue_name: str) -> dict[str, Any]:
    """``{"deadLetterTargetArn": ARN, "maxReceiveCount": N}`` -> dead_letter, max_receives ("" removes)."""
    if text == "":
        return {"dead_letter": None, "max_receives": None}

    def invalid(why: str) -> SqsError:  # Amazon: InvalidParameterValue, quoting the policy as given
        return invalid_parameter_value("RedrivePolicy", text[:1024], why)

    try:
        policy = parse_json(text.encode("utf-8", "surrogatepass"), MAX_SMALL_JSON_VALUES)
    except BodyRefused:
        raise invalid("Redrive policy is not a valid JSON map.") from None
    if not isinstance(policy, dict):
        raise invalid("Redrive policy is not a valid JSON map.")
    for key in ("deadLetterTargetArn", "maxReceiveCount"):
        if key not in policy:
            raise invalid(f"Redrive policy does not contain mandatory attribute: {key}.")
    if set(policy) != {"deadLetterTargetArn", "maxReceiveCount"}:
        raise invalid("Only following attributes are supported: [deadLetterTargetArn, maxReceiveCount].")
    count = policy["maxReceiveCount"]
    if isinstance(count, str) and _COUNT_RE.fullmatch(count):
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_RECEIVE_COUNT:
        raise invalid(f"Invalid value for maxReceiveCount: {str(policy['maxReceiveCount'])[:40]}, valid values "
                      f"are from 1 to {MAX_RECEIVE_COUNT} both inclusive.")
    arn = policy["deadLetterTargetArn"]
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs":
        raise invalid("Invalid value for deadLetterTargetArn.")
    try:
        target = check_queue_name(parts[5])
    except InvalidArgument:
        raise invalid("Invalid value for deadLetterTargetArn.") from None
    if target == queue_name:  # Amazon takes it: a message would move to the queue it is in, so none moves
        return {"dead_letter": None, "max_receives": None}
    if is_fifo(target) != is_fifo(queue_name):
        raise invalid("Dead-letter queue must be same type of queue as the source.")
    return {"dead_letter": target, "max_receives": count}


def check_dead_letter_region(text: str, region: str) -> None:
    """The RedrivePolicy ``text`` (checked by :func:`settings_of`) names a dead-letter
    queue of ``region``, the source queue's: a queue's dead-letter queue is in its region,
    as Amazon requires (InvalidParameterValue if not)."""
    if not text:
        return
    arn = parse_json(text.encode("utf-8", "surrogatepass"), MAX_SMALL_JSON_VALUES)["deadLetterTargetArn"]
    if arn.split(":")[3] != region:
        raise invalid_parameter_value("RedrivePolicy", text[:1024],
                                      "Dead-letter queue must be in the same region as the source.")


def check_dead_letter_exists(spool_queues: Iterable[str], settings: Mapping[str, Any], text: str) -> None:
    """The RedrivePolicy ``text``'s target queue exists (InvalidParameterValue if not)."""
    target = settings.get("dead_letter")
    if target is not None and target not in spool_queues:
        raise invalid_parameter_value("RedrivePolicy", text[:1024], "Dead letter target does not exist.")


def queue_attributes(call: Call, queue: Queue, name: str, wanted: set[str]) -> dict[str, str]:
    """The queue attributes asked for (blocking: reads settings, lists the queue for counts)."""
    settings = queue.settings
    everything = wants_all(wanted)
    out: dict[str, str] = {}

    def want(attribute: str) -> bool:
        return everything or attribute in wanted

    for attribute, (setting, _, _) in _NUMERIC_ATTRIBUTES.items():
        if want(attribute):
            value = settings[setting]
            if attribute == "MaximumMessageSize":
                value = call.message_limit(settings)
            if value is None:
                value = REPORTED_DEFAULTS.get(setting)
            if value is not None:
                out[attribute] = number_text(value)
    if want("RedrivePolicy") and settings["max_receives"] is not None:
        target = settings["dead_letter"] or f"{name}.dlq"
        if target.startswith("/"):
            target = target.rsplit("/", 1)[-1]
        out["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": call.arn_of(target),
                                           "maxReceiveCount": settings["max_receives"]}, separators=(",", ":"))
    if want("QueueArn"):
        out["QueueArn"] = call.arn_of(name)
    out.update(security_attributes(settings, want))
    if want("CreatedTimestamp") or want("LastModifiedTimestamp"):
        created = queue.created_at
        changed = queue.settings_changed_at or created  # a queue never configured: its creation
        for attribute, at in (("CreatedTimestamp", created), ("LastModifiedTimestamp", changed)):
            if want(attribute) and at is not None:
                out[attribute] = str(int(at))  # Amazon: epoch seconds
    counts = {"ApproximateNumberOfMessages": "ready", "ApproximateNumberOfMessagesNotVisible": "in_flight",
              "ApproximateNumberOfMessagesDelayed": "delayed"}
    if any(want(attribute) for attribute in counts):
        stats = queue.stats()
        for attribute, state in counts.items():
            if want(attribute):
                out[attribute] = str(getattr(stats, state))
    if is_fifo(name):
        if want("FifoQueue"):
            out["FifoQueue"] = "true"
        if want("ContentBasedDeduplication"):
            out["ContentBasedDeduplication"] = "true" if settings["content_dedup"] else "false"
        for attribute, (setting, choices, unset) in _FIFO_CHOICES.items():
            if want(attribute):
                reported = {value: text for text, value in choices.items()}
                out[attribute] = reported.get(settings[setting], unset)
    return out


# -- message attributes -----------------------------------------------------------


def check_text(text: str, name: str = "InvalidMessageContents") -> None:
    """SQS's character rule, in Amazon's words: a body breaking it is
    InvalidMessageContents, a String attribute's value InvalidParameterValue."""
    if _BAD_TEXT_RE.search(text) is not None:
        raise SqsError(name, "Invalid characters found. Valid unicode characters are #x9 | #xA | #xD | "
                       "#x20 to #xD7FF | #xE000 to #xFFFD | #x10000 to #x10FFFF")


def _empty_value(name: str, data_type: str) -> SqsError:
    kind = data_type.split(".", 1)[0]
    return SqsError("InvalidParameterValue", f"Message (user) attribute '{name[:256]}' must contain a non-empty "
                    f"value of type '{kind}'.")


def message_attributes(value: object, where: str = "MessageAttributes") -> dict[str, dict[str, str]]:
    """Check SQS message attributes; return them with Binary values in canonical base64."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SqsError("InvalidParameterValue", f"{where} must be a map.")
    if len(value) > MAX_MESSAGE_ATTRIBUTES:
        raise SqsError("InvalidParameterValue",
                       f"Number of message attributes [{len(value)}] exceeds the allowed maximum "
                       f"[{MAX_MESSAGE_ATTRIBUTES}].")
    clean: dict[str, dict[str, str]] = {}
    for name, attribute in value.items():
        if (not ATTRIBUTE_NAME_RE.fullmatch(name) or name.startswith(".") or name.endswith(".")
                or ".." in name or name.lower().startswith(("aws.", "amazon.", RESERVED_PREFIX))):
            raise SqsError("InvalidParameterValue",
                           f"Message attribute name {name[:100]!r} is invalid: 1-{MAX_ATTRIBUTE_NAME} of "
                           "A-Z a-z 0-9 _ - . and Latin letters, not starting or ending with '.', no '..', "
                           "not starting with AWS., Amazon. or sqs.")
        if not isinstance(attribute, dict) or not isinstance(attribute.get("DataType"), str):
            raise SqsError("InvalidParameterValue",
                           f"The message attribute '{name}' must contain non-empty message attribute type.")
        data_type = attribute["DataType"]
        if not _DATA_TYPE_RE.fullmatch(data_type) or len(data_type) > 256:
            raise SqsError("InvalidParameterValue", f"The message attribute '{name}' has an invalid message "
                           "attribute type, the set of supported type prefixes is Binary, Number, and String.")
        if attribute.get("StringListValues") or attribute.get("BinaryListValues"):
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r}: list values are not supported.")
        if data_type.startswith("Binary"):
            raw = attribute.get("BinaryValue")
            try:
                data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
            except (binascii.Error, ValueError):
                data = None
            if not data:
                raise _empty_value(name, data_type)
            clean[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(data).decode("ascii")}
            continue
        text = attribute.get("StringValue")
        if not isinstance(text, str) or not text:
            raise _empty_value(name, data_type)
        check_text(text, "InvalidParameterValue")
        if data_type.startswith("Number") and not _NUMBER_RE.fullmatch(text):
            raise SqsError("InvalidParameterValue", f"Can't cast the value of message (user) attribute '{name}' "
                           "to a number.")
        clean[name] = {"DataType": data_type, "StringValue": text}
    return clean


def attributes_size(attributes: Mapping[str, Mapping[str, str]]) -> int:
    """Bytes SQS counts for attributes: names, types and values."""
    size = 0
    for name, value in attributes.items():
        payload = base64.b64decode(value["BinaryValue"]) if "BinaryValue" in value else value["StringValue"].encode()
        size += len(name.encode()) + len(value["DataType"].encode()) + len(payload)
    return size


def stored_attributes(attributes: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """SQS attributes as vsqs ones: String as is, the other types' names in sqs.types."""
    stored = {name: value.get("StringValue", value.get("BinaryValue", "")) for name, value in attributes.items()}
    types = {name: value["DataType"] for name, value in attributes.items() if value["DataType"] != "String"}
    if types:
        stored[TYPES_ATTRIBUTE] = json.dumps(types, sort_keys=True, separators=(",", ":"))
    return stored


def sqs_attributes(stored: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """vsqs attributes as SQS ones (hidden sqs.* ones left out)."""
    try:
        types = load_json(stored.get(TYPES_ATTRIBUTE) or "{}")
    except ValueError:  # (a message published by another client: its values are Strings)
        types = {}
    if not isinstance(types, dict):
        types = {}
    out: dict[str, dict[str, str]] = {}
    for name, value in stored.items():
        if name.startswith(RESERVED_PREFIX):
            continue
        data_type = types.get(name)
        if not isinstance(data_type, str) or not _DATA_TYPE_RE.fullmatch(data_type):
            data_type = "String"
        if data_type.startswith("Binary"):
            try:
                base64.b64decode(value, validate=True)
                out[name] = {"DataType": data_type, "BinaryValue": value}
                continue
            except (binascii.Error, ValueError):
                data_type = "String"
        out[name] = {"DataType": data_type, "StringValue": value}
    return out


def selected(attributes: dict[str, dict[str, str]], names: list[str]) -> dict[str, dict[str, str]]:
    """MessageAttributeNames as Amazon reads them: ``All`` (in any case), ``*`` or
    ``.*`` are every attribute, ``prefix.*`` those whose names start with
    ``prefix`` (``Hel.*``: ``Hello`` and ``Help.Me``), else exact names."""
    if wants_all(names) or "*" in names or ".*" in names:
        return attributes
    prefixes = tuple(name[:-2] for name in names if name.endswith(".*"))
    exact = set(names)
    return {name: value for name, value in attributes.items()
            if name in exact or (prefixes and name.startswith(prefixes))}
