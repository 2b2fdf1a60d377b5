"""The queue's ``.spark/`` as the Spark adapter reaches it: from the queue's
own directory, one directory at a time, never through a symbolic link.

A handle crosses to the executors as its path (it pickles so), and the
adapter may not use the engine's directory descriptors (only the public
API), so each operation on the area (a manifest file written, a partition
read or removed, a query's tree listed: per chunk, partition or batch,
never per message) goes down from the path anew:

1. the queue's directory is opened with ``O_NOFOLLOW``: a symbolic link (or
   no directory) at the queue's path is refused, :class:`QueueNotFound`,
   as the engine refuses it;
2. its ``.vsqs.json`` is read relative to that descriptor (``O_NOFOLLOW``,
   ``O_NONBLOCK``, at most MAX_CONTROL_FILE bytes): a ``queue_id`` other
   than the handle's (or none) means that the path leads to another queue
   now (the directory the handle opened was moved or replaced), refused
   with :class:`QueueNotFound`;
3. ``.spark`` and each directory below it is opened relative to the one
   above with ``O_NOFOLLOW|O_DIRECTORY``, made with ``mkdirat`` where it is
   missing and the operation writes; one that is a symbolic link, or no
   directory, is refused (:class:`StorageError`, ``ENOTDIR``), never
   followed;
4. every create, read, listing, unlink, rename and rmdir is then relative
   to a descriptor so reached (``dir_fd``).

What that costs: an open of the queue's directory and of its metadata, a
read of about 80 bytes, and one open per directory down to the one acted
in (five for a partition): against a manifest file's two fsyncs, little.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence

from vsqs import Queue, QueueNotFound, StorageError
from vsqs._core.limits import MAX_CONTROL_FILE, SPARK_AREA
from vsqs._core.rules import load_json

METADATA = ".vsqs.json"  # the queue's metadata (docs/FORMAT.md, "Queue metadata"): it names the queue's id
# O_DIRECTORY|O_NOFOLLOW: a directory itself, never what a link points to; O_RDONLY: enough
# to list it, fsync it and act relative to it; O_CLOEXEC: never leaks into a child process;
# O_NONBLOCK: a FIFO planted under the name never blocks the open (O_DIRECTORY refuses it)
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# O_NOFOLLOW as above; O_NONBLOCK: a FIFO planted there returns at once (fstat then refuses
# it); O_NOCTTY: a terminal planted there never becomes ours
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# O_CREAT|O_EXCL: the name is claimed atomically (fails if it exists, a link included);
# O_NOFOLLOW: (with O_EXCL, a link fails anyway) said outright
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# what open(O_NOFOLLOW|O_DIRECTORY) answers for a link (Linux ELOOP, FreeBSD EMLINK) or a non-directory
_NO_DIRECTORY = frozenset({errno.ELOOP, errno.EMLINK, errno.ENOTDIR})
_GONE = frozenset({errno.ENOENT, errno.ESTALE})
# a lost exclusive create, as some filesystems report it (HDFS's NFS gateway: EIO): look before deciding
_CREATE_LOST = frozenset({errno.EIO, errno.EACCES, errno.EPERM})
_MAKE_TRIES = 3  # a directory made and removed (by gc) before it could be opened is made again


@contextlib.contextmanager
def opened(queue: Queue, parts: Sequence[str], *, create: bool = False) -> Iterator[int | None]:
    """A descriptor of ``.spark/PARTS...`` of ``queue``, reached as the
    module's docstring says, held for the block; None if a directory on the
    way is missing (``create``: made instead)."""
    fd = _queue_directory(queue)
    path = queue.path
    held: int | None = fd  # the descriptor to close
    try:
        for part in (SPARK_AREA, *parts):
            path = os.path.join(path, part)
            inner = _step(fd, part, path, create)
            os.close(fd)
            held = inner
            if inner is None:
                break
            fd = inner
        yield held
    finally:
        if held is not None:
            os.close(held)


@contextlib.contextmanager
def subdirectory(directory: int | None, name: str, path: str | None = None) -> Iterator[int | None]:
    """Directory ``name`` of ``directory`` held open for the block; None if
    there is none (or ``directory`` is None). A symbolic link or a non-directory
    there is refused (:class:`StorageError`) when ``path`` (its path, for the
    message) is given; otherwise it is None too, as an entry of a listing
    that is no directory of the area's."""
    fd = None
    if directory is not None:
        try:
            fd = _open_directory(directory, name)
        except OSError as exc:
            if exc.errno in _GONE:
                pass  # none there
            elif exc.errno not in _NO_DIRECTORY or path is not None:
                raise _error(exc, path or name) from exc
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


