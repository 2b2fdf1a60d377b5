"""A queue's birth certificate: ``.vsqs.json``, read to open a queue and
written (with the shard directories) to create one so that it appears whole."""

from __future__ import annotations

import errno
import os
import time

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import (
    DamagedEntry,
    IncompatibleFormat,
    QueueNotFound,
    StorageError,
)
from vsqs._core.layout import Layout, layout_for
from vsqs._core.limits import MAX_CONTROL_FILE
from vsqs._core.rules import load_json

# how long to wait for a racing creator to write the metadata; a metadata file
# found empty is waited for only while it is this young (its mtime), else it
# is damage, refused at once (no thread is held for it)
_METADATA_WAIT = 5.0


def open_queue(path: str, *, create: bool, shards: int = 1, mode: int | None = None,
               first_receive: bool = True) -> _format.Metadata:
    """Check (or make, with ``shards`` and file ``mode``, at format 3, or
    without ``first_receive`` at the format 1 or 2 older vsqs read) the queue
    directory at ``path`` and its metadata; return what the metadata fixes.

    A queue directory that is a symbolic link is refused (vsqs follows none:
    a link planted in a spool would take messages outside it), and so is
    metadata that is not a regular file."""
    return _open(path, create, shards, mode, first_receive)[1]


def _open(path: str, create: bool, shards: int, mode: int | None,
          first_receive: bool) -> tuple[_fs.Pin, _format.Metadata]:
    """:func:`open_queue`, and the queue's directory held open (every later
    operation goes through it, see :mod:`vsqs._core.layout`)."""
    pin = _pin(path, create)
    meta = os.path.join(pin.path if pin else path, _format.METADATA_NAME)
    data = _read(meta) if pin else None
    if data is None and create:
        _create(path, shards, mode, first_receive)
        deadline = time.monotonic() + _METADATA_WAIT
        while True:
            pin = pin or _pin(path, create)
            meta = os.path.join(pin.path if pin else path, _format.METADATA_NAME)
            data = _read(meta) if pin else None
            if data is not None or time.monotonic() >= deadline:
                break
            # another host's creator won: this host's client may not show its queue yet
            # (a cached lookup saying "none": NFS, sshfs); bounded, then QueueNotFound as before
            time.sleep(0.05)
            _fs.list_names(os.path.dirname(path))  # (revalidates NFS's lookups of the parent's names)
    if data is None or pin is None:
        if pin is not None:
            raise QueueNotFound(f"not a vsqs queue: {path} has no {_format.METADATA_NAME} (create it first)")
        raise QueueNotFound(f"no queue at {path} (create it first)")
    if not data and _young(meta):  # a creator is still writing it
        deadline = time.monotonic() + _METADATA_WAIT
        while not data and time.monotonic() < deadline:
            time.sleep(0.01)
            data = _read(meta) or b""
    return pin, _format.decode_metadata(data, _fs.shown(meta))


def _pin(path: str, create: bool) -> _fs.Pin | None:
    """The queue directory at ``path`` held open; None if there is none."""
    if _fs.is_link(path):
        if create:
            raise StorageError(errno.ELOOP, "cannot create a queue over a symbolic link (vsqs follows none)", path)
        raise QueueNotFound(f"not a vsqs queue: {path} is a symbolic link (vsqs follows none)")
    try:
        return _fs.pin(path)
    except QueueNotFound:
        return None
    except StorageError as exc:  # a link put there since the look above, or no directory
        if create or exc.errno != errno.ENOTDIR:
            raise
        raise QueueNotFound(f"not a vsqs queue: {path} is not a directory (vsqs follows no link)") from exc


def _read(meta: str) -> bytes | None:
    """The metadata's content (``None``: there is none); one that is not a
    regular file, or too large for metadata, is :class:`IncompatibleFormat`."""
    try:
        return _fs.read(meta, MAX_CONTROL_FILE)
    except DamagedEntry as exc:
        raise IncompatibleFormat(f"{_fs.shown(meta)}: unreadable queue metadata ({exc.strerror})") from None


def _young(meta: str) -> bool:
    """Whether the metadata file was written less than _METADATA_WAIT ago
    (by this host's clock: either way, the wait is bounded)."""
    written = _fs.mtime(meta)
    return written is not None and abs(time.time() - written) < _METADATA_WAIT


def _create(path: str, shards: int, mode: int | None, first_receive: bool) -> None:
    """Make the queue so that it appears whole: a private directory holding
    the metadata (and the shard directories) is renamed into place. An
    existing directory is adopted by an exclusive create of the metadata
    file, after its shard directories."""
    content = _format.encode_metadata(_format.new_queue_id(), shards, first_receive=first_receive)
    meta = os.path.join(path, _format.METADATA_NAME)
    if not _fs.is_dir(path):
        parent, base = os.path.split(path)
        _fs.make_root(parent)
        private = os.path.join(parent, f".{base}.creating-{_format.new_tag()}")
        _fs.make_dir(private, mode)
        Layout.make(private, shards, mode)
        _fs.create_exclusive(os.path.join(private, _format.METADATA_NAME), content, durable=True, mode=mode)
        _fs.fsync_dir(private)
        if _fs.rename_dir(private, path):
            _fs.fsync_dir(parent)
            return
        if shards > 1:  # another creator won, or a directory appeared there meanwhile
            _fs.remove_tree(private)
        else:
            _fs.remove_tree_quietly(private, [_format.METADATA_NAME])
        # The server says `path` exists, but this host's client may still hold a lookup of it
        # that says it does not (another host made it: NFS's negative entries, sshfs's caches):
        # then it is the winner's queue, which _open waits to see; it is adopted only if seen.
        _fs.list_names(parent)  # (revalidates NFS's lookups of the parent's names)
        if not _fs.is_dir(path):
            return
    if not _fs.exists(meta):  # adopt the directory: shards first
        Layout.make(path, shards, mode)
    if _fs.create_exclusive(meta, content, durable=True, mode=mode):
        _fs.fsync_dir(path)


def created_at(path: str) -> float | None:
    """When the queue at ``path`` was created, from its metadata (``None`` if it does not say)."""
    meta = os.path.join(path, _format.METADATA_NAME)
    data = _fs.read_control(meta)
    if data is None:
        raise QueueNotFound(f"no queue at {_fs.shown(path)} (create it first)")
    try:
        created = load_json(data).get("created")
    except (ValueError, AttributeError):
        return None  # (a creator still writing it, or torn: opening the queue says more)
    return None if isinstance(created, bool) or not isinstance(created, (int, float)) else float(created)


class Store:
    """A queue as the engine sees it: its id and where its files live (what a
    handle's parts, dead-lettering and redrive need of a queue), and whether
    a first receive writes ``-rFIRST`` (format 3: see docs/FORMAT.md). A
    slotted class, not a NamedTuple: the hot paths read its attributes."""

    __slots__ = ("first_receive", "id", "layout")

    def __init__(self, queue_id: str, layout: Layout, first_receive: bool = False) -> None:
        self.id = queue_id
        self.layout = layout
        self.first_receive = first_receive


def open_store(path: str, *, create: bool = False, shards: int = 1, mode: int | None = None,
               first_receive: bool = True) -> Store:
    """The :class:`Store` of the queue at ``path`` (made if ``create``, with
    ``shards``, file ``mode`` and ``first_receive``: see :func:`open_queue`)."""
    pin, meta = _open(path, create, shards, mode, first_receive)
    return Store(meta.queue_id, layout_for(pin, meta.shards), meta.first_receive)
