"""Looking at a queue and tidying it: messages in delivery order (all, or a
page after a cursor), counts by state, purge, the bulk requeue of expired
messages, and garbage collection. None of it is on a hot path; each is one
listing (or a few)."""

from __future__ import annotations

import heapq
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.adapter_area import collect_area
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.dedup import Reservations
from vsqs._core.errors import DamagedEntry, InvalidArgument, QueueNotFound, StorageError
from vsqs._core.format import State
from vsqs._core.groups import GroupLeases
from vsqs._core.layout import Layout
from vsqs._core.limits import (
    DEFAULT_GC_GRACE,
    DEFAULT_STAGE_GRACE,
    MAX_BATCH,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
)
from vsqs._core.message import MessageInfo, QueueStats
from vsqs._core.rules import check_seconds
from vsqs._core.settings_store import SettingsStore
from vsqs._core.stages import Stages

log = logging.getLogger("vsqs")


class Maintenance:
    """Inspection and upkeep of one queue, through its collaborators."""

    def __init__(
        self,
        layout: Layout,
        skew_us: int,
        settings: SettingsStore,
        dead_letters: DeadLetters[Any],
        stages: Stages,
        groups: GroupLeases,
        reservations: Reservations,
        lock: threading.Lock,
    ) -> None:
        self._layout = layout
        self._skew_us = skew_us
        self._settings = settings
        self._dead_letters = dead_letters
        self._stages = stages
        self._groups = groups
        self._reservations = reservations
        self._lock = lock  # the queue's: it guards the group leases
        self._area_reported: set[str] = set()  # entries of .spark/ reported as damage

    def state_of(self, name: _format.Name, now: int) -> str:
        """"ready", "in_flight" or "delayed" at ``now`` (µs), with the clock skew allowed."""
        if name.state is State.HIDDEN and name.until_us + self._skew_us > now:
            return "delayed" if name.receive_count == 0 else "in_flight"
        return "ready"

    def messages(self, bodies: bool, ids: Iterable[str] | None, after: str | None = None,
                 limit: int | None = None, preview: int | None = None) -> Iterator[MessageInfo]:
        """Every message (or those of ``ids``) in delivery order, or one
        :meth:`page` if ``after``, ``limit`` or ``preview`` is given."""
        if after is not None or limit is not None or preview is not None:
            if bodies or ids is not None:
                raise InvalidArgument("a page (after, limit, preview) takes neither bodies nor ids")
            return iter(self.page(after, 100 if limit is None else limit, preview))
        return self._all(bodies, ids)

    def _all(self, bodies: bool, ids: Iterable[str] | None) -> Iterator[MessageInfo]:
        """Every message (or those of ``ids``) in delivery order; changes nothing.
        A message that moves between the listing and the read of its body is
        looked up once more by its id."""
        wanted = None if ids is None else set(ids)
        now = _format.now_us()
        moved: set[str] = set()
        for name in sorted(self._layout.files(), key=str):
            if name.state is State.WRITING or (wanted is not None and name.key not in wanted):
                continue
            data = self._body(name) if bodies else None
            if bodies and data is None:
                moved.add(name.key)
                continue
            yield self._info(name, now, data)
        if moved:
            for name in sorted(self._layout.files(), key=str):
                if name.key in moved and name.state is not State.WRITING:
                    data = self._body(name)
                    if data is not None:
                        yield self._info(name, now, data)

    def page(self, after: str | None, limit: int, preview: int | None) -> list[MessageInfo]:
        """Up to ``limit`` messages whose id comes after ``after`` in delivery
        order, changing nothing. One listing, kept to the ``limit`` smallest
        names in a bounded heap (names are compared as strings, parsed only
        for the page), and with ``preview`` the first ``preview`` bytes of the
        page's bodies only: its cost grows with the queue's listing, never
        with its bodies."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BATCH:
            raise InvalidArgument(f"limit must be 1..{MAX_BATCH} messages, not {limit!r}")
        if after is not None and not _format.is_key(after):
            raise InvalidArgument(f"after must be a message id, not {after!r}")
        if preview is not None and (isinstance(preview, bool) or not isinstance(preview, int)
                                    or not 0 <= preview <= MAX_BODY_BYTES):
            raise InvalidArgument(f"preview must be 0..{MAX_BODY_BYTES} bytes, not {preview!r}")
        entries = [entry for place in self._layout.message_dirs() for entry in _fs.list_files(place)[0]]
        now = _format.now_us()
        found: list[MessageInfo] = []
        # every name of a message starts with its id, and every character
        # that may follow an id sorts before "~": "ID~" is past all of ID's names
        bound = "" if after is None else after + "~"
        spare = 16  # (a few spare: entries of no message are dropped; doubled each pass, so a run of
        # thousands of them costs a few passes over the listing, not one per page's worth)
        while len(found) < limit:
            wanted = limit - len(found) + spare
            spare *= 2
            chosen = heapq.nsmallest(wanted, (entry for entry in entries if entry > bound))
            for entry in chosen:
                name = _format.parse_name(entry)
                if name is None or name.state is State.WRITING or len(found) == limit:
                    continue
                info = self._peek(name, now, preview)
                if info is not None:
                    found.append(info)
            if len(chosen) < wanted:
                break
            bound = chosen[-1][: _format.KEY_LENGTH] + "~"
        return found

    def _peek(self, name: _format.Name, now: int, preview: int | None) -> MessageInfo | None:
        """What a page says of message ``name``; None if it moved or is damage (reported)."""
        if preview is None:
            return self._info(name, now, None)
        path = self._layout.message_file(str(name))
        try:
            read = _fs.read_head(path, preview + (4096 if name.envelope else 0))
            if read is not None and name.envelope and b"\n" not in read[0] and read[1] > len(read[0]):
                read = _fs.read_head(path, preview + MAX_HEADER_BYTES + 1)  # a long header line
            if read is None:
                return None  # moved since the listing: the next page, or a refresh, shows it
            data, size = read
            header: dict[str, Any] = {}
            head = data
            if name.envelope:  # the body is what follows the header line
                header, head = _envelope.decode_envelope(data)
                size -= len(data) - len(head)
        except DamagedEntry as exc:
            self._layout.report_damage(path, str(exc.strerror))
            return None
        except ValueError as exc:  # an envelope cut short or corrupt: reported, skipped
            self._layout.report_damage(path, f"corrupt message envelope ({exc})")
            return None
        info = self._info(name, now, None)
        attributes = header.get("attributes")  # (a hostile header may hold anything)
        attributes = {str(k): str(v) for k, v in attributes.items()} if isinstance(attributes, dict) else {}
        group = header.get("group")
        return MessageInfo(info.id, info.state, info.receive_count, info.sent_at, info.visible_at, info.priority,
                           head[:preview], attributes, None if group is None else str(group), size)

    def _body(self, name: _format.Name) -> bytes | None:
        """The content of message ``name``; None if it is gone, or if it
        turned out to be no message (then reported, and skipped)."""
        path = self._layout.message_file(str(name))
        try:
            return _fs.read(path)
        except DamagedEntry as exc:
            self._layout.report_damage(path, str(exc.strerror))
            return None

    def _info(self, name: _format.Name, now: int, data: bytes | None) -> MessageInfo:
        visible_at = name.until_us if name.state is State.HIDDEN else name.sent_us
        where = self._layout.message_file(str(name))
        body, header = (None, None) if data is None else _envelope.decode_content(name, data, where)
        header = header or {}
        return MessageInfo(
            name.key,
            self.state_of(name, now),
            name.receive_count,
            name.sent_us / 1e6,
            visible_at / 1e6,
            name.priority,
            body,
            dict(header.get("attributes", {})),
            header.get("group"),
        )

    def stats(self, groups: bool) -> QueueStats:
        """Counts by state and the age of the oldest visible message, from one
        listing; with ``groups`` also counts per message group."""
        now = _format.now_us()
        counts = {"ready": 0, "in_flight": 0, "delayed": 0}
        per_group: dict[str, dict[str, int]] = {}
        sample: dict[str, _format.Name] = {}
        writing = 0
        oldest = now
        for name in self._layout.files():
            if name.state is State.WRITING:
                writing += 1
                continue
            state = self.state_of(name, now)
            counts[state] += 1
            if state == "ready":
                oldest = min(oldest, name.sent_us)
            if groups and name.group_hash:
                tally = per_group.setdefault(name.group_hash, {"ready": 0, "in_flight": 0, "delayed": 0})
                tally[state] += 1
                sample.setdefault(name.group_hash, name)
        return QueueStats(
            oldest_ready_age=max(0, now - oldest) / 1e6,
            writing=writing,
            dead_lettered=self._dead_letters.count(),
            groups={self._group_name(sample[h]): tally for h, tally in per_group.items()} if groups else None,
            staged=self._stages.count(),
            **counts,
        )

    def _group_name(self, name: _format.Name) -> str:
        """A group's name, from the header of one of its messages (its hash if
        unreadable): only the header line is read, never the body, and a file
        that is no message (a FIFO, a directory, a huge file) names no group."""
        path = self._layout.message_file(str(name))
        try:
            read = _fs.read_head(path, 4096) if name.envelope else None
            if read is not None and b"\n" not in read[0] and read[1] > len(read[0]):
                read = _fs.read_head(path, MAX_HEADER_BYTES + 1)  # a long header line
            header = _envelope.decode_envelope(read[0])[0] if read else None
        except (StorageError, ValueError):
            header = None
        return str((header or {}).get("group") or name.group_hash)

    def purge(self, ids: Iterable[str] | None = None) -> int:
        """Delete every message (or those of ``ids``), in flight and delayed
        included; how many. Entries named like messages that are no regular
        files are reported and left alone (see Layout.files). A purge of the
        whole queue frees the group slots held by the in-flight messages it
        removed (see :meth:`GroupLeases.free_purged`), so their groups go on at
        once; a purge of ``ids`` frees none (their leases run out). A
        message of ``ids`` that moved (was received) while it went is looked
        up once more. Then the de-duplication ids the removed messages held are
        freed (:meth:`Reservations.forget`): a message published again with one
        is stored. (A crash before that leaves them held, as a delete would.)"""
        if ids is None:
            self._record_purge(_format.now_us())
        wanted = None if ids is None else set(ids)
        keys: set[str] = set()
        removed = self._purge(wanted, keys)
        if wanted:  # those not removed may have moved between the listing and the unlink
            removed += self._purge(wanted, keys)
        self._reservations.forget(keys)
        return removed

    def _record_purge(self, when_us: int) -> None:
        """Record a purge of the whole queue at ``when_us`` (an empty file
        ``.purged/WHEN``, before the first message goes) and remove the
        older records: the newest is the one read. A record that cannot be
        written (``.purged`` planted as a file or a link, a full disk) is
        reported and the purge goes on: it serves only the SQS face's rule."""
        directory = self._layout.file(_format.PURGED_DIR)
        mode = self._settings.mode
        try:
            _fs.make_dirs(directory, mode)
            _fs.create_exclusive(os.path.join(directory, _format.purged_record(when_us)), b"", durable=False, mode=mode)
            for entry in _fs.list_files(directory)[0]:
                when = _format.parse_purged_record(entry)
                if when is not None and when < when_us:
                    _fs.unlink(os.path.join(directory, entry))
        except StorageError as exc:
            log.warning("queue %s: the record of its purge was not written: %s", self._layout.shown, exc)

    def purged_at(self) -> float | None:
        """When the whole queue was last purged (epoch seconds), from the newest
        record of ``.purged/`` (a time more than a minute ahead of this host's
        clock is ignored, one less ahead reads as now); ``None`` if never."""
        directory = self._layout.file(_format.PURGED_DIR)
        if not _fs.is_private_dir(directory):
            if _fs.lstat(directory) is not None:
                log.warning("queue %s: %s is not a directory: no purge records read", self._layout.shown,
                            _format.PURGED_DIR)
            return None
        try:
            entries = _fs.list_files(directory)[0]  # regular files only: a FIFO, a link, a directory is none
        except QueueNotFound:  # gone since, or swapped for a link
            return None
        times = (_format.parse_purged_record(entry) for entry in entries)
        newest = _format.newest_time((t for t in times if t is not None), _format.now_us())
        return None if newest is None else newest / 1_000_000

    def _purge(self, wanted: set[str] | None, keys: set[str]) -> int:
        """One pass of :meth:`purge`: how many files it removed; their ids leave ``wanted``, join ``keys``."""
        removed = 0
        held: dict[str, set[int]] = {}
        removed_keys: dict[str, set[str]] = {}
        for name in self._layout.files():
            if wanted is not None and name.key not in wanted:
                continue
            if name.state is State.WRITING:
                continue
            path = self._layout.message_file(str(name))
            gone = _fs.remove_message(path)
            if gone is None:  # a file over MAX_MESSAGE_FILE (or replaced since the listing): damage, left alone
                self._layout.report_damage(path, "not a regular file, or too large")
            elif gone:
                if wanted is not None:
                    wanted.discard(name.key)
                keys.add(name.key)
                removed += 1
                if name.group_hash:
                    removed_keys.setdefault(name.group_hash, set()).add(name.key)
                if name.group_hash and name.state is State.HIDDEN and name.receive_count:
                    held.setdefault(name.group_hash, set()).add(name.until_us)
        if held and wanted is None:  # (a purge of some ids frees no slot: the lease runs out)
            with self._lock:
                self._groups.free_purged(held, removed_keys)
        return removed

    def requeue_expired(self) -> int:
        """Make every hidden message whose time has come ready again, and move
        those received ``max_receives`` times to the dead-letter queue; how many
        moved. A message past retention is neither: it is gc's to remove."""
        now = _format.now_us()
        settings = self._settings.current()
        max_receives = settings["max_receives"]
        kept_from = _settings.retained_from_us(settings["retention"], now, self._skew_us)
        moved = 0
        for name in self._layout.names():
            if name.state is State.WRITING or self.state_of(name, now) != "ready":
                continue
            if kept_from is not None and name.sent_us < kept_from:
                continue
            if max_receives is not None and name.receive_count >= max_receives:
                buried = self._dead_letters.bury(name)
                moved += buried
                if buried and name.group_hash:  # a run's member, maybe: see GroupLeases.mark_gone
                    with self._lock:
                        self._groups.mark_gone(name.group_hash, name.key)
            elif name.state is State.HIDDEN:
                ready = _format.ready_name(name.stem, name.receive_count)
                if _fs.rename(self._layout.message_file(str(name)), self._layout.message_file(ready)):
                    moved += 1
        return moved

    def collect_garbage(self, grace: float = DEFAULT_GC_GRACE, stage_grace: float = DEFAULT_STAGE_GRACE) -> int:
        """Remove old ``.new`` files, stages, messages past the queue's
        ``retention``, spent group leases and de-duplication reservations,
        and leftovers in ``.spark/`` (``adapter_area``: trees untouched for
        ``stage_grace``, files being written older than ``grace``); how many
        files went (see :meth:`Queue.collect_garbage`)."""
        grace = check_seconds(grace, "grace", math.inf)
        stage_grace = check_seconds(stage_grace, "stage_grace", math.inf)
        now = time.time()
        kept_from = _settings.retained_from_us(self._settings.current()["retention"], _format.now_us(), self._skew_us)
        removed = 0
        present: set[str] = set()
        self._layout.rehome_strays(self._settings.mode)
        for entry, regular in self._layout.entries():
            name = _format.parse_name(entry)
            if name is not None and not regular:  # damage: reported, left in place, never removed
                present.add(name.key)
                self._layout.report_damage(self._layout.message_file(entry), "not a regular file")
            elif name is not None and name.state is not State.WRITING:
                if kept_from is not None and name.sent_us < kept_from:  # past retention
                    gone = _fs.remove_message(self._layout.message_file(entry))
                    if gone is None:  # damage after all (over MAX_MESSAGE_FILE, or replaced): never removed
                        present.add(name.key)
                        self._layout.report_damage(self._layout.message_file(entry), "not a regular file, or too large")
                    removed += bool(gone)
                    if gone and name.group_hash and name.receive_count:
                        with self._lock:
                            self._groups.mark_gone(name.group_hash, name.key)
                else:
                    present.add(name.key)
            elif name is not None:
                present.add(name.key)
                removed += self._layout.remove_orphan(entry, now - grace)
            elif _format.parse_stage_dir(entry) is not None and _fs.is_private_dir(self._layout.file(entry)):
                modified = _fs.mtime(self._layout.file(entry))
                if modified is not None and modified <= now - stage_grace:
                    removed += self._stages.abort(_format.parse_stage_dir(entry) or "")
        with self._lock:
            removed += self._groups.sweep()
        removed += self._reservations.sweep(self._settings.current()["dedup_window"], present)
        removed += collect_area(self._layout.path, now, grace, stage_grace, self._report_area).files
        return removed

    def _report_area(self, path: str, why: str) -> None:
        """Report damage in ``.spark/`` once per entry and handle (gc runs every minute in a gateway)."""
        if path not in self._area_reported:
            if len(self._area_reported) >= 1000:  # bounded memory: report them all again
                self._area_reported.clear()
            self._area_reported.add(path)
            log.warning("queue %s: %s is %s: skipped, left in place", self._layout.shown, _fs.shown(path), why)