def names(directory: int) -> list[str]:
    """The names in ``directory`` (a descriptor of it)."""
    return os.listdir(directory)


def read_file(directory: int, name: str, limit: int) -> bytes | None:
    """The content of file ``name`` of ``directory``; None if it is missing,
    no regular file (a link, a FIFO...), over ``limit`` bytes, or unreadable."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def create_file(directory: int, name: str, data: bytes) -> bool:
    """Write ``data`` durably as a new file ``name`` of ``directory`` (file
    and directory synced); False if the name exists (another writer has it,
    complete or not). FileNotFoundError: the directory was removed since
    it was opened (gc): reach it again."""
    try:
        fd = os.open(name, _CREATE_FLAGS, 0o644, dir_fd=directory)
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno in _CREATE_LOST and _exists(directory, name):
            return False
        raise
    try:
        with os.fdopen(fd, "wb", closefd=False) as stream:
            stream.write(data)
        os.fsync(fd)
    except BaseException:
        # never complete: take the name back
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=directory)
        raise
    finally:
        os.close(fd)
    os.fsync(directory)
    return True


def _exists(directory: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return False
    return True


def _queue_directory(queue: Queue) -> int:
    """A descriptor of the queue's directory, checked to be the queue ``queue`` opened."""
    expected = queue.id  # (an unpickled handle reads it now, from the queue at its path)
    try:
        fd = os.open(queue.path, _DIRECTORY_FLAGS)
    except OSError as exc:
        if exc.errno in _GONE:
            raise QueueNotFound(f"no queue at {queue.path} any more") from None
        if exc.errno in _NO_DIRECTORY:
            raise QueueNotFound(f"not a vsqs queue: {queue.path} is a symbolic link or no directory now "
                                "(vsqs follows none)") from None
        raise _error(exc, queue.path) from exc
    data = read_file(fd, METADATA, MAX_CONTROL_FILE)
    try:
        found = load_json(data).get("queue_id") if data is not None else None
    except (ValueError, AttributeError):
        found = None
    if found != expected:
        os.close(fd)
        raise QueueNotFound(f"{queue.path} is not the queue this handle opened (queue id {expected}) any more: "
                            f"another queue, or none, is there now ({METADATA} names {found!r:.20})")
    return fd


def _step(directory: int, name: str, path: str, create: bool) -> int | None:
    """Directory ``name`` of ``directory`` opened (made first if missing and
    ``create``); None if missing. A link or non-directory: StorageError."""
    for _ in range(_MAKE_TRIES):
        try:
            return _open_directory(directory, name)
        except FileNotFoundError:
            if not create:
                return None
        except OSError as exc:
            raise _error(exc, path) from exc
        try:
            os.mkdir(name, 0o777, dir_fd=directory)  # (the umask applies, as to every directory vsqs makes)
        except FileExistsError:
            pass  # made meanwhile by another task (or something else is there: the open says what)
        except OSError as exc:
            raise _error(exc, path, "cannot make directory") from exc
    raise StorageError(errno.ENOENT, "directory removed as soon as it was made, again and again", path)


def _open_directory(directory: int, name: str) -> int:
    if name in ("", os.curdir, os.pardir) or os.sep in name:
        raise OSError(errno.EINVAL, "not a name below the directory", name)
    return os.open(name, _DIRECTORY_FLAGS, dir_fd=directory)


def _error(exc: OSError, path: str, what: str = "cannot open directory") -> StorageError:
    if exc.errno in _NO_DIRECTORY:
        return StorageError(errno.ENOTDIR, "not a directory (a symbolic link?): not followed", path)
    return StorageError(exc.errno or 0, f"{what}: {exc.strerror or exc}", path)
