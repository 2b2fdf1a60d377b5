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

import contextlib
import errno
import os
import shutil
import stat
import threading
import time
import weakref

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
# nothing there: gone, or a directory of the path that is not one (below a pin, a link is not one)
_NOT_THERE = _GONE | {errno.ENOTDIR} | _LINK_ERRNOS


def storage_error(exc: OSError, what: str, path: str | None = None) -> StorageError:
    """Translate an OSError, keeping errno and the file's name (``path``, as
    a person knows it: see :func:`shown`); ``what`` says what failed."""
    name = path if path is not None else exc.filename
    err = StorageError(exc.errno or 0, f"{what}: {exc.strerror or exc}", shown(name) if isinstance(name, str) else name)
    err.__cause__ = exc
    return err


def exists(path: str) -> bool:
    """Whether ``path`` exists; errors other than absence count as existing.
    A path through something that is not a directory (ENOTDIR, or a link
    below a pin) does not exist, nor does a pinned directory since removed."""
    try:
        status = _lstat(path)
    except OSError as exc:
        return exc.errno != errno.ESTALE
    return status is not None and (status.st_nlink > 0 or path not in _PINS or path in _NO_NLINK)


def _lstat(path: str) -> os.stat_result | None:
    """``lstat`` of ``path``; None if it is not there (see :data:`_NOT_THERE`)."""
    try:
        name, fd, owned = _at(path)
    except OSError as exc:
        if exc.errno in _NOT_THERE:
            return None
        raise
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _NOT_THERE:
            return None
        raise
    finally:
        if owned:
            os.close(fd)  # type: ignore[arg-type]


def mtime(path: str) -> float | None:
    """Modification time, or ``None`` if the file is gone."""
    try:
        name, fd, owned = _at(path)
    except OSError as exc:
        if exc.errno in _NOT_THERE:
            return None
        raise storage_error(exc, "cannot stat file", path) from exc
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ESTALE:
            return None
        raise storage_error(exc, "cannot stat file", path) from exc
    finally:
        if owned:
            os.close(fd)  # type: ignore[arg-type]


def list_names(directory: str) -> list[str]:
    """One listing of a queue directory: names only, no stat."""
    try:
        if not directory.startswith(PINNED):
            return os.listdir(directory)
        fd = _open_dir(directory)  # (a descriptor of its own: listdir rewinds the one it is given)
        try:
            names = os.listdir(fd)
            if not names and directory in _PINS and directory not in _NO_NLINK:
                _check_alive(fd)
            return names
        finally:
            os.close(fd)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise QueueNotFound(f"queue directory is gone: {shown(directory)}") from exc
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise QueueNotFound(f"not a directory (a symbolic link?): {shown(directory)}") from exc
        if exc.errno == errno.ESTALE and _pin_removed(directory):  # held open, removed on the server
            raise QueueNotFound(f"queue directory is gone: {shown(directory)}") from exc
        raise storage_error(exc, "cannot list queue directory", directory) from exc


def list_files(directory: str) -> tuple[list[str], list[str]]:
    """One listing of a directory that tells regular files from the rest:
    (names of regular files, names of everything else: directories, FIFOs,
    symlinks, devices, sockets). The type comes from the listing itself
    where the filesystem gives it (no stat); else one ``lstat`` per entry.
    An entry gone in between is left out."""
    files: list[str] = []
    others: list[str] = []
    fd = None
    try:
        fd = _open_dir(directory) if directory.startswith(PINNED) else None
        with os.scandir(directory if fd is None else fd) as listing:
            for entry in listing:
                try:
                    regular = entry.is_file(follow_symlinks=False)
                except OSError:
                    continue  # gone since the listing (or unreadable: not a file of ours)
                (files if regular else others).append(entry.name)
        if fd is not None and not files and not others and directory in _PINS and directory not in _NO_NLINK:
            _check_alive(fd)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise QueueNotFound(f"queue directory is gone: {shown(directory)}") from exc
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            raise QueueNotFound(f"not a directory (a symbolic link?): {shown(directory)}") from exc
        if exc.errno == errno.ESTALE and _pin_removed(directory):  # held open, removed on the server
            raise QueueNotFound(f"queue directory is gone: {shown(directory)}") from exc
        raise storage_error(exc, "cannot list queue directory", directory) from exc
    finally:
        if fd is not None:
            os.close(fd)
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
        head, _, name = path.rpartition("/")
        at = _PINS.get(head)
        if at is not None:  # the hot path inline: a name directly in a held directory
            fd = os.open(name, _CREATE_FLAGS, 0o666 if mode is None else mode & 0o777, dir_fd=at)
        else:
            fd = _create(path, mode)
    except OSError as exc:
        _create_failed(exc, path)
        return False  # taken
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
        raise storage_error(exc, "cannot write message file", path) from exc
    try:
        os.close(fd)  # NFS reports deferred write errors at close
    except OSError as exc:
        _unlink_quietly(path)
        raise storage_error(exc, "cannot write message file", path) from exc
    return True


