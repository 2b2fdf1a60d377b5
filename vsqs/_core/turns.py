"""Whose turn it is: which of the processes waiting on a queue claims a message that lands.

On a local filesystem every waiting process hears of a message at once
(inotify). Were they all to try to claim it, one would win and the rest
would lose a rename and list the directory for nothing: a storm that grows
with the number of waiting processes. Instead each process with a waiting
receive keeps one empty file in the queue's ``.waiting/`` directory, named
after itself (:func:`vsqs._core.format.waiter_name`), and every process
knows the others from that directory's notifications. A message that lands
has an order of its own over those processes (a hash of its name and
theirs: no process has to talk to another); the first claims it at once,
the k-th only if it is still there ``k`` x :data:`STAGGER` later. The one
whose turn it is is almost always there, so a message costs one rename.

The order is a hint, never a rule: a process not yet in the directory, or
one whose entry was lost, claims at once (a lost race at worst), and a
process whose turn came because those before it are gone (killed: their
entries remain) checks them and removes the entries of the dead, so the
next message does not wait for them.
"""

from __future__ import annotations

import os
import time

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core.errors import VsqsError

STAGGER = 0.002  # seconds between one process's turn at a message and the next one's
# a process waits for at most this many turns before its own (entries planted in the
# directory, or many processes, cost a message at most this many x STAGGER), and
# knows of at most MAX_WAITERS others (the rest are not waited for)
MAX_TURNS = 8
MAX_WAITERS = 1024
FOREIGN_AGE = 3600.0  # an entry of another boot (or host) older than this is removed


class Turns:
    """This process's place in one queue's line of waiting processes."""

    def __init__(self, queue_path: str, mode: int | None) -> None:
        self.dir = os.path.join(queue_path, _format.WAITING_DIR)
        self._mode = mode
        self.me = _identity()
        self.others: set[str] = set()  # the entries of this boot's other processes
        self.entered = False

    def start(self) -> bool:
        """Make the directory if need be and read who is in it (the dead removed, at most
        MAX_WAITERS entries looked at); False if it cannot be had (no write permission, a
        link or a file in its place...): no line, every process claims at once."""
        try:
            _fs.make_dirs(self.dir, self._mode)
            if not _fs.is_private_dir(self.dir):
                return False
            names = _fs.list_names(self.dir)
        except (VsqsError, OSError):
            return False
        for name in names[:MAX_WAITERS]:
            self.seen(name, True, tidy=True)
        return True

    def seen(self, name: str, arrived: bool, tidy: bool = False) -> None:
        """An entry of the directory arrived or left (``tidy``: remove it if its process is gone)."""
        parsed = _format.parse_waiter_name(name)
        if parsed is None or name == self.me:
            return
        if not arrived:
            self.others.discard(name)
            return
        boot, pid, start = parsed
        if boot != self.me.split("-", 1)[0]:  # another boot's (or host's): no process of ours
            if tidy and _older_than(os.path.join(self.dir, name), FOREIGN_AGE):
                self._remove(name)
            return
        if tidy and not _alive(pid, start):
            self._remove(name)
            return
        if len(self.others) < MAX_WAITERS:
            self.others.add(name)

    def delay(self, name: str) -> float:
        """How long this process lets the ones before it in ``name``'s order claim it first."""
        if not self.others:
            return 0.0
        return STAGGER * min(MAX_TURNS, _format.waiter_rank(name, self.others | {self.me}, self.me))

    def passed_over(self, name: str) -> None:
        """``name``'s turn reached this process: those before it did not claim it in time.
        Remove the entries of the ones that are gone, so the next message does not wait for them."""
        mine = _format.waiter_key(name, self.me)
        ahead = [other for other in self.others if _format.waiter_key(name, other) < mine]
        for other in ahead[:MAX_TURNS]:  # (those further ahead were not waited for)
            parsed = _format.parse_waiter_name(other)
            if parsed is not None and not _alive(parsed[1], parsed[2]):
                self._remove(other)
                self.others.discard(other)

    def enter(self) -> None:
        """Be in the line (this process has waiting receives)."""
        if not self.entered:
            try:
                _fs.create_exclusive(os.path.join(self.dir, self.me), b"", durable=False, mode=self._mode)
            except (VsqsError, OSError):  # (the directory went: the others do not wait for us; no harm)
                return
            self.entered = True

    def leave(self) -> None:
        """Leave the line (no waiting receive here for a while)."""
        if self.entered:
            self._remove(self.me)
            self.entered = False

    def _remove(self, name: str) -> None:
        """Remove an entry; one that cannot be removed (a directory planted there...) stays."""
        try:
            _fs.unlink(os.path.join(self.dir, name))
        except (VsqsError, OSError):
            pass


def _identity() -> str:
    """This process's entry: its boot, pid, and start time (read from /proc)."""
    boot = (_read("/proc/sys/kernel/random/boot_id") or "0" * 16).replace("-", "")[:16].ljust(16, "0")
    pid = os.getpid()
    return _format.waiter_name(boot, pid, _start_time(pid) or 0)


def _start_time(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    if stat is None:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])  # field 22: starttime, in clock ticks
    except (IndexError, ValueError):
        return None


def _alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` that started at ``start`` still runs (on this boot)."""
    return _start_time(pid) == start


def _older_than(path: str, seconds: float) -> bool:
    modified = _fs.mtime(path)
    return modified is not None and time.time() - modified > seconds


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read(4096).strip()
    except OSError:
        return None
