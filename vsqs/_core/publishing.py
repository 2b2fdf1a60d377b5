"""What publishing needs besides the hot path in :class:`Queue`: a message's
options checked and turned into what goes on disk, the write of its ``.new``
file, its first name, de-duplication lookups and back-pressure (the queue's
``max_messages`` and ``max_message_bytes``)."""

from __future__ import annotations

import contextlib
import hashlib
import math
import threading
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from vsqs._core import dedup as _dedup
from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.dedup import Reservations
from vsqs._core.errors import InvalidArgument, MessageTooLarge, QueueFull, StorageError
from vsqs._core.format import State
from vsqs._core.layout import Layout
from vsqs._core.limits import DEFAULT_PRIORITY, MAX_DELAY, MAX_PRIORITY
from vsqs._core.message import Body, Outgoing, to_bytes, to_us
from vsqs._core.rules import check_attributes, check_priority, check_seconds
from vsqs._core.synced import SyncedFiles

COUNT_TTL = 1.0  # max_messages is checked against a count at most this old


class Defaults(NamedTuple):
    """A batch's options, for the messages that do not bring their own."""

    delay: float | None
    at: datetime | None
    priority: int
    attributes: Mapping[str, str] | None
    group: str | None
    dedup_id: str | None
    dedup_content: bool


NO_DEFAULTS = Defaults(None, None, DEFAULT_PRIORITY, None, None, None, False)


class Prepared(NamedTuple):
    """One message ready to write."""

    body: bytes
    header: dict[str, Any]  # the envelope header; empty: a bare body
    priority: int
    group_hash: str
    delay: float  # seconds
    digest: str  # de-duplication hash, or ""


def prepare(item: Body | Outgoing, defaults: Defaults, settings: Mapping[str, Any]) -> Prepared:
    """Check one message's options and build what goes on disk."""
    if isinstance(item, Outgoing):
        own_time = item.delay is not None or item.at is not None
        delay = item.delay if own_time else defaults.delay
        at = item.at if own_time else defaults.at
        priority = defaults.priority if item.priority is None else item.priority
        attributes = defaults.attributes if item.attributes is None else item.attributes
        group = defaults.group if item.group is None else item.group
        dedup_id = defaults.dedup_id if item.dedup_id is None else item.dedup_id
        body = item.body
    else:
        delay, at, priority = defaults.delay, defaults.at, defaults.priority
        attributes, group, dedup_id, body = defaults.attributes, defaults.group, defaults.dedup_id, item
    data = to_bytes(body)
    # the defaults need no checks: the setting was validated when it was read
    seconds = settings["delay"] if delay is None and at is None else delay_of(delay, at, settings)
    if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
        priority = check_priority(priority)
    header: dict[str, Any] = {}
    if attributes:
        header["attributes"] = check_attributes(attributes)
    group_hash = ""
    if group is not None:
        group_hash = _format.group_hash(group)
        if priority != DEFAULT_PRIORITY:
            raise InvalidArgument("priority cannot be combined with group: a group is strictly in order")
        header["group"] = group
    digest = ""
    if dedup_id is not None or defaults.dedup_content or settings["content_dedup"]:
        scope = group if settings["dedup_scope"] == "group" else None
        digest = _dedup.dedup_hash(hashlib.sha256(data).hexdigest() if dedup_id is None else dedup_id, scope)
    return Prepared(data, header, priority, group_hash, seconds, digest)


def delay_of(delay: float | None, at: datetime | None, settings: Mapping[str, Any]) -> float:
    """Seconds a message stays hidden, from ``delay`` or ``at`` (or the queue's setting)."""
    if at is not None:
        if delay is not None:
            raise InvalidArgument("give delay or at, not both")
        if not isinstance(at, datetime):
            raise InvalidArgument(f"at must be a datetime, not {type(at).__name__}")
        delay = min(max(0.0, at.timestamp() - time.time()), MAX_DELAY)
    return check_seconds(settings["delay"] if delay is None else delay, "delay", MAX_DELAY)


def final_name(stem: str, delay: float) -> str:
    """The name a published message starts with: ready, or hidden until its delay ends."""
    if delay:
        return _format.hidden_name(stem, _format.now_us() + to_us(delay), 0)
    return _format.ready_name(stem)


def check_moved(layout: Layout, temp: str, name: str) -> None:
    """After the rename of a publisher's ``.new`` file ``temp`` to the message name
    ``name`` answered "lost" (``fs.rename`` False): raise unless it took effect.

    The rename's own rule (a destination that exists is ours) fails a publish on a
    network filesystem: NFS answers a retransmitted, successful rename with ENOENT, and
    a consumer may have claimed the new name by then. No one else moves ``temp``, so a
    source gone with no destination is looked for under any message name of its key
    (claimed, or moved on); none there means it vanished (garbage collected) or was
    consumed already, which cannot be told apart: the publish is reported as failed."""
    if _fs.exists(temp):  # (answered "gone", still there: the rename did not happen)
        raise StorageError(2, "message file not published: its rename failed", _fs.shown(temp))
    key = name[: _format.KEY_LENGTH]
    if not any(other.key == key and other.state is not State.WRITING for other in layout.names(beside=name)):
        raise StorageError(2, "message file vanished before it was published", _fs.shown(temp))


