"""Stages: many messages written durably into a private directory of the
queue, invisible to receivers, then published together by one rename each
(or dropped). A Spark task attempt writes its own stage, and only the
committed attempt's messages are published."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import publishing
from vsqs._core.dedup import Reservations
from vsqs._core.errors import QueueNotFound, StorageError
from vsqs._core.format import State
from vsqs._core.layout import Layout, move_into
from vsqs._core.message import Body, Outgoing
from vsqs._core.settings import check_suspended
from vsqs._core.settings_store import SettingsStore
from vsqs._core.synced import SyncedFiles


class Stages:
    """The stages of one queue: its files (``layout``), its settings and the
    back-pressure (``capacity``) a publish obeys, its de-duplication ``reservations``."""

    def __init__(
        self, layout: Layout, settings: SettingsStore, capacity: publishing.Capacity, reservations: Reservations
    ) -> None:
        self._layout = layout
        self._settings = settings
        self._capacity = capacity
        self._reservations = reservations

    def publish(
        self, bodies: Iterable[Body | Outgoing], stage: str, written: Callable[[], object] | None = None
    ) -> list[str]:
        """Write messages durably into ``stage``; their ids. The files are
        written, fsynced together (:class:`SyncedFiles`), renamed to their
        staged names, and the stage directory is fsynced once. ``written()``
        is called once every file is written (every key taken), before the
        wait for their fsyncs: a publish started after it sorts after these."""
        directory = self._layout.file(_format.stage_dir_name(stage))
        settings = self._settings.current()
        check_suspended("publish", settings, self._layout.shown)
        entries = [publishing.prepare(item, publishing.NO_DEFAULTS, settings) for item in bodies]
        self._capacity.check([entry.body for entry in entries], settings, self._layout.shown)
        mode = self._settings.mode
        _fs.make_dirs(directory, mode)
        prefix = directory + os.sep
        staged: list[tuple[str, str, str]] = []  # (stem, .new path, staged path)
        try:
            with SyncedFiles() as files:  # every file written, then all synced together
                for entry in entries:
                    if entry.digest:  # the commit needs it: it travels in the envelope
                        entry = entry._replace(header={**entry.header, "dedup": entry.digest})
                    stem, temp = publishing.write_new(self._layout, entry, True, mode, stage=prefix, files=files)
                    staged.append((stem, temp, prefix + publishing.final_name(stem, entry.delay)))
                if written is not None:
                    files.hand_over()  # closed without this thread: written() may publish, or wait for one
                    written()
                files.wait()
        except BaseException:
            for _, temp, _ in staged:  # not one of them is staged: none stays
                with contextlib.suppress(StorageError):
                    _fs.unlink(temp)
            raise
        # only whole, durable files get a staged name (a .new file is never published)
        for _, temp, final in staged:
            if not _fs.rename(temp, final):
                raise StorageError(2, "staged message file vanished", _fs.shown(temp))
        _fs.fsync_dir(directory)  # once for them all
        return [stem[: _format.KEY_LENGTH] for stem, _, _ in staged]

    def commit(self, stage: str) -> int:
        """Publish every message of ``stage`` and remove it; how many were published."""
        directory = self._layout.file(_format.stage_dir_name(stage))
        if not _fs.is_private_dir(directory):
            return 0
        settings = self._settings.current()
        reserved: dict[str, tuple[str, int]] = {}
        presence = publishing.Presence(self._layout)
        published: list[str] = []
        leftovers = []
        try:
            for name in _fs.list_names(directory):
                parsed = _format.parse_name(name)
                if parsed is None or parsed.state is State.WRITING:
                    leftovers.append(name)  # .new files of a writer that died: never published
                    continue
                staged = os.path.join(directory, name)
                digest = _staged_digest(parsed, staged) if parsed.envelope else ""
                if digest and digest not in reserved and self._reservations.peek(
                    digest, settings["dedup_window"], presence
                ):
                    leftovers.append(name)  # a known duplicate never enters the queue
                    continue
                if not move_into(staged, self._layout.message_file(name)):
                    continue
                holder = (
                    publishing.reserve(self._reservations, digest, parsed.stem, settings, reserved, presence)
                    if digest else None
                )
                if holder is not None and holder != parsed.key:
                    _fs.unlink(self._layout.message_file(name))  # a duplicate: take it back
                    continue
                published.append(name)
        finally:  # (also when a move failed half-way: what did move is made durable and kept)
            if published:
                self._layout.fsync(published)
            for digest, (key, gen) in reserved.items():
                self._reservations.confirm(digest, gen, key)
        _fs.remove_tree_quietly(directory, leftovers)
        return len(published)

    def abort(self, stage: str) -> int:
        """Drop ``stage`` and its messages unpublished; how many were dropped."""
        directory = self._layout.file(_format.stage_dir_name(stage))
        if not _fs.is_private_dir(directory):
            return 0
        names = _fs.list_names(directory)
        dropped = sum(1 for name in names if _format.parse_name(name) is not None)
        _fs.remove_tree_quietly(directory, names)  # all of it: the directory is ours
        return dropped

    def count(self) -> int:
        """How many messages the stages hold (staged, not yet published): one
        listing of the queue and one of each stage."""
        total = 0
        for stage in self.names():
            directory = self._layout.file(_format.stage_dir_name(stage))
            try:
                names = _fs.list_names(directory)
            except QueueNotFound:
                continue  # committed or dropped since the listing
            parsed = (_format.parse_name(name) for name in names)
            total += sum(1 for name in parsed if name is not None and name.state is not State.WRITING)
        return total

    def names(self) -> list[str]:
        """The names of the stages not yet committed or aborted."""
        found = []
        for entry in _fs.list_names(self._layout.path):
            name = _format.parse_stage_dir(entry)
            if name is not None and _fs.is_private_dir(self._layout.file(entry)):
                found.append(name)
        return sorted(found)


def _staged_digest(name: _format.Name, path: str) -> str:
    """The de-duplication hash a staged message carries in its envelope, or ""."""
    data = _fs.read(path)
    try:
        header = _envelope.decode_content(name, data, path)[1] if data else None
    except StorageError:
        header = None
    return str((header or {}).get("dedup") or "")
