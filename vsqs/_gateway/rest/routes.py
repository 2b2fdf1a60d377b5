"""The native API's handlers, under ``/queues``: queues, then messages in raw
mode (one body as is, metadata in headers), then messages in JSON."""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response

from vsqs import Message, QueueNotFound, VsqsError
from vsqs._core.settings import validate as validate_settings
from vsqs._gateway.errors import ApiError, api_error_of
from vsqs._gateway.limits import MAX_SHARDS
from vsqs._gateway.rest.bodies import BoundedRoute
from vsqs._gateway.rest.models import (
    Count,
    DeleteOutcome,
    DeleteResult,
    EntryError,
    MessageOut,
    NewReceipt,
    Operations,
    Published,
    PublishRequest,
    PublishResult,
    QueueList,
    QueueName,
    QueueOut,
    QueueSettings,
    QueueStatsOut,
    RawPublishOptions,
    RawReceiveOptions,
    ReceiptPath,
    Receipts,
    ReceiveRequest,
    ReceiveResult,
    RedriveRequest,
    Visibility,
    VisibilityBatch,
    VisibilityOutcome,
    VisibilityResult,
    queue_name_ok,
)
from vsqs._gateway.state import Gateway, gateway_of

CONTENT_TYPE_ATTRIBUTE = "content-type"  # where raw mode keeps a body's Content-Type
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_MEDIA_TYPE_RE = re.compile(rf'{_TOKEN}/{_TOKEN}(\s*;\s*{_TOKEN}=({_TOKEN}|"[ !#-\[\]-~]*"))*')

# a body is data, never a page of the gateway's origin (where its scripts would be
# same-origin, and with no API key all-powerful), whatever type its publisher chose
_INERT = {"X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox"}

router = APIRouter(prefix="/queues", route_class=BoundedRoute)


def _is_media_type(text: str) -> bool:
    """A well-formed media type, short enough for a header (anything else is not echoed)."""
    return len(text) <= 256 and _MEDIA_TYPE_RE.fullmatch(text) is not None


def _timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _message_out(m: Message) -> MessageOut:
    body = m.body
    attributes = m.attributes
    out = MessageOut(id=m.id, receipt=m.receipt, md5=_md5(body), receive_count=m.receive_count,
                     sent_at=m.sent_at, attributes=attributes, group=m.group)
    try:
        out.body = body.decode("utf-8")
    except UnicodeDecodeError:
        out.body_base64 = base64.b64encode(body).decode("ascii")
    return out


def _entry_error(exc: VsqsError) -> EntryError:
    error = api_error_of(exc)
    return EntryError(code=error.code, message=error.message)


async def _throttled_or_empty(gateway: Gateway, name: str) -> None:
    """An empty receive on a throttled queue is a 429, so clients back off."""
    if await gateway.on(name, lambda q: q.throttled()):
        raise ApiError(429, "throttled", "the queue's receive budget for this window is spent",
                       headers={"Retry-After": "1"})


# -- queues ---------------------------------------------------------------

@router.get("", name="list_queues", tags=["queues"])
async def list_queues(request: Request) -> QueueList:
    """The queues of the spool, sorted by name."""
    gateway = gateway_of(request)
    return QueueList(queues=await gateway.call(gateway.spool.queues))

@router.put("/{queue}", name="create_queue", tags=["queues"], status_code=201,
         responses={200: {"model": QueueOut, "description": "The queue existed already, with these settings"},
                    409: {"description": "The queue exists with other settings (PATCH changes them)"}})
