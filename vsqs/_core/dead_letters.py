"""Dead letters: a message received ``max_receives`` times moves, by one
rename that adds its origin queue's id to its name, into the dead-letter
queue; ``.sources/`` in the dead-letter queue maps each origin id to its
queue's path, for redrive."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import InvalidArgument, QueueNotFound, StorageError
from vsqs._core.format import State
from vsqs._core.layout import Layout, move_into
from vsqs._core.metadata import Store, open_store
from vsqs._core.settings import SETTINGS_DIR
from vsqs._core.settings_store import SettingsStore

QueueT = TypeVar("QueueT")
log = logging.getLogger("vsqs")


class DeadLetters(Generic[QueueT]):
    """The dead letters of one queue (the one whose ``layout`` this is), and,
    when that queue is itself a dead-letter queue, the redrive of its messages.

    It sees its own queue through ``queue_id`` and its ``settings``, and
    other queues only as :class:`Store` (id and layout); ``open_queue`` makes
    the public handle that :meth:`queue` returns.
    """

    def __init__(
        self,
        layout: Layout,
        queue_id: str,
        settings: SettingsStore,
        open_queue: Callable[[str, bool, int | None], QueueT],
        first_receive: bool = True,
    ) -> None:
        self._layout = layout
        # this queue's format records first receives (3), or not (1, 2: older vsqs may share it,
        # and its dead-letter queue, made here on demand, must be one they open too)
        self._first_receive = first_receive
        self._queue_id = queue_id
        self._settings = settings
        self._open_queue = open_queue
        self._lock = threading.Lock()
        self._cached: tuple[QueueT, Store] | None = None

    def path(self, settings: Mapping[str, Any] | None = None) -> str | None:
        """The dead-letter queue's path; None without ``max_receives`` nor ``dead_letter``."""
        return dead_letter_path(self._layout.shown, settings or self._settings.current())

    def live_sources(self) -> list[str]:
        """Paths of the queues whose dead-letter queue this one is now: the
        ``.sources`` entries whose queue exists and whose settings still name it."""
        found = set()
        for path in self.sources().values():
            try:
                store = open_store(path)
                settings = SettingsStore(store.layout.file(SETTINGS_DIR), lambda settings: None).current()
                if dead_letter_path(store.layout.shown, settings) == self._layout.shown:
                    found.add(store.layout.shown)
            except (QueueNotFound, InvalidArgument):
                continue  # gone, or no longer a queue that names this one
        return sorted(found)


    def queue(self, create: bool = True) -> QueueT | None:
        """The dead-letter queue's handle, made on demand (see :meth:`Queue.dead_letter_queue`)."""
        found = self._open(create)
        return None if found is None else found[0]

    def _open(self, create: bool = True) -> tuple[QueueT, Store] | None:
        path = self.path()
        if path is None:
            return None
        with self._lock:
            cached = self._cached
        if cached is not None and cached[1].layout.shown == path and not cached[1].layout.gone():
            return cached
        mode = self._settings.mode  # a dead-letter queue made here takes this queue's mode
        if create:  # made first by the store: at this queue's format family (see __init__), then opened
            open_store(path, create=True, mode=mode, first_receive=self._first_receive)
        handle = self._open_queue(path, create, mode)
        store = open_store(path, create=create, mode=mode)
        # .sources belongs to the dead-letter queue: its files take that queue's mode
        own_mode = SettingsStore(store.layout.file(SETTINGS_DIR), lambda settings: None).current_mode()
        register_source(store.layout, self._queue_id, self._layout.shown, own_mode)
        with self._lock:
            self._cached = (handle, store)
        return handle, store

    def register(self) -> None:
        """Record this queue in its dead-letter queue's ``.sources`` now, if
        that queue exists: so it is known as a source before any message dies."""
        path = self.path()
        if path is None:
            return
        try:
            store = open_store(path)
        except QueueNotFound:
            return  # made (and registered) on demand, at the first dead letter
        own_mode = SettingsStore(store.layout.file(SETTINGS_DIR), lambda settings: None).current_mode()
        register_source(store.layout, self._queue_id, self._layout.shown, own_mode)

    def bury(self, name: _format.Name) -> int:
        """Move a message that used up its receives into the dead-letter queue,
        keeping id, body, receive count and send time; 1 if it moved."""
        found = self._open()
        assert found is not None
        store = found[1]
        # (-rFIRST kept only in a dead-letter queue of format 3: older vsqs may serve one of format 1 or 2)
        dead = _format.ready_name(_format.with_origin(name, self._queue_id, store.first_receive), name.receive_count)
        try:
            return int(move_into(self._layout.message_file(str(name)), store.layout.message_file(dead)))
        except StorageError as exc:
            if exc.errno == errno.EXDEV:
                raise StorageError(
                    exc.errno,
                    f"dead-letter queue {store.layout.shown} must be on the same filesystem as {self._layout.shown}",
                    store.layout.shown,
                ) from exc
            raise

    def count(self) -> int:
        """Messages of this queue now in its dead-letter queue (one listing of it)."""
        path = self.path()
        if path is None or not _fs.is_dir(path):
            return 0
        try:
            names = open_store(path).layout.files()
        except QueueNotFound:
            return 0
        queue_id = self._queue_id
        return sum(1 for name in names if name.origin == queue_id)

    def redrive(self, to: str | None, max_messages: int | None, now: int, skew_us: int) -> int:
        """Move visible messages of this (dead-letter) queue back, with their
        receive count reset: into the queue at ``to``, or each into the queue
        it came from. Messages with no known home (and no ``to``) stay."""
        if max_messages is not None and (
            isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 0
        ):
            raise InvalidArgument(f"max_messages must be an int >= 0 or None, not {max_messages!r}")
        target = open_store(to) if to is not None else None
        homes: dict[str, Store | None] = {}
        sources = self.sources() if target is None else {}
        moved = 0
        for name in sorted(self._layout.files(), key=str):
            if max_messages is not None and moved >= max_messages:
                break
            if name.state is State.WRITING or (name.state is State.HIDDEN and name.until_us + skew_us > now):
                continue
            home = target
            if home is None:
                if name.origin not in homes:
                    homes[name.origin] = self._home(sources.get(name.origin))
                home = homes[name.origin]
            if home is None:
                continue
            back = _format.ready_name(_format.with_origin(name, ""))
            if move_into(self._layout.message_file(str(name)), home.layout.message_file(back)):
                moved += 1
        return moved

    def sources(self) -> dict[str, str]:
        """Origin queue id -> path, of the queues this one is the dead-letter
        queue of, as ``.sources`` says (read from the spool: see :meth:`_home`)."""
        directory = self._layout.file(_format.SOURCES_DIR)
        if not _fs.is_private_dir(directory):
            return {}
        found = {}
        for entry in _fs.list_names(directory):
            if not _format.is_queue_id(entry):
                continue
            data = _fs.read_control(os.path.join(directory, entry))
            if data:
                found[entry] = data.decode("utf-8", "replace")
        return found

    def _home(self, source: str | None) -> Store | None:
        """The queue a redrive without ``to`` moves a dead letter back to: the
        queue ``.sources`` names, only if that path lies inside the spool of
        this dead-letter queue (its parent directory): a path read from the
        spool never leads vsqs outside it. Elsewhere: reported, the messages
        stay (the operator may name the queue with ``to``)."""
        if not source:
            return None
        spool = os.path.dirname(self._layout.shown)
        path = _fs.inside(source, spool)
        if path is None or path == _fs.inside(self._layout.shown, spool):  # (itself: no home either)
            log.warning(
                "dead-letter queue %s: source %r is not a queue of the spool %s: not followed "
                "(redrive to= moves its messages)", self._layout.shown, source, spool,
            )
            return None
        return _store_or_none(path)


def dead_letter_path(here: str, settings: Mapping[str, Any]) -> str | None:
    """The path of the dead-letter queue of the queue at ``here`` with ``settings``;
    None without ``max_receives`` nor ``dead_letter``."""
    if settings["max_receives"] is None and not settings["dead_letter"]:
        return None
    target = settings["dead_letter"] or os.path.basename(here) + ".dlq"
    path = os.path.abspath(os.path.join(os.path.dirname(here), target))  # absolute wins
    if path == here or here.startswith(path.rstrip(os.sep) + os.sep):
        raise InvalidArgument(f"dead_letter {target!r} is this queue or a directory above it")
    return path


def register_source(dead_letter_queue: Layout, source_id: str, source_path: str, mode: int | None) -> None:
    """Remember in the dead-letter queue where dead letters marked with ``source_id`` came from."""
    directory = dead_letter_queue.file(_format.SOURCES_DIR)
    entry = os.path.join(directory, source_id)
    if not _fs.exists(entry):
        _fs.make_dirs(directory, mode)
        _fs.create_exclusive(entry, source_path.encode(), durable=True, mode=mode)


def _store_or_none(path: str) -> Store | None:
    try:
        return open_store(path)
    except QueueNotFound:
        return None
