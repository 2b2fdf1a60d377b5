"""The native API's schemas: path and query parameters, request and response
bodies. FastAPI validates requests against them and generates the OpenAPI
schema from them, so the two cannot drift apart; their limits come from
:mod:`vsqs._gateway.limits`, and the settings body from the settings'
declarations (:data:`vsqs._core.settings.SCHEMA`)."""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Discriminator, Field, JsonValue, StringConstraints, Tag, create_model

from vsqs import InvalidArgument, Outgoing
from vsqs._core.rules import ATTRIBUTE_NAME_RE, QUEUE_NAME_RE, check_queue_name
from vsqs._core.settings import SCHEMA, Setting
from vsqs._gateway.errors import ApiError
from vsqs._gateway.limits import (
    MAX_DEDUP_ID,
    MAX_GROUP_LENGTH,
    MAX_JSON_BATCH,
    MAX_PRIORITY,
    MAX_QUEUE_NAME,
    MAX_VISIBILITY_TIMEOUT,
    MAX_WAIT,
    MIN_PRIORITY,
)

QueueName = Annotated[
    str, Path(description=f"Queue name: 1-{MAX_QUEUE_NAME} of A-Z a-z 0-9 _ . -, "
                          "starting with a letter or digit",
              min_length=1, max_length=MAX_QUEUE_NAME, pattern=rf"^{QUEUE_NAME_RE.pattern}$")
]
ReceiptPath = Annotated[str, Path(description="A receipt, as received", min_length=1, max_length=512)]


class RawPublishOptions(BaseModel):
    """The query parameters of a raw publish (``POST /queues/{queue}/messages``)."""

    delay: float | None = Field(None, ge=0, description="Seconds hidden")
    priority: int | None = Field(None, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    group: str | None = Field(None, min_length=1, max_length=MAX_GROUP_LENGTH)
    dedup_id: str | None = Field(None, min_length=1, max_length=MAX_DEDUP_ID)


class RawReceiveOptions(BaseModel):
    """The query parameters of a raw receive (``GET /queues/{queue}/messages``)."""

    wait: float | None = Field(
        None, ge=0, le=MAX_WAIT, description="Long-poll seconds [default: the queue's receive_wait]")
    visibility_timeout: float | None = Field(
        None, ge=0, le=MAX_VISIBILITY_TIMEOUT,
        description="Seconds the message stays hidden [default: the queue's setting]")


def queue_name_ok(name: str) -> bool:
    """A plain queue name of this spool (never a path: HTTP clients stay inside the spool)."""
    try:
        check_queue_name(name)
    except InvalidArgument:
        return False
    return True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _SettingsBody(_Strict):
    """Queue settings (docs/FORMAT.md has their meaning); null unsets one."""

    def changes(self) -> dict[str, Any]:
        """The settings the client named (null included: it unsets)."""
        given = self.model_dump(exclude_unset=True)
        dead_letter = given.get("dead_letter")
        if dead_letter is not None and not queue_name_ok(dead_letter):
            raise ApiError(422, "invalid_parameter",
                           "dead_letter must name a queue of this spool (paths are for the library)", "dead_letter")
        return given


_API_DOCS = {"dead_letter": "A queue of this spool, by name"}  # where the API takes less than the library


def _settings_field(name: str, setting: Setting) -> Any:
    """The field of an editable setting: its type, its doc and its bounds for the
    schema (the engine checks the bounds, so a refusal is worded as ever)."""
    bounds: dict[str, JsonValue] = {}
    if setting.bounds is not None:
        low, high = setting.bounds
        bounds = {"exclusiveMinimum" if setting.positive else "minimum": low, "maximum": high}
    doc = _API_DOCS.get(name, setting.doc).replace("`", "")  # plain text, without Markdown's code marks
    return (setting.type | None, Field(None, description=doc[:1].upper() + doc[1:], json_schema_extra=bounds or None))


if TYPE_CHECKING:
    QueueSettings = _SettingsBody
else:  # one field per editable setting, from the declarations
    QueueSettings = create_model(
        "QueueSettings", __base__=_SettingsBody, __doc__=_SettingsBody.__doc__,
        **{name: _settings_field(name, setting) for name, setting in SCHEMA.items() if setting.editable})


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


AttributeName = Annotated[str, StringConstraints(pattern=rf"^{ATTRIBUTE_NAME_RE.pattern}$")]


class _MessageOptions(_Strict):
    delay: float | None = Field(None, ge=0, description="Seconds hidden [default: the queue's delay]")
    priority: int | None = Field(None, ge=MIN_PRIORITY, le=MAX_PRIORITY,
                                 description=f"{MIN_PRIORITY}..{MAX_PRIORITY}, higher first (not with group)")
    attributes: dict[AttributeName, str] | None = None
    group: str | None = Field(None, min_length=1, max_length=MAX_GROUP_LENGTH,
                              description="Delivered in order within the group")
    dedup_id: str | None = Field(None, min_length=1, max_length=MAX_DEDUP_ID)

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
    visibility_timeout: float | None = Field(None, ge=0, le=MAX_VISIBILITY_TIMEOUT)


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
    timeout: float = Field(ge=0, le=MAX_VISIBILITY_TIMEOUT, description="Seconds from now the message stays hidden")


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