async def create_queue(
    request: Request, response: Response, queue: QueueName,
    settings: Annotated[QueueSettings | None, Body()] = None,
    shards: Annotated[int | None, Query(
        ge=1, le=MAX_SHARDS, description="Spread the messages over this many directories (a power of two), "
        "for queues that stand deep; fixed at creation [default: 1]")] = None,
) -> QueueOut:
    """Create a queue with settings; idempotent when it exists with the same settings."""
    gateway = gateway_of(request)
    if shards is not None and shards & (shards - 1):
        raise ApiError(422, "invalid_parameter", f"shards must be a power of two, not {shards}", "shards")
    changes = settings.changes() if settings else {}
    try:
        existing, existing_shards = await gateway.on(queue, lambda q: (dict(q.settings), q.shards))
    except QueueNotFound:
        existing, existing_shards = None, 1
    if existing is None:
        made = await gateway.call(lambda: gateway.create_queue(queue, shards=shards, **changes))
        return QueueOut(name=queue, settings=dict(made.settings), shards=made.shards)
    wanted = {**existing, **validate_settings(changes)}
    if wanted != existing or (shards is not None and shards != existing_shards):
        raise ApiError(409, "queue_exists", f"queue {queue!r} exists with other settings; PATCH changes them",
                       "settings" if wanted != existing else "shards")
    response.status_code = 200
    return QueueOut(name=queue, settings=existing, shards=existing_shards)

@router.get("/{queue}", name="get_queue", tags=["queues"])
async def get_queue(request: Request, queue: QueueName) -> QueueOut:
    """A queue's settings and message counts."""
    gateway = gateway_of(request)
    settings, stats, shards = await gateway.on(queue, lambda q: (dict(q.settings), q.stats(), q.shards))
    return QueueOut(name=queue, settings=settings, stats=QueueStatsOut(**stats.__dict__), shards=shards)

@router.patch("/{queue}", name="configure_queue", tags=["queues"])
async def configure_queue(request: Request, queue: QueueName, settings: QueueSettings) -> QueueOut:
    """Change some settings (null unsets one); the rest stay."""
    gateway = gateway_of(request)
    changes = settings.changes()
    new, shards = await gateway.on(queue, lambda q: (dict(q.configure(**changes)), q.shards))
    return QueueOut(name=queue, settings=new, shards=shards)

@router.delete("/{queue}", name="delete_queue", tags=["queues"])
async def delete_queue(request: Request, queue: QueueName) -> Count:
    """Delete a queue and its messages; answers how many messages went."""
    gateway = gateway_of(request)
    count = await gateway.call(gateway.spool.delete_queue, queue)
    gateway.forget(queue)
    return Count(count=count)

@router.get("/{queue}/stats", name="stats", tags=["queues"])
async def stats(request: Request, queue: QueueName,
                groups: Annotated[bool, Query(description="Count per message group too")] = False) -> QueueStatsOut:
    """Message counts by state, from one listing."""
    gateway = gateway_of(request)
    handle = await gateway.handle(queue)
    result = await gateway.call(handle.stats, groups=groups)
    return QueueStatsOut(**result.__dict__)

@router.post("/{queue}/purge", name="purge", tags=["queues"])
async def purge(request: Request, queue: QueueName) -> Count:
    """Delete every message (in flight and delayed too); answers how many."""
    gateway = gateway_of(request)
    return Count(count=await gateway.on(queue, lambda q: q.purge()))

@router.post("/{queue}/redrive", name="redrive", tags=["queues"])
async def redrive(request: Request, queue: QueueName,
                  options: Annotated[RedriveRequest | None, Body()] = None) -> Count:
    """Move this dead-letter queue's visible messages back (to ``to``, or home)."""
    gateway = gateway_of(request)
    options = options or RedriveRequest.model_validate({})
    target = None
    if options.to is not None:
        if not queue_name_ok(options.to):
            raise ApiError(422, "invalid_parameter", "to must name a queue of this spool", "to")
        try:
            target = await gateway.handle(options.to)
        except QueueNotFound:
            raise ApiError(404, "queue_not_found", f"no queue {options.to!r}", "to") from None
    handle = await gateway.handle(queue)
    moved = await gateway.call(handle.redrive, target, max_messages=options.max_messages)
    return Count(count=moved)

