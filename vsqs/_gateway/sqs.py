"""The Amazon SQS face of the gateway: the AWS JSON 1.0 protocol on ``POST /``.

An unmodified SQS client (boto3, the ``aws sqs`` command, any SDK that speaks
JSON 1.0) pointed at the gateway's URL works on the spool's queues, beside
library and CLI users of the same spool. Every action turns into calls of
the public vsqs API; file I/O runs on the gateway's thread pool.

Protocol. A request is ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>``
and a JSON body; an answer is JSON (``application/x-amz-json-1.0``) with an
``x-amzn-RequestId`` header. An error is HTTP 400 (403 for a refused
signature, 500/503 for the gateway's own trouble) with the body
``{"__type": "com.amazonaws.sqs#<Name>", "message": ...}`` and the header
``x-amzn-query-error: <query code>;Sender`` (``Receiver`` for 5xx): botocore maps that pair to
``client.exceptions.<Name>`` (``QueueDoesNotExist`` for
``AWS.SimpleQueueService.NonExistentQueue``, ``QueueNameExists`` for
``QueueAlreadyExists``, ...). Unmodelled codes (``InvalidParameterValue``,
``MissingParameter``, ...) come back as a ``ClientError`` with that code.

Actions: CreateQueue, GetQueueUrl, ListQueues, DeleteQueue,
GetQueueAttributes, SetQueueAttributes, SendMessage(Batch), ReceiveMessage,
DeleteMessage(Batch), ChangeMessageVisibility(Batch), PurgeQueue. Others
answer ``UnsupportedOperation``; an unknown target ``UnknownOperationException``.

Decisions (beyond SQS's own rules):

- Auth: SigV4 against the configured key pairs (``_sigv4``). With none but
  an API key, SigV4 with the API key as the secret and any access key id (a
  key closes both faces); with neither, every request is accepted, signed or
  not. The region in the
  signature's scope is not checked (it only names the key derivation).
- Queue URL ``{scheme}://{Host}/{account_id}/{name}``. A QueueUrl is
  accepted with any host and account; its last segment is the queue name.
  CreateQueue takes only SQS names (1-80 of ``A-Za-z0-9_-``, plus ``.fifo``);
  an existing queue may be addressed by any vsqs name (``jobs.dlq``), which
  never contains ``/`` or ``..``. A bad name or URL touches no file.
- FIFO: a queue is FIFO iff its name ends in ``.fifo`` (CreateQueue wants
  ``FifoQueue=true`` with the suffix and the suffix with it). A new FIFO
  queue gets ``dedup_window=300`` and ``group_concurrency=1``. Sends need a
  MessageGroupId, refuse a non-zero per-message DelaySeconds, and need a
  MessageDeduplicationId unless ContentBasedDeduplication is on.
  vsqs de-duplicates per message group, so DeduplicationScope is
  ``messageGroup`` (``queue`` is refused: vsqs cannot honour it) and
  FifoThroughputLimit ``perQueue`` (vsqs has no throughput limit). A dedup id
  is held while its message is in the queue and 300 s after it is gone
  (SQS: 300 s after the send). MessageGroupId on a standard queue also
  becomes a vsqs group, so that group is delivered in order, one in flight.
- Queue attributes map to settings: VisibilityTimeout, DelaySeconds,
  MessageRetentionPeriod (``retention``: reported only when set; vsqs keeps
  messages for ever by default, and only ``vsqs gc`` enforces it),
  MaximumMessageSize (the setting, else the gateway's limit),
  ReceiveMessageWaitTimeSeconds, RedrivePolicy (``dead_letter`` and
  ``max_receives``; the target must be an existing queue of the spool of the
  same type), ContentBasedDeduplication. Read-only: the three message counts
  (one listing), QueueArn, FifoQueue. CreatedTimestamp, LastModifiedTimestamp,
  Policy, KMS and RedriveAllowPolicy are not reported (no public API holds
  them); setting them is refused. Fractional settings made by the library
  are reported as decimals. CreateQueue ``tags`` are ignored.
- Message attributes: ``String`` ones are plain vsqs attributes (library
  users see them as they are, and library attributes come back as String).
  Other types keep their value as text (Binary as base64) and their type in
  the hidden vsqs attribute ``sqs.types`` (JSON name -> DataType).
  MessageDeduplicationId and AWSTraceHeader are kept in ``sqs.dedup_id`` and
  ``sqs.trace``. Attributes named ``sqs.*`` are never shown to SQS clients
  and refused from them. Message size = body + attribute names, types and
  values, as SQS counts it.
- Bodies are UTF-8 text. A body published by the library that is not UTF-8
  is delivered with U+FFFD for each bad byte; MD5OfBody is that of what is
  sent. SQS's character rule applies to sends (InvalidMessageContents).
- Receive: MessageId is the vsqs id, ReceiptHandle the vsqs receipt.
  System attributes: SenderId (the gateway's account id), SentTimestamp,
  ApproximateReceiveCount, MessageGroupId, MessageDeduplicationId (as sent,
  or the body's SHA-256 on a content-deduplicated queue), AWSTraceHeader.
  ApproximateFirstReceiveTimestamp, SequenceNumber and
  DeadLetterQueueSourceArn are not reported. ReceiveRequestAttemptId is
  ignored.
- Receipts: vsqs gives a message a new receipt when its visibility changes,
  SQS keeps the handle. The gateway remembers, per process and in memory,
  handle -> current receipt after a ChangeMessageVisibility; a handle changed
  through another gateway process is followed with
  :meth:`vsqs.Queue.current_receipt` (one listing: the same message, the same
  receive count, still in flight). So a client that extends and then deletes
  with its first handle deletes the message, whichever gateway it talks to.
- Stale receipts: DeleteMessage with a receipt that no longer holds its
  message succeeds without deleting (SQS's documented behaviour; the
  metrics outcome is ``stale``); ChangeMessageVisibility answers
  ``MessageNotInflight``. A malformed or foreign receipt is
  ``ReceiptHandleIsInvalid``.
- vsqs errors: QueueNotFound -> QueueDoesNotExist, QueueFull -> OverLimit,
  MessageTooLarge -> InvalidParameterValue, InvalidArgument ->
  InvalidParameterValue (InvalidAttributeValue for attributes),
  QueueSuspended -> 503 ``ServiceUnavailable`` (SDKs retry it with backoff),
  StorageError -> 500 ``InternalError`` if the disk is full, else 503
  ``ServiceUnavailable``; IncompatibleFormat -> UnsupportedOperation.
- PurgeQueue purges at once (no 60 s PurgeQueueInProgress window).
- A request over the gateway's size cap is refused by the gateway's
  middleware before it reaches this module (:func:`request_too_large` gives
  the SQS-shaped answer for it).
- Metrics: operation ``sqs.<Action>`` (``sqs.unknown`` for anything else),
  outcome ``ok``, ``stale``, ``partial`` (a batch with failed entries) or
  the error's name.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import logging
import re
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import Response

from vsqs._gateway import sigv4 as _sigv4
from vsqs._core.errors import (
    IncompatibleFormat,
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    QueueSuspended,
    StaleReceipt,
    StorageError,
    VsqsError,
)
from vsqs._gateway.app import MAX_WAIT, Gateway, gateway_of, without_paths
from vsqs._core.message import Message, Outgoing
from vsqs._core.queue import Queue
from vsqs._core.rules import check_queue_name

T = TypeVar("T")

log = logging.getLogger("vsqs.gateway.sqs")

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
TYPES_ATTRIBUTE = "sqs.types"  # JSON {name: DataType} of the attributes that are not String
DEDUP_ATTRIBUTE = "sqs.dedup_id"
TRACE_ATTRIBUTE = "sqs.trace"
RESERVED_PREFIX = "sqs."
FIFO_SUFFIX = ".fifo"
FIFO_DEDUP_WINDOW = 300.0  # SQS's five minutes
MAX_WAIT_SECONDS = int(MAX_WAIT)
MAX_BATCH = 10  # entries per batch request, and messages per receive: SQS's limit
MAX_VISIBILITY_TIMEOUT = 43200
MAX_DELAY_SECONDS = 900
MAX_MESSAGE_ATTRIBUTES = 10
DEFAULT_LIST_LIMIT = 1000

_SQS_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ACCOUNT_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
_ID_CHARS_RE = re.compile(r"[!-~]{1,128}")  # group and dedup ids: printable ASCII, no space
_ATTRIBUTE_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE_RE = re.compile(r"(String|Number|Binary)(\.[A-Za-z0-9_.-]+)?")
_NUMBER_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")
_BAD_TEXT_RE = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

# SQS error name -> (query error code, HTTP status); botocore raises client.exceptions.<name>
_ERRORS: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 400),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "InvalidAddress": ("InvalidAddress", 400),
    "OverLimit": ("OverLimit", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "UnknownOperationException": ("UnknownOperationException", 400),
    "SerializationException": ("SerializationException", 400),
    "InternalError": ("InternalError", 500),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
}


# errors of the AWS request framework rather than of SQS (their __type namespace differs)
_FRAMEWORK_ERRORS = frozenset({"MissingAuthenticationToken", "IncompleteSignature", "InvalidClientTokenId",
                               "SignatureDoesNotMatch", "RequestExpired", "UnknownOperationException",
                               "SerializationException"})


class SqsError(Exception):
    """An SQS error answer; ``name`` is the error's shape name (or its code when
    botocore has no class for it), ``status`` None takes the table's."""

    def __init__(self, name: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        query_code, default_status = _ERRORS.get(name, (name, 400))
        self.name, self.message, self.query_code = name, message, query_code
        self.status = default_status if status is None else status

    @property
    def fault(self) -> str:
        return "Receiver" if self.status >= 500 else "Sender"


def error_response(error: SqsError, request_id: str | None = None) -> Response:
    """The JSON 1.0 error answer botocore turns into ``client.exceptions.<name>``."""
    namespace = "com.amazon.coral.service" if error.name in _FRAMEWORK_ERRORS else "com.amazonaws.sqs"
    body = json.dumps({"__type": f"{namespace}#{error.name}", "message": error.message})
    headers = {"x-amzn-RequestId": request_id or str(uuid.uuid4()),
               "x-amzn-query-error": f"{error.query_code};{error.fault}"}
    if error.status == 503:
        headers["Retry-After"] = "5"
    return Response(body, status_code=error.status, media_type=CONTENT_TYPE, headers=headers)


def request_too_large(limit: int) -> Response:
    """The SQS-shaped answer to a request over the gateway's size cap (HTTP 413)."""
    return error_response(SqsError("InvalidParameterValue", f"The request body is over {limit} bytes.", 413))


def sqs_error_of(exc: VsqsError, spool_root: str | None = None) -> SqsError:
    """The one translation of vsqs errors for the SQS face; paths inside
    ``spool_root`` are shown relative to it (clients see queue names, not paths)."""
    text = without_paths(str(exc), spool_root) if spool_root else str(exc)
    if isinstance(exc, QueueNotFound):
        return SqsError("QueueDoesNotExist", f"The specified queue does not exist: {text}")
    if isinstance(exc, InvalidReceipt):
        return SqsError("ReceiptHandleIsInvalid", f"The receipt handle is not valid: {text}")
    if isinstance(exc, StaleReceipt):
        return SqsError("MessageNotInflight", f"The message is not in flight with this receipt: {text}")
    if isinstance(exc, MessageTooLarge):
        return SqsError("InvalidParameterValue", f"The message is over MaximumMessageSize: {text}")
    if isinstance(exc, QueueFull):
        return SqsError("OverLimit", text)
    if isinstance(exc, QueueSuspended):
        return SqsError("ServiceUnavailable", text)
    if isinstance(exc, InvalidArgument):
        return SqsError("InvalidParameterValue", text)
    if isinstance(exc, IncompatibleFormat):
        return SqsError("UnsupportedOperation", text)
    if isinstance(exc, StorageError) and exc.errno != errno.ENOSPC:
        return SqsError("ServiceUnavailable", f"storage error, try again: {text}")
    return SqsError("InternalError", text)


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


# -- handles whose receipt changed (ChangeMessageVisibility) -----------------------


class ReceiptAliases:
    """SQS keeps a receipt handle across ChangeMessageVisibility; vsqs renames
    the message and hands out a new receipt. This maps a handle a client holds
    to its message's current receipt, in this process (bounded, oldest dropped)."""

    def __init__(self, capacity: int = 65536) -> None:
        self._current: OrderedDict[str, str] = OrderedDict()
        self._capacity = capacity

    def current(self, handle: str) -> str:
        return self._current.get(handle, handle)

    def moved(self, handle: str, receipt: str) -> None:
        self._current[handle] = receipt
        self._current.move_to_end(handle)
        while len(self._current) > self._capacity:
            self._current.popitem(last=False)

    def settled(self, handle: str) -> None:
        self._current.pop(handle, None)

    def follow(self, queue: Queue, handle: str, action: Callable[[str], T]) -> T:
        """``action(receipt)`` on the receipt that holds ``handle``'s message now
        (blocking: call it on the thread pool). This process's memory answers
        first; if the message moved elsewhere (another gateway, another worker),
        :meth:`vsqs.Queue.current_receipt` finds it with one listing."""
        receipt = self.current(handle)
        try:
            return action(receipt)
        except StaleReceipt:
            current = queue.current_receipt(handle)  # StaleReceipt again if it is gone
            if current == receipt:
                raise
            return action(current)


def _outcome_of(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the vsqs error it raised (a batch entry's outcome)."""
    try:
        return fn(*args)
    except (StaleReceipt, InvalidReceipt, InvalidArgument) as exc:
        return exc


# -- a request ------------------------------------------------------------------------


@dataclass
class _Call:
    """One SQS request being answered."""

    gateway: Gateway
    request: Request
    params: dict[str, Any]
    aliases: ReceiptAliases
    queue_name: str | None = None
    outcome: str = "ok"

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await self.gateway.call(fn, *args, **kwargs)

    async def queue(self) -> Queue:
        """The queue named by QueueUrl (the handle is opened on the thread pool)."""
        name = self.queue_name or _queue_name_of_url(self.params)
        self.queue_name = name
        return await self.run(self.gateway.queue, name)

    def url_of(self, name: str) -> str:
        host = self.request.headers.get("host") or self.request.url.netloc
        return f"{self.request.url.scheme}://{host}/{self.gateway.config.account_id}/{name}"

    def arn_of(self, name: str) -> str:
        config = self.gateway.config
        return f"arn:aws:sqs:{config.region}:{config.account_id}:{name}"

    async def settings(self, queue: Queue) -> dict[str, Any]:
        """The queue's settings (read on the thread pool: they may come from disk)."""
        return await self.run(lambda: dict(queue.settings))

    def message_limit(self, settings: Mapping[str, Any]) -> int:
        return int(settings["max_message_bytes"] or self.gateway.config.max_message_bytes)


# -- parameters -------------------------------------------------------------------


def _string(params: Mapping[str, Any], key: str, *, required: bool = False) -> str | None:
    value = params.get(key)
    if value is None:
        if required:
            raise SqsError("MissingParameter", f"The request must contain the parameter {key}.")
        return None
    if not isinstance(value, str):
        raise SqsError("InvalidParameterValue", f"{key} must be a string, not {type(value).__name__}.")
    return value


def _required_string(params: Mapping[str, Any], key: str) -> str:
    value = _string(params, key, required=True)
    assert value is not None
    return value


def _integer(params: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SqsError("InvalidParameterValue",
                       f"Value {value!r} for parameter {key} is invalid: it must be an integer {low}..{high}.")
    return value


def _string_list(params: Mapping[str, Any], key: str) -> list[str]:
    value = params.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SqsError("InvalidParameterValue", f"{key} must be a list of strings.")
    return value


def _string_map(params: Mapping[str, Any], key: str) -> dict[str, str]:
    value = params.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SqsError("InvalidParameterValue", f"{key} must be a map of strings to strings.")
    return value


def _queue_name_of_url(params: Mapping[str, Any]) -> str:
    """The queue name in QueueUrl (``.../ACCOUNT/NAME``); InvalidAddress if there is none."""
    url = _required_string(params, "QueueUrl")
    try:
        parts = urlsplit(url)
    except ValueError:
        parts = None
    segments = parts.path.strip("/").split("/") if parts is not None and parts.scheme and parts.netloc else []
    if len(segments) != 2 or not _ACCOUNT_RE.fullmatch(segments[0]):
        raise SqsError("InvalidAddress", f"The address {url[:200]!r} is not a queue URL "
                       "(scheme://host/ACCOUNT/QUEUE_NAME).")
    try:
        return check_queue_name(segments[1])
    except InvalidArgument as exc:
        raise SqsError("InvalidAddress", f"The address {url[:200]!r} names no valid queue: {exc}") from None


def _sqs_queue_name(params: Mapping[str, Any]) -> str:
    """QueueName of CreateQueue: SQS's rule (1-80 of A-Za-z0-9_- plus .fifo)."""
    name = _required_string(params, "QueueName")
    base = name.removesuffix(FIFO_SUFFIX)
    if not _SQS_NAME_RE.fullmatch(base) or len(name) > 80:
        raise SqsError("InvalidParameterValue",
                       f"Queue name {name[:100]!r} is invalid: use 1-80 characters of A-Z a-z 0-9 _ - "
                       "(a FIFO queue's name ends in .fifo, within the 80).")
    return name


def _existing_queue_name(params: Mapping[str, Any]) -> str:
    """QueueName of GetQueueUrl: any vsqs queue name."""
    name = _required_string(params, "QueueName")
    try:
        return check_queue_name(name)
    except InvalidArgument as exc:
        raise SqsError("InvalidParameterValue", str(exc)) from None


def _is_fifo(name: str) -> bool:
    return name.endswith(FIFO_SUFFIX)


# -- queue attributes <-> settings ------------------------------------------------

# attribute -> (setting, lowest, highest) for the whole-number ones
_NUMERIC_ATTRIBUTES: dict[str, tuple[str, int, int]] = {
    "VisibilityTimeout": ("visibility_timeout", 0, MAX_VISIBILITY_TIMEOUT),
    "DelaySeconds": ("delay", 0, MAX_DELAY_SECONDS),
    "MessageRetentionPeriod": ("retention", 60, 1_209_600),
    "MaximumMessageSize": ("max_message_bytes", 1024, 1_048_576),
    "ReceiveMessageWaitTimeSeconds": ("receive_wait", 0, MAX_WAIT_SECONDS),
}
_FIFO_ATTRIBUTES = frozenset({"FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit"})
_FIXED_VALUES = {"DeduplicationScope": "messageGroup", "FifoThroughputLimit": "perQueue"}
_READ_ONLY = frozenset({"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
                        "ApproximateNumberOfMessagesDelayed", "QueueArn", "CreatedTimestamp",
                        "LastModifiedTimestamp"})
_UNSUPPORTED = frozenset({"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "RedriveAllowPolicy",
                          "SqsManagedSseEnabled"})
_QUEUE_ATTRIBUTE_NAMES = frozenset({"All", "RedrivePolicy", *_NUMERIC_ATTRIBUTES, *_FIFO_ATTRIBUTES,
                                    *_READ_ONLY, *_UNSUPPORTED})


def _invalid_value(name: str, why: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}: {why}")


def _settings_of(attributes: Mapping[str, str], queue_name: str) -> dict[str, Any]:
    """vsqs settings for SQS queue attributes (checked here; RedrivePolicy's
    target is checked against the spool by the caller)."""
    fifo = _is_fifo(queue_name)
    settings: dict[str, Any] = {}
    for name, text in attributes.items():
        if name in _NUMERIC_ATTRIBUTES:
            setting, low, high = _NUMERIC_ATTRIBUTES[name]
            if not re.fullmatch(r"[0-9]{1,12}", text) or not low <= int(text) <= high:
                raise _invalid_value(name, f"{text[:40]!r} is not a whole number {low}..{high}.")
            settings[setting] = int(text)
        elif name == "RedrivePolicy":
            settings.update(_redrive_settings(text, queue_name))
        elif name in _FIFO_ATTRIBUTES and not fifo:
            raise SqsError("InvalidAttributeName", f"{name} applies only to FIFO queues (names ending in .fifo).")
        elif name == "FifoQueue":
            if text.lower() != "true":
                raise _invalid_value(name, "a queue named *.fifo is a FIFO queue; FifoQueue must be true.")
        elif name == "ContentBasedDeduplication":
            if text.lower() not in ("true", "false"):
                raise _invalid_value(name, f"{text[:40]!r} is not true or false.")
            settings["content_dedup"] = text.lower() == "true"
        elif name in _FIXED_VALUES:
            if text != _FIXED_VALUES[name]:
                raise _invalid_value(name, f"vsqs supports only {_FIXED_VALUES[name]!r}, not {text[:40]!r} "
                                     "(it de-duplicates within a message group and has no throughput limit).")
        elif name in _READ_ONLY:
            raise SqsError("InvalidAttributeName", f"{name} is read-only.")
        elif name in _UNSUPPORTED:
            raise SqsError("InvalidAttributeName", f"{name} is not supported by vsqs.")
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name[:100]}.")
    return settings


def _redrive_settings(text: str, queue_name: str) -> dict[str, Any]:
    """``{"deadLetterTargetArn": ARN, "maxReceiveCount": N}`` -> dead_letter, max_receives ("" removes)."""
    if text == "":
        return {"dead_letter": None, "max_receives": None}
    try:
        policy = json.loads(text)
    except ValueError:
        raise _invalid_value("RedrivePolicy", "it is not JSON.") from None
    if not isinstance(policy, dict) or set(policy) != {"deadLetterTargetArn", "maxReceiveCount"}:
        raise _invalid_value("RedrivePolicy", "it must be a JSON object with exactly deadLetterTargetArn "
                             "and maxReceiveCount.")
    count = policy["maxReceiveCount"]
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
        raise _invalid_value("RedrivePolicy", "maxReceiveCount must be a whole number 1..1000.")
    arn = policy["deadLetterTargetArn"]
    parts = arn.split(":") if isinstance(arn, str) else []
    if len(parts) != 6 or parts[0] != "arn" or parts[2] != "sqs":
        raise _invalid_value("RedrivePolicy", "deadLetterTargetArn must be arn:aws:sqs:REGION:ACCOUNT:QUEUE.")
    try:
        target = check_queue_name(parts[5])
    except InvalidArgument as exc:
        raise _invalid_value("RedrivePolicy", str(exc)) from None
    if target == queue_name:
        raise _invalid_value("RedrivePolicy", "a queue cannot be its own dead-letter queue.")
    if _is_fifo(target) != _is_fifo(queue_name):
        raise _invalid_value("RedrivePolicy", "the dead-letter queue must be of the same type (FIFO or standard).")
    return {"dead_letter": target, "max_receives": count}


def _check_dead_letter_exists(spool_queues: Iterable[str], settings: Mapping[str, Any]) -> None:
    target = settings.get("dead_letter")
    if target is not None and target not in spool_queues:
        raise _invalid_value("RedrivePolicy", f"the dead-letter target queue {target!r} does not exist.")


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _attributes_of(call: _Call, queue: Queue, name: str, wanted: set[str]) -> dict[str, str]:
    """The queue attributes asked for (blocking: reads settings, lists the queue for counts)."""
    settings = queue.settings
    everything = "All" in wanted
    out: dict[str, str] = {}

    def want(attribute: str) -> bool:
        return everything or attribute in wanted

    for attribute, (setting, _, _) in _NUMERIC_ATTRIBUTES.items():
        if want(attribute):
            value = settings[setting]
            if attribute == "MaximumMessageSize":
                value = call.message_limit(settings)
            if value is not None:
                out[attribute] = _number_text(value)
    if want("RedrivePolicy") and settings["max_receives"] is not None:
        target = settings["dead_letter"] or f"{name}.dlq"
        if target.startswith("/"):
            target = target.rsplit("/", 1)[-1]
        out["RedrivePolicy"] = json.dumps({"deadLetterTargetArn": call.arn_of(target),
                                           "maxReceiveCount": settings["max_receives"]}, separators=(",", ":"))
    if want("QueueArn"):
        out["QueueArn"] = call.arn_of(name)
    counts = {"ApproximateNumberOfMessages": "ready", "ApproximateNumberOfMessagesNotVisible": "in_flight",
              "ApproximateNumberOfMessagesDelayed": "delayed"}
    if any(want(attribute) for attribute in counts):
        stats = queue.stats()
        for attribute, state in counts.items():
            if want(attribute):
                out[attribute] = str(getattr(stats, state))
    if _is_fifo(name):
        if want("FifoQueue"):
            out["FifoQueue"] = "true"
        if want("ContentBasedDeduplication"):
            out["ContentBasedDeduplication"] = "true" if settings["content_dedup"] else "false"
        for attribute, value in _FIXED_VALUES.items():
            if want(attribute):
                out[attribute] = value
    return out


# -- message attributes -----------------------------------------------------------


def _check_text(what: str, text: str) -> None:
    bad = _BAD_TEXT_RE.search(text)
    if bad is not None:
        raise SqsError("InvalidMessageContents",
                       f"{what} contains the character U+{ord(bad.group()):04X}, which SQS does not allow.")


def _message_attributes(value: object, where: str = "MessageAttributes") -> dict[str, dict[str, str]]:
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
        if (not _ATTRIBUTE_NAME_RE.fullmatch(name) or name.startswith(".") or name.endswith(".")
                or ".." in name or name.lower().startswith(("aws.", "amazon.", RESERVED_PREFIX))):
            raise SqsError("InvalidParameterValue",
                           f"Message attribute name {name[:100]!r} is invalid: 1-256 of A-Z a-z 0-9 _ - ., "
                           "not starting or ending with '.', no '..', not starting with AWS., Amazon. or sqs.")
        if not isinstance(attribute, dict) or not isinstance(attribute.get("DataType"), str):
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r} must have a DataType.")
        data_type = attribute["DataType"]
        if not _DATA_TYPE_RE.fullmatch(data_type) or len(data_type) > 256:
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r} has an invalid DataType "
                           f"{data_type[:100]!r}: String, Number or Binary, optionally .custom.")
        if attribute.get("StringListValues") or attribute.get("BinaryListValues"):
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r}: list values are not supported.")
        if data_type.startswith("Binary"):
            raw = attribute.get("BinaryValue")
            try:
                data = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
            except (binascii.Error, ValueError):
                data = None
            if not data:
                raise SqsError("InvalidParameterValue",
                               f"Message attribute {name!r} of type {data_type} needs a BinaryValue (base64).")
            clean[name] = {"DataType": data_type, "BinaryValue": base64.b64encode(data).decode("ascii")}
            continue
        text = attribute.get("StringValue")
        if not isinstance(text, str) or not text:
            raise SqsError("InvalidParameterValue",
                           f"Message attribute {name!r} of type {data_type} needs a non-empty StringValue.")
        _check_text(f"Message attribute {name!r}", text)
        if data_type.startswith("Number") and not _NUMBER_RE.fullmatch(text):
            raise SqsError("InvalidParameterValue", f"Message attribute {name!r}: {text[:40]!r} is not a number.")
        clean[name] = {"DataType": data_type, "StringValue": text}
    return clean


