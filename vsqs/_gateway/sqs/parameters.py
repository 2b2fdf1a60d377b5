"""Reading and checking the parameters of an SQS request: typed readers,
queue names and URLs, batch entries. Each failure is the :class:`SqsError`
an SQS client expects."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from vsqs import InvalidArgument
from vsqs._core.rules import check_queue_name
from vsqs._gateway.limits import MAX_BATCH, MAX_SQS_QUEUE_NAME
from vsqs._gateway.regions import is_region
from vsqs._gateway.sqs.protocol import (
    REGION_PATH_PREFIX,
    SqsError,
    invalid_parameter_value,
    missing,
    no_such_queue,
)

FIFO_SUFFIX = ".fifo"
# Amazon's wording for a bad queue name (InvalidParameterValue)
STANDARD_NAME_RULE = "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
FIFO_NAME_RULE = ("The name of a FIFO queue can only include alphanumeric characters, hyphens, or underscores, "
                  "must end with .fifo suffix and be 1 to 80 in length.")

# Amazon's two wordings of a number out of its range (InvalidParameterValue, "Reason: ...")
BETWEEN = "Must be between {low} and {high}, if provided."  # MaxNumberOfMessages, and the rest
BOUNDS = "Must be >= {low} and <= {high}, if provided."  # WaitTimeSeconds

_SQS_NAME_RE = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_SQS_QUEUE_NAME}}}")
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")


def string(params: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = params.get(key)
    if value is None:
        if required:
            raise missing(key)
        return None
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"{key} must be a string, not {type(value).__name__}.")
    return value


def required_string(params: Mapping[str, Any], key: str) -> str:
    value = string(params, key, required=True)
    assert value is not None
    return value


def integer(params: Mapping[str, Any], key: str, low: int, high: int, wording: str = BETWEEN) -> int | None:
    """``params[key]``, a whole number ``low``-``high``, else None; ``wording``
    (:data:`BETWEEN`, :data:`BOUNDS`) is the reason Amazon gives for that parameter."""
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise invalid_parameter_value(key, str(value)[:40], wording.format(low=low, high=high))
    return value


def string_list(params: Mapping[str, Any], key: str) -> list[str]:
    value = params.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SqsError("InvalidParameterValue", f"{key} must be a list of strings.")
    return value


def string_map(params: Mapping[str, Any], key: str) -> dict[str, str]:
    value = params.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SqsError("InvalidParameterValue", f"{key} must be a map of strings to strings.")
    return value


# -- queue names ------------------------------------------------------------------


def queue_name_of_url(params: Mapping[str, Any]) -> str:
    """The queue QueueUrl names: the last segment of ``scheme://host/ACCOUNT/NAME``
    (or of any path of two or more segments), or a bare queue name, as Amazon
    accepts. Anything that names no valid queue is QueueDoesNotExist."""
    url = required_string(params, "QueueUrl")
    if "/" in url:
        try:
            parts = urlsplit(url)
        except ValueError:
            raise no_such_queue() from None
        segments = parts.path.strip("/").split("/")
        if len(segments) < 2 or not _ACCOUNT_RE.fullmatch(segments[-2]):
            raise no_such_queue()
        url = segments[-1]
    try:
        return check_queue_name(url)
    except InvalidArgument:
        raise no_such_queue() from None


def queue_url_region(url: str) -> str | None:
    """The region a queue URL's path names, ``/queue/REGION/ACCOUNT/NAME`` (the form of
    a region other than the home one, :meth:`.call.Call.url_of`); None if its path has
    no such segment. QueueDoesNotExist if that segment is not a region name."""
    if "/" not in url:
        return None
    try:
        segments = urlsplit(url).path.strip("/").split("/")
    except ValueError:
        return None  # (queue_name_of_url answers it)
    if len(segments) != 4 or segments[0] != REGION_PATH_PREFIX:
        return None
    if not is_region(segments[1]):
        raise no_such_queue()
    return segments[1]


def sqs_queue_name(params: Mapping[str, Any]) -> str:
    """QueueName of CreateQueue: SQS's rule (1-80 of A-Za-z0-9_- plus .fifo)."""
    name = required_string(params, "QueueName")
    base = name.removesuffix(FIFO_SUFFIX)
    if not _SQS_NAME_RE.fullmatch(base) or len(name) > MAX_SQS_QUEUE_NAME:
        raise SqsError("InvalidParameterValue", FIFO_NAME_RULE if is_fifo(name) else STANDARD_NAME_RULE)
    return name


def existing_queue_name(params: Mapping[str, Any]) -> str:
    """QueueName of GetQueueUrl: any vsqs queue name."""
    name = required_string(params, "QueueName")
    try:
        return check_queue_name(name)
    except InvalidArgument as exc:
        raise SqsError("InvalidParameterValue", str(exc)) from None


def is_fifo(name: str) -> bool:
    return name.endswith(FIFO_SUFFIX)


# -- batches ----------------------------------------------------------------------


def batch_entries(params: Mapping[str, Any], action: str = "") -> list[dict[str, Any]]:
    """Entries of a batch request, checked as SQS does (count, ids, distinct ids);
    ``action`` (``SendMessageBatch``...) names the entries in Amazon's wording."""
    entries = params.get("Entries")
    if entries is None:
        raise missing("Entries")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of objects.")
    if not entries:
        raise SqsError("EmptyBatchRequest", f"There should be at least one {action}RequestEntry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.")
    ids = [entry.get("Id") for entry in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _BATCH_ID_RE.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain alphanumeric characters, "
                           "hyphens and underscores. It can be at most 80 letters long.")
    repeated = next((entry_id for index, entry_id in enumerate(ids) if entry_id in ids[:index]), None)
    if repeated is not None:
        raise SqsError("BatchEntryIdsNotDistinct", f"Id {repeated} repeated.")
    return entries