def create_open(path: str, data: bytes, mode: int | None = None) -> int | None:
    """:func:`create_exclusive` (a hot path: not shared) less fsync and close: the
    open descriptor, for :func:`sync_and_close`; ``None`` if the name was taken."""
    try:
        head, _, name = path.rpartition("/")
        at = _PINS.get(head)
        if at is not None:  # the hot path inline: a name directly in a held directory
            fd = os.open(name, _CREATE_FLAGS, 0o666 if mode is None else mode & 0o777, dir_fd=at)
        else:
            fd = _create(path, mode)
    except OSError as exc:
        _create_failed(exc, path)
        return None
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except OSError as exc:
        os.close(fd)
        _unlink_quietly(path)
        raise storage_error(exc, "cannot write message file", path) from exc
    return fd


def _create(path: str, mode: int | None) -> int:
    """The exclusive create of ``path`` (see create_exclusive); raises OSError."""
    name, at, owned = _at(path)
    try:
        return os.open(name, _CREATE_FLAGS, 0o666 if mode is None else mode & 0o777, dir_fd=at)
    finally:
        if owned:
            os.close(at)  # type: ignore[arg-type]


def _create_failed(exc: OSError, path: str) -> None:
    """Return if the name was taken (a lost race), else raise."""
    if exc.errno == errno.EEXIST or (exc.errno in _CREATE_LOST and exists(path)):
        return  # taken (even if gone again since: someone else's race)
    if exc.errno in (errno.EPERM, errno.EIO) and _can_create_beside(path):
        return  # sshfs (EPERM), the HDFS gateway (EIO), a stale cache: a name beside works: lost
    if exc.errno in _NOT_THERE and not exists(os.path.dirname(path)):
        raise QueueNotFound(f"queue directory is gone: {shown(os.path.dirname(path))}") from exc
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        _unlink_quietly(path)  # some filesystems leave the entry behind; only then is it ours
    raise storage_error(exc, "cannot create message file", path) from exc


def sync_and_close(fd: int, path: str) -> None:
    """fsync and close what :func:`create_open` returned for ``path`` (on a
    failure the file is removed, the error raised); many may run at once."""
    try:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)  # NFS reports deferred write errors at close
    except OSError as exc:
        _unlink_quietly(path)
        raise storage_error(exc, "cannot write message file", path) from exc


def rename(src: str, dst: str) -> bool:
    """Move ``src`` to the fresh name ``dst``; ``False`` if ``src`` was gone.

    ``dst`` must be a name no one else renames to, except where every racer
    would move the same file to the same end state.
    """
    try:
        # the hot path inline (a call costs here): both names directly in held directories
        src_head, _, src_name = src.rpartition("/")
        src_at = _PINS.get(src_head)
        dst_head, _, dst_name = dst.rpartition("/")
        dst_at = _PINS.get(dst_head)
        if src_at is not None and dst_at is not None:
            os.rename(src_name, dst_name, src_dir_fd=src_at, dst_dir_fd=dst_at)
        else:
            _rename_at(src, dst)
        return True
    except OSError as exc:
        if exc.errno in _AMBIGUOUS or exc.errno in _NOT_THERE:
            if exists(dst):
                return True  # ours: a retransmitted rename that had succeeded
            if exc.errno in _NOT_THERE or not exists(src):
                # lost the race. After ENOENT/ESTALE the server has said the source
                # is gone; a stat that still finds it reads a stale client cache
                # (seen on sshfs), so it is not asked
                return False
        raise storage_error(exc, "cannot rename message file", src) from exc


