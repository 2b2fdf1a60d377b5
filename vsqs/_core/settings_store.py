"""A queue's settings on disk: ``.settings/NNNNNNNNN.json``, each version
created with an exclusive create and never rewritten; the newest version that
parses wins. Read at most once a second per handle (``TTL``), so every
process sees a change within that time."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.errors import InvalidArgument, StorageError
from vsqs._core.message import to_us

TTL = 1.0  # other processes' setting changes are seen within this many seconds
WRITE_GRACE = 2.0  # seconds a new version may take to be whole before writers go past it
_REPORTED_MAX = 1024  # (settings directory, version) pairs reported as skipped that the process remembers

log = logging.getLogger("vsqs")
_reported: dict[tuple[str, int], None] = {}  # the pairs reported, oldest first (a dict keeps its order)
_reported_lock = threading.Lock()


def _first_report(directory: str, version: int) -> bool:
    """Whether version ``version`` in ``directory`` is not yet reported by this
    process (then remembered as reported, the oldest pair forgotten past
    ``_REPORTED_MAX``): every handle of the queue shares one memory."""
    key = (os.path.abspath(directory), version)
    with _reported_lock:
        if key in _reported:
            return False
        while len(_reported) >= _REPORTED_MAX:
            del _reported[next(iter(_reported))]
        _reported[key] = None
        return True


class SettingsStore:
    """The settings of the queue whose directory entry ``.settings`` is at
    ``directory``, with this handle's copy of them.

    ``values``, ``read_at`` and ``lease_us`` are read directly by the hot
    paths (a freshness test inlined, instead of a call to :meth:`current`).
    ``mode`` is the queue's file mode (its ``file_mode`` setting), for every
    file the handle makes; ``on_change`` is called with the settings each
    time they are read anew.
    """

    def __init__(self, directory: str, on_change: Callable[[Mapping[str, Any]], None]) -> None:
        self.directory = directory
        self.values: dict[str, Any] = _settings.defaults()
        self.mode = _settings.file_mode_of(self.values)
        self.lease_us = to_us(self.values["visibility_timeout"])  # the default visibility timeout, in µs
        self.read_at = -math.inf  # time.monotonic() of the last read
        self._on_change = on_change
        self._lock = threading.Lock()  # its own: settings are read while the queue's lock is held

    def current(self) -> dict[str, Any]:
        """The settings, read again if the copy is older than TTL."""
        if time.monotonic() - self.read_at >= TTL:
            _, settings = self.newest()
            self._adopt(settings)
        return self.values

    def expire(self) -> None:
        """Read the settings again at the next :meth:`current` (they may have changed)."""
        self.read_at = -math.inf

    def current_mode(self) -> int | None:
        """The queue's file mode, from settings at most TTL old."""
        self.current()
        return self.mode

    def write(
        self,
        clean: Mapping[str, Any],
        mode: int | None = None,
        edit: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Store a new version: the newest settings with the validated
        ``clean`` changes on top (and the validated changes ``edit`` makes of
        the newest settings, called again after a lost race, so that a
        read-modify-write of one setting loses no other writer's change).
        Its files take the queue's file_mode after the change (or ``mode``,
        for a queue whose settings do not say yet). Returns the result."""
        attempts, deadline = 0, time.monotonic() + WRITE_GRACE
        while attempts < 50:
            version, parsed, current = self._newest()
            if parsed != version and time.monotonic() < deadline and self._being_written(version):
                time.sleep(0.002)  # another writer's version, created but not yet whole: wait for it
                continue
            attempts += 1
            merged = {**current, **clean, **(edit(current) if edit is not None else {})}
            mode = _settings.file_mode_of(merged) if merged["file_mode"] is not None else mode
            _fs.make_dirs(self.directory, mode)
            data = _settings.encode(merged, _format.SETTINGS_FORMAT)
            path = os.path.join(self.directory, _settings.version_name(version + 1))
            if _fs.create_exclusive(path, data, durable=True, mode=mode):
                _fs.fsync_dir(self.directory)
                self._adopt(merged)
                return merged
        raise StorageError(17, "settings changed by others 50 times in a row; try again", _fs.shown(self.directory))

    def newest(self) -> tuple[int, dict[str, Any]]:
        """(newest version number, newest settings that parse) from one small listing."""
        version, _, settings = self._newest()
        return version, settings

    def _being_written(self, version: int) -> bool:
        """Whether version ``version`` (which does not parse) was made so recently
        that its writer may still be writing it (rather than dead half-way)."""
        made = _fs.mtime(os.path.join(self.directory, _settings.version_name(version)))
        return made is not None and time.time() - made < WRITE_GRACE

    def _newest(self) -> tuple[int, int, dict[str, Any]]:
        """(newest version number, the version the settings come from, the newest settings that parse)."""
        if not _fs.is_private_dir(self.directory):
            return 0, 0, _settings.defaults()
        versions = sorted(
            (v for v in map(_settings.parse_version, _fs.list_names(self.directory)) if v is not None),
            reverse=True,
        )
        for version in versions:
            data = _fs.read_control(os.path.join(self.directory, _settings.version_name(version)))
            if not data:
                continue  # being written, or not a regular file of at most 64 KiB
            try:
                return versions[0], version, _settings.decode(data, _format.SETTINGS_FORMAT)
            except InvalidArgument as exc:
                self._report(version, str(exc))
        return (versions[0] if versions else 0), 0, _settings.defaults()

    def _report(self, version: int, why: str) -> None:
        """Report (a warning, once per version per process, whichever handle
        reads it) a version that does not parse and is not being written: it
        is skipped (FORMAT.md, Settings)."""
        if self._being_written(version) or not _first_report(self.directory, version):
            return
        log.warning("queue settings %s: version %d skipped: %s", _fs.shown(self.directory), version, why)

    def changed_at(self) -> float | None:
        """When the newest version was written (its file's mtime); ``None`` if there is none."""
        if not _fs.is_private_dir(self.directory):
            return None
        versions = [v for v in map(_settings.parse_version, _fs.list_names(self.directory)) if v is not None]
        return _fs.mtime(os.path.join(self.directory, _settings.version_name(max(versions)))) if versions else None

    def _adopt(self, settings: dict[str, Any]) -> None:
        with self._lock:
            self.values = settings
            self.mode = _settings.file_mode_of(settings)
            self.lease_us = to_us(settings["visibility_timeout"])  # (validated when it was read)
            self._on_change(settings)
            self.read_at = time.monotonic()
