"""Queue operations: publish, receive, delete, change visibility, maintenance.

Every state change is one call into :mod:`vsqs._core.fs` (an exclusive create, a
rename or an unlink) on a name built by :mod:`vsqs._core.format`. Receive walks a
listing cached per handle instead of listing the directory on every call.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import heapq
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import Any, NamedTuple

from vsqs._core import dedup as _dedup
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.dedup import Reservations
from vsqs._core.errors import (
    InvalidArgument,
    InvalidReceipt,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    QueueSuspended,
    StaleReceipt,
    StorageError,
    VsqsError,
)
from vsqs._core.format import State
from vsqs._core.groups import GroupLeases
from vsqs._core.message import (
    Body,
    Message,
    MessageInfo,
    Outgoing,
    QueueStats,
    to_bytes,
    to_us,
)
from vsqs._core.limits import MAX_BATCH, MAX_CLOCK_SKEW, MAX_DELAY, MAX_PRIORITY, MAX_VISIBILITY_TIMEOUT, MAX_WAIT
from vsqs._core.rules import check_attributes, check_batch_size, check_priority, check_seconds
from vsqs._core.throttle import Throttle

log = logging.getLogger("vsqs")

DEFAULT_GC_GRACE = 900.0  # a .new file this old belongs to a dead publisher
DEFAULT_STAGE_GRACE = 7 * 86400.0  # a stage untouched this long belongs to a dead job

# A cached listing is re-read when it runs out, or when older than
# max(_MAX_LISTING_AGE, _AGE_FACTOR x the time the last listing took), so that
# listing costs stay a small share of the time at any depth.
_MAX_LISTING_AGE = 2.0
_AGE_FACTOR = 20.0
_EXHAUSTED_FACTOR = 4.0
_CHEAP_LISTING = 0.001  # a listing this fast is repeated whenever the cache runs out
_POLL_FIRST, _POLL_MAX = 0.005, 0.5
_METADATA_WAIT = 5.0  # how long to wait for a racing creator to write metadata
_SETTINGS_TTL = 1.0  # other processes' setting changes are seen within this many seconds
_COUNT_TTL = 1.0  # max_messages is checked against a count at most this old
_SWEEP_EVERY = 60.0  # seconds between sweeps of superseded group leases
# At most this many names of a listing are kept per handle (visible ones; as
# many hidden ones): the first ones in delivery order. A deeper queue is
# listed again when they run out, so a handle's memory does not grow with
# the queue (90-110 bytes a name: some 9-11 MB at most).
_LISTING_WINDOW = 100_000
_KEY_LENGTH = _format.KEY_LENGTH
_RECEIPTS_KEPT = 1024  # receipts this handle issued and remembers parsed (two generations of this many)
# After losing the race for a name to another consumer, a handle drops a random
# 0.._SKIP_AFTER_LOSS-1 of the next names of the same priority from its cache (never
# its last name): the winner is likely to take them next, and consumers that walk
# the same listing in the same order would otherwise lose a race for about every
# name they get. The names dropped are still in the directory: the handle lists
# again before its cache runs dry (see _skip_ahead), so a receive returns nothing
# only if every name of its latest listing was tried. At most _SKIPS_PER_CALL
# skips per receive call; after them it walks its names one by one, as before.
_SKIP_AFTER_LOSS = 16
_SKIPS_PER_CALL = 3


class _Defaults(NamedTuple):
    """A batch's options, for the messages that do not bring their own."""

    delay: float | None
    at: datetime | None
    priority: int
    attributes: Mapping[str, str] | None
    group: str | None
    dedup_id: str | None
    dedup_content: bool


class _Prepared(NamedTuple):
    """One message ready to write."""

    body: bytes
    header: dict[str, Any]  # the envelope header; empty: a bare body
    priority: int
    group_hash: str
    delay: float  # seconds
    digest: str  # de-duplication hash, or ""


class _Presence:
    """Whether messages are in the queue, for de-duplication, from as few
    listings as it can: a key seen live in an earlier listing of this batch is
    live (it can only have left since, which a window covers); anything else
    gets a fresh listing before it is answered."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._live: set[str] | None = None
        self._writing: dict[str, str] = {}

    def _list(self) -> None:
        live, writing = set(), {}
        for name in self._queue._parsed():
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
            written = _fs.mtime(self._queue._message_file(self._writing[key]))
            if written is None or written > time.time() - _dedup.WRITE_GRACE:
                return "writing"  # at work (or gone since the listing: just published)
        return None


class _Listing:
    """A handle's cached view of its directory: visible names and timed hidden ones."""

    __slots__ = (
        "visible", "grouped", "hidden", "blocked", "listed_at", "cost", "stale_at", "truncated", "claimed", "skipped",
        "rest_of_round",
    )

    def __init__(self) -> None:
        self.visible: list[str] = []  # heap: smallest name = next to deliver
        # heap of (round, name) for messages of groups: a group's first candidate
        # is in round 0, its second in round 1...: groups take turns
        self.grouped: list[tuple[int, str]] = []
        self.hidden: list[tuple[int, str]] = []  # heap by the time they turn visible
        self.blocked: set[str] = set()  # groups to leave alone until the next listing
        self.listed_at = -math.inf  # time.monotonic() of the listing
        self.cost = 0.0  # seconds the listing took
        self.stale_at = -math.inf  # time.monotonic() from which it is re-read even if not used up
        self.truncated = False  # the listing had more candidates than the window kept
        self.claimed = 0  # messages claimed from this listing
        # a sharded queue's listing stopped at a shard with candidates before
        # going round them all: once they are used up, the next shards are listed
        self.rest_of_round = False
        self.skipped = False  # names of this listing were dropped after a lost race: list again when out