def _rename_at(src: str, dst: str) -> None:
    """``rename(2)`` of two paths, each relative to its pinned directory if it has one."""
    src_name, src_at, src_owned = _at(src)
    try:
        dst_name, dst_at, dst_owned = _at(dst)
        try:
            os.rename(src_name, dst_name, src_dir_fd=src_at, dst_dir_fd=dst_at)
        finally:
            if dst_owned:
                os.close(dst_at)  # type: ignore[arg-type]
    finally:
        if src_owned:
            os.close(src_at)  # type: ignore[arg-type]


def unlink(path: str) -> bool:
    """Remove ``path``; ``False`` if it was already gone."""
    try:
        head, _, name = path.rpartition("/")
        at = _PINS.get(head)
        if at is not None:  # the hot path inline: a name directly in a held directory
            os.unlink(name, dir_fd=at)
            return True
        name, at, owned = _at(path)
        try:
            os.unlink(name, dir_fd=at)
        finally:
            if owned:
                os.close(at)  # type: ignore[arg-type]
        return True
    except OSError as exc:
        if exc.errno in _NOT_THERE or (exc.errno in _AMBIGUOUS and not exists(path)):
            return False
        raise storage_error(exc, "cannot delete message file", path) from exc


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
        head, _, name = path.rpartition("/")
        at = _PINS.get(head)
        # the hot path inline: a name directly in a held directory; see _READ_FLAGS
        fd = os.open(name, _READ_FLAGS, dir_fd=at) if at is not None else _open_file(path)
    except OSError as exc:
        _open_failed(exc, path)
        return None
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
                                   "a file here can have", shown(path))
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
            raise DamagedEntry(errno.EFBIG, f"file grew over the {limit} bytes a file here can have", shown(path))
        return b"".join(chunks)
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        if exc.errno in (errno.EISDIR, errno.EAGAIN, errno.EINVAL):  # a directory, a FIFO with a writer...
            _regular_size(fd, path)
        raise storage_error(exc, "cannot read message file", path) from exc
    finally:
        os.close(fd)


def read_head(path: str, limit: int) -> tuple[bytes, int] | None:
    """The first ``limit`` bytes of the regular file ``path`` and its whole
    size, or ``None`` if it is gone: a look at a message that never reads
    all of a large body (the gateway's console peeks this way). Anything but
    a regular file is a :class:`DamagedEntry`, as for :func:`read`."""
    try:
        fd = _open_file(path)
    except OSError as exc:
        _open_failed(exc, path)
        return None
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
        raise storage_error(exc, "cannot read message file", path) from exc
    finally:
        os.close(fd)


def _open_file(path: str) -> int:
    """Open ``path`` to read it: see _READ_FLAGS (never follows, never blocks)."""
    name, at, owned = _at(path)
    try:
        return os.open(name, _READ_FLAGS, dir_fd=at)
    finally:
        if owned:
            os.close(at)  # type: ignore[arg-type]


def _open_failed(exc: OSError, path: str) -> None:
    """Return if the file is gone (or a directory of its path is not one:
    nothing there), else raise what the failed open of ``path`` means."""
    if exc.errno in (errno.ENOENT, errno.ESTALE, errno.ENOTDIR):
        return
    if exc.errno in _LINK_ERRNOS:
        raise DamagedEntry(exc.errno, "not a regular file (a symbolic link): not followed", shown(path)) from None
    if exc.errno == errno.ENXIO:  # a socket (or a device with nothing behind it)
        raise DamagedEntry(exc.errno, "not a regular file (a socket or device)", shown(path)) from None
    raise storage_error(exc, "cannot open message file", path) from exc