@router.post("/{queue}/suspend", name="suspend", tags=["queues"])
async def suspend(request: Request, queue: QueueName,
                  body: Annotated[Operations | None, Body()] = None) -> QueueOut:
    """Suspend operations (publish, receive, delete; none named: all) in every process."""
    gateway = gateway_of(request)
    handle = await gateway.handle(queue)
    await gateway.call(handle.suspend, *(body.operations if body else []))
    settings, shards = await gateway.call(lambda: (dict(handle.settings), handle.shards))
    return QueueOut(name=queue, settings=settings, shards=shards)

@router.post("/{queue}/resume", name="resume", tags=["queues"])
async def resume(request: Request, queue: QueueName,
                 body: Annotated[Operations | None, Body()] = None) -> QueueOut:
    """Resume operations (none named: all)."""
    gateway = gateway_of(request)
    handle = await gateway.handle(queue)
    await gateway.call(handle.resume, *(body.operations if body else []))
    settings, shards = await gateway.call(lambda: (dict(handle.settings), handle.shards))
    return QueueOut(name=queue, settings=settings, shards=shards)

# -- messages, raw ---------------------------------------------------------

@router.post(
    "/{queue}/messages", name="publish_raw", tags=["messages"], status_code=201,
    response_class=Response,
    openapi_extra={"requestBody": {"required": True, "content": {"*/*": {"schema": {"type": "string",
                                                                                    "format": "binary"}}}}},
    responses={201: {"description": "Stored; Message-Id, Message-Md5 and Message-Timestamp headers",
                     "content": None}},
)
async def publish_raw(request: Request, queue: QueueName, options: Annotated[RawPublishOptions, Query()]) -> Response:
    """Store the request body as is, whatever its Content-Type (kept for GET)."""
    gateway = gateway_of(request)
    data = await request.body()  # at most --max-body-bytes: the route's cap (rest/bodies.py)
    content_type = request.headers.get("content-type")
    if content_type is not None and not _is_media_type(content_type):
        raise ApiError(422, "invalid_parameter", "Content-Type must be a media type such as text/plain",
                       "Content-Type")
    attributes = {CONTENT_TYPE_ATTRIBUTE: content_type} if content_type else None
    priority: dict[str, Any] = {} if options.priority is None else {"priority": options.priority}
    sent = datetime.now(UTC).timestamp()
    message_id = await gateway.on(queue, lambda q: q.publish(
        data, delay=options.delay, **priority,
        attributes=attributes, group=options.group, dedup_id=options.dedup_id,
    ))
    return Response(status_code=201, headers={
        "Message-Id": message_id, "Message-Md5": _md5(data), "Message-Timestamp": _timestamp(sent)})

