"""This process's wake-up hub: one thread that keeps every :class:`~vsqs._core.wakeup.Watch` informed.

It reads the kernel's notifications (inotify, where the filesystem gives
them), looks at polled queues' directories (a ``stat`` each, every
``poll_interval`` while someone waits), fires the watches' timers, and drops
watches nobody used for a while. See :mod:`vsqs._core.wakeup` for what a
watch does with the news. One hub per process (:func:`hub`); a forked child
makes its own.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import inotify as _inotify
from vsqs._core.errors import StorageError
from vsqs._core.format import State
from vsqs._core.limits import DEFAULT_POLL_INTERVAL
from vsqs._core.settings import SETTINGS_DIR
from vsqs._core.turns import Turns
from vsqs._core.wakeup import LINE_GRACE, Watch

log = logging.getLogger("vsqs")

LINGER = 5.0  # seconds a watch outlives its last waiter (a worker's next receive finds it still there)
CHECK_EVERY = 5.0  # seconds between the hub's looks (a stat) at a kernel-watched queue while someone waits
POLL_SAFETY = 0.5  # a polled queue is listed at least this often while someone waits (a stat may be cached)
RECENT = 2.0  # a directory changed this recently (by its mtime) may change again unseen: look again

# every state change of a message is a rename (a publish too: KEY.new -> KEY) or an unlink:
# the creation of a .new file, which wakes nobody, is not asked for in a shard; a flat
# queue's own directory is asked for creations too (.groups and .settings made later)
_MESSAGE_EVENTS = _inotify.IN_MOVED_TO | _inotify.IN_MOVED_FROM | _inotify.IN_DELETE
_SIDE_EVENTS = _inotify.IN_CLOSE_WRITE | _inotify.IN_MOVED_TO | _inotify.IN_MOVED_FROM | _inotify.IN_DELETE
_ARRIVING = _inotify.IN_MOVED_TO | _inotify.IN_CREATE
_ARRIVING_GEN = _inotify.IN_CLOSE_WRITE | _inotify.IN_MOVED_TO  # a generation of a slot, written whole
_LEAVING = _inotify.IN_MOVED_FROM | _inotify.IN_DELETE
_WATCH_GONE = _inotify.IN_IGNORED | _inotify.IN_DELETE_SELF | _inotify.IN_MOVE_SELF
SIDE_DIRS = (_format.GROUPS_DIR, SETTINGS_DIR)  # a slot freed, a setting changed: list again
# what a watched directory is to its queue, and what the kernel is asked to tell of it
_MESSAGES, _QUEUE, _SIDE, _TURNS = "messages", "queue", "side", "turns"
_MASKS = {
    _MESSAGES: _MESSAGE_EVENTS,  # a flat queue's directory, or a shard
    _QUEUE: _inotify.IN_CREATE | _inotify.IN_MOVED_TO,  # a sharded queue's own: .groups, .settings made later
    _SIDE: _SIDE_EVENTS,
    _TURNS: _inotify.IN_CREATE | _inotify.IN_MOVED_TO | _inotify.IN_DELETE | _inotify.IN_MOVED_FROM,
}


class Notifier(Protocol):
    """What the hub needs of a kernel notifier (inotify; a fake one in tests)."""

    fd: int

    def add(self, directory: str, mask: int) -> int: ...
    def remove(self, wd: int) -> None: ...
    def read(self) -> list[_inotify.Event]: ...
    def close(self) -> None: ...


class Hub:
    """This process's watches, fed by one thread: kernel events, looks at polled queues, timers.

    ``notifier`` makes the kernel notifier (``None``: none, every queue is polled);
    a test hands a fake one through :func:`install`."""

    def __init__(self, notifier: Callable[[], Notifier] | None = _inotify.Inotify) -> None:
        self._make_notifier = notifier
        self._notifier: Notifier | None = None
        self._kernel_off: str | None = None if notifier is not None else "no notifier"
        self._lock = threading.Lock()
        self.watches: dict[str, Watch] = {}
        self._by_wd: dict[int, tuple[Watch, str, str]] = {}  # wd -> (watch, directory, its role below)
        self._turns: dict[str, Turns] = {}  # by queue path: this process's place in its line
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._next_wake = math.inf
        self._linger_at = -math.inf  # when to look for watches nobody uses next
        self._stopped = False

    # -- watches ---------------------------------------------------------------

    def acquire(
        self, path: str, message_dirs: list[str], poll_interval: float | None, mode: int | None = None,
        keep: object = None,
    ) -> Watch:
        """The watch of the queue at ``path`` (made and started if new), counted as used
        (``mode``: the queue's file mode, for this process's entry in its line; ``keep``:
        what holds the directories of the paths open, kept as long as the watch)."""
        with self._lock:
            watch = self.watches.get(path)
            if watch is None:
                side_dirs = [os.path.join(path, name) for name in SIDE_DIRS]
                watch = Watch(path, message_dirs, side_dirs, self._poll_interval(path, poll_interval))
                watch.on_timer = self.timer_set
                watch.keep = keep
                watch.stamp = _stamp([*message_dirs, *side_dirs])  # (a change before the first look counts)
                if watch.poll_interval is None and not self._watch_kernel(watch, mode):
                    watch.poll_interval = poll_interval or DEFAULT_POLL_INTERVAL
                self.watches[path] = watch
                _now_watching()
                self._start()
            elif poll_interval is not None and watch.poll_interval is not None:
                watch.poll_interval = min(watch.poll_interval, poll_interval)
            watch.users += 1
            return watch

    def release(self, watch: Watch) -> None:
        with self._lock:
            watch.users -= 1
            if watch.users <= 0:
                watch.idle_since = time.monotonic()

    def published(self, path: str, names: Iterable[str]) -> None:
        """Names this process just made ready in the queue at ``path``: told at once (any filesystem)."""
        watch = self.watches.get(path)
        if watch is not None:
            for name in names:
                watch.arrived(name)

    def _poll_interval(self, path: str, asked: float | None) -> float | None:
        """None where the kernel tells of every change; else the seconds between looks."""
        if self._kernel_off is None and _inotify.is_local(_inotify.filesystem_type(path)):
            return None
        return asked or DEFAULT_POLL_INTERVAL

    def _watch_kernel(self, watch: Watch, mode: int | None) -> bool:
        """Add the kernel's watches of a queue, and take this process's place in its line;
        False (polled instead) if the watches cannot be had."""
        try:
            if self._notifier is None:
                assert self._make_notifier is not None
                self._notifier = self._make_notifier()
            notifier = self._notifier
            places = [(d, _MESSAGES) for d in watch.message_dirs]
            if watch.path not in watch.message_dirs:
                places.append((watch.path, _QUEUE))  # (for .groups and .settings made later)
            places += [(d, _SIDE) for d in watch.side_dirs]
            for directory, role in places:
                self._add(notifier, watch, directory, role)
            turns = Turns(watch.path, mode)
            if turns.start():  # (False: no line here; every process claims at once)
                self._add(notifier, watch, turns.dir, _TURNS)
                self._turns[watch.path] = turns
                watch.turns_kept = True
            return True
        except _inotify.Unavailable as exc:
            self._kernel_off = str(exc)
            log.warning("vsqs: %s; waiting receives poll instead (every %g s)", exc, DEFAULT_POLL_INTERVAL)
            self._drop_kernel(watch)
            return False

    def _add(self, notifier: Notifier, watch: Watch, directory: str, role: str) -> None:
        # never through a symlink at the last component; but a directory held open (fs.Pin) is
        # named by its descriptor's link in /proc, which leads to that directory itself
        mask = _MASKS[role] | (0 if _fs.is_pin(directory) else _inotify.IN_DONT_FOLLOW)
        if directory == watch.path:  # (a flat queue's: messages, and the side directories made later)
            mask |= _inotify.IN_CREATE
        try:
            wd = notifier.add(directory, mask)
        except OSError:  # not there (yet): .groups is made with the first group; a missing shard
            return
        watch.wds[wd] = directory
        self._by_wd[wd] = (watch, directory, role)

    def _drop_kernel(self, watch: Watch) -> None:
        for wd in list(watch.wds):
            self._by_wd.pop(wd, None)
            if self._notifier is not None:
                self._notifier.remove(wd)
        watch.wds.clear()

    # -- the thread --------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is not None:
            return
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="vsqs-wakeup", daemon=True)
        self._thread.start()

    def timer_set(self, due: float) -> None:
        """A sleeper asked to be woken at ``due``: make the thread look sooner if it must."""
        if due < self._next_wake and self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # full (the thread will look anyway) or closed (stopped)
                pass

    def _run(self) -> None:
        while not self._stopped:
            try:
                self._turn()
            except Exception:  # never let the thread die: waiters would oversleep
                log.exception("vsqs: the wake-up thread failed; going on")
                time.sleep(0.1)

    def _turn(self) -> None:
        self._next_wake = math.inf  # working out the next wake: a timer set meanwhile pokes the pipe
        now_mono, now_us = time.monotonic(), _format.now_us()
        soonest = now_mono + CHECK_EVERY
        with self._lock:
            watches = list(self.watches.values())
        for watch in watches:
            soonest = min(soonest, watch.next_timer(now_mono, now_us), self._next_look(watch))
            turns = self._turns.get(watch.path)
            if turns is not None and turns.entered:
                soonest = min(soonest, watch.emptied_at + LINE_GRACE)
        self._next_wake = soonest
        readable = [self._wake_r]
        if self._notifier is not None:
            readable.append(self._notifier.fd)
        ready, _, _ = select.select(readable, [], [], max(0.0, soonest - time.monotonic()))
        self._next_wake = math.inf  # looking now: a timer set meanwhile pokes the pipe (a turn more)
        if self._wake_r in ready:
            try:
                os.read(self._wake_r, 4096)
            except OSError:
                pass
        if self._notifier is not None and self._notifier.fd in ready:
            self._dispatch(self._notifier.read())
        now_mono, now_us = time.monotonic(), _format.now_us()
        for watch in watches:
            try:
                self._tend(watch, now_mono, now_us)
            except Exception:  # (one queue's trouble, a directory gone say, never holds up the others)
                log.exception("vsqs: the wake-up of %s failed; going on", _fs.shown(watch.path))
                watch.changed()
        if now_mono >= self._linger_at:
            self._linger_at = now_mono + 1.0
            self._linger(now_mono)

    def _tend(self, watch: Watch, now_mono: float, now_us: int) -> None:
        """A watch's part of a turn: its timers, its place in line, a look if one is due."""
        passed_over = watch.fire(now_mono, now_us)
        turns = self._turns.get(watch.path)
        if turns is not None:
            for name in passed_over:
                turns.passed_over(name)
            self._keep_place(watch, turns, now_mono)
        if now_mono >= self._next_look(watch):
            self._look(watch, now_mono)

    @staticmethod
    def _keep_place(watch: Watch, turns: Turns, now: float) -> None:
        """In the queue's line while a receive here waits (and a little after: a worker's
        next receive comes soon), out of it after LINE_GRACE without one."""
        if watch.has_sleepers():
            turns.enter()
        elif turns.entered and now - watch.emptied_at >= LINE_GRACE:
            turns.leave()

    def _next_look(self, watch: Watch) -> float:
        if not watch.has_sleepers():
            return math.inf
        every = CHECK_EVERY if watch.poll_interval is None else watch.poll_interval
        return watch.looked_at + every

    def _look(self, watch: Watch, now: float) -> None:
        """A stat of the queue's directories: a change no notification told of means list again."""
        stamp = _stamp([*watch.message_dirs, *watch.side_dirs])
        wall = time.time()
        moved = stamp != watch.stamp
        if watch.poll_interval is None:
            # someone still sleeps although the directories changed: whether or not
            # a notification told of it, one sleeper lists (a lost one costs this long)
            missed = moved
            if missed:
                self._rewatch(watch)
        else:
            recent = any(isinstance(s, tuple) and s[0] >= (watch.looked_wall - RECENT) * 1e9 for s in stamp)
            missed = moved or recent or now - watch.prodded_at >= POLL_SAFETY
        watch.stamp, watch.looked_at, watch.looked_wall = stamp, now, wall
        if missed:
            watch.prodded_at = now
            watch.changed()

    def _rewatch(self, watch: Watch) -> None:
        """Add the watches of directories that were missing (a shard made again by gc,
        .groups or .settings whose creation was missed)."""
        if self._notifier is None or watch.path not in self.watches:
            return
        with self._lock:
            watched = set(watch.wds.values())
            for directory in watch.message_dirs:
                if directory not in watched:
                    self._add(self._notifier, watch, directory, _MESSAGES)
            for directory in watch.side_dirs:
                if directory not in watched:
                    self._add(self._notifier, watch, directory, _SIDE)

    def _dispatch(self, events: list[_inotify.Event]) -> None:
        for event in events:
            if event.mask & _inotify.IN_Q_OVERFLOW:  # events were lost: everyone lists again
                for watch in list(self.watches.values()):
                    watch.changed()
                continue
            found = self._by_wd.get(event.wd)
            if found is None:
                continue
            watch, directory, role = found
            mask = event.mask
            if mask & _WATCH_GONE:
                with self._lock:
                    self._by_wd.pop(event.wd, None)
                    watch.wds.pop(event.wd, None)
                watch.changed()
                continue
            if mask & _inotify.IN_ISDIR:
                if event.name in SIDE_DIRS and directory == watch.path and self._notifier is not None:
                    with self._lock:
                        self._add(self._notifier, watch, os.path.join(directory, event.name), _SIDE)
                    watch.changed()  # (what was written in it before the watch, unseen)
                continue
            if role == _TURNS:
                turns = self._turns.get(watch.path)
                if turns is not None:
                    turns.seen(event.name, bool(mask & _ARRIVING))
                continue
            if role != _MESSAGES:
                if role == _SIDE and (os.path.basename(directory) != _format.GROUPS_DIR or (
                        mask & _ARRIVING_GEN and _slot_freed(directory, event.name))):
                    watch.changed()  # a setting changed, or a group's slot was freed: list again
                continue
            name = _format.parse_name(event.name)
            if name is None or name.state is State.WRITING:
                continue
            if mask & _ARRIVING:
                if name.state is State.READY:
                    turns = self._turns.get(watch.path)
                    delay = turns.delay(event.name) if turns is not None and watch.has_sleepers() else 0.0
                    watch.arrived(event.name, delay)
                else:
                    watch.hidden(event.name, name.until_us)
            elif mask & _LEAVING:
                watch.left(event.name)

    def _linger(self, now: float) -> None:
        """Drop the watches nobody used for LINGER seconds (their kernel watches too)."""
        with self._lock:
            for path, watch in list(self.watches.items()):
                if watch.users <= 0 and now - watch.idle_since >= LINGER and not watch.has_sleepers():
                    del self.watches[path]
                    self._drop_kernel(watch)
                    turns = self._turns.pop(path, None)
                    if turns is not None:
                        turns.leave()
                    watch.changed()  # a handle still holding it lists again when it comes back

    def leave_lines(self) -> None:
        """Take this process out of every queue's line (it stops waiting: exit, close)."""
        for turns in list(self._turns.values()):
            turns.leave()

    def close(self) -> None:
        """Stop the thread and let go of the kernel's watches (tests; a forked child)."""
        self._stopped = True
        self.timer_set(-math.inf)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self.leave_lines()
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._notifier is not None:
            self._notifier.close()