def _attributes_size(attributes: Mapping[str, Mapping[str, str]]) -> int:
    """Bytes SQS counts for attributes: names, types and values."""
    size = 0
    for name, value in attributes.items():
        payload = base64.b64decode(value["BinaryValue"]) if "BinaryValue" in value else value["StringValue"].encode()
        size += len(name.encode()) + len(value["DataType"].encode()) + len(payload)
    return size


def _stored_attributes(attributes: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """SQS attributes as vsqs ones: String as is, the other types' names in sqs.types."""
    stored = {name: value.get("StringValue", value.get("BinaryValue", "")) for name, value in attributes.items()}
    types = {name: value["DataType"] for name, value in attributes.items() if value["DataType"] != "String"}
    if types:
        stored[TYPES_ATTRIBUTE] = json.dumps(types, sort_keys=True, separators=(",", ":"))
    return stored


def _sqs_attributes(stored: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """vsqs attributes as SQS ones (hidden sqs.* ones left out)."""
    try:
        types = json.loads(stored.get(TYPES_ATTRIBUTE) or "{}")
    except ValueError:
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


def _selected(attributes: dict[str, dict[str, str]], names: list[str]) -> dict[str, dict[str, str]]:
    """MessageAttributeNames: All, .*, prefix.* or exact names."""
    if "All" in names or ".*" in names:
        return attributes
    prefixes = tuple(name[:-1] for name in names if name.endswith(".*"))
    exact = set(names)
    return {name: value for name, value in attributes.items()
            if name in exact or (prefixes and name.startswith(prefixes))}


# -- sending ----------------------------------------------------------------------


@dataclass
class _Outgoing:
    """One checked message to send, with the digests of the answer."""

    body: str
    message: Outgoing
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None
    size: int  # bytes as SQS counts them: body and attributes


def _prepare(entry: Mapping[str, Any], queue_name: str, limit: int) -> _Outgoing:
    """Check one SendMessage (or batch entry) against SQS's rules and the queue's type."""
    body = _required_string(entry, "MessageBody")
    if not body:
        raise SqsError("MissingParameter", "The request must contain a non-empty MessageBody.")
    _check_text("MessageBody", body)
    fifo = _is_fifo(queue_name)
    delay = _integer(entry, "DelaySeconds", 0, MAX_DELAY_SECONDS)
    group = _string(entry, "MessageGroupId")
    dedup_id = _string(entry, "MessageDeduplicationId")
    for key, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup_id)):
        if value is not None and not _ID_CHARS_RE.fullmatch(value):
            raise SqsError("InvalidParameterValue",
                           f"{key} must be 1-128 printable ASCII characters without spaces.")
    if fifo:
        if group is None:
            raise SqsError("MissingParameter", "The request must contain the parameter MessageGroupId.")
        if delay:
            raise SqsError("InvalidParameterValue", "The request includes parameter DelaySeconds, which is not "
                           "valid for a FIFO queue: set DelaySeconds on the queue.")
    elif dedup_id is not None:
        raise SqsError("InvalidParameterValue",
                       "The request includes parameter MessageDeduplicationId, which is valid only for FIFO queues.")
    attributes = _message_attributes(entry.get("MessageAttributes"))
    system = _message_attributes(entry.get("MessageSystemAttributes"), "MessageSystemAttributes")
    if set(system) - {"AWSTraceHeader"} or any(v["DataType"] != "String" for v in system.values()):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes may hold only AWSTraceHeader (String).")
    size = len(body.encode("utf-8")) + _attributes_size(attributes)
    if size > limit:
        raise SqsError("InvalidParameterValue", f"The message is {size} bytes (body and attributes); "
                       f"MaximumMessageSize is {limit}.")
    stored = _stored_attributes(attributes)
    if dedup_id is not None:
        stored[DEDUP_ATTRIBUTE] = dedup_id
    if system:
        stored[TRACE_ATTRIBUTE] = system["AWSTraceHeader"]["StringValue"]
    message = Outgoing(body.encode("utf-8"), delay=None if delay is None else float(delay),
                       attributes=stored or None, group=group, dedup_id=dedup_id)
    return _Outgoing(body, message, md5_of_body(body), md5_of_attributes(attributes) if attributes else None,
                     md5_of_attributes(system) if system else None, size)


