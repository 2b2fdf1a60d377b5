"""Linux inotify, and what kind of filesystem a path lives on.

A thin layer over the three system calls (``inotify_init1``,
``inotify_add_watch``, ``inotify_rm_watch``) through :mod:`ctypes`, and the
reading of the events from the descriptor. It is this thin on purpose: the
wake-up hub (:mod:`vsqs._core.wakeup`) needs a descriptor it can wait on
with its own ``select`` beside its timers, events parsed in batches, and
``ENOSPC``/``EMFILE`` (the kernel's ``max_user_watches`` and
``max_user_instances``) reported as such, not raised from a thread it does
not own. The well-kept libraries (inotify_simple, watchdog) either add a
thread and an observer model of their own or are a copy of these same 80
lines; none is needed elsewhere in vsqs.

Inotify sees changes made through this host's kernel only: on a network
filesystem (NFS, SMB, FUSE mounts such as sshfs or fuse-dfs, cluster
filesystems) another host's change makes no event. :func:`is_local` tells
them apart by the filesystem type of the mount a path lives on.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import struct
import sys
from typing import NamedTuple

# event kinds (linux/inotify.h)
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000  # the kernel's event queue overflowed: events were lost
IN_IGNORED = 0x00008000  # the watch is gone (its directory removed, or rm_watch)
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000  # a symlink put in a directory's place is not watched through
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len

# Filesystems on which another host (or another kernel) changes what this
# host sees, so that inotify is blind to some changes: poll there.
NETWORK_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "9p", "afs", "ceph", "glusterfs", "lustre",
    "gpfs", "gfs2", "ocfs2", "beegfs", "orangefs", "pvfs2", "virtiofs", "davfs", "coda", "fuse",
})


class Event(NamedTuple):
    wd: int
    mask: int
    name: str


class Unavailable(Exception):
    """Inotify cannot be had here: not Linux, no such call, or a kernel limit reached."""

    def __init__(self, why: str, limit: bool = False) -> None:
        super().__init__(why)
        self.limit = limit  # a kernel limit (max_user_watches, max_user_instances), not an absent feature


class Inotify:
    """One inotify descriptor: watches added and removed by directory, events read in batches."""

    def __init__(self) -> None:
        libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise Unavailable(f"inotify_init1: {os.strerror(code)}", code in (errno.EMFILE, errno.ENFILE))
        self._libc = libc
        self.fd = fd

    def add(self, directory: str, mask: int) -> int:
        """Watch ``directory`` for ``mask`` (with IN_DONT_FOLLOW: never through a symlink
        at its last component); the watch descriptor.
        Unavailable(limit=True) when the kernel's watch limit is reached; OSError if the
        directory cannot be watched (gone, not a directory)."""
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(directory), mask | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSPC:
                raise Unavailable("inotify watch limit reached (fs.inotify.max_user_watches)", limit=True)
            raise OSError(code, os.strerror(code), directory)
        return int(wd)

    def remove(self, wd: int) -> None:
        """Stop a watch (quietly if it is gone already)."""
        self._libc.inotify_rm_watch(self.fd, wd)

    def read(self) -> list[Event]:
        """The events waiting on the descriptor (none if there are none)."""
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        events = []
        offset, end, header = 0, len(data), _HEADER
        while offset + header.size <= end:
            wd, mask, _cookie, length = header.unpack_from(data, offset)
            offset += header.size
            raw = data[offset:offset + length].split(b"\0", 1)[0]
            offset += length
            events.append(Event(wd, mask, os.fsdecode(raw)))
        return events

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _libc() -> ctypes.CDLL:
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"no inotify on {sys.platform}")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    try:
        init, add, remove = libc.inotify_init1, libc.inotify_add_watch, libc.inotify_rm_watch
    except AttributeError as exc:
        raise Unavailable("the C library has no inotify") from exc
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes, add.restype = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32], ctypes.c_int
    remove.argtypes, remove.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return libc


def filesystem_type(path: str, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The type of the filesystem ``path`` lives on (``ext4``, ``nfs4``, ``fuse.sshfs``...),
    from this process's mount table; None where there is none to read."""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    target = os.path.realpath(path)
    best, found = -1, None
    for line in lines:
        fields = line.split(" ")
        try:
            separator = fields.index("-")
            point, kind = _unescape(fields[4]), fields[separator + 1]
        except (ValueError, IndexError):
            continue
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:  # the last of equal mount points is the one on top
            best, found = len(point), kind
    return found


def is_local(kind: str | None) -> bool:
    """Whether inotify sees every change of a filesystem of type ``kind`` (None: unknown, no)."""
    if kind is None:
        return False
    return kind.split(".", 1)[0] not in NETWORK_TYPES


def _unescape(text: str) -> str:
    """A mount point as mountinfo writes it (space, tab, newline and backslash as octal escapes)."""
    if "\\" not in text:
        return text
    return text.encode("latin-1", "surrogateescape").decode("unicode_escape").encode(
        "latin-1").decode("utf-8", "surrogateescape")
