"""SQS's Query protocol on the gateway's SQS endpoint: recognising a request,
and reading its form into the parameters the actions take.

Older SDKs (boto3/botocore before 1.34.90, the AWS SDKs for JavaScript v2,
Java v1, PHP and Go v1) speak Query: ``POST`` of a form
(``application/x-www-form-urlencoded``: ``Action=SendMessage&Version=2012-11-05
&QueueUrl=...&MessageBody=...``), or ``GET`` with the same form as the query
string, to ``/`` or to a queue's URL path ``/ACCOUNT/NAME`` (where the
Java SDK v1 and boto 2 send a queue's actions; a QueueUrl the form leaves
out is that path). The answers are XML (:mod:`.query_xml`).

The form is read into the same parameter dicts the JSON 1.0 protocol gives
the actions, following :mod:`.query_shapes`: ``Attribute.1.Name=A&
Attribute.1.Value=B`` becomes ``{"Attributes": {"A": "B"}}``, integers become
ints, so each action, its checks and its errors are the JSON protocol's.

Hostile forms cost bounded work: more than ``MAX_QUERY_FIELDS`` fields is
refused (413) before anything is decoded; a list index is a number of at
most four digits up to ``MAX_QUERY_FIELDS`` (``Entry.99999999.Id`` is
refused, and nothing is ever allocated by index); a field given twice,
under the same name or two names of one item, is refused; a value that is
not UTF-8 is InvalidMessageContents in a message, InvalidParameterValue
elsewhere; fields no action knows are ignored (as unknown JSON members are),
and only fields that name a parameter of the action are kept. An unindexed
``AttributeName=All`` or ``Attribute.Name``/``Attribute.Value`` (as older
clients send) is item 1; a list's member name with no value (``Entries=``,
as botocore sends an empty list) is an empty list.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_to_bytes

from vsqs._gateway.asgi import Scope
from vsqs._gateway.limits import MAX_QUERY_FIELDS
from vsqs._gateway.sqs.protocol import SqsError, invalid_parameter_value, is_queue_path, missing
from vsqs._gateway.sqs.query_shapes import INPUTS, ListOf, MapOf, Scalar, Shape, Struct

FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
_INDEX_RE = re.compile(r"[1-9][0-9]{0,3}")
_INTEGER_RE = re.compile(r"-?[0-9]{1,12}")
_MAX_KEY = 200  # characters of a field name: the longest SQS has is under 80
_MESSAGE_PARTS = frozenset({"MessageBody", "MessageAttribute", "MessageSystemAttribute"})


def is_query_request(scope: Scope) -> bool:
    """A request in the Query protocol: a form POST (no X-Amz-Target), or a GET
    naming an Action, to ``/`` or to a queue URL's path; or a GET of a queue
    URL that names none (Amazon answers it: no such operation)."""
    path = scope["path"]
    if path != "/" and not is_queue_path(path):
        return False  # the native face's paths, cheaply
    if scope["method"] == "GET":
        query = scope.get("query_string", b"")
        return path != "/" or query.startswith(b"Action=") or b"&Action=" in query
    if scope["method"] != "POST":
        return False
    content_type = None
    for key, value in scope["headers"]:
        if key == b"x-amz-target":
            return False
        if key == b"content-type":
            content_type = value
    return content_type is not None and content_type.split(b";", 1)[0].strip().lower() == FORM_CONTENT_TYPE.encode()


# -- the form ------------------------------------------------------------------


def _decoded(raw: bytes, key: str | None) -> str:
    """A form name or value, %-decoded (``+`` is a space) as UTF-8 text."""
    try:
        return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        if key is None:
            raise SqsError("InvalidParameterValue", "A parameter name is not UTF-8 text.") from None
        in_message = bool(_MESSAGE_PARTS & set(key.split(".")))
        raise SqsError("InvalidMessageContents" if in_message else "InvalidParameterValue",
                       f"The value of {key[:_MAX_KEY]} is not UTF-8 text.") from None


def split_form(data: bytes) -> dict[str, str]:
    """A form's fields, name -> value; more than MAX_QUERY_FIELDS of them, or one
    name given twice, is refused."""
    if data.count(b"&") >= MAX_QUERY_FIELDS:
        raise SqsError("InvalidParameterValue",
                       f"The request has more than {MAX_QUERY_FIELDS} parameters.", 413)
    fields: dict[str, str] = {}
    for pair in data.split(b"&"):
        if not pair:
            continue
        raw_key, _, raw_value = pair.partition(b"=")
        key = _decoded(raw_key, None)
        if key in fields:
            raise SqsError("InvalidParameterValue", f"The parameter {key[:_MAX_KEY]} is given more than once.")
        fields[key] = _decoded(raw_value, key)
    return fields


def action_of(fields: dict[str, str]) -> str:
    """The action a form names (``""``: none)."""
    return fields.get("Action", "")


def named_action(data: bytes) -> str:
    """The action a form names, read before the rest of it is decoded (only the names,
    each bounded, and the Action's value): what the request may carry, and whether it
    is authentic, are decided before its values cost anything."""
    for pair in data.split(b"&", MAX_QUERY_FIELDS):
        raw_key, _, raw_value = pair.partition(b"=")
        if len(raw_key) > 3 * _MAX_KEY:  # (%XX for each character, at most)
            raise SqsError("InvalidParameterValue", f"A parameter name is over {_MAX_KEY} characters.")
        if raw_value and len(raw_value) <= 3 * _MAX_KEY and _decoded(raw_key, None) == "Action":
            return _decoded(raw_value, "Action")
    return ""


# -- the form's fields as the action's parameters ---------------------------------


def _twice(key: str) -> SqsError:
    return SqsError("InvalidParameterValue", f"The parameter {key[:_MAX_KEY]} is given more than once.")


def _index(segments: list[str], at: int, key: str) -> int:
    if at >= len(segments):
        raise SqsError("InvalidParameterValue", f"The parameter {key[:_MAX_KEY]} needs an index (.1, .2, ...).")
    text = segments[at]
    if not _INDEX_RE.fullmatch(text) or int(text) > MAX_QUERY_FIELDS:
        raise SqsError("InvalidParameterValue", f"The index {text[:20]} in {key[:_MAX_KEY]} is not a number "
                       f"1..{MAX_QUERY_FIELDS}.")
    return int(text)


def _place(node: dict[Any, Any], shape: Shape, segments: list[str], at: int, value: str, key: str) -> None:
    """Put one field (its name split at dots, read from ``at`` on) into the raw tree
    of ``shape``: structures by member name, lists and maps by index. A name
    that leaves the shape names nothing the action takes: it is ignored."""
    if isinstance(shape, Struct):
        if at >= len(segments):
            return
        member = shape.by_wire.get(segments[at])
        if member is None:
            member = shape.by_name.get(segments[at])
            if member is not None and isinstance(member.shape, ListOf) and at + 1 == len(segments) and not value:
                node.setdefault(member.name, {})  # an empty list, as botocore sends it: "Entries="
            return
        if isinstance(member.shape, Scalar):
            if at + 1 == len(segments):
                if member.name in node:
                    raise _twice(key)
                node[member.name] = value
            return
        _place(node.setdefault(member.name, {}), member.shape, segments, at + 1, value, key)
    elif isinstance(shape, ListOf):
        if isinstance(shape.item, Scalar) and at == len(segments):
            index = 1  # AttributeName=All: one item, unindexed
        else:
            index = _index(segments, at, key)
            at += 1
        if isinstance(shape.item, Scalar):
            if at == len(segments):
                if index in node:
                    raise _twice(key)
                node[index] = value
            return
        _place(node.setdefault(index, {}), shape.item, segments, at, value, key)
    elif isinstance(shape, MapOf):
        if at < len(segments) and segments[at] in (shape.key, shape.value):
            index = 1  # Attribute.Name / Attribute.Value: one entry, unindexed
        else:
            index = _index(segments, at, key)
            at += 1
        entry = node.setdefault(index, {})
        part = segments[at] if at < len(segments) else None
        if part == shape.key or (part == shape.value and isinstance(shape.item, Scalar)):
            if at + 1 == len(segments):
                if part in entry:
                    raise _twice(key)
                entry[part] = value
        elif part == shape.value:
            _place(entry.setdefault(part, {}), shape.item, segments, at + 1, value, key)


def _integer(text: str, name: str) -> int:
    if not _INTEGER_RE.fullmatch(text):
        raise invalid_parameter_value(name, text[:40], "it must be a whole number.")
    return int(text)


def _finish(raw: Any, shape: Shape, name: str, wire: str) -> Any:
    """The raw tree of ``shape`` as the JSON protocol's value (lists in index order)."""
    if isinstance(shape, Scalar):
        if shape.kind == "integer":
            return _integer(raw, name)
        if shape.kind == "boolean":
            return raw.lower() == "true"
        return raw
    if isinstance(shape, Struct):
        return {member.name: _finish(raw[member.name], member.shape, member.name, member.wire)
                for member in shape.members if member.name in raw}
    if isinstance(shape, ListOf):
        return [_finish(raw[index], shape.item, name, wire) for index in sorted(raw)]
    out: dict[str, Any] = {}
    for index in sorted(raw):
        entry = raw[index]
        key = entry.get(shape.key)
        if key is None:
            raise missing(f"{wire}.{index}.{shape.key}")
        if key in out:
            raise SqsError("InvalidParameterValue", f"{wire}: the {shape.key} {key[:100]} is given more than once.")
        value = entry.get(shape.value)
        if value is None:
            if isinstance(shape.item, Scalar):
                raise missing(f"{wire}.{index}.{shape.value}")
            value = {}
        out[key] = _finish(value, shape.item, f"{name}.{key}", wire)
    return out


def params_of(action: str, fields: dict[str, str], path: str = "/") -> dict[str, Any]:
    """The parameters of ``action`` (one of :data:`.query_shapes.INPUTS`) that the
    form's ``fields`` give, in the JSON protocol's shape; a request sent to a
    queue URL's ``path`` that names no QueueUrl is about that queue."""
    shape = INPUTS[action]
    raw: dict[Any, Any] = {}
    for key, value in fields.items():
        if len(key) <= _MAX_KEY:
            _place(raw, shape, key.split("."), 0, value, key)
    params: dict[str, Any] = _finish(raw, shape, action, action)
    if "QueueUrl" not in params and "QueueUrl" in shape.by_wire and is_queue_path(path):
        params["QueueUrl"] = path
    return params
