"""The queue's settings, inspection and maintenance: a base of :class:`vsqs.Queue`.

Cold paths, each a call into a part (the settings store, maintenance); they
live here so that the queue's own module keeps the hot paths (publish,
receive, delete) and the opening. The methods work on the parts that
:meth:`vsqs.Queue._open_store` sets up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

from vsqs._core import settings as _settings
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.errors import InvalidArgument
from vsqs._core.limits import DEFAULT_GC_GRACE, DEFAULT_STAGE_GRACE
from vsqs._core.maintenance import Maintenance
from vsqs._core.message import MessageInfo, QueueStats
from vsqs._core.metadata import Store, created_at
from vsqs._core.receiver import Receiver
from vsqs._core.settings_store import SettingsStore

T = TypeVar("T")


class Administration:
    """Settings, suspension, inspection and maintenance of a queue."""

    _settings: SettingsStore
    _dead_letters: DeadLetters[Any]
    _maintenance: Maintenance
    _receiver: Receiver

    def _open_parts(self) -> Store:  # the queue's: its metadata, opened once
        raise NotImplementedError

    def _reopening(self, call: Callable[[], T]) -> T:  # the queue's: call(), again if the queue was made again
        raise NotImplementedError

    @property
    def settings(self) -> Mapping[str, Any]:
        """The queue's settings (defaults filled in), read-only; at most a second old."""
        self._open_parts()
        return MappingProxyType(dict(self._settings.current()))

    @property
    def created_at(self) -> float | None:
        """When the queue was created (epoch seconds, from its metadata; ``None``
        if the metadata does not say). Read from disk on each call."""
        return created_at(self._open_parts().layout.path)

    @property
    def settings_changed_at(self) -> float | None:
        """When the queue's settings were last changed (the newest version's
        time, epoch seconds; ``None`` if they never were). Read from disk on each call."""
        self._open_parts()
        return self._settings.changed_at()

    def configure(self, **changes: Any) -> Mapping[str, Any]:
        """Change settings (``None`` unsets one); every process sees them within a second.

        The settings, their defaults and bounds: docs/FORMAT.md's table, made
        from their declarations (``vsqs._core.settings.SCHEMA``).
        """
        clean = _settings.validate(changes)
        self._open_parts()
        if clean.get("dead_letter"):
            self._dead_letters.path({**self._settings.current(), **clean})  # refuses itself, ancestors
        mode = None if "file_mode" in clean else self._settings.mode  # (for settings that name no mode yet)
        result = self._settings.write(clean, mode)
        if clean.keys() & {"dead_letter", "max_receives"} and result["max_receives"] is not None:
            self._dead_letters.register()  # a source before its first dead letter (dead_letter_sources)
        return MappingProxyType(dict(result))

    def update_setting(self, name: str, change: Callable[[Any], Any]) -> Mapping[str, Any]:
        """Set the setting ``name`` to ``change(its newest value)``, atomically against other
        writers (after a lost race, ``change`` is called again on the winner's value)."""
        if name not in _settings.SCHEMA or name in ("dead_letter", "file_mode"):
            raise InvalidArgument(f"update_setting cannot change {name!r}; use configure")
        edit = lambda current: _settings.validate({name: change(current[name])})  # noqa: E731
        self._open_parts()
        return MappingProxyType(dict(self._settings.write({}, self._settings.mode, edit)))

    def suspend(self, *operations: str) -> None:
        """Suspend ``operations`` ("publish", "receive", "delete"; none given: all)
        in every process: they raise :class:`QueueSuspended` until resumed."""
        self._open_parts()
        current = set(self._settings.current()["suspended"])
        self.configure(suspended=sorted(current | set(operations or _settings.OPERATIONS)))

    def resume(self, *operations: str) -> None:
        """Resume ``operations`` (none given: all)."""
        _settings.validate({"suspended": list(operations)})
        self._open_parts()
        current = set(self._settings.current()["suspended"])
        self.configure(suspended=sorted(current - set(operations or _settings.OPERATIONS)))

    def messages(
        self, *, bodies: bool = False, ids: Iterable[str] | None = None,
        after: str | None = None, limit: int | None = None, preview: int | None = None,
    ) -> Iterator[MessageInfo]:
        """Every message (or those of ``ids``) in delivery order; changes nothing. With ``bodies=True``
        each body is read too (a message that moved since the listing is looked up once more).
        Given ``after``, ``limit`` (1..10,000) or ``preview``: one page after the id ``after``, with the
        first ``preview`` bytes of each body (``size`` tells the whole); it reads the page's bodies only."""
        self._open_parts()
        return self._maintenance.messages(bodies, ids, after, limit, preview)

    def stats(self, *, groups: bool = False) -> QueueStats:
        """Counts by state and the age of the oldest visible message, from one
        listing; with ``groups=True`` also counts per message group (reading one
        message of each group for its name)."""
        self._open_parts()
        return self._reopening(lambda: self._maintenance.stats(groups))

    def purge(self, ids: Iterable[str] | None = None) -> int:
        """Delete every message (or those of ``ids``), in flight and delayed included; return how many.
        A purge of every message is recorded first (:attr:`purged_at`)."""
        self._open_parts()
        removed = self._maintenance.purge(ids)
        self._receiver.forget_listing()
        return removed

    @property
    def purged_at(self) -> float | None:
        """When every message was last purged (:meth:`purge` without ``ids``), by any
        process or host (epoch seconds; ``None`` if never). Read from disk on each call."""
        self._open_parts()
        return self._maintenance.purged_at()

    def requeue_expired(self) -> int:
        """Make every hidden message whose time has come ready again, and move
        those received ``max_receives`` times to the dead-letter queue; return
        how many moved. Receive already does both as it goes; this pass only
        tidies the directory so a listing shows the truth."""
        self._open_parts()
        return self._maintenance.requeue_expired()

    def collect_garbage(
        self, grace: float = DEFAULT_GC_GRACE, *, stage_grace: float = DEFAULT_STAGE_GRACE
    ) -> int:
        """Remove ``.new`` files older than ``grace`` seconds (left by publishers
        that died mid-write), stages untouched for ``stage_grace`` seconds
        (left by jobs that died before commit), messages sent longer ago than
        the queue's ``retention``, spent group leases, de-duplication reservations
        and ``.spark/`` trees untouched for ``stage_grace``; how many files went."""
        self._open_parts()
        return self._maintenance.collect_garbage(grace, stage_grace)
