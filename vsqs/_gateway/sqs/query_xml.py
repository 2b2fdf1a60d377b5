"""The Query protocol's answers: XML, shaped as Amazon SQS writes them.

An answer is ``<ActionResponse xmlns="http://queue.amazonaws.com/doc/2012-11-05/">``
holding ``<ActionResult>`` (for an action that answers something: its
members named as :data:`.query_shapes.OUTPUTS` says, lists and maps
flattened) and ``<ResponseMetadata><RequestId>``. An error is
``<ErrorResponse><Error><Type>Sender|Receiver</Type><Code>..</Code>
<Message>..</Message><Detail/></Error><RequestId>..</RequestId></ErrorResponse>``
with the error's Query code (``AWS.SimpleQueueService.NonExistentQueue``
where JSON says ``QueueDoesNotExist``) and the same HTTP status.

Text is escaped for XML 1.0: ``& < >``, and a carriage return as ``&#13;``
(a parser would turn a literal one into a line feed, and the body's MD5
would no longer match). A character XML 1.0 cannot carry at all (a control
character, U+FFFE...) cannot be in a body an SQS client sent (sends refuse
it, as Amazon does), but a body published by the library may hold one: it
is delivered with U+FFFD in its place, and the MD5 digests are those of
what is delivered (:func:`deliverable`), as for a body that is not UTF-8.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import Response

from vsqs._gateway.sqs.attributes import md5_of_attributes, md5_of_body
from vsqs._gateway.sqs.protocol import SqsError
from vsqs._gateway.sqs.query_shapes import (
    OUTPUTS,
    XML_NAMESPACE,
    ListOf,
    MapOf,
    Scalar,
    Shape,
    Struct,
)

CONTENT_TYPE = "text/xml"
# errors whose Query code differs from the JSON protocol's (the request framework's own)
_QUERY_CODES = {"UnknownOperationException": "InvalidAction", "SerializationException": "MalformedQueryString"}
# what text must not hold as is: markup, CR (parsers normalise it), and what XML 1.0 cannot carry
_ESCAPED_RE = re.compile("[&<>\r\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NOT_XML_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"}


def _escape_one(match: re.Match[str]) -> str:
    return _ESCAPES.get(match.group(), "\ufffd")


def escape(text: str) -> str:
    """``text`` as XML 1.0 element content (a character XML cannot carry becomes U+FFFD)."""
    return _ESCAPED_RE.sub(_escape_one, text) if _ESCAPED_RE.search(text) else text


def _xml_text(text: str) -> str:
    return _NOT_XML_RE.sub("\ufffd", text)


def deliverable(result: dict[str, Any]) -> dict[str, Any]:
    """ReceiveMessage's answer with what XML cannot carry replaced by U+FFFD in
    bodies and attribute values, and their digests made those of what is sent
    (a client checks them). Messages that need nothing are left as they are."""
    for message in result.get("Messages", ()):
        body = message["Body"]
        if _NOT_XML_RE.search(body):
            message["Body"] = _xml_text(body)
            message["MD5OfBody"] = md5_of_body(message["Body"])
        attributes = message.get("MessageAttributes")
        if attributes and any("StringValue" in value and _NOT_XML_RE.search(value["StringValue"])
                              for value in attributes.values()):
            for value in attributes.values():
                if "StringValue" in value:
                    value["StringValue"] = _xml_text(value["StringValue"])
            message["MD5OfMessageAttributes"] = md5_of_attributes(attributes)
    return result


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return escape(value) if isinstance(value, str) else str(int(value))


def _render(out: list[str], name: str, value: Any, shape: Shape) -> None:
    """``value`` as the element(s) ``name`` of ``shape`` (lists and maps flattened)."""
    if isinstance(shape, Scalar):
        out.append(f"<{name}>{_scalar(value)}</{name}>")
    elif isinstance(shape, ListOf):
        for item in value:
            _render(out, name, item, shape.item)
    elif isinstance(shape, MapOf):
        for key, item in value.items():
            out.append(f"<{name}><{shape.key}>{escape(key)}</{shape.key}>")
            _render(out, shape.value, item, shape.item)
            out.append(f"</{name}>")
    else:
        out.append(f"<{name}>")
        _members(out, value, shape)
        out.append(f"</{name}>")


def _members(out: list[str], value: dict[str, Any], shape: Struct) -> None:
    for member in shape.members:
        item = value.get(member.name)
        if item is not None:
            _render(out, member.wire, item, member.shape)


def result_xml(action: str, result: dict[str, Any], request_id: str) -> str:
    """The XML answer of ``action`` for the result the action returned."""
    out = [f'<?xml version="1.0"?><{action}Response xmlns="{XML_NAMESPACE}">']
    shape = OUTPUTS.get(action)
    if shape is not None:
        if action == "ReceiveMessage":
            result = deliverable(result)
        members: list[str] = []
        _members(members, result, shape)
        # an answer with no members is one empty element, as Amazon writes it (<ReceiveMessageResult/>)
        out.append(f"<{action}Result>{''.join(members)}</{action}Result>" if members else f"<{action}Result/>")
    out.append(f"<ResponseMetadata><RequestId>{escape(request_id)}</RequestId></ResponseMetadata>"
               f"</{action}Response>")
    return "".join(out)


def result_response(action: str, result: dict[str, Any], request_id: str) -> Response:
    return Response(result_xml(action, result, request_id).encode("utf-8"), media_type=CONTENT_TYPE,
                    headers={"x-amzn-RequestId": request_id})


def query_code(error: SqsError) -> str:
    """The error's code in the Query protocol."""
    return _QUERY_CODES.get(error.name, error.query_code)


def error_xml(error: SqsError, request_id: str) -> str:
    if error.status == 404 and error.name == "UnknownOperationException":
        return '<?xml version="1.0"?><UnknownOperationException/>'  # a queue URL's GET naming no action
    return (f'<?xml version="1.0"?><ErrorResponse xmlns="{XML_NAMESPACE}"><Error><Type>{error.fault}</Type>'
            f"<Code>{escape(query_code(error))}</Code><Message>{escape(error.query_message)}</Message><Detail/></Error>"
            f"<RequestId>{escape(request_id)}</RequestId></ErrorResponse>")


def error_response(error: SqsError, request_id: str) -> Response:
    headers = {"x-amzn-RequestId": request_id}
    if error.status == 503:
        headers["Retry-After"] = "5"
    return Response(error_xml(error, request_id).encode("utf-8"), status_code=error.status,
                    media_type=CONTENT_TYPE, headers=headers)