def _slot_freed(directory: str, name: str) -> bool:
    """Whether the new file ``name`` of ``.groups/`` frees a slot (a generation that says
    ``free``; one that cannot be read counts too). A slot taken, a run's mark: no."""
    if _format.parse_lease_name(name) is None:
        return False
    try:
        data = _fs.read_control(os.path.join(directory, name))
    except StorageError:
        return True
    return data is not None and _format.decode_lease(data) in (0, None)  # (None: damaged, unreadable)


def _stamp(directories: list[str]) -> tuple[object, ...]:
    """What a look sees of each directory: its times, size and inode (None: not there)."""
    stamp: list[object] = []
    for directory in directories:
        st = _fs.lstat(directory)  # (a directory held open: its own, not its link in /proc)
        if st is None:
            stamp.append(None)
            continue
        stamp.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_nlink))
    return tuple(stamp)


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """This process's hub, made on first use."""
    global _hub
    if _hub is None:
        with _hub_lock:
            if _hub is None:
                _hub = Hub()
    return _hub


def install(new: Hub | None) -> Hub | None:
    """Put ``new`` in place of this process's hub (None: a fresh one on next use); the old one,
    not closed. The seam for tests: a hub with a fake notifier, or none (every queue polled)."""
    global _hub
    with _hub_lock:
        old, _hub = _hub, new
    return old


def wake_all(path: str) -> None:
    """Wake every receive of this process waiting on the queue at ``path``."""
    current = _hub
    watch = current.watches.get(path) if current is not None else None
    if watch is not None:
        watch.wake_all()


def published(path: str, names: Iterable[str]) -> None:
    """Tell this process's waiters on the queue at ``path`` of names it just made ready.
    (On every publish: callers test :data:`watching` first, a global read.)"""
    current = _hub
    if current is not None and current.watches:
        current.published(path, names)


watching = False  # whether this process ever watched a queue (then publishes tell the hub)


def _now_watching() -> None:
    global watching
    watching = True


def _forget_in_child() -> None:
    """A forked child has its parent's descriptors but not its thread: it starts its own hub."""
    global _hub
    old, _hub = _hub, None
    if old is not None:
        old._stopped = True
        for fd in (old._wake_r, old._wake_w, old._notifier.fd if old._notifier is not None else -1):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        old._wake_r = old._wake_w = -1


def _leave_lines_at_exit() -> None:
    if _hub is not None:
        _hub.leave_lines()


atexit.register(_leave_lines_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
