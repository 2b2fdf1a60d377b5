"""The Query protocol's answers as JSON, for a request that asks for them
(``Accept: application/json``), shaped as Amazon writes them: the XML
answer's elements as JSON members under the same names
(``{"GetQueueAttributesResponse": {"GetQueueAttributesResult": {...},
"ResponseMetadata": {"RequestId": ...}}}``), the result's members named as
in the JSON protocol (``Attributes``, ``Messages``), a map as a list of its
entries (``[{"Name": ..., "Value": ...}]``). An error is
``{"Error": {"Type": ..., "Code": ..., "Message": ...}, "RequestId": ...}``,
with the Query protocol's code and text."""

from __future__ import annotations

import json
from typing import Any

from fastapi.responses import Response

from vsqs._gateway.sqs.protocol import SqsError
from vsqs._gateway.sqs.query_shapes import OUTPUTS, ListOf, MapOf, Scalar, Shape
from vsqs._gateway.sqs.query_xml import query_code

CONTENT_TYPE = "application/json"


def wants_json(accept: bytes) -> bool:
    """Whether an ``Accept`` header asks for JSON."""
    return any(part.split(b";", 1)[0].strip().lower() == CONTENT_TYPE.encode() for part in accept.split(b","))


def _value(value: Any, shape: Shape) -> Any:
    if isinstance(shape, Scalar):
        return value
    if isinstance(shape, ListOf):
        return [_value(item, shape.item) for item in value]
    if isinstance(shape, MapOf):
        return [{shape.key: key, shape.value: _value(item, shape.item)} for key, item in value.items()]
    return {member.name: _value(value[member.name], member.shape) for member in shape.members
            if value.get(member.name) is not None}


def result_json(action: str, result: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The JSON answer of ``action`` for the result the action returned."""
    answer: dict[str, Any] = {}
    shape = OUTPUTS.get(action)
    if shape is not None:
        answer[f"{action}Result"] = _value(result, shape)
    answer["ResponseMetadata"] = {"RequestId": request_id}
    return {f"{action}Response": answer}


def result_response(action: str, result: dict[str, Any], request_id: str) -> Response:
    return Response(json.dumps(result_json(action, result, request_id), separators=(",", ":")),
                    media_type=CONTENT_TYPE, headers={"x-amzn-RequestId": request_id})


def error_response(error: SqsError, request_id: str) -> Response:
    body = {"Error": {"Type": error.fault, "Code": query_code(error), "Message": error.query_message},
            "RequestId": request_id}
    headers = {"x-amzn-RequestId": request_id}
    if error.status == 503:
        headers["Retry-After"] = "5"
    return Response(json.dumps(body, separators=(",", ":")), status_code=error.status, media_type=CONTENT_TYPE,
                    headers=headers)