class _Receipts:
    """Receipts this handle issued, with what delete needs from them, so that a
    delete of a receipt just received does not parse it again. Bounded: two
    generations of ``size`` entries; older receipts are simply parsed.

    Only an exact receipt string this handle made is found here, so nothing
    foreign gets past validation; a stale one is caught, as always, by the
    system call that fails on its name.
    """

    __slots__ = ("new", "old", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.new: dict[str, tuple[str, _format.SlotRef | None]] = {}
        self.old: dict[str, tuple[str, _format.SlotRef | None]] = {}

    def add(self, receipt: str, name: str, slot: _format.SlotRef | None) -> None:
        if len(self.new) >= self.size:
            self.old, self.new = self.new, {}  # each step is atomic: safe across threads
        self.new[receipt] = (name, slot)

    def take(self, receipt: str) -> tuple[str, _format.SlotRef | None] | None:
        """(hidden name, slot) of a receipt issued here, forgotten as it is taken."""
        found = self.new.pop(receipt, None)
        return found if found is not None else self.old.pop(receipt, None)

    def __len__(self) -> int:
        return len(self.new) + len(self.old)


class Queue:
    """A queue directory. Cheap to create; holds no open file between calls.

    ``clock_skew`` (seconds) is the allowance for clocks of hosts sharing the
    spool: a hidden message is taken for visible only that long after its
    time, so a consumer whose clock runs ahead does not steal a live lease.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = False,
        clock_skew: float = 0.0,
        mode: int | str | None = None,
        shards: int | None = None,
    ) -> None:
        self._path = os.path.abspath(os.fspath(path))
        self._clock_skew = check_seconds(clock_skew, "clock_skew", MAX_CLOCK_SKEW)
        self._init_runtime()
        if mode is not None:  # the queue's file_mode, needed before its settings exist
            self._mode = _settings.file_mode_of(_settings.validate({"file_mode": mode}))
        if shards is not None:
            _format.check_shards(shards)
        self._queue_id: str | None = None
        self._adopt(self._open(create, shards or 1))
        if shards is not None and shards != self._shards:
            raise InvalidArgument(
                f"queue {self._path} exists with {self._shards} shard(s), not {shards}: "
                "the shard count is fixed when a queue is created"
            )
        if create and mode is not None and self.settings["file_mode"] is None:
            self.configure(file_mode=mode)

    def _init_runtime(self) -> None:
        self._prefix = self._path.rstrip(os.sep) + os.sep
        self._mode = _settings.file_mode_of({})  # file_mode: set explicitly on every file made
        self._skew_us = to_us(self._clock_skew)
        self._lock = threading.Lock()  # the listing cache, group leases, throttle tokens
        self._settings_lock = threading.Lock()
        self._listing = _Listing()
        self._window = _LISTING_WINDOW
        self._receipts = _Receipts(_RECEIPTS_KEPT)
        self._default_lease: tuple[Any, int] = (None, 0)  # (visibility_timeout setting, in µs)
        self._settings_read_at = -math.inf
        self._settings: dict[str, Any] = dict(_settings.DEFAULTS)
        self._counted_at = -math.inf
        self._count = 0
        self._dlq: Queue | None = None
        self._throttle = Throttle(self._path)
        self._groups = GroupLeases(self._path)
        self._groups_seen = False
        self._groups_swept_at = -math.inf
        self._orphans_swept_at = -math.inf
        self._reservations = Reservations(self._path)
        self._shards = 0  # 0 until the metadata is read (see _adopt)
        self._shard_prefixes: list[str] = []
        # name -> its shard's prefix; None: no shards; until the metadata is read, reads it
        self._locate: Callable[[str], str] | None = self._locate_after_open
        self._cursor = 0  # the shard a sharded queue's next listing starts at
        self._cursor_pid = os.getpid()

    def _adopt(self, metadata: _format.Metadata) -> None:
        """Take what the queue's metadata fixes: its id and its shards."""
        if metadata.shards > 1:
            self._shard_prefixes = [
                self._prefix + _format.shard_dir_name(index) + os.sep for index in range(metadata.shards)
            ]
            self._cursor = random.randrange(metadata.shards)  # consumers start apart
        self._locate = _format.shard_locator(self._shard_prefixes) if metadata.shards > 1 else None
        for prefix in self._shard_prefixes:
            self._check_shard_dir(prefix[:-1])
        self._shards = metadata.shards
        self._queue_id = metadata.queue_id

    # -- pickling: path and options only; reopened lazily where unpickled --

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self._path, "clock_skew": self._clock_skew}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._path = state["path"]
        self._clock_skew = state["clock_skew"]
        self._init_runtime()
        self._queue_id = None

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
        if self._queue_id is None:
            self._adopt(self._open(create=False))
        assert self._queue_id is not None
        return self._queue_id

    @property
    def shards(self) -> int:
        """How many shard directories hold the messages (1: the queue directory itself)."""
        if not self._shards:
            self._adopt(self._open(create=False))
        return self._shards

    def _file(self, name: str) -> str:
        """An entry of the queue directory itself (metadata, settings, stages...)."""
        return self._prefix + name  # names are single components: no join needed

    def _message_file(self, name: str) -> str:
        """Where the message file ``name`` (of the grammar) lives: the queue
        directory, or in a sharded queue the shard its name maps to."""
        locate = self._locate
        return self._prefix + name if locate is None else locate(name) + name

    def _locate_after_open(self, name: str) -> str:
        """A handle that has not read the metadata yet (unpickled): read it, then locate."""
        self._adopt(self._open(create=False))
        return self._prefix if self._locate is None else self._locate(name)

    def _message_dirs(self) -> list[str]:
        """The directories that hold messages: the queue's, or each shard's."""
        if self.shards == 1:
            return [self._path]
        return [prefix[:-1] for prefix in self._shard_prefixes]

    def _open(self, create: bool, shards: int = 1) -> _format.Metadata:
        """Check (or make) the queue directory and its metadata; return what it fixes."""
        meta = self._file(_format.METADATA_NAME)
        data = _fs.read(meta)
        if data is None and create:
            self._create(shards)
            data = _fs.read(meta)
        if data is None:
            if _fs.is_dir(self._path):
                raise QueueNotFound(
                    f"not a vsqs queue: {self._path} has no {_format.METADATA_NAME} (create it first)"
                )
            raise QueueNotFound(f"no queue at {self._path} (create it first)")
        deadline = time.monotonic() + _METADATA_WAIT
        while not data and time.monotonic() < deadline:  # a creator is still writing it
            time.sleep(0.01)
            data = _fs.read(meta) or b""
        return _format.decode_metadata(data, meta)

    def _create(self, shards: int) -> None:
        """Make the queue so that it appears whole: a private directory holding
        the metadata (and the shard directories) is renamed into place. An
        existing directory is adopted by an exclusive create of the metadata
        file, after its shard directories."""
        meta = _format.encode_metadata(_format.new_queue_id(), shards)
        if not _fs.is_dir(self._path):
            parent, base = os.path.split(self._path)
            _fs.make_dirs(parent)
            private = os.path.join(parent, f".{base}.creating-{_format.new_tag()}")
            _fs.make_dir(private, self._mode)
            self._make_shards(private, shards)
            _fs.create_exclusive(
                os.path.join(private, _format.METADATA_NAME), meta, durable=True, mode=self._mode
            )
            _fs.fsync_dir(private)
            if _fs.rename_dir(private, self._path):
                _fs.fsync_dir(parent)
                return
            if shards > 1:  # another creator won, or a directory appeared there meanwhile
                _fs.remove_tree(private)
            else:
                _fs.remove_tree_quietly(private, [_format.METADATA_NAME])
        if not _fs.exists(self._file(_format.METADATA_NAME)):  # adopt the directory: shards first
            self._make_shards(self._path, shards)
        if _fs.create_exclusive(self._file(_format.METADATA_NAME), meta, durable=True, mode=self._mode):
            _fs.fsync_dir(self._path)

    def _make_shards(self, directory: str, shards: int) -> None:
        """The shard directories of a new queue (none for one shard)."""
        if shards == 1:
            return
        _fs.make_dirs(os.path.join(directory, _format.SHARDS_DIR), self._mode)
        for index in range(shards):
            _fs.make_dirs(os.path.join(directory, _format.shard_dir_name(index)), self._mode)
        _fs.fsync_dir(os.path.join(directory, _format.SHARDS_DIR))

    # -- settings ------------------------------------------------------------

    @property
    def settings(self) -> Mapping[str, Any]:
        """The queue's settings (defaults filled in), read-only; at most a second old."""
        return MappingProxyType(dict(self._current_settings()))

    def configure(self, **changes: Any) -> Mapping[str, Any]:
        """Change settings (``None`` unsets one); every process sees them within a second.

        Known settings: visibility_timeout, delay, retention, max_messages,
        max_message_bytes, max_receives, dead_letter, group_concurrency,
        dedup_window, throttle.
        """
        clean = _settings.validate(changes)
        if clean.get("dead_letter"):
            self._dead_letter_path({**self._current_settings(), **clean})  # refuses itself, ancestors
        directory = self._file(_settings.SETTINGS_DIR)
        mode = _settings.file_mode_of(clean) if "file_mode" in clean else self._mode
        _fs.make_dirs(directory, mode)
        for _attempt in range(50):
            version, current = self._read_settings()
            merged = {**current, **clean}
            data = _settings.encode(merged, _format.FORMAT_VERSION)
            path = os.path.join(directory, _settings.version_name(version + 1))
            if _fs.create_exclusive(path, data, durable=True, mode=mode):
                _fs.fsync_dir(directory)
                with self._settings_lock:
                    self._settings = merged
                    self._set_mode(merged)
                    self._settings_read_at = time.monotonic()
                return MappingProxyType(dict(merged))
        raise StorageError(17, "settings changed by others 50 times in a row; try again", directory)

    def suspend(self, *operations: str) -> None:
        """Suspend ``operations`` ("publish", "receive", "delete"; none given: all)
        in every process: they raise :class:`QueueSuspended` until resumed."""
        current = set(self._current_settings()["suspended"])
        self.configure(suspended=sorted(current | set(operations or _settings.OPERATIONS)))

    def resume(self, *operations: str) -> None:
        """Resume ``operations`` (none given: all)."""
        _settings.validate({"suspended": list(operations)})
        current = set(self._current_settings()["suspended"])
        self.configure(suspended=sorted(current - set(operations or _settings.OPERATIONS)))

    def _check_suspended(self, operation: str, settings: Mapping[str, Any]) -> None:
        if operation in settings["suspended"]:
            raise QueueSuspended(f"{operation} is suspended on queue {self._path} (resume it to go on)")

    def _current_settings(self) -> dict[str, Any]:
        if time.monotonic() - self._settings_read_at >= _SETTINGS_TTL:
            _, settings = self._read_settings()
            with self._settings_lock:  # not self._lock: settings are read while it is held
                self._settings = settings
                self._set_mode(settings)
                self._settings_read_at = time.monotonic()
        return self._settings

    def _set_mode(self, settings: Mapping[str, Any]) -> None:
        """Give every part of the handle that makes files the queue's file_mode."""
        self._mode = _settings.file_mode_of(settings)
        self._groups.mode = self._reservations.mode = self._throttle.mode = self._mode

    def _read_settings(self) -> tuple[int, dict[str, Any]]:
        """(newest version number, newest settings that parse) from one small listing."""
        directory = self._file(_settings.SETTINGS_DIR)
        if not _fs.is_private_dir(directory):
            return 0, dict(_settings.DEFAULTS)
        versions = sorted(
            (v for v in map(_settings.parse_version, _fs.list_names(directory)) if v is not None),
            reverse=True,
        )
        for version in versions:
            data = _fs.read(os.path.join(directory, _settings.version_name(version)))
            settings = _settings.decode(data, _format.FORMAT_VERSION) if data else None
            if settings is not None:
                return versions[0], settings
        return (versions[0] if versions else 0), dict(_settings.DEFAULTS)

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
        if delay is at is attributes is group is dedup_id is dedup is None:  # every option unset
            return self._publish_plain(body, priority, durable)
        return self.publish_batch(
            [body],
            delay=delay,
            at=at,
            priority=priority,
            attributes=attributes,
            group=group,
            dedup=dedup,
            durable=durable,
            _dedup_id=dedup_id,
        )[0]

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
        settings = self._current_settings()
        if settings["suspended"]:  # (a cheap test first: this is on every publish)
            self._check_suspended("publish", settings)
        if dedup not in (None, "content"):
            raise InvalidArgument(f"dedup must be 'content' or None, not {dedup!r}")
        defaults = _Defaults(delay, at, priority, attributes, group, _dedup_id, dedup == "content")
        entries = [self._prepare(item, defaults, settings) for item in bodies]
        if len(entries) > MAX_BATCH:
            raise InvalidArgument(f"bodies: at most {MAX_BATCH} messages per batch, not {len(entries)}")
        if settings["max_message_bytes"] is not None or settings["max_messages"] is not None:
            self._check_limits([entry.body for entry in entries], settings)
        written: list[tuple[_Prepared, str, str]] = []
        duplicates: dict[int, str] = {}  # position -> id of the message already holding the dedup id
        reserved: dict[str, tuple[str, int]] = {}  # dedup hash -> (key, generation), this batch
        presence = _Presence(self) if any(entry.digest for entry in entries) else None
        try:
            for position, entry in enumerate(entries):
                stem, temp = self._write_new(entry, durable)
                if entry.digest:
                    # the body is written first, so a reservation always has its message
                    # (or the .new file of its publisher) behind it
                    assert presence is not None
                    holder = self._reserve(entry.digest, stem, settings, reserved, presence)
                    if holder is not None:
                        _fs.unlink(temp)
                        duplicates[position] = holder
                        continue
                written.append((entry, stem, temp))
        except BaseException:
            for _, _, temp in written:
                with contextlib.suppress(StorageError):
                    _fs.unlink(temp)
            raise
        ids: list[str] = []
        for entry, stem, temp in written:
            if not _fs.rename(temp, self._message_file(self._final_name(stem, entry.delay))):
                raise StorageError(2, "message file vanished before it was published", temp)
            ids.append(stem[: _format.KEY_LENGTH])
        if durable and ids:
            self._fsync_message_dirs(stem for _, stem, _ in written)
        for digest, (key, gen) in reserved.items():
            self._reservations.confirm(digest, gen, key)
        with self._lock:
            self._count += len(ids)
        for position in sorted(duplicates) if duplicates else ():
            ids.insert(position, duplicates[position])
        return ids

    def _publish_plain(self, body: Body, priority: int, durable: bool) -> str:
        """publish() of a body with no option but its priority: what publish_batch
        does for it (same checks, same system calls), without the batch's
        bookkeeping for de-duplication and envelopes."""
        settings = self._current_settings()
        if settings["content_dedup"]:  # the queue de-duplicates every publish: the full path
            return self.publish_batch([body], priority=priority, durable=durable)[0]
        if settings["suspended"]:
            self._check_suspended("publish", settings)
        data = to_bytes(body)
        if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
            priority = check_priority(priority)
        if settings["max_message_bytes"] is not None or settings["max_messages"] is not None:
            self._check_limits([data], settings)
        delay = settings["delay"]  # validated when it was read
        stem, temp = self._write_new(_Prepared(data, {}, priority, "", delay, ""), durable)
        if not _fs.rename(temp, self._message_file(self._final_name(stem, delay))):
            raise StorageError(2, "message file vanished before it was published", temp)
        if durable:
            _fs.fsync_dir(os.path.dirname(temp))
        with self._lock:
            self._count += 1
        return stem[: _format.KEY_LENGTH]

    def _prepare(self, item: Body | Outgoing, defaults: _Defaults, settings: Mapping[str, Any]) -> _Prepared:
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
        seconds = settings["delay"] if delay is None and at is None else self._delay_of(delay, at, settings)
        if type(priority) is not int or not 0 <= priority <= MAX_PRIORITY:
            priority = check_priority(priority)
        header: dict[str, Any] = {}
        if attributes:
            header["attributes"] = check_attributes(attributes)
        group_hash = ""
        if group is not None:
            group_hash = _format.group_hash(group)
            if priority != _format.DEFAULT_PRIORITY:
                raise InvalidArgument("priority cannot be combined with group: a group is strictly in order")
            header["group"] = group
        digest = ""
        if dedup_id is not None or defaults.dedup_content or settings["content_dedup"]:
            digest = _dedup.dedup_hash(
                hashlib.sha256(data).hexdigest() if dedup_id is None else dedup_id, group
            )
        return _Prepared(data, header, priority, group_hash, seconds, digest)

    def _reserve(
        self,
        digest: str,
        stem: str,
        settings: Mapping[str, Any],
        reserved: dict[str, tuple[str, int]],
        presence: _Presence,
    ) -> str | None:
        """Reserve a dedup id for message ``stem`` (remembered in ``reserved``);
        or return the id of the message holding it."""
        if digest in reserved:
            return reserved[digest][0]
        key = stem[: _format.KEY_LENGTH]
        holder, gen = self._reservations.reserve(digest, key, settings["dedup_window"], presence)
        if holder is None:
            reserved[digest] = (key, gen)
        return holder

    @staticmethod
    def _final_name(stem: str, delay: float) -> str:
        """The name a published message starts with: ready, or hidden until its delay ends."""
        if delay:
            return _format.hidden_name(stem, _format.now_us() + to_us(delay), 0)
        return _format.ready_name(stem)

    @staticmethod
    def _delay_of(delay: float | None, at: datetime | None, settings: Mapping[str, Any]) -> float:
        if at is not None:
            if delay is not None:
                raise InvalidArgument("give delay or at, not both")
            if not isinstance(at, datetime):
                raise InvalidArgument(f"at must be a datetime, not {type(at).__name__}")
            delay = min(max(0.0, at.timestamp() - time.time()), MAX_DELAY)
        return check_seconds(settings["delay"] if delay is None else delay, "delay", MAX_DELAY)

    def _check_limits(self, datas: list[bytes], settings: Mapping[str, Any]) -> None:
        """max_message_bytes, and max_messages against a count at most a second old
        (plus what this handle published since): back-pressure, approximate across hosts."""
        limit = settings["max_message_bytes"]
        if limit is not None:
            for data in datas:
                if len(data) > limit:
                    raise MessageTooLarge(
                        f"message of {len(data)} bytes is over the queue's max_message_bytes ({limit})"
                    )
        capacity = settings["max_messages"]
        if capacity is not None:
            if time.monotonic() - self._counted_at >= _COUNT_TTL:
                count = sum(1 for name in self._parsed() if name.state is not State.WRITING)
                with self._lock:
                    self._count, self._counted_at = count, time.monotonic()
            if self._count + len(datas) > capacity:
                raise QueueFull(
                    f"queue {self._path} is full: {self._count} messages, max_messages is {capacity}"
                )

    def _write_new(self, entry: _Prepared, durable: bool, stage: str | None = None) -> tuple[str, str]:
        """Write ``STEM.new`` under a fresh key, where the message will live (or
        in the directory ``stage``, ending in a separator); return (stem, path)."""
        content = _format.encode_envelope(entry.header, entry.body) if entry.header else entry.body
        for _attempt in range(8):
            key = _format.new_key(entry.priority)
            stem = _format.make_stem(key, group_hash=entry.group_hash, envelope=bool(entry.header))
            name = _format.writing_name(stem)
            temp = stage + name if stage is not None else self._message_file(name)
            if _fs.create_exclusive(temp, content, durable=durable, mode=self._mode):
                return stem, temp
        raise StorageError(17, "no free message name after 8 tries", stage or self._path)

    def _fsync_message_dirs(self, names: Iterable[str]) -> None:
        """fsync each directory that the messages ``names`` (stems or names) went into, once."""
        if self.shards == 1:
            _fs.fsync_dir(self._path)
            return
        for index in sorted({_format.shard_of(name, self._shards) for name in names}):
            _fs.fsync_dir(self._shard_prefixes[index][:-1])

    # -- stages: publish many messages at once, later --------------------------

    def publish_staged(self, bodies: Iterable[Body | Outgoing], *, stage: str) -> list[str]:
        """Write messages durably into the private ``stage``, invisible to receivers
        until :meth:`commit_stage` publishes the whole stage (or :meth:`abort_stage`
        drops it). A stage is one directory inside the queue; a Spark task attempt
        writes its own, and only the committed attempt's messages are published.

        Items may be :class:`Outgoing` with options of their own; a delay runs
        from now, not from the commit; a ``dedup_id`` is checked at the commit.
        """
        directory = self._file(_format.stage_dir_name(stage))
        settings = self._current_settings()
        self._check_suspended("publish", settings)
        defaults = _Defaults(None, None, _format.DEFAULT_PRIORITY, None, None, None, False)
        entries = [self._prepare(item, defaults, settings) for item in bodies]
        self._check_limits([entry.body for entry in entries], settings)
        _fs.make_dirs(directory, self._mode)
        prefix = directory + os.sep
        ids = []
        for entry in entries:
            if entry.digest:  # the commit needs it: it travels in the envelope
                entry = entry._replace(header={**entry.header, "dedup": entry.digest})
            stem, temp = self._write_new(entry, True, stage=prefix)
            if not _fs.rename(temp, prefix + self._final_name(stem, entry.delay)):
                raise StorageError(2, "staged message file vanished", temp)
            ids.append(stem[: _format.KEY_LENGTH])
        _fs.fsync_dir(directory)
        return ids

    def commit_stage(self, stage: str) -> int:
        """Publish every message of ``stage`` (each by one rename) and remove the
        stage; return how many were published. Safe to repeat after a crash: it
        moves the rest. A message whose ``dedup_id`` is held by another is
        taken back at once (if a consumer was quicker, it is delivered twice:
        at-least-once, never lost)."""
        directory = self._file(_format.stage_dir_name(stage))
        if not _fs.is_private_dir(directory):
            return 0
        settings = self._current_settings()
        reserved: dict[str, tuple[str, int]] = {}
        presence = _Presence(self)
        moved = 0
        published: list[str] = []
        leftovers = []
        try:
            for name in _fs.list_names(directory):
                parsed = _format.parse_name(name)
                if parsed is None or parsed.state is State.WRITING:
                    leftovers.append(name)  # .new files of a writer that died: never published
                    continue
                staged = os.path.join(directory, name)
                digest = self._staged_digest(parsed, staged) if parsed.envelope else ""
                if digest and digest not in reserved and self._reservations.peek(
                    digest, settings["dedup_window"], presence
                ):
                    leftovers.append(name)  # a known duplicate never enters the queue
                    continue
                if not _move_into(staged, self._message_file(name)):
                    continue
                holder = self._reserve(digest, parsed.stem, settings, reserved, presence) if digest else None
                if holder is not None and holder != parsed.key:
                    _fs.unlink(self._message_file(name))  # a duplicate: take it back
                    continue
                moved += 1
                published.append(name)
        finally:  # (also when a move failed half-way: what did move is made durable and kept)
            if moved:
                self._fsync_message_dirs(published)
            for digest, (key, gen) in reserved.items():
                self._reservations.confirm(digest, gen, key)
        _fs.remove_tree_quietly(directory, leftovers)
        return moved

    def _staged_digest(self, name: _format.Name, path: str) -> str:
        data = _fs.read(path)
        try:
            header = self._decode(name, data, path)[1] if data else None
        except StorageError:
            header = None
        return str((header or {}).get("dedup") or "")

    def abort_stage(self, stage: str) -> int:
        """Drop ``stage`` and its messages unpublished; return how many were dropped."""
        directory = self._file(_format.stage_dir_name(stage))
        if not _fs.is_private_dir(directory):
            return 0
        names = _fs.list_names(directory)
        dropped = sum(1 for name in names if _format.parse_name(name) is not None)
        _fs.remove_tree_quietly(directory, names)  # all of it: the directory is ours
        return dropped

    def stages(self) -> list[str]:
        """The names of the stages not yet committed or aborted."""
        found = []
        for entry in _fs.list_names(self._path):
            name = _format.parse_stage_dir(entry)
            if name is not None and _fs.is_private_dir(self._file(entry)):
                found.append(name)
        return sorted(found)

    # -- receive -----------------------------------------------------------

    def receive(
        self, *, visibility_timeout: float | None = None, wait: float | None = None
    ) -> Message | None:
        """Take the next visible message, hidden from others for ``visibility_timeout`` s.

        ``wait`` > 0 long-polls: returns as soon as a message is visible, or
        ``None`` after ``wait`` seconds. ``visibility_timeout`` and ``wait``
        default to the queue's settings (30 s and 0 s unless configured).
        """
        got = self._receive(1, visibility_timeout, wait, True)
        return got[0] if got else None

    def receive_batch(
        self,
        max_messages: int = 10,
        *,
        visibility_timeout: float | None = None,
        wait: float | None = None,
        read_bodies: bool = True,
    ) -> list[Message]:
        """Take up to ``max_messages`` visible messages (fewer if fewer are visible).

        ``read_bodies=False`` only claims: each body is read when first used
        (for example by another process holding the receipt, see :meth:`read`).
        """
        if type(max_messages) is not int or not 1 <= max_messages <= MAX_BATCH:
            check_batch_size(max_messages)
        return self._receive(max_messages, visibility_timeout, wait, read_bodies)

    def _receive(
        self, max_messages: int, visibility_timeout: float | None, wait: float | None, read_bodies: bool
    ) -> list[Message]:
        settings = self._current_settings()
        if visibility_timeout is None:  # the setting was validated when it was read
            setting, lease_us = self._default_lease
            if setting != settings["visibility_timeout"]:
                setting = settings["visibility_timeout"]
                lease_us = to_us(setting)
                self._default_lease = (setting, lease_us)
        else:
            lease_us = to_us(check_seconds(visibility_timeout, "visibility_timeout", MAX_VISIBILITY_TIMEOUT))
        if wait is None:
            wait = settings["receive_wait"]  # validated when it was read
        elif type(wait) is not int or wait:  # 0 needs no check
            wait = check_seconds(wait, "wait", MAX_WAIT)
        queue_id = self._queue_id or self.id
        deadline = time.monotonic() + wait if wait else 0.0
        pause = _POLL_FIRST
        while True:
            if settings["suspended"]:  # a long poll notices a suspension too
                self._check_suspended("receive", settings)
            got = self._claim(max_messages, lease_us, queue_id, read_bodies, settings)
            if got or not wait:
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                return got
            time.sleep(min(pause, left, self._until_next_expiry()))
            pause = min(pause * 2, _POLL_MAX)
            settings = self._current_settings()

    def throttled(self) -> bool:
        """Whether receives are throttled right now (every token of this window taken)."""
        throttle = self._current_settings()["throttle"]
        return throttle is not None and self._throttle.exhausted(throttle[0], throttle[1], time.time())

    def _claim(
        self, limit: int, lease_us: int, queue_id: str, read_bodies: bool, settings: Mapping[str, Any]
    ) -> list[Message]:
        got: list[Message] = []
        failure: StorageError | None = None  # raised only if nothing else was claimed
        max_receives, throttle = settings["max_receives"], settings["throttle"]
        lock, prefix, locate = self._lock, self._prefix, self._locate  # (the path of a name, inlined)
        # listings this call may make that give nothing: one, or in a sharded
        # queue one per shard (another consumer may have emptied the shard that
        # was listed); renewed by each claim that succeeds, so no spinning on
        # names that fail
        fruitless = self._shards or 1
        lists_left = fruitless
        skips = _SKIPS_PER_CALL
        while len(got) < limit:
            with lock:
                cache = self._listing
                if cache.visible and not (cache.hidden or cache.grouped) and time.monotonic() < cache.stale_at:
                    name = heapq.heappop(cache.visible)  # the common case of _next_candidate, inlined
                else:
                    listed_at = cache.listed_at
                    name = self._next_candidate(lists_left > 0)
                    if self._listing.listed_at != listed_at:
                        # a listing that went round every shard has seen them all: no more this call
                        lists_left = lists_left - 1 if self._listing.rest_of_round else 0
            if name is None:
                break
            parsed = _format.parse_name(name)  # the one parse of this name on its way out
            if parsed is None or parsed.state is State.WRITING:
                continue  # a foreign name the listing passed through unparsed
            if max_receives is not None and parsed.receive_count >= max_receives:
                try:
                    self._dead_letter(parsed)
                except StorageError as exc:  # e.g. a dead-letter queue on another filesystem
                    failure = failure or exc
                continue
            if throttle is not None:
                with lock:
                    allowed = self._throttle.take(throttle[0], throttle[1], time.time())
                if not allowed:
                    self._remember(name)  # still a candidate later
                    break
            count = parsed.receive_count + 1
            now = time.time_ns() // 1000  # _format.now_us(), inlined
            until = now + lease_us
            new = _format.hidden_name(parsed.stem, until, count)
            slot = None
            group = parsed.group_hash
            if group:
                with lock:
                    slot = self._groups.claim(group, settings["group_concurrency"], until, now, self._skew_us)
                if slot is None:
                    with lock:
                        self._listing.blocked.add(group)  # its slots are all held
                    continue
            if locate is None:
                source, path = prefix + name, prefix + new
            else:  # (the shard of ``new`` is the shard of ``name``: the stem stays)
                shard = locate(name)
                source, path = shard + name, shard + new
            if not _fs.rename(source, path):
                with lock:
                    if group and slot is not None:
                        self._groups.free(group, slot)
                        self._listing.blocked.add(group)  # our view of the group is stale
                    elif not group and skips:
                        skips -= 1
                        if self._skip_ahead(name):
                            lists_left = max(lists_left, 1)  # the names dropped may still be there: list before giving up
                continue  # another consumer got it first
            self._listing.claimed += 1
            lists_left = fruitless
            header = None
            if read_bodies:
                try:
                    data = _fs.read(path)
                    if data is None:
                        continue  # only if another host's clock is far ahead: it took our lease
                    if parsed.envelope:
                        data, header = self._decode(parsed, data, path)
                except StorageError as exc:  # unreadable (permissions) or corrupt
                    # a corrupt file stays in flight and comes back with its lease (and
                    # goes to the dead-letter queue after max_receives); the rest go on
                    log.warning("%s", exc)
                    failure = failure or exc
                    continue
            else:
                data = None
            receipt = _format.make_receipt(queue_id, new, slot)
            self._receipts.add(receipt, new, slot)
            got.append(Message(self, name[:_KEY_LENGTH], data, receipt, count, None, header))  # sent_at: from the id
        if failure is not None and not got:
            raise failure
        return got

    def _next_candidate(self, may_list: bool = True) -> str | None:
        """The next name to try to claim (not yet validated); caller holds the lock.
        The directory is listed again if the cache is stale and ``may_list``."""
        cache = self._listing
        if cache.hidden:
            self._promote(_format.now_us())
        if cache.visible or cache.grouped:
            stale = time.monotonic() >= cache.stale_at
        else:  # ran out: at once if the window left names behind (and was of use), else not too often
            age = time.monotonic() - cache.listed_at
            stale = (
                cache.skipped
                or cache.rest_of_round
                or (cache.truncated and cache.claimed > 0)
                or cache.cost < _CHEAP_LISTING
                or age >= _EXHAUSTED_FACTOR * cache.cost
            )
        if stale and may_list:
            cache.skipped = False
            self._relist(_format.now_us())
        while cache.grouped:
            turn, name = cache.grouped[0]
            if cache.visible and (turn > 0 or cache.visible[0] < name):
                break
            heapq.heappop(cache.grouped)
            if _format.group_of(name) not in cache.blocked:
                return name
        return heapq.heappop(cache.visible) if cache.visible else None

    def _skip_ahead(self, lost: str) -> bool:
        """After losing the race for ``lost``: drop a random few of the next
        visible names of the same priority from the cache (see _SKIP_AFTER_LOSS);
        whether any was dropped. Caller holds the lock."""
        cache = self._listing
        visible = cache.visible
        skip = _format.random_below(_SKIP_AFTER_LOSS)
        priority = lost[:1]  # the first character of a name: its priority
        dropped = False
        while skip and len(visible) > 1 and visible[0][:1] == priority:  # the last name stays
            heapq.heappop(visible)
            skip -= 1
            dropped = True
        if dropped:
            cache.skipped = True  # once the cache runs out, list again at once
            if visible[0][:1] != priority:
                # list again before going on to a lower priority, in case some of
                # the dropped names are still there
                cache.stale_at = -math.inf
        return dropped

    def _promote(self, now: int) -> None:
        cache = self._listing
        while cache.hidden and cache.hidden[0][0] + self._skew_us <= now:
            name = heapq.heappop(cache.hidden)[1]
            if _format.group_of(name):
                heapq.heappush(cache.grouped, (0, name))
            else:
                heapq.heappush(cache.visible, name)

    def _relist(self, now: int) -> None:
        """List the directory; keep the first names of each kind (see _LISTING_WINDOW)."""
        started = time.monotonic()
        found, grouped, more_shards = self._list_for_receive(now)
        hidden = found.hidden
        window = self._window
        visible, truncated = _first_messages(found.visible, window)
        kept_grouped = _first(grouped, window)
        truncated = truncated or len(kept_grouped) < len(grouped)
        hidden = _first(hidden, window)  # the soonest to turn visible; later ones wait for a listing
        if found.writing and time.monotonic() - self._orphans_swept_at > _SWEEP_EVERY:
            # a bulk pass at most once a minute: .new files of publishers that died
            self._orphans_swept_at = time.monotonic()
            cutoff = time.time() - DEFAULT_GC_GRACE
            for orphan in found.writing:
                self._remove_orphan(orphan, cutoff)
        if found.grouped or self._groups_seen:
            if time.monotonic() - self._groups_swept_at > _SWEEP_EVERY:
                self._groups.sweep()  # a bulk pass, at most once a minute per handle
                self._groups_swept_at = time.monotonic()
            self._groups.refresh()
            self._groups_seen = bool(found.grouped)
        cache = self._listing
        cache.visible, cache.grouped, cache.hidden = visible, kept_grouped, hidden
        cache.truncated = truncated
        cache.rest_of_round = more_shards
        cache.claimed = 0
        cache.blocked = set()
        cache.listed_at = time.monotonic()
        cache.cost = cache.listed_at - started
        cache.stale_at = cache.listed_at + max(_MAX_LISTING_AGE, _AGE_FACTOR * cache.cost)

    def _list_for_receive(self, now: int) -> tuple[_format.Triage, list[tuple[int, str]], bool]:
        """One listing sorted out for receive: the names by state, the groups'
        candidates, and whether other shards may hold more.

        A sharded queue lists one shard at a time, going round from where its
        last listing stopped (each handle starts at a random shard, so
        consumers spread out), until a shard has something to claim now or
        every shard was listed once; hidden names and ``.new`` files of the
        shards passed on the way are kept too (their visible names are not:
        by then they were all foreign, or strays of other shards)."""
        visible_from = now - self._skew_us
        shards = self.shards
        if shards == 1:
            found = _format.triage(_fs.list_names(self._path), visible_from)
            grouped = self._group_candidates(found.grouped, now, found.hidden) if found.grouped else []
            return found, grouped, False
        if self._cursor_pid != os.getpid():  # a handle made before a fork: start apart
            self._cursor, self._cursor_pid = random.randrange(shards), os.getpid()
        passed = _format.Triage([], [], [], [])
        candidates: list[tuple[int, str]] = []
        for _ in range(shards):
            index = self._cursor
            self._cursor = (index + 1) % shards
            found = _format.triage(self._list_shard(index), visible_from)
            grouped = self._group_candidates(found.grouped, now, found.hidden) if found.grouped else []
            candidates.extend(grouped)
            if grouped or self._any_claimable(found.visible, index):
                found.hidden.extend(passed.hidden)
                found.writing.extend(passed.writing)
                found.grouped.extend(passed.grouped)
                return found, candidates, True
            passed.hidden.extend(found.hidden)
            passed.writing.extend(found.writing)
            passed.grouped.extend(found.grouped)
        return passed, candidates, False

    def _any_claimable(self, names: list[str], index: int) -> bool:
        """Whether a shard's visible names hold a message that lives there
        (checked until one does: foreign names and strays are passed over)."""
        home = self._shard_prefixes[index]
        locate = self._locate
        assert locate is not None
        return any(_format.is_message_name(name) and locate(name) == home for name in names)

    def _group_candidates(
        self, members_of_groups: list[_format.Name], now: int, hidden: list[tuple[int, str]]
    ) -> list[tuple[int, str]]:
        """Each group's next messages in order, as many as it has free slots."""
        groups: dict[str, list[_format.Name]] = {}
        for name in members_of_groups:
            groups.setdefault(name.group_hash, []).append(name)
        limit = self._current_settings()["group_concurrency"]
        candidates = []
        for members in groups.values():
            members.sort(key=lambda name: name.key)
            held = [
                m
                for m in members
                if m.state is State.HIDDEN and m.receive_count and m.until_us + self._skew_us > now
            ]
            for m in held:  # back in play when its lease runs out
                hidden.append((m.until_us, str(m)))
            free = limit - len(held)
            turn = 0
            for m in members:
                if free <= 0:
                    break
                if m.state is State.HIDDEN and m.until_us + self._skew_us > now:
                    continue  # in flight, or delayed: not yet in the group's order
                candidates.append((turn, str(m)))
                turn += 1
                free -= 1
        return candidates

    def _remember(self, name: str, until_us: int = 0) -> None:
        """Put a name this handle just made into its cache, so it sees its own moves."""
        with self._lock:
            cache = self._listing
            if cache.listed_at == -math.inf:
                return
            if until_us:
                heapq.heappush(cache.hidden, (until_us, name))
            elif _format.group_of(name):
                cache.blocked.discard(_format.group_of(name))
                heapq.heappush(cache.grouped, (0, name))
            else:
                heapq.heappush(cache.visible, name)

    def _until_next_expiry(self) -> float:
        with self._lock:
            hidden = self._listing.hidden
            if not hidden:
                return math.inf
            return max(0.0, (hidden[0][0] + self._skew_us - _format.now_us()) / 1e6)

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
        issued = self._receipts.take(receipt) if isinstance(receipt, str) else None
        if issued is None:
            _, text, slot = _format.parse_receipt(self.id, receipt)
        else:  # a receipt this handle made: already valid
            text, slot = issued
        if time.monotonic() - self._settings_read_at < _SETTINGS_TTL:  # _current_settings(), inlined
            settings = self._settings
        else:
            settings = self._current_settings()
        if settings["suspended"]:
            self._check_suspended("delete", settings)
        locate = self._locate
        deleted = _fs.unlink(self._prefix + text if locate is None else locate(text) + text)
        if slot is not None:  # harmless if the slot moved on: the next generation exists then
            with self._lock:
                self._groups.free(_format.group_of(text), slot)
        if not deleted:
            raise StaleReceipt(_stale_message(text[: _format.KEY_LENGTH]))

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

    def change_visibility_batch(
        self, entries: Iterable[tuple[str, float]]
    ) -> list[str | VsqsError]:
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
        return self._read_content(receipt)[0]

    def read_message(self, receipt: str) -> Message:
        """The message held by ``receipt`` (body, attributes, group...), read
        where the receipt went, e.g. on a Spark executor; changes nothing."""
        name, _, _ = _format.parse_receipt(self.id, receipt)
        body, header = self._read_content(receipt)
        return Message(self, name.key, body, receipt, name.receive_count, name.sent_us / 1e6, header)

    def _read_content(self, receipt: str) -> tuple[bytes, dict[str, Any] | None]:
        name, text, slot = _format.parse_receipt(self.id, receipt)
        data = _fs.read(self._message_file(text))
        if data is None:
            raise StaleReceipt(_stale_message(name.key))
        return self._decode(name, data, self._message_file(text))

    @staticmethod
    def _decode(name: _format.Name, data: bytes, path: str) -> tuple[bytes, dict[str, Any] | None]:
        """(body, header) of a message file's content."""
        if not name.envelope:
            return data, None
        try:
            header, body = _format.decode_envelope(data)
        except ValueError as exc:
            raise StorageError(errno.EIO, f"corrupt message envelope ({exc})", path) from None
        return body, header

    def change_visibility(self, receipt: str, timeout: float) -> str:
        """Hide the message for ``timeout`` seconds from now; return the new receipt."""
        timeout = check_seconds(timeout, "timeout", MAX_VISIBILITY_TIMEOUT)
        name, text, slot = _format.parse_receipt(self.id, receipt)
        until = _format.now_us() + to_us(timeout)
        new = _format.hidden_name(name.stem, until, name.receive_count, _format.moved_tag(name.tag))
        if slot is not None:  # the slot first: a crash between leaves the group blocked, not open
            with self._lock:
                extended = self._groups.extend(name.group_hash, slot, until)
            if extended is None:  # the lease ran out and the slot was taken: so was the message
                raise StaleReceipt(_stale_message(name.key))
            slot = extended
        if not _fs.rename(self._message_file(text), self._message_file(new)):
            if slot is not None:
                with self._lock:
                    self._groups.free(name.group_hash, slot)
            raise StaleReceipt(_stale_message(name.key))
        self._remember(new, until)
        return _format.make_receipt(self.id, new, slot)

    def current_receipt(self, receipt: str) -> str:
        """The receipt that holds ``receipt``'s message now, after
        :meth:`change_visibility` moved it (perhaps in another process).

        SQS clients keep the first receipt of a receive for its whole life;
        this finds the message of the same receive with one listing: same
        id, same receive count, and the same receive id (a visibility change
        keeps the first digits of the TAG). :class:`StaleReceipt` if the
        message was deleted, released or received again since.
        """
        name, text, slot = _format.parse_receipt(self.id, receipt)
        if _fs.exists(self._message_file(text)):
            return receipt
        for other in self._parsed(beside=text):  # (its shard: the stem stays)
            if (other.stem != name.stem or other.state is not State.HIDDEN
                    or other.receive_count != name.receive_count
                    or not _format.same_receive(other.tag, name.tag)):
                continue
            if slot is None:
                return _format.make_receipt(self.id, str(other), None)
            with self._lock:
                held = self._groups.held_until(name.group_hash, slot.index, other.until_us)
            if held is not None:
                return _format.make_receipt(self.id, str(other), held)
        raise StaleReceipt(_stale_message(name.key))

    def release(self, receipt: str) -> None:
        """Make the message visible again now (ready), keeping its receive count."""
        name, text, slot = _format.parse_receipt(self.id, receipt)
        ready = _format.ready_name(name.stem, name.receive_count)
        released = _fs.rename(self._message_file(text), self._message_file(ready))
        if slot is not None:
            with self._lock:
                self._groups.free(name.group_hash, slot)
        if not released:
            raise StaleReceipt(_stale_message(name.key))
        self._remember(ready)

    # -- inspection and maintenance ------------------------------------------

    def _parsed(self, beside: str | None = None) -> list[_format.Name]:
        """Every name of the grammar in the queue (every shard; or, given the
        name ``beside``, the shard that name maps to), parsed."""
        if self.shards == 1:
            names = (_format.parse_name(entry) for entry in _fs.list_names(self._path))
            return [name for name in names if name is not None]
        found = []
        shards = range(self._shards) if beside is None else [_format.shard_of(beside, self._shards)]
        for index in shards:
            for entry in self._list_shard(index):
                name = _format.parse_name(entry)
                # a name in a shard it does not map to was moved there by hand: gc moves it home
                if name is not None and _format.shard_of(entry, self._shards) == index:
                    found.append(name)
        return found

    def _list_shard(self, index: int) -> list[str]:
        """One listing of a shard. A shard directory that is gone from a queue
        that is still there is damage: reported, passed over (the other
        shards go on being served), and made again by gc."""
        directory = self._shard_prefixes[index][:-1]
        self._check_shard_dir(directory)
        try:
            return _fs.list_names(directory)
        except QueueNotFound:
            if not _fs.is_dir(self._path):
                raise
            log.warning("queue %s: shard directory %s is missing (vsqs gc makes it again)",
                        self._path, _format.shard_dir_name(index))
            return []

    @staticmethod
    def _check_shard_dir(directory: str) -> None:
        """A shard directory must be a directory itself: vsqs follows no symlink
        out of the queue. (A missing one is passed over, see _list_shard.)"""
        if not _fs.is_private_dir(directory) and _fs.exists(directory):
            raise StorageError(
                errno.ENOTDIR, "shard directory is not a directory of the queue (a symlink?): not followed", directory
            )

    def _rehome_strays(self) -> int:
        """Move message files of a sharded queue that lie outside their shard
        (in the queue directory, or in another shard: put there by hand or by
        a tool that ignored the shards) to where their name maps; how many moved."""
        if self.shards == 1:
            return 0
        moved = 0
        if not _fs.exists(self._file(_format.METADATA_NAME)):  # deleted: nothing to repair
            raise QueueNotFound(f"no queue at {self._path}")
        self._make_shards(self._path, self._shards)  # any that went missing
        places = [self._path] + [prefix[:-1] for prefix in self._shard_prefixes]
        for index, directory in enumerate(places):
            for entry in _fs.list_names(directory):
                name = _format.parse_name(entry)
                if name is None or _format.shard_of(entry, self._shards) == index - 1:
                    continue
                if _move_into(os.path.join(directory, entry), self._message_file(entry)):
                    log.warning("moved %s from %s into its shard", entry, directory)
                    moved += 1
        return moved

    def messages(
        self, *, bodies: bool = False, ids: Iterable[str] | None = None
    ) -> Iterator[MessageInfo]:
        """Every message (or those of ``ids``) in delivery order; changes nothing.

        With ``bodies=True`` each body is read too; a message that moves
        between the listing and the read is looked up once more by its id.
        """
        wanted = None if ids is None else set(ids)
        now = _format.now_us()
        moved: set[str] = set()
        for name in sorted(self._parsed(), key=str):
            if name.state is State.WRITING or (wanted is not None and name.key not in wanted):
                continue
            data = _fs.read(self._message_file(str(name))) if bodies else None
            if bodies and data is None:
                moved.add(name.key)
                continue
            yield self._info(name, now, data)
        if moved:
            for name in sorted(self._parsed(), key=str):
                if name.key in moved and name.state is not State.WRITING:
                    data = _fs.read(self._message_file(str(name)))
                    if data is not None:
                        yield self._info(name, now, data)

    def _info(self, name: _format.Name, now: int, data: bytes | None) -> MessageInfo:
        visible_at = name.until_us if name.state is State.HIDDEN else name.sent_us
        body, header = (None, None) if data is None else self._decode(name, data, self._message_file(str(name)))
        header = header or {}
        return MessageInfo(
            name.key,
            self._state_of(name, now),
            name.receive_count,
            name.sent_us / 1e6,
            visible_at / 1e6,
            name.priority,
            body,
            dict(header.get("attributes", {})),
            header.get("group"),
        )

    def _state_of(self, name: _format.Name, now: int) -> str:
        if name.state is State.HIDDEN and name.until_us + self._skew_us > now:
            return "delayed" if name.receive_count == 0 else "in_flight"
        return "ready"

    def stats(self, *, groups: bool = False) -> QueueStats:
        """Counts by state and the age of the oldest visible message, from one
        listing; with ``groups=True`` also counts per message group (reading one
        message of each group for its name)."""
        now = _format.now_us()
        counts = {"ready": 0, "in_flight": 0, "delayed": 0}
        per_group: dict[str, dict[str, int]] = {}
        sample: dict[str, _format.Name] = {}
        writing = 0
        oldest = now
        for name in self._parsed():
            if name.state is State.WRITING:
                writing += 1
                continue
            state = self._state_of(name, now)
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
            dead_lettered=self._count_dead_letters(),
            groups={self._group_name(sample[h]): tally for h, tally in per_group.items()} if groups else None,
            **counts,
        )

    def _group_name(self, name: _format.Name) -> str:
        """A group's name, from the envelope of one of its messages (its hash if unreadable)."""
        data = _fs.read(self._message_file(str(name)))
        try:
            header = self._decode(name, data, str(name))[1] if data else None
        except StorageError:
            header = None
        return str((header or {}).get("group") or name.group_hash)

    def _count_dead_letters(self) -> int:
        """Messages of this queue now in its dead-letter queue (one listing of it)."""
        path = self._dead_letter_path()
        if path is None or not _fs.is_dir(path):
            return 0
        try:
            names = Queue(path)._parsed()
        except QueueNotFound:
            return 0
        return sum(1 for name in names if name.origin == self.id)

    def purge(self) -> int:
        """Delete every message, in flight and delayed included; return how many."""
        removed = 0
        for name in self._parsed():
            if name.state is not State.WRITING and _fs.unlink(self._message_file(str(name))):
                removed += 1
        with self._lock:
            self._listing = _Listing()
        return removed

    def requeue_expired(self) -> int:
        """Make every hidden message whose time has come ready again, and move
        those received ``max_receives`` times to the dead-letter queue; return
        how many moved. Receive already does both as it goes; this pass only
        tidies the directory so a listing shows the truth."""
        now = _format.now_us()
        max_receives = self._current_settings()["max_receives"]
        moved = 0
        for name in self._parsed():
            if name.state is State.WRITING or self._state_of(name, now) != "ready":
                continue
            if max_receives is not None and name.receive_count >= max_receives:
                moved += self._dead_letter(name)
            elif name.state is State.HIDDEN:
                ready = _format.ready_name(name.stem, name.receive_count)
                if _fs.rename(self._message_file(str(name)), self._message_file(ready)):
                    moved += 1
        return moved

    # -- dead letters ----------------------------------------------------------

    def dead_letter_queue(self, *, create: bool = True) -> Queue | None:
        """The queue's dead-letter queue, made on demand; ``None`` without ``max_receives``.

        The ``dead_letter`` setting names a sibling queue (same parent
        directory) or a path; unset, it is the sibling ``<name>.dlq``.
        """
        path = self._dead_letter_path()
        if path is None:
            return None
        with self._lock:
            cached = self._dlq
        if cached is not None and cached.path == os.path.abspath(path):
            return cached
        dlq = Queue(path, create=create, mode=self._mode)  # a shared spool shares it too
        dlq._register_source(self)
        with self._lock:
            self._dlq = dlq
        return dlq

    def _dead_letter_path(self, settings: Mapping[str, Any] | None = None) -> str | None:
        settings = settings or self._current_settings()
        if settings["max_receives"] is None and not settings["dead_letter"]:
            return None
        target = settings["dead_letter"] or os.path.basename(self._path) + ".dlq"
        path = os.path.abspath(os.path.join(os.path.dirname(self._path), target))  # absolute wins
        if path == self._path or self._path.startswith(path.rstrip(os.sep) + os.sep):
            raise InvalidArgument(f"dead_letter {target!r} is this queue or a directory above it")
        return path

    def _register_source(self, source: Queue) -> None:
        """Remember where dead letters marked with ``source.id`` came from, for redrive."""
        directory = self._file(_format.SOURCES_DIR)
        entry = os.path.join(directory, source.id)
        if not _fs.exists(entry):
            _fs.make_dirs(directory, self._mode)
            _fs.create_exclusive(entry, source.path.encode(), durable=True, mode=self._mode)

    def _sources(self) -> dict[str, str]:
        directory = self._file(_format.SOURCES_DIR)
        if not _fs.is_private_dir(directory):
            return {}
        found = {}
        for entry in _fs.list_names(directory):
            data = _fs.read(os.path.join(directory, entry))
            if data and _format.is_queue_id(entry):
                found[entry] = data.decode("utf-8", "replace")
        return found

    def _dead_letter(self, name: _format.Name) -> int:
        """Move a message that used up its receives into the dead-letter queue,
        keeping id, body, receive count and send time; 1 if it moved."""
        dlq = self.dead_letter_queue()
        assert dlq is not None
        dead = _format.ready_name(_format.with_origin(name, self.id), name.receive_count)
        try:
            return int(_move_into(self._message_file(str(name)), dlq._message_file(dead)))
        except StorageError as exc:
            if exc.errno == errno.EXDEV:
                raise StorageError(
                    exc.errno,
                    f"dead-letter queue {dlq.path} must be on the same filesystem as {self._path}",
                    dlq.path,
                ) from exc
            raise

    def redrive(self, to: Queue | str | os.PathLike[str] | None = None, *, max_messages: int | None = None) -> int:
        """Move visible messages of this (dead-letter) queue back, with their
        receive count reset: to ``to``, or each to the queue it came from.
        Messages with no known home (and no ``to``) stay. Returns how many moved."""
        if max_messages is not None and (isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 0):
            raise InvalidArgument(f"max_messages must be an int >= 0 or None, not {max_messages!r}")
        target = to if isinstance(to, Queue) or to is None else Queue(to)
        homes: dict[str, Queue | None] = {}
        sources = self._sources() if target is None else {}
        now = _format.now_us()
        moved = 0
        for name in sorted(self._parsed(), key=str):
            if max_messages is not None and moved >= max_messages:
                break
            if name.state is State.WRITING or self._state_of(name, now) != "ready":
                continue
            home = target
            if home is None:
                if name.origin not in homes:
                    path = sources.get(name.origin)
                    try:
                        homes[name.origin] = Queue(path) if path else None
                    except QueueNotFound:
                        homes[name.origin] = None
                home = homes[name.origin]
            if home is None:
                continue
            back = _format.ready_name(_format.with_origin(name, ""))
            if _move_into(self._message_file(str(name)), home._message_file(back)):
                moved += 1
        return moved

    def collect_garbage(
        self, grace: float = DEFAULT_GC_GRACE, *, stage_grace: float = DEFAULT_STAGE_GRACE
    ) -> int:
        """Remove ``.new`` files older than ``grace`` seconds (left by publishers
        that died mid-write), stages untouched for ``stage_grace`` seconds
        (left by jobs that died before commit), messages sent longer ago than
        the queue's ``retention``, and spent group leases and de-duplication
        reservations; return how many files went."""
        grace = check_seconds(grace, "grace", math.inf)
        stage_grace = check_seconds(stage_grace, "stage_grace", math.inf)
        retention = self._current_settings()["retention"]
        now = time.time()
        removed = 0
        present: set[str] = set()
        self._rehome_strays()
        for entry in self._gc_entries():
            name = _format.parse_name(entry)
            if name is not None and name.state is not State.WRITING:
                if retention is not None and name.sent_us / 1e6 < now - retention:
                    removed += _fs.unlink(self._message_file(entry))
                else:
                    present.add(name.key)
            elif name is not None:
                present.add(name.key)
                removed += self._remove_orphan(entry, now - grace)
            elif _format.parse_stage_dir(entry) is not None and _fs.is_private_dir(self._file(entry)):
                modified = _fs.mtime(self._file(entry))
                if modified is not None and modified <= now - stage_grace:
                    removed += self.abort_stage(_format.parse_stage_dir(entry) or "")
        with self._lock:
            removed += self._groups.sweep()
        removed += self._reservations.sweep(self._current_settings()["dedup_window"], present)
        return removed

    def _gc_entries(self) -> Iterator[str]:
        """The entries gc looks at: the queue directory's, and each shard's."""
        yield from _fs.list_names(self._path)
        for index in range(self._shards if self.shards > 1 else 0):
            yield from self._list_shard(index)

    def _remove_orphan(self, entry: str, cutoff: float) -> int:
        """Remove the .new file ``entry`` if it was last written before ``cutoff``."""
        modified = _fs.mtime(self._message_file(entry))
        return int(modified is not None and modified <= cutoff and _fs.unlink(self._message_file(entry)))