def _regular_size(fd: int, path: str) -> int:
    """The size of the regular file ``fd``; :class:`DamagedEntry` if it is
    anything else (off the hot path: fstat)."""
    status = os.fstat(fd)
    if status.st_mode & _FILE_TYPE != _REGULAR:
        raise DamagedEntry(errno.EINVAL, f"not a regular file ({_kind(status.st_mode)})", shown(path))
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
    pinned = _PINS.get(directory)  # (a pinned directory's own descriptor does)
    try:
        # O_RDONLY|O_DIRECTORY: a descriptor good only for fsync; O_CLOEXEC as above.
        fd = pinned if pinned is not None else _open_dir(directory)
    except OSError as exc:
        raise storage_error(exc, "cannot open queue directory", directory) from exc
    try:
        os.fsync(fd)
    except OSError as exc:
        # some FUSE and network filesystems cannot fsync a directory; their
        # servers commit metadata synchronously anyway
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise storage_error(exc, "cannot fsync queue directory", directory) from exc
    finally:
        if pinned is None:
            os.close(fd)


def make_dirs(directory: str, mode: int | None = None) -> None:
    """Create ``directory``, a directory of a queue (``.settings``, a stage,
    a shard...), and its parents if missing. ``mode`` (a file mode such as
    0o660) is given to the directory if this call creates it, as for
    :func:`make_dir`. An entry already there that is not a directory itself
    (a symlink, even to a directory) is refused: vsqs never follows one out
    of the queue."""
    try:
        parent = os.path.dirname(directory) or "."
        if parent.startswith(PINNED):
            _make_pinned_parents(parent)
        else:
            os.makedirs(parent, exist_ok=True)
        _mkdir_at(directory, _creation_dir_mode(mode))
    except FileExistsError:
        if not is_private_dir(directory):
            raise StorageError(
                errno.ENOTDIR, "not a directory of the queue (a symlink?): not followed", shown(directory)
            ) from None
        return
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise StorageError(
                errno.ENOTDIR, "not a directory of the queue (a symlink?): not followed", shown(directory)
            ) from None
        raise storage_error(exc, "cannot create directory", directory) from exc
    _set_dir_mode(directory, mode)


def _make_pinned_parents(directory: str) -> None:
    """The directories of ``directory`` below its pin, made where missing with
    the umask's modes (a link among them is ENOTDIR: never followed)."""
    if len(directory.rpartition("/")[0]) < _PINNED_LENGTH:
        return  # the pin itself
    _make_pinned_parents(os.path.dirname(directory))
    with contextlib.suppress(FileExistsError):
        _mkdir_at(directory, 0o777)


def _mkdir_at(directory: str, mode: int) -> None:
    name, at, owned = _at(directory)
    try:
        os.mkdir(name, mode, dir_fd=at)
    finally:
        if owned:
            os.close(at)  # type: ignore[arg-type]


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
        _mkdir_at(directory, _creation_dir_mode(mode))
    except OSError as exc:
        raise storage_error(exc, "cannot create directory", directory) from exc
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
        fd = _open_dir(directory)
    except OSError as exc:
        raise storage_error(exc, "cannot set the mode of a new directory", directory) from exc
    try:
        inherited = os.fstat(fd).st_mode & stat.S_ISGID  # a setgid spool passes it down
        os.fchmod(fd, dir_mode(mode) | inherited)
    except OSError as exc:
        raise storage_error(exc, "cannot set the mode of a new directory", directory) from exc
    finally:
        os.close(fd)


def rename_dir(src: str, dst: str) -> bool:
    """Move the directory ``src`` (ours alone) to ``dst``; ``False`` if ``dst``
    is already a non-empty directory. POSIX never replaces a non-empty one."""
    try:
        _rename_at(src, dst)
        return True
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
            return False
        if exc.errno in _AMBIGUOUS and not exists(src):
            return True  # no one else renames our private directory: it moved
        if exists(src) and (exc.errno == errno.EPERM or is_dir(dst)):
            # another creator won, told in other words: sshfs answers EPERM (SFTP's "failure"),
            # and may not show the winner's directory yet; we could make ours beside it, so
            # EPERM is no lack of permission here
            return False
        raise storage_error(exc, "cannot move new queue directory into place", src) from exc


