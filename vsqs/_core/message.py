"""What the queue hands out: received messages, listings, stats, and the options of an outgoing message."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from vsqs._core import format as _format
from vsqs._core.errors import MessageTooLarge
from vsqs._core.limits import MAX_BODY_BYTES

if TYPE_CHECKING:
    from vsqs._core.queue import Queue

Body = bytes | bytearray | memoryview | str


def to_us(seconds: float) -> int:
    return round(seconds * 1_000_000)


def to_bytes(body: object) -> bytes:
    """A body to publish, as bytes; :class:`MessageTooLarge` over
    MAX_BODY_BYTES, whatever the queue's ``max_message_bytes`` (no reader
    takes a larger message file: it would be damage)."""
    if isinstance(body, bytes):
        data = body
    elif isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, (bytearray, memoryview)):
        data = bytes(body)
    else:
        raise TypeError(f"body must be bytes or str, not {type(body).__name__}")
    if len(data) > MAX_BODY_BYTES:
        raise MessageTooLarge(f"message of {len(data)} bytes is over the {MAX_BODY_BYTES} bytes vsqs takes")
    return data


@dataclass(frozen=True)
class Outgoing:
    """One message of a batch with options of its own; a None option takes the
    batch's (``publish_batch(..., priority=5)``) or the queue's default."""

    body: Body
    delay: float | None = None
    at: datetime | None = None
    priority: int | None = None
    attributes: Mapping[str, str] | None = None
    group: str | None = None
    dedup_id: str | None = None


@dataclass(frozen=True)
class MessageInfo:
    """What a listing says about one message (no body, no state change)."""

    id: str
    state: str  # "ready", "in_flight" or "delayed"
    receive_count: int
    sent_at: float  # epoch seconds
    visible_at: float  # epoch seconds; <= now for ready messages
    priority: int
    body: bytes | None = None  # only from messages(bodies=True)
    attributes: dict[str, str] = field(default_factory=dict)  # only with bodies=True
    group: str | None = None  # only with bodies=True
    size: int | None = None  # the body's bytes; only from a page with a preview (then body is its start)


@dataclass(frozen=True)
class QueueStats:
    """Message counts by state, from one listing."""

    ready: int
    in_flight: int
    delayed: int
    oldest_ready_age: float  # seconds since the oldest visible message was sent; 0 if none
    writing: int = 0  # .new files: publishes in progress, or orphans for gc
    dead_lettered: int = 0  # this queue's messages now in its dead-letter queue
    groups: dict[str, dict[str, int]] | None = None  # group -> counts by state, if asked
    staged: int = 0  # in stages: written, not yet published (a Spark write before its commit)

    @property
    def total(self) -> int:
        return self.ready + self.in_flight + self.delayed


class Message:
    """A received message. Its ``receipt`` proves the lease; it changes on every move."""

    __slots__ = ("queue", "id", "_body", "_header", "receipt", "receive_count", "_sent_at", "_settled")

    def __init__(
        self,
        queue: Queue,
        id: str,
        body: bytes | None,
        receipt: str,
        receive_count: int,
        sent_at: float | None,
        header: dict[str, Any] | None = None,
    ) -> None:
        self.queue = queue
        self.id = id
        self._body = body
        self._header = header if body is not None else None
        self.receipt = receipt
        self.receive_count = receive_count
        self._sent_at = sent_at  # None: worked out from the id when first asked
        self._settled = False

    def __repr__(self) -> str:
        return f"<vsqs.Message {self.id} receive_count={self.receive_count}>"

    def __reduce__(self) -> Any:
        return (
            Message,
            (
                self.queue,
                self.id,
                self._body,
                self.receipt,
                self.receive_count,
                self.sent_at,
                self._header,
            ),
        )

    @property
    def sent_at(self) -> float:
        """When the message was published, epoch seconds (from its id)."""
        if self._sent_at is None:
            self._sent_at = _format.sent_us_of(self.id) / 1e6
        return self._sent_at

    @property
    def first_received_at(self) -> float | None:
        """When the message was first received, epoch seconds (to the
        millisecond), from its name; ``None`` if the name does not say (the
        first receive was by a vsqs from before it was recorded, see
        docs/FORMAT.md). SQS's ApproximateFirstReceiveTimestamp."""
        name = self._name()
        first = None if name is None else name.first_receive_ms
        return None if first is None else first / 1000

    @property
    def dead_letter_source(self) -> str | None:
        """For a message in a dead-letter queue, the name of the queue it came
        from (its name's origin id, looked up in the dead-letter queue's
        ``.sources``, see docs/FORMAT.md); ``None`` for any other message, or
        if the source is not recorded."""
        name = self._name()
        if name is None or not name.origin:
            return None
        # imported here: dead_letters imports what imports this module
        from vsqs._core.dead_letters import source_name

        return source_name(self.queue.path, name.origin)

    def _name(self) -> _format.Name | None:
        """The name the receipt holds the message by (``None`` if it is not a receipt's)."""
        parts = self.receipt.split(_format.RECEIPT_SEPARATOR) if isinstance(self.receipt, str) else []
        return _format.parse_name(parts[1]) if len(parts) > 1 else None

    @property
    def body(self) -> bytes:
        """The body; read now if it was received with ``read_bodies=False``."""
        body = self._body
        if body is None:
            read = self.queue.read_message(self.receipt)
            body, self._header = read.body, read._header
            self._body = body
        return body

    @property
    def attributes(self) -> dict[str, str]:
        """The attributes given at publish (a copy; empty if none)."""
        self.body  # noqa: B018 - loads the header with the body
        return dict((self._header or {}).get("attributes", {}))

    @property
    def group(self) -> str | None:
        """The message group given at publish, or None."""
        self.body  # noqa: B018
        return (self._header or {}).get("group")

    @property
    def priority(self) -> int:
        """0..9, higher first (it is the first digit of the id, inverted)."""
        return 9 - int(self.id[0])

    @property
    def sequence_number(self) -> str:
        """SQS's SequenceNumber: a decimal string from the id, increasing
        within a group in delivery order (see :meth:`sequence_number_of`)."""
        return _format.sequence_number(self.id)

    @staticmethod
    def sequence_number_of(message_id: str) -> str:
        """The sequence number of the message ``message_id`` (e.g. one just published)."""
        return _format.sequence_number(message_id)

    @property
    def uuid(self) -> str:
        """The id as a UUID (lower-case 8-4-4-4-12 hex), one to one and reversible:
        the SQS face's MessageId (see :meth:`uuid_of`, :meth:`id_of_uuid`)."""
        return _format.key_uuid(self.id)

    @staticmethod
    def uuid_of(message_id: str) -> str:
        """The UUID of the message ``message_id`` (e.g. one just published);
        :class:`InvalidArgument` if it is no message id."""
        return _format.key_uuid(message_id)

    @staticmethod
    def id_of_uuid(uuid: str) -> str:
        """The message id whose UUID is ``uuid`` (an SQS MessageId back to the
        vsqs id); :class:`InvalidArgument` for a UUID no message id gives."""
        return _format.key_of_uuid(uuid)

    @property
    def md5(self) -> str:
        """MD5 of the body in hex, as SQS reports it (a checksum, not security)."""
        return hashlib.md5(self.body, usedforsecurity=False).hexdigest()

    @property
    def settled(self) -> bool:
        """True once deleted, released or dead-lettered through this object."""
        return self._settled

    def delete(self) -> None:
        """Delete the message (done with it). :class:`StaleReceipt` if the lease was lost."""
        self.queue.delete(self.receipt)
        self._settled = True

    def change_visibility(self, seconds: float) -> str:
        """Keep the message hidden for ``seconds`` from now; returns and keeps the new receipt."""
        self.receipt = self.queue.change_visibility(self.receipt, seconds)
        return self.receipt

    def release(self) -> None:
        """Make the message visible again now, keeping its receive count."""
        self.queue.release(self.receipt)
        self._settled = True

    def dead_letter(self) -> None:
        """Move the message into its queue's dead-letter queue now (see :meth:`Queue.dead_letter`)."""
        self.queue.dead_letter(self.receipt)
        self._settled = True


