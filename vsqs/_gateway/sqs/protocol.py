"""The wire protocol of the SQS face: AWS JSON 1.0 on ``POST /``.

A request is ``POST /`` with ``X-Amz-Target: AmazonSQS.<Action>`` and a JSON
body; an answer is JSON (``application/x-amz-json-1.0``) with an
``x-amzn-RequestId`` header. An error is HTTP 400 (403 for a refused
signature, 404 for a resource that is not there, 500/503 for the gateway's
own trouble) with the body ``{"__type": "com.amazonaws.sqs#<Type>",
"message": ...}`` and the header ``x-amzn-query-error: <query code>;Sender``
(``Receiver`` for 5xx), which botocore maps to ``client.exceptions.<Name>``.
The type is the error's name, but for the two generic errors, which Amazon
sends as ``InvalidParameterValueException`` and
``MissingRequiredParameterException`` (their query codes
``InvalidParameterValue`` and ``MissingParameter`` are what clients see). This module reads requests,
renders answers and errors, and holds the one translation of vsqs errors
for this face. (The Query protocol, form-encoded with XML answers, is
:mod:`.query`; :mod:`.wire` picks one of the two for each request.)
"""

from __future__ import annotations

import errno
import json
import re
import uuid
from typing import Any

from fastapi.responses import Response

from vsqs import (
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
from vsqs._gateway.asgi import Scope
from vsqs._gateway.errors import without_paths
from vsqs._gateway.json_body import BodyRefused, parse_json_async
from vsqs._gateway.limits import MAX_SQS_JSON_VALUES
from vsqs._gateway.regions import REGION_RULE

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."
REGION_PATH_PREFIX = "queue"  # a queue URL's path in a region other than the home one: /queue/REGION/ACCOUNT/NAME
# a queue URL's path: /ACCOUNT/NAME, or /queue/REGION/ACCOUNT/NAME
_QUEUE_PATH_RE = re.compile(rf"(?:/{REGION_PATH_PREFIX}/{REGION_RULE})?/[0-9]{{12}}/[^/]{{1,255}}")

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
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),  # --sqs-recently-deleted
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),  # --sqs-purge-interval
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "InvalidAddress": ("InvalidAddress", 400),
    "OverLimit": ("OverLimit", 400),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "UnknownOperationException": ("UnknownOperationException", 400),
    "SerializationException": ("SerializationException", 400),
    "RequestTimeout": ("RequestTimeout", 408),
    "RequestThrottled": ("RequestThrottled", 429),  # too many wrong keys from the address (vsqs._gateway.guesses)
    "InternalError": ("InternalError", 500),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
}


# the JSON protocol's __type of the errors Amazon sends under another name than their query code
_JSON_TYPES = {"InvalidParameterValue": "InvalidParameterValueException",
               "MissingParameter": "MissingRequiredParameterException"}

# errors of the AWS request framework rather than of SQS (their __type namespace differs)
_FRAMEWORK_ERRORS = frozenset({"MissingAuthenticationToken", "IncompleteSignature", "InvalidClientTokenId",
                               "SignatureDoesNotMatch", "RequestExpired", "UnknownOperationException",
                               "SerializationException"})


class SqsError(Exception):
    """An SQS error answer; ``name`` is the error's shape name (or its code when
    botocore has no class for it), ``status`` None takes the table's;
    ``query_message`` is the text of the Query protocol, where Amazon's differs."""

    def __init__(self, name: str, message: str, status: int | None = None,
                 query_message: str | None = None) -> None:
        super().__init__(message)
        query_code, default_status = _ERRORS.get(name, (name, 400))
        self.name, self.message, self.query_code = name, message, query_code
        self.status = default_status if status is None else status
        self.query_message = message if query_message is None else query_message

    @property
    def fault(self) -> str:
        return "Receiver" if self.status >= 500 else "Sender"


def is_queue_path(path: str) -> bool:
    """Whether ``path`` is a queue URL's (``/ACCOUNT/NAME``, ``/queue/REGION/ACCOUNT/NAME``),
    where clients of either protocol may send (the PHP SDK posts JSON 1.0 there;
    Query clients send a queue's actions there)."""
    return (path[1:2].isdigit() or path.startswith("/queue/")) and _QUEUE_PATH_RE.fullmatch(path) is not None


def is_sqs_request(scope: Scope) -> bool:
    """The SQS face answers a request carrying an X-Amz-Target header to ``/`` or
    to a queue URL's path."""
    path = scope["path"]
    return (path == "/" or is_queue_path(path)) and any(key == b"x-amz-target" for key, _ in scope["headers"])


def action_of(target: str) -> str:
    """The action an X-Amz-Target names (``""``: none of SQS's)."""
    return target[len(TARGET_PREFIX):] if target.startswith(TARGET_PREFIX) else ""


