"""Where a queue's files live: the one place that knows whether a queue is
flat (messages in the queue directory) or sharded (messages spread over
``shards/NN`` directories by a digit of their name). Nothing else asks
"how many shards?".

A :class:`Layout` is a storage strategy with a few primitives: the path of
an entry of the queue directory, the path of a message file, the listings
of the message directories (all of them, one message's, or round the shards
for receive), and the fsync of the directories that messages went into.
:func:`layout_for` picks the strategy from the queue's metadata.

A layout holds the queue's directory, and each shard's, open
(:class:`vsqs._core.fs.Pin`): its paths name those directories themselves,
so every operation stays inside the queue that was opened, whatever is done
to its path later. ``shown`` is the path for people (logs, errors).
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import QueueNotFound, StorageError

log = logging.getLogger("vsqs")


class Layout:
    """A flat queue: every message file in the queue directory itself.

    ``prefix`` and ``locate`` are for the hot paths, which build a message's
    path inline: ``prefix + name`` when ``locate`` is None, else
    ``locate(name) + name``.
    """

    def __init__(self, directory: _fs.Pin | str) -> None:
        pin = directory if isinstance(directory, _fs.Pin) else _fs.pin(directory)
        self.pin = pin
        self.path = pin.path
        self.shown = pin.shown
        self.prefix = self.path + os.sep
        # instance attributes, not class ones: the hot paths read them (faster so in CPython 3.11)
        self.shards = 1
        self.locate: Callable[[str], str] | None = None
        self._reported: set[str] = set()  # damaged entries reported already (their keys)
        self.check_at = time.monotonic() + CHECK_EVERY  # when :meth:`check` looks at the path next

    def gone(self) -> bool:
        """Whether the queue's directory held is no longer the one at its path
        (removed, renamed away by a delete, replaced: by a link, even)."""
        return not _fs.exists(self.path) or _fs.moved(self.pin)

    def check(self) -> None:
        """Look (at most once a CHECK_EVERY; callers test ``check_at`` first)
        whether the directories held are still those at their paths:
        QueueNotFound if the queue's is not (the handle opens the one there
        again, by the opening rules); a shard that is not is held again."""
        self.check_at = time.monotonic() + CHECK_EVERY
        if self.gone():
            raise QueueNotFound(f"the queue directory at {self.shown} is not the one opened (deleted?)")
        self.check_shards()

    def check_shards(self) -> None:
        """Hold again each shard whose directory held is not the one at its path (none here)."""

    def file(self, name: str) -> str:
        """An entry of the queue directory itself (metadata, settings, stages...)."""
        return self.prefix + name  # names are single components: no join needed

    def message_file(self, name: str) -> str:
        """Where the message file ``name`` (of the grammar) lives."""
        return self.prefix + name

    def message_dirs(self) -> list[str]:
        """The directories that hold messages."""
        return [self.path]

    def names(self, beside: str | None = None) -> list[_format.Name]:
        """Every name of the grammar among the messages, parsed (given the name
        ``beside``, only those of the directory that name lives in)."""
        names = (_format.parse_name(entry) for entry in _fs.list_names(self.path))
        return [name for name in names if name is not None]

    def files(self) -> list[_format.Name]:
        """The messages: every regular file whose name is of the grammar,
        parsed (what :meth:`names` gives, less the damage: an entry named like
        a message that is no regular file is reported and left out)."""
        return self._files(self.path, None)

    def _files(self, directory: str, home: int | None) -> list[_format.Name]:
        """The messages of one directory (in a sharded queue: of shard ``home``,
        whose names must map to it), reporting the damage."""
        files, others = _fs.list_files(directory)
        for entry in others:
            if _format.parse_name(entry) is not None:
                self.report_damage(os.path.join(directory, entry), "not a regular file")
        found = []
        for entry in files:
            name = _format.parse_name(entry)
            # (a name outside the shard it maps to was moved there by hand: gc moves it home)
            if name is not None and (home is None or _format.shard_of(entry, self.shards) == home):
                found.append(name)
        return found

    def entries(self) -> Iterator[tuple[str, bool]]:
        """Every entry of the queue directory and of the message directories,
        unparsed, each with whether it is a regular file (for gc)."""
        yield from _typed(self.path)

    def report_damage(self, path: str, why: str) -> None:
        """Report (a warning, once per message key per handle) an entry named
        like a message that is not one: it is skipped and left in place, never
        deleted nor counted (see docs/FORMAT.md, Damage)."""
        entry = os.path.basename(path)
        key = entry[:_format.KEY_LENGTH]
        if key in self._reported:
            return
        if len(self._reported) >= _REPORTED_MAX:  # a spool full of damage: report it again, in bounded memory
            self._reported.clear()
        self._reported.add(key)
        log.warning("queue %s: %s is not a message (%s): skipped, left in place", self.shown, entry, why)

    def receive_round(self) -> Iterator[tuple[list[str], Callable[[str], bool] | None]]:
        """The listings a receive goes through, in order, each with a test of
        whether a name lives where it was listed (None: every message name does).
        The caller stops at the first that gives it something to claim."""
        yield _fs.list_names(self.path), None

    def fsync(self, names: Iterable[str]) -> None:
        """fsync each directory that the messages ``names`` (stems or names) went into, once."""
        _fs.fsync_dir(self.path)

    def remove_orphan(self, entry: str, cutoff: float) -> int:
        """Remove the ``.new`` message file ``entry`` if it was last written before ``cutoff``: 1 if it went."""
        path = self.message_file(entry)
        modified = _fs.mtime(path)
        return int(modified is not None and modified <= cutoff and _fs.unlink(path))

    def rehome_strays(self, mode: int | None) -> int:
        """Move message files that lie outside the directory their name maps to
        (making any missing directory with ``mode``); how many moved."""
        return 0

    @staticmethod
    def make(directory: str, shards: int, mode: int | None) -> None:
        """The shard directories of a new queue at ``directory`` (none for one shard)."""
        if shards == 1:
            return
        _fs.make_dirs(os.path.join(directory, _format.SHARDS_DIR), mode)
        for index in range(shards):
            _fs.make_dirs(os.path.join(directory, _format.shard_dir_name(index)), mode)
        _fs.fsync_dir(os.path.join(directory, _format.SHARDS_DIR))


class ShardedLayout(Layout):
    """A sharded queue (format 2 or 3): message files in ``shards/00`` .. ``shards/NN``,
    each in the shard the first hex digits of its GROUP (or else its RAND) map to."""

    def __init__(self, directory: _fs.Pin | str, shards: int) -> None:
        super().__init__(directory)
        self.shards = shards
        self.shard_pins: list[_fs.Pin | None] = [None] * shards
        self.shard_prefixes = [""] * shards
        for index in range(shards):
            self._pin_shard(index)
        self.cursor = random.randrange(shards)  # the shard the next receive round starts at: consumers start apart
        self._cursor_pid = os.getpid()

    def _pin_shard(self, index: int) -> None:
        """Hold shard ``index`` open (a missing one is reached by its name
        until it is there again: gc makes it; a symlink there is refused)."""
        directory = self.prefix + _format.shard_dir_name(index)
        try:
            shard: _fs.Pin | None = _fs.pin(directory)
        except QueueNotFound:
            shard = None
        except StorageError as exc:
            if exc.errno != errno.ENOTDIR:
                raise
            raise StorageError(errno.ENOTDIR, "shard directory is not a directory of the queue (a symlink?): "
                               "not followed", _fs.shown(directory)) from exc
        self.shard_pins[index] = shard
        self.shard_prefixes[index] = (directory if shard is None else shard.path) + os.sep
        self.locate = _format.shard_locator(self.shard_prefixes)

    def message_file(self, name: str) -> str:
        assert self.locate is not None
        return self.locate(name) + name

    def check_shards(self) -> None:
        for index, shard in enumerate(self.shard_pins):
            if shard is None or _fs.moved(shard) or not _fs.exists(shard.path):
                self._pin_shard(index)

    def message_dirs(self) -> list[str]:
        return [prefix[:-1] for prefix in self.shard_prefixes]

    def names(self, beside: str | None = None) -> list[_format.Name]:
        found = []
        indexes = range(self.shards) if beside is None else [_format.shard_of(beside, self.shards)]
        for index in indexes:
            for entry in self.list_shard(index):
                name = _format.parse_name(entry)
                # a name in a shard it does not map to was moved there by hand: gc moves it home
                if name is not None and _format.shard_of(entry, self.shards) == index:
                    found.append(name)
        return found

    def files(self) -> list[_format.Name]:
        found = []
        for index, prefix in enumerate(self.shard_prefixes):
            directory = prefix[:-1]
            _check_shard_dir(directory)
            try:
                found += self._files(directory, index)
            except QueueNotFound:
                if self._missing_shard(index):
                    found += self._files(self.shard_prefixes[index][:-1], index)
        return found

    def entries(self) -> Iterator[tuple[str, bool]]:
        yield from _typed(self.path)
        for prefix in self.shard_prefixes:
            _check_shard_dir(prefix[:-1])
            try:
                yield from _typed(prefix[:-1])
            except QueueNotFound:
                if not _fs.is_dir(self.path):
                    raise

    def receive_round(self) -> Iterator[tuple[list[str], Callable[[str], bool] | None]]:
        """The shards one at a time, going round from where the last round
        stopped (each handle starts at a random shard, so consumers spread out)."""
        if self._cursor_pid != os.getpid():  # a handle made before a fork: start apart
            self.cursor, self._cursor_pid = random.randrange(self.shards), os.getpid()
        locate = self.locate
        assert locate is not None
        for _ in range(self.shards):
            index = self.cursor
            self.cursor = (index + 1) % self.shards
            home = self.shard_prefixes[index]
            yield self.list_shard(index), lambda name, home=home: locate(name) == home  # type: ignore[misc]

    def fsync(self, names: Iterable[str]) -> None:
        for index in sorted({_format.shard_of(name, self.shards) for name in names}):
            _fs.fsync_dir(self.shard_prefixes[index][:-1])

    def list_shard(self, index: int) -> list[str]:
        """One listing of a shard. A shard directory that is gone from a queue
        that is still there is damage: reported, passed over (the other
        shards go on being served), and made again by gc."""
        directory = self.shard_prefixes[index][:-1]
        _check_shard_dir(directory)
        try:
            return _fs.list_names(directory)
        except QueueNotFound:
            if self._missing_shard(index):  # held again: listed once more, at most
                try:
                    return _fs.list_names(self.shard_prefixes[index][:-1])
                except QueueNotFound:
                    pass
            return []

    def _missing_shard(self, index: int) -> bool:
        """Report shard ``index`` missing, unless the whole queue is gone
        (QueueNotFound then); True if the shard held open was removed and
        one is there again (made by gc): it is held from now on."""
        if not _fs.is_dir(self.path):
            raise QueueNotFound(f"queue directory is gone: {self.shown}")
        if self.shard_pins[index] is not None:
            self._pin_shard(index)
            if self.shard_pins[index] is not None:
                return True
        log.warning("queue %s: shard directory %s is missing (vsqs gc makes it again)",
                    self.shown, _format.shard_dir_name(index))
        return False

    def rehome_strays(self, mode: int | None) -> int:
        """Move message files that lie outside their shard (in the queue
        directory, or in another shard: put there by hand or by a tool that
        ignored the shards) to where their name maps."""
        if not _fs.exists(self.file(_format.METADATA_NAME)):  # deleted: nothing to repair
            raise QueueNotFound(f"no queue at {self.shown}")
        self.make(self.path, self.shards, mode)  # any that went missing
        self.check_shards()
        moved = 0
        places = [self.path, *self.message_dirs()]
        for index, directory in enumerate(places):
            for entry in _fs.list_files(directory)[0]:  # damage stays where it is
                name = _format.parse_name(entry)
                if name is None or _format.shard_of(entry, self.shards) == index - 1:
                    continue
                if move_into(os.path.join(directory, entry), self.message_file(entry)):
                    log.warning("moved %s from %s into its shard", entry, _fs.shown(directory))
                    moved += 1
        return moved


_REPORTED_MAX = 10_000  # damaged entries a handle remembers having reported
# seconds between two looks of a layout at whether the directories it holds are still those
# at their paths: how long a handle may go on in a queue deleted meanwhile (as SQS, whose
# deletion takes up to 60 s, may accept a message meanwhile)
CHECK_EVERY = 1.0


def _typed(directory: str) -> Iterator[tuple[str, bool]]:
    """The entries of ``directory``, each with whether it is a regular file."""
    files, others = _fs.list_files(directory)
    yield from ((entry, True) for entry in files)
    yield from ((entry, False) for entry in others)


def layout_for(directory: _fs.Pin | str, shards: int) -> Layout:
    """The layout of the queue ``directory`` (held open, or its path) whose metadata says ``shards``."""
    return Layout(directory) if shards == 1 else ShardedLayout(directory, shards)


def _check_shard_dir(directory: str) -> None:
    """A shard directory must be a directory itself: vsqs follows no symlink
    out of the queue. (A missing one is passed over, see list_shard.)"""
    if not _fs.is_private_dir(directory) and _fs.exists(directory):
        raise StorageError(
            errno.ENOTDIR, "shard directory is not a directory of the queue (a symlink?): not followed",
            _fs.shown(directory),
        )


def move_into(source: str, destination: str) -> bool:
    """Rename a message file into another directory (a queue, a shard); False
    if ``source`` was gone (a lost race). A destination directory that is gone
    is an error that names it, not a lost race: the message stays where it was."""
    if _fs.rename(source, destination):
        return True
    directory = os.path.dirname(destination)
    if not _fs.is_dir(directory) and _fs.exists(source):
        raise QueueNotFound(f"queue directory is gone: {_fs.shown(directory)}")
    return False
