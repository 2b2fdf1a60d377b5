"""The shapes of SQS's Query protocol: for each action, the names its
parameters take in a form and its answer's members take in XML.

The actions (:mod:`.actions`, :mod:`.management`) read and answer the
members of the JSON 1.0 protocol (``Entries``, ``MessageAttributes``,
``QueueUrls``...). In the Query protocol the same members travel under the
names of SQS's service model (API version 2012-11-05, the last botocore
model with ``"protocol": "query"``): every list and map is *flattened*, its
items numbered from 1 under the member's location name
(``SendMessageBatchRequestEntry.2.Id``, ``AttributeName.1``,
``Attribute.1.Name`` / ``Attribute.1.Value``,
``MessageAttribute.1.Value.StringValue``), and in an answer each item is
an element of that name (``<Message>``, ``<Attribute><Name>..</Name>
<Value>..</Value></Attribute>``). This module writes those shapes down once;
:mod:`.query` reads forms with them and :mod:`.query_xml` writes answers.
tests/gateway/test_sqs_query_shapes.py checks them against botocore's model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

XML_NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
API_VERSION = "2012-11-05"


@dataclass(frozen=True)
class Scalar:
    """A leaf: ``string`` (blobs too: base64 text in both protocols), ``integer``
    (``long`` too) or ``boolean``."""

    kind: str


@dataclass(frozen=True)
class ListOf:
    """A flattened list: items ``NAME.1``, ``NAME.2``... (NAME: the member's wire name)."""

    item: Shape


@dataclass(frozen=True)
class MapOf:
    """A flattened map: entries ``NAME.N.<key>`` and ``NAME.N.<value>``."""

    key: str
    value: str
    item: Shape


@dataclass(frozen=True)
class Member:
    """A member of a structure: ``name`` in JSON, ``wire`` in the form and the XML."""

    name: str
    wire: str
    shape: Shape


@dataclass(frozen=True)
class Struct:
    members: tuple[Member, ...]
    by_wire: dict[str, Member] = field(init=False, compare=False, repr=False)
    by_name: dict[str, Member] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_wire", {member.wire: member for member in self.members})
        object.__setattr__(self, "by_name", {member.name: member for member in self.members})


Shape = Scalar | ListOf | MapOf | Struct

STRING = Scalar("string")
INTEGER = Scalar("integer")
BOOLEAN = Scalar("boolean")


_Spec = tuple[str, Shape] | tuple[str, str, Shape]


def _member(spec: _Spec) -> Member:
    if len(spec) == 2:
        return Member(spec[0], spec[0], spec[1])
    return Member(spec[0], spec[1], spec[2])


def _struct(*members: _Spec) -> Struct:
    """A structure from (name, shape) or (name, wire name, shape) specs."""
    return Struct(tuple(_member(spec) for spec in members))


def _strings(wire: str, name: str) -> _Spec:
    return (name, wire, ListOf(STRING))


_STRING_MAP = MapOf("Name", "Value", STRING)  # Attribute.N.Name / Attribute.N.Value
_TAGS = MapOf("Key", "Value", STRING)  # Tag.N.Key / Tag.N.Value
_ATTRIBUTE_VALUE = _struct(
    ("StringValue", STRING), ("BinaryValue", STRING),
    ("StringListValues", "StringListValue", ListOf(STRING)),
    ("BinaryListValues", "BinaryListValue", ListOf(STRING)),
    ("DataType", STRING),
)
_MESSAGE_ATTRIBUTES = MapOf("Name", "Value", _ATTRIBUTE_VALUE)
_QUEUE_URL = ("QueueUrl", STRING)
_SEND_FIELDS: tuple[_Spec, ...] = (
    ("MessageBody", STRING), ("DelaySeconds", INTEGER),
    ("MessageAttributes", "MessageAttribute", _MESSAGE_ATTRIBUTES),
    ("MessageSystemAttributes", "MessageSystemAttribute", _MESSAGE_ATTRIBUTES),
    ("MessageDeduplicationId", STRING), ("MessageGroupId", STRING),
)
_ERROR_ENTRY = _struct(("Id", STRING), ("SenderFault", BOOLEAN), ("Code", STRING), ("Message", STRING))
_SEND_RESULT_FIELDS: tuple[tuple[str, Shape], ...] = (
    ("MessageId", STRING), ("MD5OfMessageBody", STRING), ("MD5OfMessageAttributes", STRING),
    ("MD5OfMessageSystemAttributes", STRING), ("SequenceNumber", STRING),
)


def _batch_result(entry: str) -> Struct:
    return _struct(("Successful", entry, ListOf(_struct(("Id", STRING)))),
                   ("Failed", "BatchResultErrorEntry", ListOf(_ERROR_ENTRY)))


# action -> its parameters in a form
INPUTS: dict[str, Struct] = {
    "CreateQueue": _struct(("QueueName", STRING), ("Attributes", "Attribute", _STRING_MAP), ("tags", "Tag", _TAGS)),
    "GetQueueUrl": _struct(("QueueName", STRING), ("QueueOwnerAWSAccountId", STRING)),
    "ListQueues": _struct(("QueueNamePrefix", STRING), ("NextToken", STRING), ("MaxResults", INTEGER)),
    "DeleteQueue": _struct(_QUEUE_URL),
    "PurgeQueue": _struct(_QUEUE_URL),
    "GetQueueAttributes": _struct(_QUEUE_URL, _strings("AttributeName", "AttributeNames")),
    "SetQueueAttributes": _struct(_QUEUE_URL, ("Attributes", "Attribute", _STRING_MAP)),
    "SendMessage": _struct(_QUEUE_URL, *_SEND_FIELDS),
    "SendMessageBatch": _struct(_QUEUE_URL, ("Entries", "SendMessageBatchRequestEntry",
                                             ListOf(_struct(("Id", STRING), *_SEND_FIELDS)))),
    "ReceiveMessage": _struct(
        _QUEUE_URL, _strings("AttributeName", "AttributeNames"),
        _strings("MessageSystemAttributeName", "MessageSystemAttributeNames"),  # the JSON-era name, taken too
        _strings("MessageAttributeName", "MessageAttributeNames"),
        ("MaxNumberOfMessages", INTEGER), ("VisibilityTimeout", INTEGER), ("WaitTimeSeconds", INTEGER),
        ("ReceiveRequestAttemptId", STRING),
    ),
    "DeleteMessage": _struct(_QUEUE_URL, ("ReceiptHandle", STRING)),
    "DeleteMessageBatch": _struct(_QUEUE_URL, ("Entries", "DeleteMessageBatchRequestEntry",
                                               ListOf(_struct(("Id", STRING), ("ReceiptHandle", STRING))))),
    "ChangeMessageVisibility": _struct(_QUEUE_URL, ("ReceiptHandle", STRING), ("VisibilityTimeout", INTEGER)),
    "ChangeMessageVisibilityBatch": _struct(_QUEUE_URL, (
        "Entries", "ChangeMessageVisibilityBatchRequestEntry",
        ListOf(_struct(("Id", STRING), ("ReceiptHandle", STRING), ("VisibilityTimeout", INTEGER))))),
    "TagQueue": _struct(_QUEUE_URL, ("Tags", "Tag", _TAGS)),
    "UntagQueue": _struct(_QUEUE_URL, _strings("TagKey", "TagKeys")),
    "ListQueueTags": _struct(_QUEUE_URL),
    "AddPermission": _struct(_QUEUE_URL, ("Label", STRING), _strings("AWSAccountId", "AWSAccountIds"),
                             _strings("ActionName", "Actions")),
    "RemovePermission": _struct(_QUEUE_URL, ("Label", STRING)),
    "ListDeadLetterSourceQueues": _struct(_QUEUE_URL, ("NextToken", STRING), ("MaxResults", INTEGER)),
    "StartMessageMoveTask": _struct(("SourceArn", STRING), ("DestinationArn", STRING),
                                    ("MaxNumberOfMessagesPerSecond", INTEGER)),
    "ListMessageMoveTasks": _struct(("SourceArn", STRING), ("MaxResults", INTEGER)),
    "CancelMessageMoveTask": _struct(("TaskHandle", STRING)),
}

# action -> its answer's members inside <ActionResult> (an action absent here answers no Result element)
OUTPUTS: dict[str, Struct] = {
    "CreateQueue": _struct(("QueueUrl", STRING)),
    "GetQueueUrl": _struct(("QueueUrl", STRING)),
    "ListQueues": _struct(("QueueUrls", "QueueUrl", ListOf(STRING)), ("NextToken", STRING)),
    "GetQueueAttributes": _struct(("Attributes", "Attribute", _STRING_MAP)),
    "SendMessage": _struct(*_SEND_RESULT_FIELDS),
    "SendMessageBatch": _struct(
        ("Successful", "SendMessageBatchResultEntry", ListOf(_struct(("Id", STRING), *_SEND_RESULT_FIELDS))),
        ("Failed", "BatchResultErrorEntry", ListOf(_ERROR_ENTRY))),
    "ReceiveMessage": _struct(("Messages", "Message", ListOf(_struct(
        ("MessageId", STRING), ("ReceiptHandle", STRING), ("MD5OfBody", STRING), ("Body", STRING),
        ("Attributes", "Attribute", _STRING_MAP), ("MD5OfMessageAttributes", STRING),
        ("MessageAttributes", "MessageAttribute", _MESSAGE_ATTRIBUTES))))),
    "DeleteMessageBatch": _batch_result("DeleteMessageBatchResultEntry"),
    "ChangeMessageVisibilityBatch": _batch_result("ChangeMessageVisibilityBatchResultEntry"),
    "ListQueueTags": _struct(("Tags", "Tag", _TAGS)),
    "ListDeadLetterSourceQueues": _struct(("queueUrls", "QueueUrl", ListOf(STRING)), ("NextToken", STRING)),
    "StartMessageMoveTask": _struct(("TaskHandle", STRING)),
    "ListMessageMoveTasks": _struct(("Results", "ListMessageMoveTasksResultEntry", ListOf(_struct(
        ("TaskHandle", STRING), ("Status", STRING), ("SourceArn", STRING), ("DestinationArn", STRING),
        ("MaxNumberOfMessagesPerSecond", INTEGER), ("ApproximateNumberOfMessagesMoved", INTEGER),
        ("ApproximateNumberOfMessagesToMove", INTEGER), ("FailureReason", STRING),
        ("StartedTimestamp", INTEGER))))),
    "CancelMessageMoveTask": _struct(("ApproximateNumberOfMessagesMoved", INTEGER)),
}
