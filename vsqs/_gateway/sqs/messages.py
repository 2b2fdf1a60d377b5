"""SQS messages as vsqs messages: checking a send and preparing what to
publish (with the digests of the answer), and rendering a received message."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vsqs import Message, Outgoing
from vsqs._gateway.limits import MAX_DELAY_SECONDS
from vsqs._gateway.sqs.attributes import (
    DEDUP_ATTRIBUTE,
    TRACE_ATTRIBUTE,
    attributes_size,
    check_text,
    md5_of_attributes,
    md5_of_body,
    message_attributes,
    selected,
    sqs_attributes,
    stored_attributes,
    wants_all,
)
from vsqs._gateway.sqs.call import Call
from vsqs._gateway.sqs.parameters import integer, is_fifo, required_string, string
from vsqs._gateway.sqs.protocol import SqsError, invalid_parameter_value, missing

_ID_CHARS_RE = re.compile(r"[!-~]{1,128}")  # group and dedup ids: printable ASCII, no space


@dataclass
class Prepared:
    """One checked message to send, with the digests of the answer."""

    body: str
    message: Outgoing
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None
    size: int  # bytes as SQS counts them: body and attributes
    fifo: bool = False  # sent to a FIFO queue: the answer has a SequenceNumber


def _not_for_this_queue_type(parameter: str, value: str) -> SqsError:
    return invalid_parameter_value(parameter, value, "The request include parameter that is not valid for this "
                                   "queue type.")  # (Amazon's words)


# an id quoted in an error whole, as Amazon quotes it (129 characters of a 129-character id), within bounds
_QUOTED_ID_CHARS = 1024


def too_long(limit: int, in_batch: bool = False) -> SqsError:
    """Amazon's answer to a message over ``limit`` bytes: SendMessage's words,
    or those of a SendMessageBatch entry's Failed item."""
    check = "cannot be validated" if in_batch else "are invalid"
    return SqsError("InvalidParameterValue", f"One or more parameters {check}. "
                    f"Reason: Message must be shorter than {limit} bytes.")


def prepare(entry: Mapping[str, Any], queue_name: str, limit: int, trace: str | None = None,
            in_batch: bool = False) -> Prepared:
    """Check one SendMessage (or batch entry, ``in_batch``) against SQS's rules and the queue's type.
    ``trace``: the request's ``X-Amzn-Trace-Id`` header, kept as the message's
    AWSTraceHeader unless the entry's MessageSystemAttributes give one (Amazon:
    the attribute overrides the header); neither counts in the message's size."""
    body = required_string(entry, "MessageBody")
    if not body:
        raise missing("MessageBody")
    check_text(body)
    fifo = is_fifo(queue_name)
    delay = integer(entry, "DelaySeconds", 0, MAX_DELAY_SECONDS)
    group = string(entry, "MessageGroupId")
    dedup_id = string(entry, "MessageDeduplicationId")
    for key, value in (("MessageGroupId", group), ("MessageDeduplicationId", dedup_id)):
        if value is not None and not _ID_CHARS_RE.fullmatch(value):
            raise invalid_parameter_value(key, value[:_QUOTED_ID_CHARS], f"{key} can only include alphanumeric "
                                          "and punctuation characters. 1 to 128 in length.")
    if fifo:
        if group is None:
            raise missing("MessageGroupId")
        if delay:
            raise _not_for_this_queue_type("DelaySeconds", str(delay))
        delay = None  # DelaySeconds=0 sets no delay of its own: the queue's DelaySeconds applies
    elif dedup_id is not None:
        raise _not_for_this_queue_type("MessageDeduplicationId", dedup_id[:128])
    attributes = message_attributes(entry.get("MessageAttributes"))
    system = message_attributes(entry.get("MessageSystemAttributes"), "MessageSystemAttributes")
    if set(system) - {"AWSTraceHeader"} or any(v["DataType"] != "String" for v in system.values()):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes may hold only AWSTraceHeader (String).")
    size = len(body.encode("utf-8")) + attributes_size(attributes)
    if size > limit:
        raise too_long(limit, in_batch)
    stored = stored_attributes(attributes)
    if dedup_id is not None:
        stored[DEDUP_ATTRIBUTE] = dedup_id
    if system:
        stored[TRACE_ATTRIBUTE] = system["AWSTraceHeader"]["StringValue"]
    elif trace:
        stored[TRACE_ATTRIBUTE] = trace
    message = Outgoing(body.encode("utf-8"), delay=None if delay is None else float(delay),
                       attributes=stored or None, group=group, dedup_id=dedup_id)
    return Prepared(body, message, md5_of_body(body), md5_of_attributes(attributes) if attributes else None,
                    md5_of_attributes(system) if system else None, size, fifo)