async def parse_body(body: bytes) -> dict[str, Any]:
    """The request's parameters: a JSON object (an empty body: none), judged and
    parsed with bounded cost (:mod:`vsqs._gateway.json_body`; a large body on
    the thread pool)."""
    if not body.strip():
        return {}
    try:
        params = await parse_json_async(body, MAX_SQS_JSON_VALUES)
    except BodyRefused as refused:
        raise sqs_error_of_refusal(refused) from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return params


_MESSAGE_CONTENTS = frozenset({"MessageBody", "MessageAttributes", "MessageSystemAttributes"})


def sqs_error_of_refusal(refused: BodyRefused) -> SqsError:
    """This face's answer to a refused JSON body: a string that is no text is
    InvalidMessageContents in a message, else InvalidParameterValue."""
    if refused.status == 413:
        return SqsError("InvalidParameterValue", f"The request is too large: {refused.message}.", 413)
    if refused.status == 422:
        where = refused.parameter or "the request"
        name = "InvalidMessageContents" if _MESSAGE_CONTENTS & set(map(str, refused.where)) else "InvalidParameterValue"
        return SqsError(name, f"{where}: {refused.message}.")
    return SqsError("SerializationException", f"The request body is not acceptable JSON: {refused.message}.")


def unknown_operation(target: str, body: bytes) -> SqsError:
    """The answer to a target that names no SQS action, saying what this face speaks."""
    if not target and b"Action=" in body[:4096]:  # a Query form without its Content-Type
        return SqsError("UnknownOperationException",
                        "a request in SQS's Query protocol needs Content-Type: application/x-www-form-urlencoded")
    return SqsError("UnknownOperationException",
                    f"Unknown operation {target[:100]!r}: send X-Amz-Target: AmazonSQS.<Action> "
                    "(the AWS JSON 1.0 protocol)")


def new_request_id() -> str:
    return str(uuid.uuid4())


def result_response(result: dict[str, Any], request_id: str) -> Response:
    """An action's answer."""
    return Response(json.dumps(result, separators=(",", ":")), media_type=CONTENT_TYPE,
                    headers={"x-amzn-RequestId": request_id})


def error_response(error: SqsError, request_id: str | None = None) -> Response:
    """The JSON 1.0 error answer botocore turns into ``client.exceptions.<name>``."""
    namespace = "com.amazon.coral.service" if error.name in _FRAMEWORK_ERRORS else "com.amazonaws.sqs"
    body = json.dumps({"__type": f"{namespace}#{_JSON_TYPES.get(error.name, error.name)}", "message": error.message})
    headers = {"x-amzn-RequestId": request_id or new_request_id(),
               "x-amzn-query-error": f"{error.query_code};{error.fault}"}
    if error.status == 503:
        headers["Retry-After"] = "5"
    return Response(body, status_code=error.status, media_type=CONTENT_TYPE, headers=headers)


def too_large(limit: int) -> SqsError:
    """The error of a request over a size cap (HTTP 413)."""
    return SqsError("InvalidParameterValue", f"The request body is over {limit} bytes.", 413)


def missing(parameter: str, name: str = "MissingParameter") -> SqsError:
    """Amazon's answer to a request that lacks ``parameter`` (a FIFO batch entry's
    MessageGroupId is an InvalidParameterValue in the same words)."""
    return SqsError(name, f"The request must contain the parameter {parameter}.")


def invalid_attribute_value(name: str, why: str | None = None) -> SqsError:
    """Amazon's answer to a queue attribute's bad value (with a reason where Amazon gives one)."""
    reason = "" if why is None else f" Reason: {why}"
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.{reason}")


def invalid_parameter_value(name: str, value: str, why: str) -> SqsError:
    """Amazon's answer to a parameter's bad value (``value`` as it was given)."""
    return SqsError("InvalidParameterValue", f"Value {value} for parameter {name} is invalid. Reason: {why}")


def no_such_queue() -> SqsError:
    """Amazon's answer for a queue that is not there (or a QueueUrl that names none),
    in its words for each protocol."""
    return SqsError("QueueDoesNotExist", "The specified queue does not exist.",
                    query_message="The specified queue does not exist for this wsdl version.")


def sqs_error_of(exc: VsqsError, *spool_roots: str) -> SqsError:
    """The one translation of vsqs errors for the SQS face; paths inside each
    of ``spool_roots`` are shown relative to it (clients see queue names, not paths)."""
    text = str(exc)
    for root in sorted(spool_roots, key=len, reverse=True):  # (a root that is another's start: the longer first)
        text = without_paths(text, root)
    if isinstance(exc, QueueNotFound):
        return no_such_queue()  # Amazon's words, no path
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
