"""The system calls: the only module that touches the filesystem.

Each primitive is one atomic operation (or one file write), and this is the
one place an :class:`OSError` becomes a vsqs error. A *lost race* is not an
error: the primitives report it as ``False`` so callers move on.

Network filesystems report a lost race with many errnos (NFS: ``ENOENT`` or
``ESTALE`` for a vanished source, and ``ENOENT`` for a retransmitted rename
that succeeded; sshfs: ``EPERM`` for a lost exclusive create; the HDFS NFS
gateway: ``EIO``, ``EACCES``). So on any of them we look (``stat``) before
deciding: a rename whose unique destination exists was ours; a source that is
gone was lost; anything else is a real error.

Tests patch these functions to inject crashes between the steps of a
transition, so callers must use them as ``_fs.name(...)``.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import time

from vsqs._core.errors import DamagedEntry, QueueNotFound, StorageError
from vsqs._core.limits import MAX_CONTROL_FILE, MAX_MESSAGE_FILE

# errnos that may mean "someone else got there first" on some filesystem
_AMBIGUOUS = frozenset({errno.ENOENT, errno.ESTALE, errno.EIO, errno.EACCES, errno.EPERM})
_CREATE_LOST = frozenset({errno.EEXIST}) | _AMBIGUOUS
_GONE = frozenset({errno.ENOENT, errno.ESTALE})  # the server said: no such file
_READ_SIZE = 1 << 20
# O_CREAT|O_EXCL: atomic claim of the name, also over NFSv3+; O_WRONLY: write only;
# O_CLOEXEC: never leaks into child processes
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
# O_RDONLY: read only; O_CLOEXEC as above; O_NOFOLLOW: a symlink planted in the
# queue is never followed; O_NONBLOCK: the open of a FIFO planted in the queue
# returns at once instead of waiting for a writer (the fstat that follows
# refuses it; a regular file ignores the flag); O_NOCTTY: a terminal device
# planted there never becomes ours
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
_FILE_TYPE, _REGULAR = 0o170000, stat.S_IFREG  # the S_IFMT bits of st_mode, and a regular file's
# what open(O_NOFOLLOW) answers for a symlink: Linux ELOOP, FreeBSD EMLINK, NetBSD EFTYPE
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)})


def storage_error(exc: OSError, what: str) -> StorageError:
    """Translate an OSError, keeping errno and file name; ``what`` says what failed."""
    err = StorageError(exc.errno or 0, f"{what}: {exc.strerror or exc}", exc.filename)
    err.__cause__ = exc
    return err


def exists(path: str) -> bool:
    """Whether ``path`` exists; errors other than absence count as existing.
    A path through something that is not a directory (ENOTDIR) does not exist."""
    try:
        os.stat(path, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ESTALE:
            return False
        return True
    return True


def mtime(path: str) -> float | None:
    """Modification time, or ``None`` if the file is gone."""
    try:
        return os.stat(path, follow_symlinks=False).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ESTALE:
            return None
        raise storage_error(exc, "cannot stat file") from exc


def list_names(directory: str) -> list[str]:
    """One listing of a queue directory: names only, no stat."""
    try:
        return os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise QueueNotFound(f"queue directory is gone: {directory}") from exc
    except OSError as exc:
        raise storage_error(exc, "cannot list queue directory") from exc


def list_files(directory: str) -> tuple[list[str], list[str]]:
    """One listing of a directory that tells regular files from the rest:
    (names of regular files, names of everything else: directories, FIFOs,
    symlinks, devices, sockets). The type comes from the listing itself
    where the filesystem gives it (no stat); else one ``lstat`` per entry.
    An entry gone in between is left out."""
    files: list[str] = []
    others: list[str] = []
    try:
        with os.scandir(directory) as listing:
            for entry in listing:
                try:
                    regular = entry.is_file(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing (or unreadable: not a file of ours)
                (files if regular else others).append(entry.name)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise QueueNotFound(f"queue directory is gone: {directory}") from exc
    except OSError as exc:
        raise storage_error(exc, "cannot list queue directory") from exc
    return files, others


def create_exclusive(path: str, data: bytes, *, durable: bool, mode: int | None = None) -> bool:
    """Create ``path`` holding ``data``; ``False`` if the name was taken.

    ``mode`` (e.g. 0o660 for a spool shared by a group) is given to the new
    file: it is created with no bit that ``mode`` lacks (the kernel takes
    away the umask's too), then ``fchmod`` sets ``mode`` exactly, so the
    file is never more open than asked, not even for an instant. Without
    it the process umask applies. On a write failure (a full disk, say) the
    partial file is removed and the error raised, so no half-written file
    survives.
    """
    # _CREATE_FLAGS: O_CREAT|O_EXCL, see above; the creation mode: 0o666 less the
    # umask, or only bits of ``mode`` (we never touch the process-wide umask)
    try:
        fd = os.open(path, _CREATE_FLAGS, 0o666 if mode is None else mode & 0o777)
    except OSError as exc:
        if exc.errno == errno.EEXIST or (exc.errno in _CREATE_LOST and exists(path)):
            return False  # taken (even if gone again since: someone else's race)
        if exc.errno in (errno.EPERM, errno.EIO) and _can_create_beside(path):
            # sshfs answers a lost O_EXCL race with EPERM, the HDFS gateway with EIO,
            # and a stale negative cache may still say the name is free: if a fresh
            # name beside it can be created, the directory is fine and the race was lost
            return False
        if exc.errno == errno.ENOENT and not exists(os.path.dirname(path)):
            raise QueueNotFound(f"queue directory is gone: {os.path.dirname(path)}") from exc
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            _unlink_quietly(path)  # some filesystems leave the entry behind; only then is it ours
        raise storage_error(exc, "cannot create message file") from exc
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # up to the exact mode, never through the process-wide umask
        written = os.write(fd, data)
        if written < len(data):  # a short write: write the rest
            view = memoryview(data)[written:]
            while view:
                view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        _unlink_quietly(path)
        raise storage_error(exc, "cannot write message file") from exc
    try:
        os.close(fd)  # NFS reports deferred write errors at close
    except OSError as exc:
        _unlink_quietly(path)
        raise storage_error(exc, "cannot write message file") from exc
    return True


def rename(src: str, dst: str) -> bool:
    """Move ``src`` to the fresh name ``dst``; ``False`` if ``src`` was gone.

    ``dst`` must be a name no one else renames to, except where every racer
    would move the same file to the same end state.
    """
    try:
        os.rename(src, dst)
        return True
    except OSError as exc:
        if exc.errno in _AMBIGUOUS:
            if exists(dst):
                return True  # ours: a retransmitted rename that had succeeded
            if exc.errno in _GONE or not exists(src):
                # lost the race. After ENOENT/ESTALE the server has said the source
                # is gone; a stat that still finds it reads a stale client cache
                # (seen on sshfs), so it is not asked
                return False
        raise storage_error(exc, "cannot rename message file") from exc


def unlink(path: str) -> bool:
    """Remove ``path``; ``False`` if it was already gone."""
    try:
        os.unlink(path)
        return True
    except OSError as exc:
        if exc.errno in _GONE or (exc.errno in _AMBIGUOUS and not exists(path)):
            return False
        raise storage_error(exc, "cannot delete message file") from exc


def read(path: str, limit: int = MAX_MESSAGE_FILE) -> bytes | None:
    """The whole content of the regular file ``path``, or ``None`` if it is gone.

    Anything else planted under that name (a FIFO, a directory, a symlink,
    a device) and a file over ``limit`` bytes (a sparse 10 GB file, say) is a
    :class:`DamagedEntry`: the open never blocks (O_NONBLOCK), nothing is
    followed (O_NOFOLLOW), and no more than ``limit`` + 1 bytes, and at most
    one read's worth before the size is known, are ever held.

    The common case costs what it always did: one read that returns the
    message and one that returns nothing (only that says "end of file" on a
    network filesystem). A FIFO or a socket refuses the read or gives
    nothing, a directory refuses it (EISDIR); an empty read or a full one is
    then checked with ``fstat`` (a regular file? its size?), which costs
    CPython five times a read on this hot path and is left off it.
    """
    try:
        fd = os.open(path, _READ_FLAGS)  # see _READ_FLAGS: never follows, never blocks
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESTALE, errno.ENOTDIR):
            return None  # gone (ENOTDIR: a directory of the path is not one: nothing there)
        if exc.errno in _LINK_ERRNOS:
            raise DamagedEntry(exc.errno, "not a regular file (a symbolic link): not followed", path) from None
        if exc.errno == errno.ENXIO:  # a socket (or a device with nothing behind it)
            raise DamagedEntry(exc.errno, "not a regular file (a socket or device)", path) from None
        raise storage_error(exc, "cannot open message file") from exc
    try:
        first = min(_READ_SIZE, limit + 1)
        data = os.read(fd, first)
        if data and len(data) < first:
            more = os.read(fd, first)
            if not more:
                return data  # the common case: a regular file (a FIFO would have refused) read whole
            chunks, total = [data, more], len(data) + len(more)
        else:  # nothing, or a whole read's worth: is it a regular file, and how large?
            size = _regular_size(fd, path)
            if size > limit or len(data) > limit:
                raise DamagedEntry(errno.EFBIG, f"file of {max(size, len(data))} bytes, over the {limit} "
                                   "a file here can have", path)
            if not data:
                return data
            chunks, total = [data], len(data)
        while total <= limit:
            chunk = os.read(fd, min(_READ_SIZE, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise DamagedEntry(errno.EFBIG, f"file grew over the {limit} bytes a file here can have", path)
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        if exc.errno in (errno.EISDIR, errno.EAGAIN, errno.EINVAL):  # a directory, a FIFO with a writer...
            _regular_size(fd, path)
        raise storage_error(exc, "cannot read message file") from exc
    finally:
        os.close(fd)


def read_head(path: str, limit: int) -> tuple[bytes, int] | None:
    """The first ``limit`` bytes of the regular file ``path`` and its whole
    size, or ``None`` if it is gone: a look at a message that never reads
    all of a large body (the gateway's console peeks this way). Anything but
    a regular file is a :class:`DamagedEntry`, as for :func:`read`."""
    try:
        fd = os.open(path, _READ_FLAGS)  # see _READ_FLAGS: never follows, never blocks
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESTALE, errno.ENOTDIR):
            return None
        if exc.errno in _LINK_ERRNOS:
            raise DamagedEntry(exc.errno, "not a regular file (a symbolic link): not followed", path) from None
        if exc.errno == errno.ENXIO:
            raise DamagedEntry(exc.errno, "not a regular file (a socket or device)", path) from None
        raise storage_error(exc, "cannot open message file") from exc
    try:
        size = _regular_size(fd, path)  # before any read: a FIFO is never read
        chunks, total = [], 0
        while total < limit:
            chunk = os.read(fd, min(_READ_SIZE, limit - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        return b"".join(chunks), size
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        raise storage_error(exc, "cannot read message file") from exc
    finally:
        os.close(fd)


def _regular_size(fd: int, path: str) -> int:
    """The size of the regular file ``fd``; :class:`DamagedEntry` if it is
    anything else (off the hot path: fstat)."""
    status = os.fstat(fd)
    if status.st_mode & _FILE_TYPE != _REGULAR:
        raise DamagedEntry(errno.EINVAL, f"not a regular file ({_kind(status.st_mode)})", path)
    return status.st_size


def read_control(path: str) -> bytes | None:
    """The content of a small file of vsqs's own (a settings version, a lease,
    a reservation, a dead-letter source), or ``None`` if it is gone; ``b""``
    (what its readers skip as "does not parse") if it is damaged: not a
    regular file, or over MAX_CONTROL_FILE bytes."""
    try:
        return read(path, MAX_CONTROL_FILE)
    except DamagedEntry:
        return b""


def _kind(mode: int) -> str:
    """What a file that is not regular is, in a word or two, for a report."""
    for test, word in (
        (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return word
    return f"file type {stat.S_IFMT(mode):o}"


def fsync_dir(directory: str) -> None:
    """Make the directory's entries durable (new names after create/rename)."""
    try:
        # O_RDONLY|O_DIRECTORY: a descriptor good only for fsync; O_CLOEXEC as above.
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise storage_error(exc, "cannot open queue directory") from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        # some FUSE and network filesystems cannot fsync a directory; their
        # servers commit metadata synchronously anyway
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise storage_error(exc, "cannot fsync queue directory") from exc
    finally:
        os.close(fd)


def make_dirs(directory: str, mode: int | None = None) -> None:
    """Create ``directory``, a directory of a queue (``.settings``, a stage,
    a shard...), and its parents if missing. ``mode`` (a file mode such as
    0o660) is given to the directory if this call creates it, as for
    :func:`make_dir`. An entry already there that is not a directory itself
    (a symlink, even to a directory) is refused: vsqs never follows one out
    of the queue."""
    try:
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        os.mkdir(directory, _creation_dir_mode(mode))
    except FileExistsError as exc:
        if not is_private_dir(directory):
            raise StorageError(
                errno.ENOTDIR, f"not a directory of the queue (a symlink?): not followed: {exc.filename}", directory
            ) from exc
        return
    except OSError as exc:
        raise storage_error(exc, "cannot create directory") from exc
    _set_dir_mode(directory, mode)


def make_root(directory: str) -> None:
    """Create ``directory`` and its parents if missing, with the umask's
    modes: a spool's root, or the directory a queue is made in. A symlink to
    a directory is fine here: where the spool lies is the operator's choice."""
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError as exc:  # something that is not a directory
        raise StorageError(errno.ENOTDIR, f"not a directory: {exc.filename}", directory) from exc
    except OSError as exc:
        raise storage_error(exc, "cannot create directory") from exc


def make_dir(directory: str, mode: int | None = None) -> None:
    """Create one new directory; it must not exist. ``mode`` (a file mode)
    gives it :func:`dir_mode`: it is created with no bit that mode lacks,
    then set to it exactly, keeping a setgid bit it inherited."""
    try:
        os.mkdir(directory, _creation_dir_mode(mode))
    except OSError as exc:
        raise storage_error(exc, "cannot create directory") from exc
    _set_dir_mode(directory, mode)


def dir_mode(file_mode: int) -> int:
    """The mode of a directory holding files of ``file_mode``: x wherever r."""
    return file_mode | ((file_mode & 0o444) >> 2)


def _creation_dir_mode(mode: int | None) -> int:
    """The mode mkdir is given: 0o777 (less the umask), or only bits of the
    directory's final mode, so it is never more open than asked."""
    return 0o777 if mode is None else dir_mode(mode) & 0o777


def _set_dir_mode(directory: str, mode: int | None) -> None:
    if mode is None:
        return
    try:
        # O_DIRECTORY|O_NOFOLLOW: the directory just made, never what a symlink
        # put in its place since would point to; O_CLOEXEC as above
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise storage_error(exc, "cannot set the mode of a new directory") from exc
    try:
        inherited = os.fstat(fd).st_mode & stat.S_ISGID  # a setgid spool passes it down
        os.fchmod(fd, dir_mode(mode) | inherited)
    except OSError as exc:
        raise storage_error(exc, "cannot set the mode of a new directory") from exc
    finally:
        os.close(fd)


def rename_dir(src: str, dst: str) -> bool:
    """Move the directory ``src`` (ours alone) to ``dst``; ``False`` if ``dst``
    is already a non-empty directory. POSIX never replaces a non-empty one."""
    try:
        os.rename(src, dst)
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        if exc.errno in _AMBIGUOUS and not exists(src):
            return True  # no one else renames our private directory: it moved
        raise storage_error(exc, "cannot move new queue directory into place") from exc


def remove_tree_quietly(directory: str, names: list[str]) -> None:
    """Remove our own private directory holding ``names``; leftovers are harmless."""
    for name in names:
        _unlink_quietly(os.path.join(directory, name))
    try:
        os.rmdir(directory)
    except OSError:
        pass


def remove_tree(directory: str) -> None:
    """Remove a private directory and everything in it (symlinks are not followed)."""
    shutil.rmtree(directory, ignore_errors=True)


def is_private_dir(path: str) -> bool:
    """Whether ``path`` is a directory itself, not a symlink to one: vsqs's own
    subdirectories are never followed out of the queue."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory, or a symlink to one (for a spool's root)."""
    return os.path.isdir(path)


def is_link(path: str) -> bool:
    """Whether ``path`` itself is a symbolic link (``lstat``): a queue directory
    that is one is refused, whatever it points to."""
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def inside(path: str, root: str) -> str | None:
    """``path`` with its directories resolved (symlinks followed), if that
    lies inside ``root`` (resolved too) and is not ``root`` itself; else
    ``None``. For a path read from the spool: it must lead nowhere outside.
    The last component is kept as it is (whoever opens it refuses a link)."""
    if not os.path.isabs(path) or os.path.normpath(path) != path or "\0" in path:
        return None
    name = os.path.basename(path)
    if name in ("", ".", ".."):
        return None
    try:
        parent, base = os.path.realpath(os.path.dirname(path)), os.path.realpath(root)
    except (OSError, ValueError):
        return None
    if parent != base and not parent.startswith(base.rstrip(os.sep) + os.sep):
        return None
    return os.path.join(parent, name)


def _can_create_beside(path: str) -> bool:
    """Whether a fresh file can be created in ``path``'s directory (then removed)."""
    probe = f"{path}.probe-{os.getpid()}-{time.monotonic_ns()}"
    try:
        # O_CREAT|O_EXCL on a name no one else uses; O_WRONLY, O_CLOEXEC as above
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError:
        return False
    _unlink_quietly(probe)
    return True


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gc removes what is left