def _dedup_needed() -> SqsError:
    return SqsError("InvalidParameterValue", "The queue should either have ContentBasedDeduplication "
                    "enabled or MessageDeduplicationId provided explicitly")


def check_dedup(prepared: Prepared, queue_name: str, settings: Mapping[str, Any]) -> None:
    """A FIFO send needs a MessageDeduplicationId unless the queue de-duplicates by content."""
    if is_fifo(queue_name) and prepared.message.dedup_id is None and not settings["content_dedup"]:
        raise _dedup_needed()


def check_fifo_batch(entries: list[dict[str, Any]], queue_name: str, settings: Mapping[str, Any]) -> None:
    """A FIFO batch with an entry that lacks its MessageGroupId, or its
    MessageDeduplicationId on a queue that does not de-duplicate by content, is
    refused whole, as Amazon refuses it (InvalidParameterValue), before any entry
    is checked on its own."""
    if not is_fifo(queue_name):
        return
    for entry in entries:
        if entry.get("MessageGroupId") is None:
            raise missing("MessageGroupId", "InvalidParameterValue")
        if entry.get("MessageDeduplicationId") is None and not settings["content_dedup"]:
            raise _dedup_needed()


def send_result(message_id: str, prepared: Prepared) -> dict[str, Any]:
    """The answer to a send of the message ``message_id`` (its vsqs id: for a
    de-duplicated send, the first message's): SQS's MessageId is the id's UUID."""
    result: dict[str, Any] = {"MessageId": Message.uuid_of(message_id), "MD5OfMessageBody": prepared.md5_body}
    if prepared.md5_attributes:
        result["MD5OfMessageAttributes"] = prepared.md5_attributes
    if prepared.md5_system:
        result["MD5OfMessageSystemAttributes"] = prepared.md5_system
    if prepared.fifo:
        result["SequenceNumber"] = Message.sequence_number_of(message_id)
    return result


# -- receiving --------------------------------------------------------------------

MESSAGE_SYSTEM_ATTRIBUTES = frozenset({"All", "SenderId", "SentTimestamp", "ApproximateReceiveCount",
                                       "ApproximateFirstReceiveTimestamp", "SequenceNumber",
                                       "MessageDeduplicationId", "MessageGroupId", "AWSTraceHeader",
                                       "DeadLetterQueueSourceArn"})


def dead_letter_sources(messages: list[Message], system_names: set[str], into: dict[str, str | None]) -> None:
    """Look up the source queue of each dead letter among ``messages`` into
    ``into`` (by receipt), if the receive asks for DeadLetterQueueSourceArn:
    called in a worker thread, so that rendering them (see
    :func:`received_message`) reads nothing from disk, found or not."""
    if wants_all(system_names) or "DeadLetterQueueSourceArn" in system_names:
        for message in messages:
            into[message.receipt] = message.dead_letter_source


def received_message(call: Call, message: Message, fifo: bool, content_dedup: bool,
                     system_names: set[str], attribute_names: list[str],
                     sources: dict[str, str | None]) -> dict[str, Any]:
    """A received message in SQS's terms; ``sources``: the dead-letter sources
    :func:`dead_letter_sources` looked up (this runs on the event loop: no I/O)."""
    body = message.body.decode("utf-8", errors="replace")
    stored = message.attributes
    out: dict[str, Any] = {"MessageId": message.uuid, "ReceiptHandle": message.receipt,
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
        "SequenceNumber": message.sequence_number if fifo else None,
        "MessageDeduplicationId": dedup_id,
        "AWSTraceHeader": stored.get(TRACE_ATTRIBUTE),
    }
    everything = wants_all(system_names)
    if everything or "ApproximateFirstReceiveTimestamp" in system_names:
        first = message.first_received_at  # None: received first by a vsqs that did not record it
        candidates["ApproximateFirstReceiveTimestamp"] = None if first is None else str(round(first * 1000))
    if everything or "DeadLetterQueueSourceArn" in system_names:
        source = sources.get(message.receipt)
        candidates["DeadLetterQueueSourceArn"] = None if source is None else call.arn_of(source)
    for name, value in candidates.items():
        if value is not None and (everything or name in system_names):
            system[name] = value
    if system:
        out["Attributes"] = system
    attributes = selected(sqs_attributes(stored), attribute_names) if attribute_names else {}
    if attributes:
        out["MessageAttributes"] = attributes
        out["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
    return out
