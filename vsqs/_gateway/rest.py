"""The native face of the gateway: JSON over REST under ``/queues``, plus a raw
mode for single messages in the spirit of the header-based HTTP queues.

Every handler makes public vsqs calls through ``gateway.call`` (on the thread
pool) and lets vsqs errors rise: ``_gateway`` turns them into statuses in one
place (404 unknown queue, 400 malformed receipt, 409 stale receipt, 413 too
large, 422 bad value naming the parameter, 429 full or throttled, 503
suspended, 507 disk full).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StringConstraints, Tag

from vsqs._core.errors import InvalidArgument, QueueNotFound, VsqsError
from vsqs._gateway.app import MAX_WAIT, ApiError, Gateway, api_error_of, gateway_of
from vsqs._core.message import Message, Outgoing
from vsqs._core.settings import validate as validate_settings
from vsqs._core.rules import check_queue_name

MAX_JSON_BATCH = 100
CONTENT_TYPE_ATTRIBUTE = "content-type"  # where raw mode keeps a body's Content-Type
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_MEDIA_TYPE_RE = re.compile(rf'{_TOKEN}/{_TOKEN}(\s*;\s*{_TOKEN}=({_TOKEN}|"[ !#-\[\]-~]*"))*')

QueueName = Annotated[
    str, Path(description="Queue name: 1-80 of A-Z a-z 0-9 _ . -, starting with a letter or digit",
              min_length=1, max_length=80, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
]
ReceiptPath = Annotated[str, Path(description="A receipt, as received", min_length=1, max_length=512)]
Wait = Annotated[float | None, Query(ge=0, le=MAX_WAIT, description="Long-poll seconds [default: the queue's receive_wait]")]
VisibilityQuery = Annotated[
    float | None, Query(ge=0, le=43200, description="Seconds the message stays hidden [default: the queue's setting]")
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class QueueSettings(_Strict):
    """Queue settings (docs/FORMAT.md has their meaning); null unsets one."""

    visibility_timeout: float | None = None
    delay: float | None = None
    retention: float | None = None
    max_messages: int | None = None
    max_message_bytes: int | None = None
    max_receives: int | None = None
    dead_letter: str | None = Field(None, description="A queue of this spool, by name")
    group_concurrency: int | None = None
    dedup_window: float | None = None
    content_dedup: bool | None = None
    receive_wait: float | None = None
    throttle: tuple[int, float] | None = Field(None, description="[N, seconds]: at most N receives per window")
    suspended: list[Literal["publish", "receive", "delete"]] | None = None

    def changes(self) -> dict[str, Any]:
        """The settings the client named (null included: it unsets)."""
        given = self.model_dump(exclude_unset=True)
        dead_letter = given.get("dead_letter")
        if dead_letter is not None and not _queue_name_ok(dead_letter):
            raise ApiError(422, "invalid_parameter",
                           "dead_letter must name a queue of this spool (paths are for the library)", "dead_letter")
        return given


class QueueStatsOut(BaseModel):
    ready: int
    in_flight: int
    delayed: int
    writing: int
    dead_lettered: int
    oldest_ready_age: float = Field(description="Seconds since the oldest visible message was sent")
    groups: dict[str, dict[str, int]] | None = None


class QueueOut(BaseModel):
    name: str
    settings: dict[str, Any]
    shards: int = Field(1, description="Directories the messages are spread over (fixed at creation)")
    stats: QueueStatsOut | None = None


class QueueList(BaseModel):
    queues: list[str]


AttributeName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,256}$")]


class _MessageOptions(_Strict):
    delay: float | None = Field(None, ge=0, description="Seconds hidden [default: the queue's delay]")
    priority: int | None = Field(None, ge=0, le=9, description="0..9, higher first (not with group)")
    attributes: dict[AttributeName, str] | None = None
    group: str | None = Field(None, min_length=1, max_length=128, description="Delivered in order within the group")
    dedup_id: str | None = Field(None, min_length=1, max_length=128)

    def outgoing(self, data: bytes | str) -> Outgoing:
        return Outgoing(data, delay=self.delay, priority=self.priority, attributes=self.attributes,
                        group=self.group, dedup_id=self.dedup_id)


class TextMessage(_MessageOptions):
    """A message whose body is text (stored as UTF-8)."""

    body: str

    def data(self) -> bytes:
        return self.body.encode("utf-8")


class BinaryMessage(_MessageOptions):
    """A message whose body is any bytes, in base64."""

    body_base64: str = Field(pattern=r"^[A-Za-z0-9+/]*={0,2}$")

    def data(self) -> bytes:
        try:
            return base64.b64decode(self.body_base64, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(422, "invalid_parameter", "body_base64 is not base64", "body_base64") from None


def _body_kind(entry: Any) -> str:
    has_base64 = isinstance(entry, dict) and "body_base64" in entry or isinstance(entry, BinaryMessage)
    return "binary" if has_base64 else "text"


OutgoingMessage = Annotated[
    Annotated[TextMessage, Tag("text")] | Annotated[BinaryMessage, Tag("binary")], Discriminator(_body_kind)
]


class PublishRequest(_Strict):
    messages: list[OutgoingMessage] = Field(min_length=1, max_length=MAX_JSON_BATCH)
    dedup: Literal["content"] | None = Field(None, description="Messages without dedup_id dedup by content")


class Published(BaseModel):
    id: str
    md5: str


class PublishResult(BaseModel):
    messages: list[Published]


class ReceiveRequest(_Strict):
    max_messages: int = Field(10, ge=1, le=MAX_JSON_BATCH)
    wait: float | None = Field(None, ge=0, le=MAX_WAIT, description="Long-poll seconds [default: receive_wait]")
    visibility_timeout: float | None = Field(None, ge=0, le=43200)


class MessageOut(BaseModel):
    """A received message: ``body`` when it is UTF-8 text, else ``body_base64``."""

    id: str
    receipt: str
    body: str | None = None
    body_base64: str | None = None
    md5: str
    receive_count: int
    sent_at: float = Field(description="Epoch seconds")
    attributes: dict[str, str]
    group: str | None = None


class ReceiveResult(BaseModel):
    messages: list[MessageOut]


class Receipts(_Strict):
    receipts: list[str] = Field(min_length=1, max_length=MAX_JSON_BATCH)


class EntryError(BaseModel):
    code: str
    message: str


class DeleteOutcome(BaseModel):
    receipt: str
    error: EntryError | None = None


class DeleteResult(BaseModel):
    results: list[DeleteOutcome]


class Visibility(_Strict):
    timeout: float = Field(ge=0, le=43200, description="Seconds from now the message stays hidden")


class VisibilityEntry(Visibility):
    receipt: str


class VisibilityBatch(_Strict):
    entries: list[VisibilityEntry] = Field(min_length=1, max_length=MAX_JSON_BATCH)


class NewReceipt(BaseModel):
    receipt: str


class VisibilityOutcome(BaseModel):
    receipt: str = Field(description="The receipt given")
    new_receipt: str | None = None
    error: EntryError | None = None


class VisibilityResult(BaseModel):
    results: list[VisibilityOutcome]


class RedriveRequest(_Strict):
    to: str | None = Field(None, description="A queue of this spool [default: each message's own source]")
    max_messages: int | None = Field(None, ge=0)


class Operations(_Strict):
    operations: list[Literal["publish", "receive", "delete"]] = Field(
        default_factory=list, description="Empty: all of publish, receive, delete")


class Count(BaseModel):
    count: int


def _is_media_type(text: str) -> bool:
    """A well-formed media type, short enough for a header (anything else is not echoed)."""
    return len(text) <= 256 and _MEDIA_TYPE_RE.fullmatch(text) is not None


def _queue_name_ok(name: str) -> bool:
    """A plain queue name of this spool (never a path: HTTP clients stay inside the spool)."""
    try:
        check_queue_name(name)
    except InvalidArgument:
        return False
    return True


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


def router() -> APIRouter:
    api = APIRouter(prefix="/queues")

    # -- queues ---------------------------------------------------------------

    @api.get("", name="list_queues", tags=["queues"])
    async def list_queues(request: Request) -> QueueList:
        """The queues of the spool, sorted by name."""
        gateway = gateway_of(request)
        return QueueList(queues=await gateway.call(gateway.spool.queues))

    @api.put("/{queue}", name="create_queue", tags=["queues"], status_code=201,
             responses={200: {"model": QueueOut, "description": "The queue existed already, with these settings"},
                        409: {"description": "The queue exists with other settings (PATCH changes them)"}})
    async def create_queue(
        request: Request, response: Response, queue: QueueName,
        settings: Annotated[QueueSettings | None, Body()] = None,
        shards: Annotated[int | None, Query(
            ge=1, le=256, description="Spread the messages over this many directories (a power of two), "
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

    @api.get("/{queue}", name="get_queue", tags=["queues"])
    async def get_queue(request: Request, queue: QueueName) -> QueueOut:
        """A queue's settings and message counts."""
        gateway = gateway_of(request)
        settings, stats, shards = await gateway.on(queue, lambda q: (dict(q.settings), q.stats(), q.shards))
        return QueueOut(name=queue, settings=settings, stats=QueueStatsOut(**stats.__dict__), shards=shards)

    @api.patch("/{queue}", name="configure_queue", tags=["queues"])
    async def configure_queue(request: Request, queue: QueueName, settings: QueueSettings) -> QueueOut:
        """Change some settings (null unsets one); the rest stay."""
        gateway = gateway_of(request)
        changes = settings.changes()
        new, shards = await gateway.on(queue, lambda q: (dict(q.configure(**changes)), q.shards))
        return QueueOut(name=queue, settings=new, shards=shards)

    @api.delete("/{queue}", name="delete_queue", tags=["queues"])
    async def delete_queue(request: Request, queue: QueueName) -> Count:
        """Delete a queue and its messages; answers how many messages went."""
        gateway = gateway_of(request)
        count = await gateway.call(gateway.spool.delete_queue, queue)
        gateway.forget(queue)
        return Count(count=count)

    @api.get("/{queue}/stats", name="stats", tags=["queues"])
    async def stats(request: Request, queue: QueueName,
                    groups: Annotated[bool, Query(description="Count per message group too")] = False) -> QueueStatsOut:
        """Message counts by state, from one listing."""
        gateway = gateway_of(request)
        handle = await gateway.handle(queue)
        result = await gateway.call(handle.stats, groups=groups)
        return QueueStatsOut(**result.__dict__)

    @api.post("/{queue}/purge", name="purge", tags=["queues"])
    async def purge(request: Request, queue: QueueName) -> Count:
        """Delete every message (in flight and delayed too); answers how many."""
        gateway = gateway_of(request)
        return Count(count=await gateway.on(queue, lambda q: q.purge()))

    @api.post("/{queue}/redrive", name="redrive", tags=["queues"])
    async def redrive(request: Request, queue: QueueName,
                      options: Annotated[RedriveRequest | None, Body()] = None) -> Count:
        """Move this dead-letter queue's visible messages back (to ``to``, or home)."""
        gateway = gateway_of(request)
        options = options or RedriveRequest.model_validate({})
        target = None
        if options.to is not None:
            if not _queue_name_ok(options.to):
                raise ApiError(422, "invalid_parameter", "to must name a queue of this spool", "to")
            try:
                target = await gateway.handle(options.to)
            except QueueNotFound:
                raise ApiError(404, "queue_not_found", f"no queue {options.to!r}", "to") from None
        handle = await gateway.handle(queue)
        moved = await gateway.call(handle.redrive, target, max_messages=options.max_messages)
        return Count(count=moved)

    @api.post("/{queue}/suspend", name="suspend", tags=["queues"])
    async def suspend(request: Request, queue: QueueName,
                      body: Annotated[Operations | None, Body()] = None) -> QueueOut:
        """Suspend operations (publish, receive, delete; none named: all) in every process."""
        gateway = gateway_of(request)
        handle = await gateway.handle(queue)
        await gateway.call(handle.suspend, *(body.operations if body else []))
        settings, shards = await gateway.call(lambda: (dict(handle.settings), handle.shards))
        return QueueOut(name=queue, settings=settings, shards=shards)

    @api.post("/{queue}/resume", name="resume", tags=["queues"])
    async def resume(request: Request, queue: QueueName,
                     body: Annotated[Operations | None, Body()] = None) -> QueueOut:
        """Resume operations (none named: all)."""
        gateway = gateway_of(request)
        handle = await gateway.handle(queue)
        await gateway.call(handle.resume, *(body.operations if body else []))
        settings, shards = await gateway.call(lambda: (dict(handle.settings), handle.shards))
        return QueueOut(name=queue, settings=settings, shards=shards)

    # -- messages, raw ---------------------------------------------------------

    @api.post(
        "/{queue}/messages", name="publish_raw", tags=["messages"], status_code=201,
        response_class=Response,
        openapi_extra={"requestBody": {"required": True, "content": {"*/*": {"schema": {"type": "string",
                                                                                        "format": "binary"}}}}},
        responses={201: {"description": "Stored; Message-Id, Message-Md5 and Message-Timestamp headers",
                         "content": None}},
    )
    async def publish_raw(
        request: Request, queue: QueueName,
        delay: Annotated[float | None, Query(ge=0, description="Seconds hidden")] = None,
        priority: Annotated[int | None, Query(ge=0, le=9)] = None,
        group: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
        dedup_id: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    ) -> Response:
        """Store the request body as is, whatever its Content-Type (kept for GET)."""
        gateway = gateway_of(request)
        data = await request.body()
        limit = gateway.config.max_message_bytes
        if len(data) > limit:
            raise ApiError(413, "message_too_large", f"the body is {len(data)} bytes, over the gateway's {limit}", "body")
        content_type = request.headers.get("content-type")
        if content_type is not None and not _is_media_type(content_type):
            raise ApiError(422, "invalid_parameter", "Content-Type must be a media type such as text/plain",
                           "Content-Type")
        attributes = {CONTENT_TYPE_ATTRIBUTE: content_type} if content_type else None
        options: dict[str, Any] = {} if priority is None else {"priority": priority}
        sent = datetime.now(UTC).timestamp()
        message_id = await gateway.on(queue, lambda q: q.publish(
            data, delay=delay, **options,
            attributes=attributes, group=group, dedup_id=dedup_id,
        ))
        gateway.published(queue, 1)
        return Response(status_code=201, headers={
            "Message-Id": message_id, "Message-Md5": _md5(data), "Message-Timestamp": _timestamp(sent)})

    @api.get(
        "/{queue}/messages", name="receive_raw", tags=["messages"], response_class=Response,
        responses={200: {"description": "The body as is; Message-Id, Message-Receipt, Message-Receive-Count, "
                                        "Message-Timestamp, Message-Md5 headers",
                         "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}},
                   204: {"description": "No message is visible (after the wait)"}},
    )
    async def receive_raw(request: Request, queue: QueueName, wait: Wait = None,
                          visibility_timeout: VisibilityQuery = None) -> Response:
        """Receive one message and answer its body as is (204 when none is visible)."""
        gateway = gateway_of(request)
        got = await gateway.receive(queue, 1, visibility_timeout, wait, request.is_disconnected)
        if not got:
            await _throttled_or_empty(gateway, queue)
            return Response(status_code=204)
        m = got[0]
        body = await gateway.call(lambda: m.body)
        attributes = m.attributes
        stored_type = attributes.get(CONTENT_TYPE_ATTRIBUTE, "")  # set by anyone: the library, SQS clients
        media_type = stored_type if _is_media_type(stored_type) else "application/octet-stream"
        return Response(body, media_type=media_type,
                        headers={"Message-Id": m.id, "Message-Receipt": m.receipt,
                                 "Message-Receive-Count": str(m.receive_count),
                                 "Message-Timestamp": _timestamp(m.sent_at), "Message-Md5": _md5(body)})

    # -- messages, JSON ---------------------------------------------------------

    @api.post("/{queue}/messages/batch", name="publish", tags=["messages"], status_code=201)
    async def publish(request: Request, queue: QueueName, batch: PublishRequest) -> PublishResult:
        """Publish 1-100 messages together (one directory fsync); all are stored or none."""
        gateway = gateway_of(request)
        bodies = [entry.data() for entry in batch.messages]
        limit = gateway.config.max_message_bytes
        for position, data in enumerate(bodies):
            if len(data) > limit:
                raise ApiError(413, "message_too_large", f"messages.{position}: {len(data)} bytes, over the "
                               f"gateway's {limit}", f"messages.{position}.body")
        outgoing = [entry.outgoing(data) for entry, data in zip(batch.messages, bodies, strict=True)]
        ids = await gateway.on(queue, lambda q: q.publish_batch(outgoing, dedup=batch.dedup))
        gateway.published(queue, len(ids))
        md5s = [_md5(data) for data in bodies]
        return PublishResult(messages=[Published(id=i, md5=m) for i, m in zip(ids, md5s, strict=True)])

    @api.post("/{queue}/messages/receive", name="receive", tags=["messages"], response_model_exclude_none=True,
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
        return ReceiveResult(messages=await gateway.call(lambda: [_message_out(m) for m in got]))

    @api.delete("/{queue}/messages/{receipt}", name="delete", tags=["messages"], status_code=204,
                response_class=Response,
                responses={409: {"description": "The receipt no longer holds its message"}})
    async def delete(request: Request, queue: QueueName, receipt: ReceiptPath) -> Response:
        """Delete a received message by its receipt."""
        gateway = gateway_of(request)
        await gateway.on(queue, lambda q: q.delete(receipt))
        return Response(status_code=204)

    @api.post("/{queue}/messages/delete", name="delete_batch", tags=["messages"])
    async def delete_batch(request: Request, queue: QueueName, body: Receipts) -> DeleteResult:
        """Delete several messages; one outcome per receipt, in order."""
        gateway = gateway_of(request)
        outcomes = await gateway.on(queue, lambda q: q.delete_batch(body.receipts))
        return DeleteResult(results=[
            DeleteOutcome(receipt=r, error=None if e is None else _entry_error(e))
            for r, e in zip(body.receipts, outcomes, strict=True)])

    @api.put("/{queue}/messages/{receipt}/visibility", name="change_visibility", tags=["messages"],
             responses={409: {"description": "The receipt no longer holds its message"}})
    async def change_visibility(request: Request, queue: QueueName, receipt: ReceiptPath,
                                body: Visibility) -> NewReceipt:
        """Hide the message for ``timeout`` seconds from now; answers the new receipt."""
        gateway = gateway_of(request)
        new = await gateway.on(queue, lambda q: q.change_visibility(receipt, body.timeout))
        return NewReceipt(receipt=new)

    @api.post("/{queue}/messages/visibility", name="change_visibility_batch", tags=["messages"])
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

    return api

