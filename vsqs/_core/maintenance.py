"""Looking at a queue and tidying it: messages in delivery order, counts by
state, purge, the bulk requeue of expired messages, and garbage collection.
None of it is on a hot path; each is one listing (or a few)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.dedup import Reservations
from vsqs._core.errors import DamagedEntry, StorageError
from vsqs._core.format import State
from vsqs._core.groups import GroupLeases
from vsqs._core.layout import Layout
from vsqs._core.limits import DEFAULT_GC_GRACE, DEFAULT_STAGE_GRACE
from vsqs._core.message import MessageInfo, QueueStats
from vsqs._core.rules import check_seconds
from vsqs._core.settings_store import SettingsStore
from vsqs._core.stages import Stages


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

    def state_of(self, name: _format.Name, now: int) -> str:
        """"ready", "in_flight" or "delayed" at ``now`` (µs), with the clock skew allowed."""
        if name.state is State.HIDDEN and name.until_us + self._skew_us > now:
            return "delayed" if name.receive_count == 0 else "in_flight"
        return "ready"

    def messages(self, bodies: bool, ids: Iterable[str] | None) -> Iterator[MessageInfo]:
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
        """A group's name, from the envelope of one of its messages (its hash if unreadable)."""
        data = _fs.read(self._layout.message_file(str(name)))
        try:
            header = _envelope.decode_content(name, data, str(name))[1] if data else None
        except StorageError:
            header = None
        return str((header or {}).get("group") or name.group_hash)

    def purge(self) -> int:
        """Delete every message, in flight and delayed included; how many.
        Entries named like messages that are no regular files are reported
        and left alone (see Layout.files). The group slots held by the
        in-flight messages it removed are freed (see
        :meth:`GroupLeases.free_purged`), so their groups go on at once."""
        removed = 0
        held: dict[str, set[int]] = {}
        for name in self._layout.files():
            if name.state is not State.WRITING and _fs.unlink(self._layout.message_file(str(name))):
                removed += 1
                if name.group_hash and name.state is State.HIDDEN and name.receive_count:
                    held.setdefault(name.group_hash, set()).add(name.until_us)
        if held:
            with self._lock:
                self._groups.free_purged(held)
        return removed

    def requeue_expired(self) -> int:
        """Make every hidden message whose time has come ready again, and move
        those received ``max_receives`` times to the dead-letter queue; how many moved."""
        now = _format.now_us()
        max_receives = self._settings.current()["max_receives"]
        moved = 0
        for name in self._layout.names():
            if name.state is State.WRITING or self.state_of(name, now) != "ready":
                continue
            if max_receives is not None and name.receive_count >= max_receives:
                moved += self._dead_letters.bury(name)
            elif name.state is State.HIDDEN:
                ready = _format.ready_name(name.stem, name.receive_count)
                if _fs.rename(self._layout.message_file(str(name)), self._layout.message_file(ready)):
                    moved += 1
        return moved

    def collect_garbage(self, grace: float = DEFAULT_GC_GRACE, stage_grace: float = DEFAULT_STAGE_GRACE) -> int:
        """Remove old ``.new`` files, stages, messages past the queue's
        ``retention``, spent group leases and de-duplication reservations;
        how many files went (see :meth:`Queue.collect_garbage`)."""
        grace = check_seconds(grace, "grace", math.inf)
        stage_grace = check_seconds(stage_grace, "stage_grace", math.inf)
        retention = self._settings.current()["retention"]
        now = time.time()
        removed = 0
        present: set[str] = set()
        self._layout.rehome_strays(self._settings.mode)
        for entry, regular in self._layout.entries():
            name = _format.parse_name(entry)
            if name is not None and not regular:  # damage: reported, left in place, never removed
                present.add(name.key)
                self._layout.report_damage(self._layout.message_file(entry), "not a regular file")
            elif name is not None and name.state is not State.WRITING:
                if retention is not None and name.sent_us / 1e6 < now - retention:
                    removed += _fs.unlink(self._layout.message_file(entry))
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
        return removed
