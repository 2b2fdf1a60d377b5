"""The SQS face's two wire protocols side by side: AWS JSON 1.0
(:mod:`.protocol`) and Query (:mod:`.query`, :mod:`.query_xml`).

:func:`wire_of` tells which one a request speaks from its head alone;
the :class:`Wire` it returns turns the request into an action's parameters
and renders the action's result or error, so that the endpoint and the
actions are the same for both. The middleware that refuses requests before
they reach the endpoint (size cap, browser guard) answers in the request's
protocol with :func:`refusal`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response

from vsqs._gateway.asgi import Scope
from vsqs._gateway.sqs import protocol as _json
from vsqs._gateway.sqs import query as _query
from vsqs._gateway.sqs import query_json as _query_json
from vsqs._gateway.sqs import query_xml as _xml
from vsqs._gateway.sqs.protocol import SqsError, is_queue_path, missing

# actions that are no queue's: Amazon refuses them at a queue's URL (InvalidAction)
_QUEUELESS_ACTIONS = frozenset({"CreateQueue", "ListQueues"})


@dataclass
class Incoming:
    """A request to the SQS face, read: the action it names (``""``: none of SQS's),
    what it named (for the answer to an unknown one), the bytes it signed (its
    body) and, in the Query protocol, its form's fields."""

    action: str
    named: str
    body: bytes
    fields: dict[str, str] | None = None
    form: bytes | None = None  # Query: the form, its fields decoded once the request is authenticated
    bare_get: bool = False  # Query: a GET of a queue's URL that names no action


class Wire:
    """One protocol's reading of parameters and rendering of answers."""

    name = ""

    async def params(self, incoming: Incoming, path: str) -> dict[str, Any]:
        raise NotImplementedError

    def unknown_operation(self, incoming: Incoming) -> SqsError:
        raise NotImplementedError

    def result_response(self, action: str, result: dict[str, Any], request_id: str) -> Response:
        raise NotImplementedError

    def error_response(self, error: SqsError, request_id: str | None = None) -> Response:
        raise NotImplementedError


class JsonWire(Wire):
    """AWS JSON 1.0: ``X-Amz-Target`` names the action, the body is a JSON object."""

    name = "json"

    async def params(self, incoming: Incoming, path: str) -> dict[str, Any]:
        return await _json.parse_body(incoming.body)

    def unknown_operation(self, incoming: Incoming) -> SqsError:
        return _json.unknown_operation(incoming.named, incoming.body)

    def result_response(self, action: str, result: dict[str, Any], request_id: str) -> Response:
        return _json.result_response(result, request_id)

    def error_response(self, error: SqsError, request_id: str | None = None) -> Response:
        return _json.error_response(error, request_id)


class QueryWire(Wire):
    """Query: a form names the action and carries its parameters; answers are XML."""

    name = "query"

    async def params(self, incoming: Incoming, path: str) -> dict[str, Any]:
        assert incoming.fields is not None  # (decoded after authentication: see SqsFace.answer)
        if incoming.action in _QUEUELESS_ACTIONS and is_queue_path(path):
            raise _invalid_action(incoming.action)
        return _query.params_of(incoming.action, incoming.fields, path)

    def unknown_operation(self, incoming: Incoming) -> SqsError:
        if incoming.bare_get:
            return SqsError("UnknownOperationException", "", 404)  # (Amazon: a bare <UnknownOperationException/>)
        if not incoming.named:
            return missing("Action", "MissingAction")
        return _invalid_action(incoming.named)

    def result_response(self, action: str, result: dict[str, Any], request_id: str) -> Response:
        return _xml.result_response(action, result, request_id)

    def error_response(self, error: SqsError, request_id: str | None = None) -> Response:
        return _xml.error_response(error, request_id or _json.new_request_id())


class QueryJsonWire(QueryWire):
    """Query, answered in JSON for a request whose ``Accept`` asks for it (:mod:`.query_json`)."""

    name = "query-json"

    def result_response(self, action: str, result: dict[str, Any], request_id: str) -> Response:
        return _query_json.result_response(action, result, request_id)

    def error_response(self, error: SqsError, request_id: str | None = None) -> Response:
        if error.status == 404 and error.name == "UnknownOperationException":
            return super().error_response(error, request_id)  # Amazon answers it in XML whatever was asked
        return _query_json.error_response(error, request_id or _json.new_request_id())


def _invalid_action(named: str) -> SqsError:
    """Amazon's answer to an action it does not take (at this URL)."""
    return SqsError("UnknownOperationException", f"The action {named[:100]} is not valid for this endpoint.")


JSON = JsonWire()
QUERY = QueryWire()
QUERY_JSON = QueryJsonWire()


def wire_of(scope: Scope) -> Wire:
    """The protocol a request speaks: Query for a form POST or a GET naming an
    Action (:func:`.query.is_query_request`; answered in JSON when its
    ``Accept`` asks for it), else JSON 1.0."""
    if not _query.is_query_request(scope):
        return JSON
    accept = next((value for key, value in scope["headers"] if key == b"accept"), b"")
    return QUERY_JSON if _query_json.wants_json(accept) else QUERY


def is_sqs_request(scope: Scope) -> bool:
    """A request for the SQS face, in either protocol."""
    return _json.is_sqs_request(scope) or _query.is_query_request(scope)


def content_type(scope: Scope) -> str | None:
    """The media type an SQS request's body must have (None: a GET, no body)."""
    if _query.is_query_request(scope):
        return _query.FORM_CONTENT_TYPE if scope["method"] == "POST" else None
    return _json.CONTENT_TYPE


def refusal(scope: Scope, error: SqsError) -> Response:
    """A refused SQS request's answer, in its protocol."""
    return wire_of(scope).error_response(error)


def request_too_large(scope: Scope, limit: int) -> Response:
    """The answer to a request over the face's size cap (HTTP 413)."""
    return refusal(scope, _json.too_large(limit))


def request_timeout(scope: Scope, message: str) -> Response:
    """The answer to a request whose body came too slowly (HTTP 408; SDKs retry
    ``RequestTimeout``); the connection is closed after it."""
    response = refusal(scope, SqsError("RequestTimeout", message, 408))
    response.headers["Connection"] = "close"
    return response