def write_new(
    layout: Layout,
    entry: Prepared,
    durable: bool,
    mode: int | None,
    stage: str | None = None,
    files: SyncedFiles | None = None,
) -> tuple[str, str]:
    """Write ``STEM.new`` under a fresh key, where the message will live (or
    in the directory ``stage``, ending in a separator); return (stem, path).
    With ``files`` its fsync is left to them (``durable`` is then ignored)."""
    if time.monotonic() >= layout.check_at:  # still the queue's directory at its path? (once a second)
        layout.check()
    content = _envelope.encode_envelope(entry.header, entry.body) if entry.header else entry.body
    for _attempt in range(8):
        key = _format.new_key(entry.priority)
        stem = _format.make_stem(key, group_hash=entry.group_hash, envelope=bool(entry.header))
        name = _format.writing_name(stem)
        temp = stage + name if stage is not None else layout.message_file(name)
        if files is not None:
            if files.create(temp, content, mode):
                return stem, temp
        elif _fs.create_exclusive(temp, content, durable=durable, mode=mode):
            return stem, temp
    raise StorageError(17, "no free message name after 8 tries", _fs.shown(stage or layout.path))


class Written(NamedTuple):
    """What the first phase of a batch publish wrote."""

    files: list[tuple[Prepared, str, str]]  # (entry, stem, path of its .new file), in order
    duplicates: dict[int, str]  # position -> id of the message already holding the dedup id
    reserved: dict[str, tuple[str, int]]  # dedup hash -> (key, generation) reserved by this batch


class Presence:
    """Whether messages are in the queue, for de-duplication, from as few
    listings as it can: a key seen live in an earlier listing of this batch is
    live (it can only have left since, which a window covers); anything else
    gets a fresh listing before it is answered."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._live: set[str] | None = None
        self._writing: dict[str, str] = {}

    def _list(self) -> None:
        live, writing = set(), {}
        for name in self._layout.names():
            if name.state is State.WRITING:
                writing[name.key] = str(name)
            else:
                live.add(name.key)
        self._live, self._writing = live, writing

    def __call__(self, key: str) -> str | None:
        """"live", "writing" (a publisher that may still be at work) or None."""
        if self._live is None or key not in self._live:
            self._list()
        assert self._live is not None
        if key in self._live:
            return "live"
        if key in self._writing:
            written = _fs.mtime(self._layout.message_file(self._writing[key]))
            if written is None or written > time.time() - _dedup.WRITE_GRACE:
                return "writing"  # at work (or gone since the listing: just published)
        return None


def reserve(
    reservations: Reservations,
    digest: str,
    stem: str,
    settings: Mapping[str, Any],
    reserved: dict[str, tuple[str, int]],
    presence: Presence,
) -> str | None:
    """Reserve a dedup id for message ``stem`` (remembered in ``reserved``);
    or return the id of the message holding it."""
    if digest in reserved:
        return reserved[digest][0]
    key = stem[: _format.KEY_LENGTH]
    holder, gen = reservations.reserve(digest, key, settings["dedup_window"], presence)
    if holder is None:
        reserved[digest] = (key, gen)
    return holder


def write_batch(
    layout: Layout,
    entries: list[Prepared],
    durable: bool,
    mode: int | None,
    reservations: Reservations,
    settings: Mapping[str, Any],
) -> Written:
    """Write each entry's ``.new`` file, reserving its dedup id if it has one
    (the body first, so a reservation always has its message, or the .new
    file of its publisher, behind it). Durable files are fsynced together
    (:class:`SyncedFiles`) and all are on disk when this returns. If
    anything fails, nothing stays."""
    written = Written([], {}, {})
    presence = Presence(layout) if any(entry.digest for entry in entries) else None
    try:
        with SyncedFiles() as files:
            for position, entry in enumerate(entries):
                stem, temp = write_new(layout, entry, durable, mode, files=files if durable else None)
                written.files.append((entry, stem, temp))  # before the reservation: undone if it fails
                if entry.digest:
                    assert presence is not None
                    holder = reserve(reservations, entry.digest, stem, settings, written.reserved, presence)
                    if holder is not None:
                        written.files.pop()
                        _fs.unlink(temp)
                        written.duplicates[position] = holder
            files.wait()
    except BaseException:
        for _, _, temp in written.files:
            with contextlib.suppress(StorageError):
                _fs.unlink(temp)
        raise
    return written


class Capacity:
    """Back-pressure: ``max_message_bytes``, and ``max_messages`` against a
    count at most COUNT_TTL old plus what this handle published and deleted
    since (approximate across hosts). ``count`` is updated by the hot paths
    under ``lock``."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self.lock = threading.Lock()
        self.count = 0
        self._counted_at = -math.inf  # never counted

    def check(self, datas: list[bytes], settings: Mapping[str, Any], path: str) -> None:
        """Refuse ``datas`` if one is too large or the queue would be too full."""
        limit = settings["max_message_bytes"]
        if limit is not None:
            for data in datas:
                if len(data) > limit:
                    raise MessageTooLarge(
                        f"message of {len(data)} bytes is over the queue's max_message_bytes ({limit})"
                    )
        capacity = settings["max_messages"]
        if capacity is not None:
            if time.monotonic() - self._counted_at >= COUNT_TTL:
                count = sum(1 for name in self._layout.names() if name.state is not State.WRITING)
                with self.lock:
                    self.count, self._counted_at = count, time.monotonic()
            if self.count + len(datas) > capacity:
                raise QueueFull(f"queue {path} is full: {self.count} messages, max_messages is {capacity}")