def remove_tree_quietly(directory: str, names: list[str]) -> None:
    """Remove our own private directory holding ``names``; leftovers are harmless."""
    for name in names:
        _unlink_quietly(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        name, at, owned = _at(directory)
        try:
            os.rmdir(name, dir_fd=at)
        finally:
            if owned:
                os.close(at)  # type: ignore[arg-type]


def remove_tree(directory: str) -> None:
    """Remove a private directory and everything in it (symlinks are not followed)."""
    if not directory.startswith(PINNED):
        shutil.rmtree(directory, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        name, at, owned = _at(directory)
        try:
            for _, dirs, files, fd in os.fwalk(name, topdown=False, follow_symlinks=False, dir_fd=at):
                for entry in files:
                    with contextlib.suppress(OSError):
                        os.unlink(entry, dir_fd=fd)
                for entry in dirs:  # (a link to a directory is listed here, never entered: unlinked)
                    with contextlib.suppress(OSError):
                        try:
                            os.rmdir(entry, dir_fd=fd)
                        except NotADirectoryError:
                            os.unlink(entry, dir_fd=fd)
            os.rmdir(name, dir_fd=at)
        finally:
            if owned:
                os.close(at)  # type: ignore[arg-type]


def is_private_dir(path: str) -> bool:
    """Whether ``path`` is a directory itself, not a symlink to one: vsqs's own
    subdirectories are never followed out of the queue."""
    try:
        status = _lstat(path)
    except OSError:
        return False
    return status is not None and stat.S_ISDIR(status.st_mode) and (
        status.st_nlink > 0 or path not in _PINS or path in _NO_NLINK)


def is_dir(path: str) -> bool:
    """Whether ``path`` is a directory, or a symlink to one (for a spool's root)."""
    if path.startswith(PINNED):
        return is_private_dir(path)  # below a pin nothing is followed
    return os.path.isdir(path)


def is_link(path: str) -> bool:
    """Whether ``path`` itself is a symbolic link (``lstat``): a queue directory
    that is one is refused, whatever it points to."""
    try:
        status = _lstat(path)
    except OSError:
        return False
    return status is not None and stat.S_ISLNK(status.st_mode)


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
        name, at, owned = _at(probe)
        try:
            # O_CREAT|O_EXCL on a name no one else uses; O_WRONLY, O_CLOEXEC as above
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=at))
        finally:
            if owned:
                os.close(at)  # type: ignore[arg-type]
    except OSError:
        return False
    _unlink_quietly(probe)
    return True


def _unlink_quietly(path: str) -> None:
    try:
        name, at, owned = _at(path)
        try:
            os.unlink(name, dir_fd=at)
        finally:
            if owned:
                os.close(at)  # type: ignore[arg-type]
    except OSError:
        pass  # gc removes what is left


# -- pinned directories ------------------------------------------------------
#
# A queue's directory is opened once, when a handle opens the queue, and every
# later operation goes through that descriptor (the *at system calls), so it
# stays inside the directory it opened whatever happens to the path: a queue
# directory (or a shard) swapped for a symbolic link, or renamed, later is
# never followed. Callers keep building paths as strings: a pinned directory's
# path is ``/proc/self/fd/N`` (the descriptor's own name on Linux), and every
# primitive here turns a path below it into a call relative to descriptor N
# (no lookup through /proc happens, so it works where there is none). A
# deeper path (``N/.groups/x``) is walked one ``O_NOFOLLOW`` open at a time.

PINNED = "/proc/self/fd/"
_PINNED_LENGTH = len(PINNED)
# O_DIRECTORY|O_NOFOLLOW: a directory itself, never what a symlink points to;
# O_RDONLY: good for listing and fsync; O_CLOEXEC as above; O_NONBLOCK: a FIFO
# planted under the name never blocks the open (O_DIRECTORY refuses it)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_pins_lock = threading.RLock()  # (re-entered by a pin let go of by the garbage collector while it is held)
_PINS: dict[str, int] = {}  # pin path -> its descriptor (read without the lock: one dict lookup)
_SHOWN: dict[str, str] = {}  # pin path -> the path it was opened at, for messages
_BY_IDENTITY: weakref.WeakValueDictionary[tuple[int, int], Pin] = weakref.WeakValueDictionary()