def _move_into(source: str, destination: str) -> bool:
    """Rename a message file into another directory (a queue, a shard); False
    if ``source`` was gone (a lost race). A destination directory that is gone
    is an error that names it, not a lost race: the message stays where it was."""
    if _fs.rename(source, destination):
        return True
    directory = os.path.dirname(destination)
    if not _fs.is_dir(directory) and _fs.exists(source):
        raise QueueNotFound(f"queue directory is gone: {directory}")
    return False


def _first(items: list[Any], n: int) -> list[Any]:
    """The ``n`` smallest of ``items`` as a heap (``items`` itself, heapified, if
    there are no more than ``n``).

    For a long list, a sorted sample gives a cutoff, the items below it are
    sorted (a sorted list is a heap) and cut to ``n``: much cheaper than a heap
    selection over a million names. Any cutoff yields an exact prefix of the
    sorted order; if the sample set it too low, a heap selection does it.
    """
    if len(items) <= n:
        heapq.heapify(items)
        return items
    step = max(1, len(items) // 4096)
    sample = sorted(items[::step])
    cutoff = sample[min(len(sample) - 1, (n + n // 4) // step)]  # some slack: usually > n pass
    below = [item for item in items if item <= cutoff]
    if len(below) < n:
        return heapq.nsmallest(n, items)
    below.sort()
    del below[n:]
    return below


def _first_messages(names: list[str], n: int) -> tuple[list[str], bool]:
    """The ``n`` first message names of ``names`` (as :func:`_first`), none of
    them foreign, and whether any message name was left out. When the window
    leaves names out, a foreign name must not take a place in it, or foreign
    names first in order could starve every message."""
    kept = _first(names, n)
    while len(kept) < len(names):
        foreign = {name for name in kept if not _format.is_message_name(name)}
        if not foreign:
            # fresh copies, packed together: the originals lie scattered among the
            # whole listing's strings and would keep all their memory pages alive
            return "\0".join(kept).split("\0"), True  # no file name holds a NUL
        names = [name for name in names if name not in foreign]
        kept = _first(names, n)
    return kept, False


def _stale_message(key: str) -> str:
    return (
        f"receipt for message {key} is stale: the message was deleted, its visibility "
        "was changed with this receipt already, or its lease ran out and it was received again"
    )