@router.get(
    "/{queue}/messages", name="receive_raw", tags=["messages"], response_class=Response,
    responses={200: {"description": "The body as is; Message-Id, Message-Receipt, Message-Receive-Count, "
                                    "Message-Timestamp, Message-Md5 headers",
                     "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}},
               204: {"description": "No message is visible (after the wait)"}},
)
async def receive_raw(request: Request, queue: QueueName, options: Annotated[RawReceiveOptions, Query()]) -> Response:
    """Receive one message and answer its body as is (204 when none is visible)."""
    gateway = gateway_of(request)
    got = await gateway.receive(queue, 1, options.visibility_timeout, options.wait, request.is_disconnected)
    if not got:
        await _throttled_or_empty(gateway, queue)
        return Response(status_code=204)
    m = got[0]
    body = m.body  # read by the receive, on the thread pool
    attributes = m.attributes
    stored_type = attributes.get(CONTENT_TYPE_ATTRIBUTE, "")  # set by anyone: the library, SQS clients
    media_type = stored_type if _is_media_type(stored_type) else "application/octet-stream"
    return Response(body, media_type=media_type,
                    headers={"Message-Id": m.id, "Message-Receipt": m.receipt,
                             "Message-Receive-Count": str(m.receive_count),
                             "Message-Timestamp": _timestamp(m.sent_at), "Message-Md5": _md5(body),
                             **_INERT})

# -- messages, JSON ---------------------------------------------------------

@router.post("/{queue}/messages/batch", name="publish", tags=["messages"], status_code=201)
async def publish(request: Request, queue: QueueName, batch: PublishRequest) -> PublishResult:
    """Publish 1-100 messages together (one directory fsync); all are stored or none."""
    gateway = gateway_of(request)
    bodies = [entry.data() for entry in batch.messages]
    limit = gateway.config.max_body_bytes
    for position, data in enumerate(bodies):
        if len(data) > limit:
            raise ApiError(413, "message_too_large", f"messages.{position}: {len(data)} bytes, over the "
                           f"gateway's {limit}", f"messages.{position}.body")
    outgoing = [entry.outgoing(data) for entry, data in zip(batch.messages, bodies, strict=True)]
    ids = await gateway.on(queue, lambda q: q.publish_batch(outgoing, dedup=batch.dedup))
    md5s = [_md5(data) for data in bodies]
    return PublishResult(messages=[Published(id=i, md5=m) for i, m in zip(ids, md5s, strict=True)])

@router.post("/{queue}/messages/receive", name="receive", tags=["messages"], response_model_exclude_none=True,
          responses={429: {"description": "Nothing received and the queue is throttled"}})
async def receive(request: Request, queue: QueueName,
                  options: Annotated[ReceiveRequest | None, Body()] = None) -> ReceiveResult:
    """Receive up to max_messages, long-polling up to ``wait`` seconds for the first."""
    gateway = gateway_of(request)
    options = options or ReceiveRequest.model_validate({})
    got = await gateway.receive(queue, options.max_messages, options.visibility_timeout, options.wait,
                                request.is_disconnected)
    if not got:
        await _throttled_or_empty(gateway, queue)
    return ReceiveResult(messages=[_message_out(m) for m in got])  # the bodies were read by the receive

@router.delete("/{queue}/messages/{receipt}", name="delete", tags=["messages"], status_code=204,
            response_class=Response,
            responses={409: {"description": "The receipt no longer holds its message"}})
async def delete(request: Request, queue: QueueName, receipt: ReceiptPath) -> Response:
    """Delete a received message by its receipt."""
    gateway = gateway_of(request)
    await gateway.on(queue, lambda q: q.delete(receipt))
    return Response(status_code=204)

@router.post("/{queue}/messages/delete", name="delete_batch", tags=["messages"])
async def delete_batch(request: Request, queue: QueueName, body: Receipts) -> DeleteResult:
    """Delete several messages; one outcome per receipt, in order."""
    gateway = gateway_of(request)
    outcomes = await gateway.on(queue, lambda q: q.delete_batch(body.receipts))
    return DeleteResult(results=[
        DeleteOutcome(receipt=r, error=None if e is None else _entry_error(e))
        for r, e in zip(body.receipts, outcomes, strict=True)])

@router.put("/{queue}/messages/{receipt}/visibility", name="change_visibility", tags=["messages"],
         responses={409: {"description": "The receipt no longer holds its message"}})
async def change_visibility(request: Request, queue: QueueName, receipt: ReceiptPath,
                            body: Visibility) -> NewReceipt:
    """Hide the message for ``timeout`` seconds from now; answers the new receipt."""
    gateway = gateway_of(request)
    new = await gateway.on(queue, lambda q: q.change_visibility(receipt, body.timeout))
    return NewReceipt(receipt=new)

@router.post("/{queue}/messages/visibility", name="change_visibility_batch", tags=["messages"])
async def change_visibility_batch(request: Request, queue: QueueName, body: VisibilityBatch) -> VisibilityResult:
    """Change the visibility of several messages; one outcome per entry, in order."""
    gateway = gateway_of(request)
    pairs = [(entry.receipt, entry.timeout) for entry in body.entries]
    outcomes = await gateway.on(queue, lambda q: q.change_visibility_batch(pairs))
    results = []
    for (receipt, _), outcome in zip(pairs, outcomes, strict=True):
        if isinstance(outcome, VsqsError):
            results.append(VisibilityOutcome(receipt=receipt, error=_entry_error(outcome)))
        else:
            results.append(VisibilityOutcome(receipt=receipt, new_receipt=outcome))
    return VisibilityResult(results=results)