def _check_dedup(prepared: _Outgoing, queue_name: str, settings: Mapping[str, Any]) -> None:
    """A FIFO send needs a MessageDeduplicationId unless the queue de-duplicates by content."""
    if _is_fifo(queue_name) and prepared.message.dedup_id is None and not settings["content_dedup"]:
        raise SqsError("InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
                       "enabled or MessageDeduplicationId provided explicitly.")


def _send_result(message_id: str, prepared: _Outgoing) -> dict[str, Any]:
    result: dict[str, Any] = {"MessageId": message_id, "MD5OfMessageBody": prepared.md5_body}
    if prepared.md5_attributes:
        result["MD5OfMessageAttributes"] = prepared.md5_attributes
    if prepared.md5_system:
        result["MD5OfMessageSystemAttributes"] = prepared.md5_system
    return result


# -- receiving --------------------------------------------------------------------

_MESSAGE_SYSTEM_ATTRIBUTES = frozenset({"All", "SenderId", "SentTimestamp", "ApproximateReceiveCount",
                                        "ApproximateFirstReceiveTimestamp", "SequenceNumber",
                                        "MessageDeduplicationId", "MessageGroupId", "AWSTraceHeader",
                                        "DeadLetterQueueSourceArn"})


def _received(call: _Call, message: Message, fifo: bool, content_dedup: bool,
              system_names: set[str], attribute_names: list[str]) -> dict[str, Any]:
    body = message.body.decode("utf-8", errors="replace")
    stored = message.attributes
    out: dict[str, Any] = {"MessageId": message.id, "ReceiptHandle": message.receipt,
                           "MD5OfBody": md5_of_body(body), "Body": body}
    system: dict[str, str] = {}
    dedup_id = stored.get(DEDUP_ATTRIBUTE)
    if dedup_id is None and fifo and content_dedup:
        dedup_id = hashlib.sha256(message.body).hexdigest()
    candidates = {
        "SenderId": call.gateway.config.account_id,
        "SentTimestamp": str(int(message.sent_at * 1000)),
        "ApproximateReceiveCount": str(message.receive_count),
        "MessageGroupId": message.group,
        "MessageDeduplicationId": dedup_id,
        "AWSTraceHeader": stored.get(TRACE_ATTRIBUTE),
    }
    for name, value in candidates.items():
        if value is not None and ("All" in system_names or name in system_names):
            system[name] = value
    if system:
        out["Attributes"] = system
    attributes = _selected(_sqs_attributes(stored), attribute_names) if attribute_names else {}
    if attributes:
        out["MessageAttributes"] = attributes
        out["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
    return out


# -- batches ----------------------------------------------------------------------


def _batch_entries(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Entries of a batch request, checked as SQS does (count, ids, distinct ids)."""
    entries = params.get("Entries")
    if entries is None:
        raise SqsError("MissingParameter", "The request must contain the parameter Entries.")
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise SqsError("InvalidParameterValue", "Entries must be a list of objects.")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one entry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest",
                       f"Maximum number of entries per request are {MAX_BATCH}. You have sent {len(entries)}.")
    ids = [entry.get("Id") for entry in entries]
    for entry_id in ids:
        if not isinstance(entry_id, str) or not _BATCH_ID_RE.fullmatch(entry_id):
            raise SqsError("InvalidBatchEntryId", f"A batch entry id {str(entry_id)[:100]!r} is invalid: "
                           "use 1-80 characters of A-Z a-z 0-9 _ -.")
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries in the request have the same Id.")
    return entries


def _failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": error.status < 500, "Code": error.query_code, "Message": error.message}


def _batch_outcome(call: _Call, failed: list[Any], stale: bool = False) -> None:
    call.outcome = "partial" if failed else "stale" if stale else "ok"


# -- the actions -------------------------------------------------------------------


async def create_queue(call: _Call) -> dict[str, Any]:
    name = _sqs_queue_name(call.params)
    attributes = _string_map(call.params, "Attributes")
    fifo_flag = attributes.get("FifoQueue")
    if _is_fifo(name) and (fifo_flag or "").lower() != "true":
        raise SqsError("InvalidParameterValue", f"Queue name {name!r} ends in .fifo: create it with "
                       "Attributes FifoQueue=true (or choose a name without .fifo).")
    if not _is_fifo(name) and fifo_flag is not None:
        raise (_invalid_value("FifoQueue", "a FIFO queue's name must end in .fifo.")
               if fifo_flag.lower() == "true" else SqsError("InvalidAttributeName", "FifoQueue applies only to "
                                                             "FIFO queues (names ending in .fifo)."))
    settings = _settings_of(attributes, name)
    spool = call.gateway.spool

    def create() -> None:
        _check_dead_letter_exists(spool.queues(), settings)
        try:
            existing = spool.queue(name)
        except QueueNotFound:
            extra = {"dedup_window": FIFO_DEDUP_WINDOW, "group_concurrency": 1} if _is_fifo(name) else {}
            call.gateway.create_queue(name, **extra, **settings)
            return
        current = existing.settings
        differing = sorted(key for key, value in settings.items() if current[key] != value)
        if differing:
            raise SqsError("QueueNameExists", f"A queue named {name!r} already exists with different "
                           f"attributes ({', '.join(differing)}).")

    call.queue_name = name
    try:
        await call.run(create)
    except InvalidArgument as exc:
        raise SqsError("InvalidAttributeValue", str(exc)) from None
    call.gateway.forget(name)
    return {"QueueUrl": call.url_of(name)}


async def get_queue_url(call: _Call) -> dict[str, Any]:
    call.queue_name = _existing_queue_name(call.params)
    await call.queue()
    return {"QueueUrl": call.url_of(call.queue_name)}


async def list_queues(call: _Call) -> dict[str, Any]:
    prefix = _string(call.params, "QueueNamePrefix") or ""
    limit = _integer(call.params, "MaxResults", 1, 1000)
    token = _string(call.params, "NextToken")
    after = ""
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode("ascii")).decode("utf-8")
        except (ValueError, UnicodeError):
            raise SqsError("InvalidParameterValue", "NextToken is not one this gateway gave out.") from None
    names = [name for name in await call.run(call.gateway.spool.queues) if name.startswith(prefix) and name > after]
    shown = names[: limit or DEFAULT_LIST_LIMIT]
    result: dict[str, Any] = {}
    if shown:
        result["QueueUrls"] = [call.url_of(name) for name in shown]
    if limit is not None and len(names) > len(shown):
        result["NextToken"] = base64.urlsafe_b64encode(shown[-1].encode("utf-8")).decode("ascii")
    return result


async def delete_queue(call: _Call) -> dict[str, Any]:
    name = _queue_name_of_url(call.params)
    call.queue_name = name
    await call.run(call.gateway.spool.delete_queue, name)
    call.gateway.forget(name)
    return {}


async def get_queue_attributes(call: _Call) -> dict[str, Any]:
    wanted = set(_string_list(call.params, "AttributeNames"))
    unknown = sorted(wanted - _QUEUE_ATTRIBUTE_NAMES)
    if unknown:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0][:100]}.")
    queue = await call.queue()
    assert call.queue_name is not None
    attributes = await call.run(_attributes_of, call, queue, call.queue_name, wanted) if wanted else {}
    return {"Attributes": attributes} if attributes else {}


async def set_queue_attributes(call: _Call) -> dict[str, Any]:
    name = _queue_name_of_url(call.params)
    call.queue_name = name
    attributes = _string_map(call.params, "Attributes")
    if not attributes:
        raise SqsError("MissingParameter", "The request must contain the parameter Attributes.")
    settings = _settings_of(attributes, name)
    queue = await call.queue()

    def configure() -> None:
        _check_dead_letter_exists(call.gateway.spool.queues(), settings)
        if settings:
            queue.configure(**settings)

    try:
        await call.run(configure)
    except InvalidArgument as exc:
        raise SqsError("InvalidAttributeValue", str(exc)) from None
    return {}


async def send_message(call: _Call) -> dict[str, Any]:
    queue = await call.queue()
    name = call.queue_name
    assert name is not None
    settings = await call.settings(queue)
    prepared = _prepare(call.params, name, call.message_limit(settings))
    _check_dedup(prepared, name, settings)
    message_id = (await call.run(queue.publish_batch, [prepared.message]))[0]
    call.gateway.published(name)
    return _send_result(message_id, prepared)


async def send_message_batch(call: _Call) -> dict[str, Any]:
    queue = await call.queue()
    name = call.queue_name
    assert name is not None
    entries = _batch_entries(call.params)
    settings = await call.settings(queue)
    limit = call.message_limit(settings)
    failed: list[dict[str, Any]] = []
    ready: list[tuple[str, _Outgoing]] = []
    total = 0
    for entry in entries:
        try:
            prepared = _prepare(entry, name, limit)
            _check_dedup(prepared, name, settings)
            total += prepared.size
            ready.append((entry["Id"], prepared))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
            total += len(str(entry.get("MessageBody", "")).encode("utf-8", "replace"))  # SQS counts it too
    batch_limit = call.gateway.config.max_message_bytes  # SQS: a batch may be as large as one message can
    if total > batch_limit:
        raise SqsError("BatchRequestTooLong", f"The batch's messages are {total} bytes in all; "
                       f"at most {batch_limit} are allowed.")

    def send() -> list[str | SqsError]:
        messages = [prepared.message for _, prepared in ready]
        try:
            return list(queue.publish_batch(messages))
        except (InvalidArgument, MessageTooLarge):
            pass  # nothing was published: find the culprits one by one
        outcomes: list[str | SqsError] = []
        for message in messages:
            try:
                outcomes.append(queue.publish_batch([message])[0])
            except (InvalidArgument, MessageTooLarge) as exc:
                outcomes.append(sqs_error_of(exc))
        return outcomes

    successful: list[dict[str, Any]] = []
    if ready:
        for (entry_id, prepared), outcome in zip(ready, await call.run(send)):
            if isinstance(outcome, SqsError):
                failed.append(_failed(entry_id, outcome))
            else:
                successful.append({"Id": entry_id, **_send_result(outcome, prepared)})
        call.gateway.published(name, len(successful))
    _batch_outcome(call, failed)
    return {"Successful": successful, "Failed": failed}


async def receive_message(call: _Call) -> dict[str, Any]:
    params = call.params
    count = _integer(params, "MaxNumberOfMessages", 1, MAX_BATCH) or 1
    visibility = _integer(params, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
    wait = _integer(params, "WaitTimeSeconds", 0, MAX_WAIT_SECONDS)
    system_names = set(_string_list(params, "AttributeNames")) | set(_string_list(params, "MessageSystemAttributeNames"))
    unknown = sorted(system_names - _MESSAGE_SYSTEM_ATTRIBUTES - _QUEUE_ATTRIBUTE_NAMES)
    if unknown:
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {unknown[0][:100]}.")
    attribute_names = _string_list(params, "MessageAttributeNames")
    queue = await call.queue()
    name = call.queue_name
    assert name is not None
    settings = await call.settings(queue)
    messages = await call.gateway.receive(
        name, count, None if visibility is None else float(visibility),
        float(settings["receive_wait"] if wait is None else wait), call.request.is_disconnected,
    )
    fifo = _is_fifo(name)
    received = [_received(call, m, fifo, bool(settings["content_dedup"]), system_names, attribute_names)
                for m in messages]
    return {"Messages": received} if received else {}


async def delete_message(call: _Call) -> dict[str, Any]:
    handle = _required_string(call.params, "ReceiptHandle")
    queue = await call.queue()
    try:
        await call.run(call.aliases.follow, queue, handle, queue.delete)
    except StaleReceipt:
        log.debug("DeleteMessage with a stale receipt on %s: nothing deleted", call.queue_name)
        call.outcome = "stale"
    call.aliases.settled(handle)
    return {}


async def delete_message_batch(call: _Call) -> dict[str, Any]:
    queue = await call.queue()
    entries = _batch_entries(call.params)
    failed: list[dict[str, Any]] = []
    todo: list[tuple[str, str]] = []
    for entry in entries:
        handle = entry.get("ReceiptHandle")
        if not isinstance(handle, str):
            failed.append(_failed(entry["Id"], SqsError("MissingParameter", "ReceiptHandle is required.")))
        else:
            todo.append((entry["Id"], handle))
    outcomes = await call.run(lambda: [_outcome_of(call.aliases.follow, queue, handle, queue.delete)
                                       for _, handle in todo])
    successful: list[dict[str, Any]] = []
    stale = False
    for (entry_id, handle), outcome in zip(todo, outcomes):
        if isinstance(outcome, InvalidReceipt):
            failed.append(_failed(entry_id, sqs_error_of(outcome)))
            continue
        stale = stale or isinstance(outcome, StaleReceipt)
        call.aliases.settled(handle)
        successful.append({"Id": entry_id})
    _batch_outcome(call, failed, stale)
    return {"Successful": successful, "Failed": failed}


async def change_message_visibility(call: _Call) -> dict[str, Any]:
    handle = _required_string(call.params, "ReceiptHandle")
    if call.params.get("VisibilityTimeout") is None:
        raise SqsError("MissingParameter", "The request must contain the parameter VisibilityTimeout.")
    timeout = _integer(call.params, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
    queue = await call.queue()
    receipt = await call.run(call.aliases.follow, queue, handle,
                             lambda current: queue.change_visibility(current, float(timeout or 0)))
    call.aliases.moved(handle, receipt)
    return {}


async def change_message_visibility_batch(call: _Call) -> dict[str, Any]:
    queue = await call.queue()
    entries = _batch_entries(call.params)
    failed: list[dict[str, Any]] = []
    todo: list[tuple[str, str, float]] = []
    for entry in entries:
        try:
            handle = _required_string(entry, "ReceiptHandle")
            if entry.get("VisibilityTimeout") is None:
                raise SqsError("MissingParameter", "VisibilityTimeout is required.")
            timeout = _integer(entry, "VisibilityTimeout", 0, MAX_VISIBILITY_TIMEOUT)
            todo.append((entry["Id"], handle, float(timeout or 0)))
        except SqsError as exc:
            failed.append(_failed(entry["Id"], exc))
    outcomes = await call.run(lambda: [
        _outcome_of(call.aliases.follow, queue, handle,
                    lambda current, timeout=timeout: queue.change_visibility(current, timeout))
        for _, handle, timeout in todo])
    successful: list[dict[str, Any]] = []
    for (entry_id, handle, _), outcome in zip(todo, outcomes):
        if isinstance(outcome, VsqsError):
            failed.append(_failed(entry_id, sqs_error_of(outcome)))
        else:
            call.aliases.moved(handle, outcome)
            successful.append({"Id": entry_id})
    _batch_outcome(call, failed)
    return {"Successful": successful, "Failed": failed}


async def purge_queue(call: _Call) -> dict[str, Any]:
    queue = await call.queue()
    await call.run(queue.purge)
    return {}


Action = Callable[[_Call], Awaitable[dict[str, Any]]]
ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "SendMessage": send_message,
    "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message,
    "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
    "PurgeQueue": purge_queue,
}
UNSUPPORTED_ACTIONS = frozenset({
    "AddPermission", "RemovePermission", "TagQueue", "UntagQueue", "ListQueueTags", "ListDeadLetterSourceQueues",
    "StartMessageMoveTask", "CancelMessageMoveTask", "ListMessageMoveTasks",
})


# -- the endpoint ------------------------------------------------------------------


def _parse_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        params = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise SqsError("SerializationException", "The request body is not valid JSON.") from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return params


class _AnyAccessKey(Mapping[str, str]):
    """Every access key id, one secret: the API key, when no AWS key pairs are configured."""

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def __getitem__(self, key: str) -> str:
        return self._secret

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def _authenticate(request: Request, gateway: Gateway, body: bytes) -> None:
    """SigV4 against the AWS key pairs; with none but an API key, against the API key
    as the secret (any access key id), so that a key closes both faces."""
    config = gateway.config
    credentials: Mapping[str, str] = config.aws_credentials
    if not credentials:
        if not config.api_key:
            return  # none configured: every signature is accepted (the gateway warned at start-up)
        credentials = _AnyAccessKey(config.api_key)
    try:
        _sigv4.verify(
            method=request.method,
            raw_path=request.scope.get("raw_path", request.url.path.encode()).decode("latin-1"),
            raw_query=request.scope.get("query_string", b"").decode("latin-1"),
            headers=_sigv4.header_map(request.scope["headers"]),
            body=body,
            credentials=credentials,
            now=time.time(),
        )
    except _sigv4.SigV4Error as exc:
        raise SqsError(exc.code, exc.message, exc.status) from None


def router() -> APIRouter:
    """The SQS face: one route, ``POST /``, dispatching on X-Amz-Target."""
    api = APIRouter()
    aliases = ReceiptAliases()

    async def sqs(request: Request) -> Response:
        request_id = str(uuid.uuid4())
        gateway = gateway_of(request)
        target = request.headers.get("x-amz-target", "")
        action = target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else ""
        handler = ACTIONS.get(action)
        request.scope["vsqs.operation"] = f"sqs.{action}" if handler else "sqs.unknown"
        body = await request.body()  # over the size cap: the middleware answers
        try:
            _authenticate(request, gateway, body)
            if handler is None:
                if action in UNSUPPORTED_ACTIONS:
                    raise SqsError("UnsupportedOperation", f"vsqs does not support {action}.")
                if not target and b"Action=" in body[:4096]:  # the older query protocol
                    raise SqsError("UnknownOperationException",
                                   "this gateway speaks SQS's AWS JSON 1.0 protocol, not the query protocol: "
                                   "use an SDK from after April 2024 (boto3/botocore 1.34.90 or later)")
                raise SqsError("UnknownOperationException",
                               f"Unknown operation {target[:100]!r}: send X-Amz-Target: AmazonSQS.<Action> "
                               "(the AWS JSON 1.0 protocol)")
            call = _Call(gateway, request, _parse_body(body), aliases)
            try:
                result = await handler(call)
            except VsqsError as exc:
                if isinstance(exc, QueueNotFound) and call.queue_name:
                    gateway.forget(call.queue_name)
                raise sqs_error_of(exc, gateway.spool.root) from None
        except SqsError as exc:
            request.scope["vsqs.outcome"] = exc.name
            if exc.status >= 500:
                log.warning("SQS %s failed: %s: %s", action or "request", exc.name, exc.message)
            return error_response(exc, request_id)
        except Exception:
            log.exception("SQS %s failed", action or "request")
            request.scope["vsqs.outcome"] = "InternalError"
            return error_response(SqsError("InternalError", "The gateway failed to answer; see its log."),
                                  request_id)
        request.scope["vsqs.outcome"] = call.outcome
        return Response(json.dumps(result, separators=(",", ":")), media_type=CONTENT_TYPE,
                        headers={"x-amzn-RequestId": request_id})

    api.add_api_route("/", sqs, methods=["POST"], include_in_schema=False, name="sqs")
    return api