class Pin:
    """A directory held open. ``path`` names the directory itself (its
    descriptor), not what the path it was opened at (``shown``) leads to
    later; the descriptor is closed when the last holder lets go. Handles
    of one directory share a pin (one descriptor per directory)."""

    __slots__ = ("__weakref__", "fd", "identity", "path", "shown")

    def __init__(self, fd: int, shown: str, identity: tuple[int, int]) -> None:
        self.fd, self.path, self.shown, self.identity = fd, f"{PINNED}{fd}", shown, identity

    def __repr__(self) -> str:
        return f"Pin({self.shown!r})"


def pin(path: str) -> Pin:
    """Open the directory at ``path`` and hold it. Its last component (and,
    below a pin, every component) must be a directory itself: a symbolic
    link there raises :class:`StorageError` (ENOTDIR), a missing one
    :class:`QueueNotFound`."""
    try:
        fd = _open_dir(path)
    except OSError as exc:
        if exc.errno in _GONE:
            raise QueueNotFound(f"no such directory: {shown(path)}") from None
        if exc.errno in _LINK_ERRNOS or exc.errno == errno.ENOTDIR:
            raise StorageError(errno.ENOTDIR, "not a directory (a symbolic link?): not followed", shown(path)) from None
        raise storage_error(exc, "cannot open directory", path) from exc
    try:
        status = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise storage_error(exc, "cannot open directory", path) from exc
    identity = (status.st_dev, status.st_ino)
    with _pins_lock:
        held = _BY_IDENTITY.get(identity)
        if held is not None and _identity(held.fd) == identity:
            os.close(fd)
            return held
        made = Pin(fd, shown(path), identity)
        _PINS[made.path], _SHOWN[made.path], _OWNERS[made.path] = fd, made.shown, id(made)
        _BY_IDENTITY[identity] = made
        if status.st_nlink == 0:  # (fuse-dfs counts no links of a directory: nlink tells nothing there)
            _NO_NLINK.add(made.path)
    # (not at exit: the descriptor closes with the process, and until then exit handlers may use it)
    weakref.finalize(made, _unpin, made.path, fd, id(made)).atexit = False
    return made


_OWNERS: dict[str, int] = {}  # pin path -> id() of the Pin that holds it
_close = os.close  # (a pin let go of closes its descriptor whatever stands in for os: tests' crash points)
_NO_NLINK: set[str] = set()  # pins on a filesystem that reports no links of a directory


def _after_fork_in_child() -> None:
    global _pins_lock
    _pins_lock = threading.RLock()  # (another thread of the parent may have held it at the fork)


os.register_at_fork(after_in_child=_after_fork_in_child)


def moved(held: Pin) -> bool:
    """Whether the path ``held`` was opened at no longer leads to it: the
    directory was removed, renamed away or replaced (a link put there
    included). An error other than absence says nothing: False."""
    try:
        status = os.stat(held.shown, follow_symlinks=False)
    except OSError as exc:
        return exc.errno in _NOT_THERE
    return (status.st_dev, status.st_ino) != held.identity


def lstat(path: str) -> os.stat_result | None:
    """``lstat`` of ``path`` (below a pin: through it), None if it cannot be had."""
    try:
        return _lstat(path)
    except OSError:
        return None


def lstat_message(path: str) -> os.stat_result | None:
    """``lstat`` of the message file ``path``; None only if it is not there (a racer
    took it): any other failure (EIO, ESTALE, EACCES...) raises StorageError, so
    that a caller never takes a file it could not look at for one that is gone."""
    try:
        return _lstat(path)
    except OSError as exc:
        raise storage_error(exc, "cannot stat message file", path) from exc


