"""The queue: publish, receive, delete, change visibility, and the rest.

:class:`Queue` is a facade over small collaborators, each in its own module:
the layout of its files (:mod:`~vsqs._core.layout`: flat or sharded), its
metadata, its settings store, the listing cache receive walks, the receipts
it issued, publishing helpers and back-pressure, stages, dead letters, and
maintenance. The three hot paths (publish of a plain message, receive,
delete) stay here as single methods that bind what they use to locals:
that is where the per-message cost is decided (see docs/benchmarks.md).
The cold paths are its bases: settings, inspection and maintenance in
:mod:`~vsqs._core.administration`, the dead-letter queue and redrive in
:mod:`~vsqs._core.redrive`.

Every state change is one call into :mod:`vsqs._core.fs` (an exclusive
create, a rename or an unlink) on a name built by :mod:`vsqs._core.format`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, TypeVar

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import hub as _hub
from vsqs._core import publishing
from vsqs._core import settings as _settings
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.dedup import Reservations
from vsqs._core.errors import (
    InvalidArgument,
    InvalidReceipt,
    QueueNotFound,
    StaleReceipt,
    VsqsError,
)
from vsqs._core.groups import GroupLeases
from vsqs._core.limits import (
    MAX_BATCH,
    MAX_CLOCK_SKEW,
    MAX_PRIORITY,
    MAX_VISIBILITY_TIMEOUT,
)
from vsqs._core.maintenance import Maintenance
from vsqs._core.message import Body, Message, Outgoing, to_bytes, to_us
from vsqs._core.metadata import Store, open_store
from vsqs._core.receipts import HeldMessages, IssuedReceipts, read_held, stale_message
from vsqs._core.receiver import Receiver
from vsqs._core.redrive import Redrive
from vsqs._core.rules import check_batch_size, check_poll_interval, check_priority, check_seconds, check_share
from vsqs._core.settings_store import TTL as _SETTINGS_TTL
from vsqs._core.settings_store import SettingsStore
from vsqs._core.stages import Stages
from vsqs._core.throttle import Throttle

log = logging.getLogger("vsqs")

_KEY_LENGTH = _format.KEY_LENGTH
T = TypeVar("T")


class Queue(Redrive):
    """A queue directory. Cheap to create; it holds the directory open (one descriptor per
    directory and process, see fs.Pin): every operation stays in the queue it opened.

    ``clock_skew`` (seconds) is the allowance for clocks of hosts sharing the
    spool: a hidden message is taken for visible only that long after its
    time, so a consumer whose clock runs ahead does not steal a live lease.
    ``poll_interval`` (seconds, default 0.05): how often a waiting receive looks
    at the queue where no kernel notification tells it of a change (a network
    filesystem; see docs/filesystems.md).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = False,
        clock_skew: float = 0.0,
        mode: int | str | None = None,
        shards: int | None = None,
        poll_interval: float | None = None,
    ) -> None:
        self._path = os.path.abspath(os.fspath(path))
        self._skew_us = to_us(check_seconds(clock_skew, "clock_skew", MAX_CLOCK_SKEW))
        self._poll_interval = check_poll_interval(poll_interval)
        # the queue's file_mode, needed before its settings exist
        self._init_runtime(None if mode is None else _settings.file_mode_of(_settings.validate({"file_mode": mode})))
        if shards is not None:
            _format.check_shards(shards)
        store = self._open_store(create, shards or 1)
        if shards is not None and shards != store.layout.shards:
            raise InvalidArgument(
                f"queue {self._path} exists with {store.layout.shards} shard(s), not {shards}: "
                "the shard count is fixed when a queue is created"
            )
        if create and mode is not None and self.settings["file_mode"] is None:
            self.configure(file_mode=mode)

    def _init_runtime(self, mode: int | None = None) -> None:
        """The handle's parts that need no I/O (the rest come with the metadata, see _open_store)."""
        self._lock = threading.Lock()  # the opening; the receiver's listing, group leases, throttle tokens
        self._receipts = IssuedReceipts()
        self._asked_mode = mode
        self._store: Store | None = None  # until the metadata is read (an unpickled handle reads it lazily)
        self._share: tuple[int, int] | None = None  # (index, count): see prefer_share

    def _open_store(self, create: bool = False, shards: int = 1) -> Store:
        """Read (or make) the metadata and set up what depends on the layout it fixes.

        The parts get what they need (the settings store, the layout...),
        never the handle itself: a handle is in no reference cycle, so a
        dropped one frees its listing cache at once."""
        with self._lock:  # two threads of an unpickled handle: one opens it
            if self._store is not None:
                return self._store
            store = open_store(self._path, create=create, shards=shards, mode=self._asked_mode)
            layout = store.layout  # (every part works in the queue's directory as opened: layout.path)
            throttle, groups, reservations = Throttle(layout.path), GroupLeases(layout.path), Reservations(layout.path)
            self._throttle, self._groups, self._reservations = throttle, groups, reservations

            def give_mode(settings: Mapping[str, Any]) -> None:  # the parts that make files take the queue's mode
                groups.mode = reservations.mode = throttle.mode = _settings.file_mode_of(settings)

            self._settings = settings = SettingsStore(os.path.join(layout.path, _settings.SETTINGS_DIR), give_mode)
            if self._asked_mode is not None:
                settings.mode = self._asked_mode
            self._capacity = publishing.Capacity(layout)
            self._stages = Stages(layout, settings, self._capacity, self._reservations)
            self._dead_letters: DeadLetters[Queue] = DeadLetters(
                layout, store.id, settings,
                lambda path, create, mode: Queue(path, create=create, mode=mode),  # a shared spool shares it too
                store.first_receive,
            )
            self._receiver = Receiver(store, settings, self._lock, self._groups, self._receipts, self._throttle,
                                      self._dead_letters, self._skew_us, self._poll_interval, self._share)
            self._listing = self._receiver.listing  # (a bool set on each publish: no lock)
            self._maintenance = Maintenance(
                layout, self._skew_us, settings, self._dead_letters, self._stages,
                self._groups, self._reservations, self._lock,
            )
            self._store = store
            return store

    # -- pickling: path and options only; reopened lazily where unpickled --

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path, "clock_skew": self._skew_us / 1e6, "poll_interval": self._poll_interval}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._path = state["path"]
        self._skew_us = to_us(state["clock_skew"])
        self._poll_interval = state.get("poll_interval")
        self._init_runtime()

    def __repr__(self) -> str:
        return f"vsqs.Queue({self._path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Queue) and other._path == self._path

    def __hash__(self) -> int:
        return hash(self._path)

    @property
    def path(self) -> str:
        return self._path

    @property
    def id(self) -> str:
        """The queue's random id from its metadata; it prefixes every receipt."""
        return (self._store or self._open_store()).id

    @property
    def shards(self) -> int:
        """How many shard directories hold the messages (1: the queue directory itself)."""
        return (self._store or self._open_store()).layout.shards

    def _check_suspended(self, operation: str, settings: Mapping[str, Any]) -> None:
        _settings.check_suspended(operation, settings, self._path)

    def _check_capacity(self, datas: list[bytes], settings: Mapping[str, Any]) -> None:
        self._capacity.check(datas, settings, self._path)

    def _open_parts(self) -> Store:
        return self._store or self._open_store()

    def _reopening(self, call: Callable[[], T]) -> T:
        """``call()``, once more if it found the queue deleted and made again (see :meth:`_reopened`)."""
        try:
            return call()
        except QueueNotFound:
            if not self._reopened():
                raise
            return call()

    def _reopened(self) -> bool:
        """After QueueNotFound: whether the directory opened was removed and a queue is at its path
        again; the handle then serves that one, opened as any is (its old receipts are stale)."""
        store = self._store
        if store is None or not store.layout.gone():
            return False
        with self._lock:
            if self._store is store:
                self._store = None
        try:
            self._open_store()
        except QueueNotFound:
            return False
        return True

    # -- publish -----------------------------------------------------------

    def publish(
        self,
        body: Body,
        *,
        delay: float | None = None,
        at: datetime | None = None,
        priority: int = _format.DEFAULT_PRIORITY,
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        dedup: str | None = None,
        durable: bool = True,
    ) -> str:
        """Store one message; return its id. ``durable`` fsyncs file and directory first.

        ``delay`` (seconds, default the queue's ``delay`` setting) or ``at`` (a
        datetime) keep it hidden until then; ``priority`` 0..9, higher first;
        ``attributes``: small str -> str metadata returned on receive;
        ``group``: messages of one group are delivered in order, at most
        ``group_concurrency`` (a queue setting, default 1) in flight at once;
        ``dedup_id`` (or ``dedup="content"``: the SHA-256 of the body): while a
        message with the same id is in the queue (or was, less than the
        ``dedup_window`` setting ago), store nothing and return that message's id.
        """
        if dedup_id is not None and dedup is not None:
            raise InvalidArgument("give dedup_id or dedup, not both")
        if delay is at is attributes is group is dedup_id is dedup is None:  # type: ignore[comparison-overlap]  # every option unset
            try:
                return self._publish_plain(body, priority, durable)
            except QueueNotFound:
                if not self._reopened():
                    raise
                return self._publish_plain(body, priority, durable)
        return self.publish_batch([body], delay=delay, at=at, priority=priority, attributes=attributes, group=group,
                                  dedup=dedup, durable=durable, _dedup_id=dedup_id)[0]

    def publish_batch(
        self,
        bodies: Iterable[Body | Outgoing],
        *,
        delay: float | None = None,
        at: datetime | None = None,
        priority: int = _format.DEFAULT_PRIORITY,
        attributes: Mapping[str, str] | None = None,
        group: str | None = None,
        dedup: str | None = None,
        durable: bool = True,
        _dedup_id: str | None = None,
    ) -> list[str]:
        """Store several messages sharing one directory fsync; return their ids in order.

        Each item is a body, or an :class:`Outgoing` with options of its own
        (the keyword arguments are the batch's defaults). If writing any file
        fails, none is published. If it fails while the files are being made
        visible (rare: an I/O error between renames), the earlier ones are
        published and the rest are left for gc.
        """
        items = list(bodies)
        return self._reopening(
            lambda: self._publish_batch(items, delay, at, priority, attributes, group, dedup, durable, _dedup_id))

    def _publish_batch(self, bodies: list[Body | Outgoing], delay: float | None, at: datetime | None, priority: int,
                       attributes: Mapping[str, str] | None, group: str | None, dedup: str | None, durable: bool,
                       _dedup_id: str | None) -> list[str]:
        layout = self._open_parts().layout
        settings = self._settings.current()
        if settings["suspended"]:  # (a cheap test first: this is on every publish)
            self._check_suspended("publish", settings)
        if dedup not in (None, "content"):
            raise InvalidArgument(f"dedup must be 'content' or None, not {dedup!r}")
        defaults = publishing.Defaults(delay, at, priority, attributes, group, _dedup_id, dedup == "content")
        entries = [publishing.prepare(item, defaults, settings) for item in bodies]
        if len(entries) > MAX_BATCH:
            raise InvalidArgument(f"bodies: at most {MAX_BATCH} messages per batch, not {len(entries)}")
        if settings["max_message_bytes"] is not None or settings["max_messages"] is not None:
            self._check_capacity([entry.body for entry in entries], settings)
        written = publishing.write_batch(layout, entries, durable, self._settings.mode, self._reservations, settings)
        ids: list[str] = []
        names: list[str] = []
        try:
            for entry, stem, temp in written.files:
                name = publishing.final_name(stem, entry.delay)
                if not _fs.rename(temp, layout.message_file(name)):
                    publishing.check_moved(layout, temp, name)
                ids.append(stem[:_KEY_LENGTH])
                names.append(name)
        finally:  # (after the renames: a listing begun before them clears it first)
            self._listing.published = True  # this handle's receives list again before they answer empty
        if _hub.watching:  # this process's waiters learn of them at once, on any filesystem
            _hub.published(layout.path, names)
        if durable and ids:
            layout.fsync(stem for _, stem, _ in written.files)
        for digest, (key, gen) in written.reserved.items():
            self._reservations.confirm(digest, gen, key)
        with self._capacity.lock:
            self._capacity.count += len(ids)
        for position in sorted(written.duplicates) if written.duplicates else ():
            ids.insert(position, written.duplicates[position])
        return ids

    def _publish_plain(self, body: Body, priority: int, durable: bool) -> str:
        """publish() of a body with no option but its priority: what publish_batch
        does for it (same checks, same system calls), without the batch's
        bookkeeping for de-duplication and envelopes. A hot path: one method."""
        layout = (self._store or self._open_store()).layout
        settings = self._settings.current()
        if settings["content_dedup"]:  # the queue de-duplicates every publish: the full path
            return self.publish_batch([body], priority=priority, durable=durable)[0]
        if settings["suspended"]:
            self._check_suspended("publish", settings)
        data = to_bytes(body)
        if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
            priority = check_priority(priority)
        if settings["max_message_bytes"] is not None or settings["max_messages"] is not None:
            self._check_capacity([data], settings)
        delay = settings["delay"]  # validated when it was read
        entry = publishing.Prepared(data, {}, priority, "", delay, "")
        stem, temp = publishing.write_new(layout, entry, durable, self._settings.mode)
        name = publishing.final_name(stem, delay)
        try:
            if not _fs.rename(temp, layout.message_file(name)):
                publishing.check_moved(layout, temp, name)
        finally:
            self._listing.published = True
        if _hub.watching:
            _hub.published(layout.path, (name,))
        if durable:
            _fs.fsync_dir(os.path.dirname(temp))
        capacity = self._capacity
        with capacity.lock:
            capacity.count += 1
        return stem[:_KEY_LENGTH]

    # -- stages: publish many messages at once, later --------------------------

    def publish_staged(
        self, bodies: Iterable[Body | Outgoing], *, stage: str, written: Callable[[], object] | None = None
    ) -> list[str]:
        """Write messages durably into the private ``stage`` (a directory of the queue),
        invisible to receivers until :meth:`commit_stage` publishes the whole stage (or
        :meth:`abort_stage` drops it); a Spark task attempt writes its own. Items may be
        :class:`Outgoing`; a delay runs from now, a ``dedup_id`` is checked at the commit.
        ``written()`` is called once every message has its id (its file written), before
        the wait for the fsyncs: a publish started after it sorts after these messages."""
        self._open_parts()
        return self._stages.publish(bodies, stage, written)

    def commit_stage(self, stage: str) -> int:
        """Publish every message of ``stage`` (each by one rename) and remove the
        stage; return how many were published. Safe to repeat after a crash: it
        moves the rest. A message whose ``dedup_id`` is held by another is
        taken back at once (if a consumer was quicker, it is delivered twice:
        at-least-once, never lost)."""
        self._open_parts()
        try:
            return self._stages.commit(stage)
        finally:  # (what it renamed before a failure is published too)
            self._listing.published = True

    def abort_stage(self, stage: str) -> int:
        """Drop ``stage`` and its messages unpublished; return how many were dropped."""
        self._open_parts()
        return self._stages.abort(stage)

    def stages(self) -> list[str]:
        """The names of the stages not yet committed or aborted."""
        self._open_parts()
        return self._stages.names()

    # -- receive -----------------------------------------------------------

    def receive(self, *, visibility_timeout: float | None = None, wait: float | None = None) -> Message | None:
        """Take the next visible message, hidden from others for ``visibility_timeout`` s.

        ``wait`` > 0 long-polls: returns as soon as a message is visible, or
        ``None`` after ``wait`` seconds. ``visibility_timeout`` and ``wait``
        default to the queue's settings (30 s and 0 s unless configured).
        """
        self._store or self._open_store()
        try:
            got = self._receiver.receive(self, 1, visibility_timeout, wait, True, False)
        except QueueNotFound:
            if not self._reopened():
                raise
            got = self._receiver.receive(self, 1, visibility_timeout, wait, True, False)
        return got[0] if got else None

    def receive_batch(
        self,
        max_messages: int = 10,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        read_bodies: bool = True,
        group_runs: bool = False,
    ) -> list[Message]:
        """Take up to ``max_messages`` visible messages (fewer if fewer are
        visible, or once the bodies read reach 16 MiB, ``MAX_RECEIVE_BYTES``:
        a batch holds at most that plus one message; the rest wait for the
        next call).

        ``read_bodies=False`` only claims: each body is read when first used
        (for example by another process holding the receipt, see :meth:`read`).

        ``group_runs=True`` (group_concurrency 1): a group's next messages together, in order, held
        until each is deleted or visible again (Amazon SQS FIFO). Off by default: a batch spreads
        over groups, and vsqs without runs refuses their receipts (docs/FORMAT.md, Runs)."""
        if type(max_messages) is not int or not 1 <= max_messages <= MAX_BATCH:
            check_batch_size(max_messages)
        self._store or self._open_store()
        try:
            return self._receiver.receive(self, max_messages, visibility_timeout, wait, read_bodies, bool(group_runs))
        except QueueNotFound:
            if not self._reopened():
                raise
            return self._receiver.receive(self, max_messages, visibility_timeout, wait, read_bodies, bool(group_runs))

    def _receive_unless(
        self, stopped: Callable[[], bool], visibility_timeout: float | None, wait: float
    ) -> Message | None:
        """:meth:`receive`, which also returns (None) when woken with ``stopped()`` true:
        the worker's, whose :meth:`Worker.stop` calls :meth:`_interrupt_waits`."""
        self._store or self._open_store()
        got = self._reopening(lambda: self._receiver.receive(self, 1, visibility_timeout, wait, True, False, stopped))
        return got[0] if got else None

    def _interrupt_waits(self) -> None:
        """Wake every receive of this process waiting on this queue (each tries again)."""
        store = self._store  # (none open: no receive of this handle waits)
        if store is not None:
            _hub.wake_all(store.layout.path)

    async def areceive(
        self, *, visibility_timeout: float | None = None, wait: float | None = None,
        offload: Callable[[Callable[[], list[Message]]], Awaitable[list[Message]]] | None = None,
    ) -> Message | None:
        """:meth:`receive` for asyncio: ``await queue.areceive(wait=20)``. See :meth:`areceive_batch`."""
        got = await self.areceive_batch(1, visibility_timeout=visibility_timeout, wait=wait, offload=offload)
        return got[0] if got else None

    async def areceive_batch(
        self,
        max_messages: int = 10,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        read_bodies: bool = True,
        group_runs: bool = False,
        offload: Callable[[Callable[[], list[Message]]], Awaitable[list[Message]]] | None = None,
    ) -> list[Message]:
        """:meth:`receive_batch` for asyncio: the wait holds no thread (it sleeps on the
        event loop until a message may be claimable); each attempt (file system calls)
        runs through ``offload(fn)``, by default in the loop's executor. Cancelling the
        awaiting task loses nothing: what an attempt running meanwhile claims is released."""
        if type(max_messages) is not int or not 1 <= max_messages <= MAX_BATCH:
            check_batch_size(max_messages)
        self._store or self._open_store()
        try:
            return await self._receiver.areceive(
                self, max_messages, visibility_timeout, wait, read_bodies, bool(group_runs), offload
            )
        except QueueNotFound:
            if not self._reopened():
                raise
            return await self._receiver.areceive(
                self, max_messages, visibility_timeout, wait, read_bodies, bool(group_runs), offload
            )

    def prefer_share(self, index: int, count: int) -> None:
        """Take the ready messages of share ``index`` of ``count`` (at most MAX_SHARES) first, the
        others' once those are taken: consumers splitting a queue among them (a Spark batch's
        partitions) then race less. Dealt by the random end of the ids (a sharded queue: each
        shard's listing); no lower priority before a higher. Not kept by pickling."""
        self._share = check_share(index, count)
        with self._lock:
            if self._store is not None:
                self._receiver.listing.prefer_share(*self._share)

    def throttled(self) -> bool:
        """Whether receives are throttled right now (every token of this window taken)."""
        self._open_parts()
        throttle = self._settings.current()["throttle"]
        return throttle is not None and self._throttle.exhausted(throttle[0], throttle[1], time.time())

    @contextlib.contextmanager
    def receiving(
        self, *, visibility_timeout: float | None = None, wait: float = 0
    ) -> Iterator[Message | None]:
        """Receive one message for a ``with`` block: deleted on normal exit,
        released (visible again) if the block raises. Yields ``None`` when empty."""
        message = self.receive(visibility_timeout=visibility_timeout, wait=wait)
        if message is None:
            yield None
            return
        try:
            yield message
        except BaseException:
            if not message.settled:
                with contextlib.suppress(StaleReceipt):
                    message.release()
            raise
        if not message.settled:
            message.delete()

    # -- receipts ----------------------------------------------------------

    def delete(self, receipt: str) -> None:
        """Delete the message held by ``receipt``; :class:`StaleReceipt` if it no longer is."""
        store = self._store or self._open_store()
        issued = self._receipts.take(receipt) if isinstance(receipt, str) else None
        if issued is None:
            _, text, slot = _format.parse_receipt(store.id, receipt)
        else:  # a receipt this handle made: already valid
            text, slot = issued
        settings_store = self._settings
        if time.monotonic() - settings_store.read_at < _SETTINGS_TTL:  # settings_store.current(), inlined
            settings = settings_store.values
        else:
            settings = settings_store.current()
        if settings["suspended"]:
            self._check_suspended("delete", settings)
        layout = store.layout
        locate = layout.locate
        deleted = _fs.unlink(layout.prefix + text if locate is None else locate(text) + text)
        if slot is not None:
            self._receiver.settled(text, slot, deleted, issued is not None, settings["group_concurrency"] == 1)
        if not deleted:
            raise StaleReceipt(stale_message(text[:_KEY_LENGTH]))
        if settings["max_messages"] is not None:  # this handle's deletes count at once, as its publishes
            capacity = self._capacity
            with capacity.lock:
                capacity.count = max(0, capacity.count - 1)

    def delete_batch(self, receipts: Iterable[str]) -> list[VsqsError | None]:
        """Delete several messages; one outcome per receipt, in order: ``None``
        for success, or the error (:class:`StaleReceipt`, :class:`InvalidReceipt`)."""
        outcomes: list[VsqsError | None] = []
        for receipt in receipts:
            try:
                self.delete(receipt)
                outcomes.append(None)
            except (StaleReceipt, InvalidReceipt) as exc:
                outcomes.append(exc)
        return outcomes

    def change_visibility_batch(self, entries: Iterable[tuple[str, float]]) -> list[str | VsqsError]:
        """Change the visibility of several messages, each entry a
        ``(receipt, timeout)``; one outcome per entry, in order: the new receipt,
        or the error (:class:`StaleReceipt`, :class:`InvalidReceipt`,
        :class:`InvalidArgument`)."""
        outcomes: list[str | VsqsError] = []
        for entry in entries:
            try:
                receipt, timeout = entry
                outcomes.append(self.change_visibility(receipt, timeout))
            except (StaleReceipt, InvalidReceipt, InvalidArgument) as exc:
                outcomes.append(exc)
            except (TypeError, ValueError):
                outcomes.append(InvalidArgument(f"entry must be (receipt, timeout), not {entry!r}"))
        return outcomes

    def read(self, receipt: str) -> bytes:
        """The body of the message held by ``receipt``; :class:`StaleReceipt` if it no longer is."""
        return read_held(self._open_parts(), receipt)[1]

    def read_message(self, receipt: str) -> Message:
        """The message held by ``receipt`` (body, attributes, group...), read
        where the receipt went, e.g. on a Spark executor; changes nothing."""
        name, body, header = read_held(self._open_parts(), receipt)
        return Message(self, name.key, body, receipt, name.receive_count, name.sent_us / 1e6, header)

    def change_visibility(self, receipt: str, timeout: float) -> str:
        """Hide the message for ``timeout`` seconds from now; return the new receipt."""
        timeout = check_seconds(timeout, "timeout", MAX_VISIBILITY_TIMEOUT)
        return self._held(self._open_parts()).change_visibility(receipt, timeout)

    def current_receipt(self, receipt: str) -> str:
        """The receipt that holds ``receipt``'s message now, after
        :meth:`change_visibility` moved it (perhaps in another process).

        SQS clients keep the first receipt of a receive for its whole life;
        this finds the message of the same receive with one listing: same
        id, same receive count, and the same TAG (a receive's secret, which a
        visibility change keeps whole). :class:`StaleReceipt` if the
        message was deleted, released or received again since.
        """
        return self._held(self._open_parts()).current(receipt)

    def message_id(self, receipt: str) -> str:
        """The id of the message ``receipt`` names (whether or not it still
        holds it); :class:`InvalidReceipt` if it is not a receipt of this queue."""
        return _format.parse_receipt(self.id, receipt)[0].key

    def held_until(self, receipt: str) -> float:
        """When the lease ``receipt`` proves runs out (epoch seconds, written in it: reads nothing); after
        it the receipt holds its message only until a receive takes it. :class:`InvalidReceipt` as for
        :meth:`message_id`."""
        return _format.parse_receipt(self.id, receipt)[0].until_us / 1e6

    def release(self, receipt: str) -> None:
        """Make the message visible again now (ready), keeping its receive count."""
        self._held(self._open_parts()).release(receipt)

    def dead_letter(self, receipt: str) -> None:
        """Move the message held by ``receipt`` into the dead-letter queue now, as if it had used
        up its receives (id, body, attributes and receive count kept; :meth:`redrive` returns it).
        :class:`StaleReceipt` if it is no longer held; :class:`InvalidArgument` if the queue has no
        dead-letter queue (neither ``max_receives`` nor ``dead_letter`` is set)."""
        store = self._open_parts()
        self._receipts.take(receipt)
        name, text, slot = _format.parse_receipt(store.id, receipt)
        settings = self._settings.current()
        if settings["suspended"]:
            self._check_suspended("delete", settings)
        if self._dead_letters.path(settings) is None:
            raise InvalidArgument(f"queue {self._path} has no dead-letter queue: set max_receives or dead_letter")
        # (a rename whose source is gone and destination exists reports success: the answer to a
        # retransmitted rename; a receipt that no longer names a file is stale)
        moved = _fs.exists(store.layout.message_file(text)) and bool(self._dead_letters.bury(name))
        if slot is not None:
            self._receiver.settled(text, slot, moved, False, settings["group_concurrency"] == 1)
        if not moved:
            raise StaleReceipt(stale_message(name.key))
        if settings["max_messages"] is not None:
            with self._capacity.lock:
                self._capacity.count = max(0, self._capacity.count - 1)

    def _held(self, store: Store) -> HeldMessages:
        return self._receiver.held(self._settings.current()["group_concurrency"] == 1)
