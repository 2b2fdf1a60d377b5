"""A spool: a directory of named queues."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator
from typing import Any

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import settings as _settings
from vsqs._core.errors import InvalidArgument, QueueNotFound, StorageError
from vsqs._core.limits import DELETED_KEEP, DELETED_SWEEP_EVERY
from vsqs._core.queue import Queue
from vsqs._core.rules import check_queue_name, is_queue_name

log = logging.getLogger("vsqs")


class Spool:
    """A directory of queues, each a subdirectory named after the queue."""

    def __init__(self, root: str | os.PathLike[str], *, create: bool = False) -> None:
        self._root = os.path.abspath(os.fspath(root))
        self._deletions_swept_at = -math.inf  # (time.monotonic() of this handle's last sweep of .deleted/)
        if not _fs.is_dir(self._root):
            if not create:
                raise QueueNotFound(f"no spool at {self._root} (create it first)")
            _fs.make_root(self._root)

    def __repr__(self) -> str:
        return f"vsqs.Spool({self._root!r})"

    def __reduce__(self) -> Any:
        return (Spool, (self._root,))

    @property
    def root(self) -> str:
        return self._root

    def path(self, name: str) -> str:
        return os.path.join(self._root, check_queue_name(name))

    def create_queue(self, name: str, *, shards: int | None = None, **settings: Any) -> Queue:
        """Create queue ``name`` (or open it if it exists) and apply ``settings``.

        ``shards`` (a power of two up to 256, fixed at creation) spreads the
        messages over that many directories, for queues that stand deep (see
        docs/FORMAT.md, Shards); an existing queue must have as many."""
        _settings.validate(settings)  # a bad setting fails before anything is made
        queue = Queue(self.path(name), create=True, mode=settings.get("file_mode"), shards=shards)
        if settings:
            queue.configure(**settings)
        return queue

    def queue(self, name: str) -> Queue:
        """Open queue ``name``; :class:`QueueNotFound` if it does not exist."""
        return Queue(self.path(name))

    def __getitem__(self, name: str) -> Queue:
        return self.queue(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.queues()

    def __iter__(self) -> Iterator[Queue]:
        return (self.queue(name) for name in self.queues())

    def queues(self) -> list[str]:
        """The names of the queues in the spool, sorted: directories (not
        symlinks: vsqs follows none out of the spool) holding queue metadata."""
        names = []
        for entry in _fs.list_names(self._root):
            if is_queue_name(entry) and _is_queue_dir(os.path.join(self._root, entry)):
                names.append(entry)
        return sorted(names)

    def delete_queue(self, name: str) -> int:
        """Remove queue ``name`` with its messages; return how many messages went.

        The queue first moves aside under a private name in one rename, so
        every process sees it gone at once; then its files are removed.
        """
        path = self.path(name)
        if not _is_queue_dir(path):  # a plain file or a symlink of that name is no queue: left alone
            raise QueueNotFound(f"no queue {name!r} in {self._root}")
        doomed = os.path.join(self._root, f".{name}.deleting-{_format.new_tag()}")
        if not _fs.rename(path, doomed):
            raise QueueNotFound(f"no queue {name!r} in {self._root}")
        self._record_deletion(name, _format.now_us())
        count = _count_messages(doomed)
        _fs.remove_tree(doomed)
        return count

    def deleted_at(self, name: str) -> float | None:
        """When queue ``name`` was last deleted (epoch seconds), by any process
        or host sharing the spool; ``None`` if not within the last hour
        (records are kept that long). Read from ``.deleted/`` in the spool's
        root (docs/FORMAT.md, Spools) on each call: a record of a time more
        than a minute ahead of this host's clock is ignored, one less ahead
        reads as now. The SQS face's ``QueueDeletedRecently`` rule reads it."""
        check_queue_name(name)
        directory = os.path.join(self._root, _format.DELETED_DIR)
        if not _fs.is_private_dir(directory):
            if _fs.lstat(directory) is not None:
                log.warning("spool: %s is not a directory: no queue deletion records read", _fs.shown(directory))
            return None
        try:
            entries = _fs.list_files(directory)[0]  # regular files only: a FIFO, a link, a directory is none
        except QueueNotFound:  # gone since, or swapped for a link
            return None
        now = _format.now_us()
        times = (parsed[1] for parsed in map(_format.parse_deleted_record, entries)
                 if parsed is not None and parsed[0] == name)
        newest = _format.newest_time(times, now)
        if newest is None or newest < now - int(DELETED_KEEP * 1_000_000):
            return None
        return newest / 1_000_000

    def _record_deletion(self, name: str, when_us: int) -> None:
        """Record that queue ``name`` went at ``when_us`` (an empty file
        ``.deleted/NAME.WHEN``), and, at most once a minute, sweep the records
        older than an hour or more than a minute ahead, and each name's but its
        newest. A failure is logged: the queue is gone
        all the same, and the record serves only the SQS face's rule."""
        directory = os.path.join(self._root, _format.DELETED_DIR)
        try:
            _fs.make_dirs(directory)
            _fs.create_exclusive(os.path.join(directory, _format.deleted_record(name, when_us)), b"", durable=False)
            if time.monotonic() - self._deletions_swept_at < DELETED_SWEEP_EVERY:
                return  # (a listing of every record per deletion would cost O(records) each)
            self._deletions_swept_at = time.monotonic()
            oldest = when_us - int(DELETED_KEEP * 1_000_000)
            ahead = when_us + 60_000_000  # (a record further ahead is ignored by readers: it goes too)
            records = [(parsed, entry) for entry in _fs.list_files(directory)[0]
                       if (parsed := _format.parse_deleted_record(entry)) is not None]
            for (_, at), entry in records:
                if at > ahead:
                    _fs.unlink(os.path.join(directory, entry))
            records = [((queue, at), entry) for (queue, at), entry in records if at <= ahead]
            newest: dict[str, int] = {}
            for (queue, at), _ in records:
                newest[queue] = max(at, newest.get(queue, at))
            for (queue, at), entry in records:  # an hour old, or not the newest of its name
                if at < oldest or at < newest[queue]:
                    _fs.unlink(os.path.join(directory, entry))
        except (StorageError, QueueNotFound) as exc:
            log.warning("spool: the record of the deletion of queue %r was not written: %s", name, exc)

    def claim_period(self, task: str, seconds: float, *, now: float | None = None) -> bool:
        """Claim the current ``seconds``-long period for ``task`` among every
        process and host sharing the spool; True for exactly one caller per
        period.

        Time is cut into periods ``floor(epoch / seconds)``; the claim is an
        exclusive create of ``.claims/TASK.PERIOD`` in the spool's root, so the
        first creator wins, with no lock and no broker. The winner removes the
        task's tokens of periods before the previous one. ``task`` is 1-32
        characters of a-z 0-9 _ -, starting with a letter (e.g. ``"gc"``).
        """
        if not isinstance(task, str) or not _format.CLAIM_TASK_RE.fullmatch(task):
            raise InvalidArgument(f"bad task name {task!r}: use 1-32 characters of a-z 0-9 _ -, a letter first")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
            raise InvalidArgument(f"seconds must be a positive number, not {seconds!r}")
        period = int((time.time() if now is None else now) // seconds)
        directory = os.path.join(self._root, _format.CLAIMS_DIR)
        _fs.make_dirs(directory)
        if not _fs.create_exclusive(os.path.join(directory, _format.claim_token(task, period)), b"", durable=False):
            return False
        for entry in _fs.list_names(directory):
            parsed = _format.parse_claim_token(entry)
            if parsed is not None and parsed[0] == task and parsed[1] < period - 1:
                _fs.unlink(os.path.join(directory, entry))
        return True

    def put_record(self, task: str, period: int, data: bytes, *, keep: int) -> bool:
        """Store ``data`` (at most 1 MiB) as ``task``'s record of time period
        ``period``, for every process sharing the spool to read
        (:meth:`record`); False if that period's record exists (never
        rewritten). Its file is ``.records/TASK.PERIOD``, made by an exclusive
        create; the task's records older than ``period - keep`` are removed
        every 64 periods. The gateway's console keeps its samples so."""
        if not isinstance(task, str) or not _format.CLAIM_TASK_RE.fullmatch(task):
            raise InvalidArgument(f"bad task name {task!r}: use 1-32 characters of a-z 0-9 _ -, a letter first")
        if not isinstance(data, bytes) or len(data) > _MAX_RECORD:
            raise InvalidArgument(f"a record is at most {_MAX_RECORD} bytes of bytes")
        directory = os.path.join(self._root, _format.RECORDS_DIR)
        _fs.make_dirs(directory)
        made = _fs.create_exclusive(os.path.join(directory, _format.claim_token(task, period)), data, durable=False)
        if made and period % 64 == 0:
            for entry in _fs.list_names(directory):
                parsed = _format.parse_claim_token(entry)
                if parsed is not None and parsed[0] == task and parsed[1] < period - keep:
                    _fs.unlink(os.path.join(directory, entry))
        return made

    def record(self, task: str, period: int) -> bytes | None:
        """``task``'s record of ``period`` (see :meth:`put_record`); None if
        there is none (or it is still being written: empty, or unreadable)."""
        if not isinstance(task, str) or not _format.CLAIM_TASK_RE.fullmatch(task):
            raise InvalidArgument(f"bad task name {task!r}")
        path = os.path.join(self._root, _format.RECORDS_DIR, _format.claim_token(task, period))
        try:
            return _fs.read(path, _MAX_RECORD) or None
        except StorageError:  # unreadable (EACCES: another user's umask), a FIFO, over 1 MiB: as documented
            return None


_MAX_RECORD = 1 << 20


def _is_queue_dir(path: str) -> bool:
    """Whether ``path`` is a directory itself (not a symlink, not a file) holding queue metadata."""
    return _fs.is_private_dir(path) and _fs.exists(os.path.join(path, _format.METADATA_NAME))


def _count_messages(directory: str) -> int:
    """Message files in a queue directory and in its shard directories, read
    without opening the queue (its metadata may be what is broken)."""
    places = [directory]
    shards = os.path.join(directory, _format.SHARDS_DIR)
    if _fs.is_private_dir(shards):
        places += [
            os.path.join(shards, entry) for entry in _fs.list_names(shards)
            if _fs.is_private_dir(os.path.join(shards, entry))
        ]
    # regular files only: a directory or a FIFO named like a message is no message
    return sum(1 for place in places for entry in _fs.list_files(place)[0] if _format.parse_name(entry) is not None)