def remove_message(path: str) -> bool | None:
    """Remove the message file ``path`` unless it is damage (docs/FORMAT.md: purge,
    gc and retention never remove damage): True if this call unlinked it, False if
    it was not there (a racer took it), None if it is damage, left in place: no
    regular file, or one larger than MAX_MESSAGE_FILE. Any failure to look at it or
    unlink it raises StorageError."""
    status = lstat_message(path)
    if status is None:
        return False
    if not stat.S_ISREG(status.st_mode) or status.st_size > MAX_MESSAGE_FILE:
        return None
    return unlink(path)


def _identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of the open ``fd``, None if it is not open (closed behind our back)."""
    try:
        status = os.fstat(fd)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _unpin(path: str, fd: int, owner: int) -> None:
    """Let go of a pin nobody holds any more (its descriptor closed, unless its
    number was found closed behind our back and is another pin's now)."""
    with _pins_lock:
        if _OWNERS.get(path) != owner:
            return
        del _OWNERS[path], _PINS[path], _SHOWN[path]
        _NO_NLINK.discard(path)
        with contextlib.suppress(OSError):
            _close(fd)


def is_pin(path: str) -> bool:
    """Whether ``path`` is the path of a directory held open (a :class:`Pin`'s own)."""
    return path in _PINS


def shown(path: str) -> str:
    """``path`` as a person knows it: a pinned directory's path replaced by the one it was opened at."""
    if not path.startswith(PINNED):
        return path
    number, sep, rest = path[_PINNED_LENGTH:].partition("/")
    base = _SHOWN.get(PINNED + number)
    return path if base is None else base + sep + rest


def _at(path: str) -> tuple[str, int | None, bool]:
    """How to reach ``path``: (name, directory descriptor or None, whether the
    caller must close that descriptor). A path directly in a pinned directory
    costs one dict lookup; the pin itself is ``"."`` in it."""
    head, _, name = path.rpartition("/")
    fd = _PINS.get(head)
    if fd is not None:
        return name, fd, False
    if not path.startswith(PINNED):
        return path, None, False
    if len(head) < _PINNED_LENGTH:  # the pin itself
        fd = _PINS.get(path)
        if fd is None:
            raise StorageError(errno.EBADF, "not a directory vsqs holds open", path)
        return ".", fd, False
    return name, _open_dir(head), True


def _pin_removed(directory: str) -> bool:
    """Whether ``directory`` is a pinned directory (not one below it) that was removed."""
    fd = _PINS.get(directory)
    if fd is None or directory in _NO_NLINK:
        return False
    try:
        _check_alive(fd)
    except FileNotFoundError:
        return True
    return False


def _check_alive(fd: int) -> None:
    """Raise FileNotFoundError if the directory ``fd`` was removed: its listing
    is empty then, not an error (glibc's readdir hides the kernel's ENOENT)."""
    try:
        removed = os.fstat(fd).st_nlink == 0
    except OSError as exc:  # NFS: ESTALE for a directory removed on the server
        removed = exc.errno in _GONE
    if removed:
        raise FileNotFoundError(errno.ENOENT, "directory removed")


def _open_dir(path: str) -> int:
    """A new descriptor of the directory ``path`` (below a pin: walked from it
    one O_NOFOLLOW open at a time; ``..`` is refused). Raises OSError."""
    if not path.startswith(PINNED):
        return os.open(path, _DIR_FLAGS)
    number, _, rest = path[_PINNED_LENGTH:].partition("/")
    fd = _PINS.get(PINNED + number)
    if fd is None:
        raise StorageError(errno.EBADF, "not a directory vsqs holds open", path)
    current = os.open(".", _DIR_FLAGS, dir_fd=fd)  # a descriptor of its own (listings must not share an offset)
    try:
        for part in rest.split("/") if rest else ():
            if part in ("", ".", ".."):
                raise OSError(errno.ENOENT, "not a name below the directory", path)
            inner = os.open(part, _DIR_FLAGS, dir_fd=current)
            os.close(current)
            current = inner
    except OSError as exc:
        os.close(current)
        if exc.errno in _LINK_ERRNOS:  # a directory of the path is a link: for the caller, no directory
            raise OSError(errno.ENOTDIR, "a directory of the path is a symbolic link: not followed", path) from None
        raise
    return current
