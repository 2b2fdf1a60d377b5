"""Waking a waiting receive when a message may have become claimable.

A receive that waits (``receive(wait=...)``, the worker, a long poll of the
gateway, ``areceive``) sleeps on its queue's :class:`Watch`, one per queue
per process, shared by every handle and every waiter of that queue in the
process. A :class:`Hub` (one per process, one thread) keeps the watches
informed (:mod:`vsqs._core.hub`):

- **Kernel notifications** (Linux inotify, on local filesystems): every
  name that lands in a message directory is told to the watch. A ready name
  (a publish, a release, a redrive) wakes one sleeper and is handed to it
  (no listing needed); a hidden name (a delayed publish, another consumer's
  lease) becomes a timer; a change in ``.groups/`` (a slot freed) or
  ``.settings/`` wakes one sleeper to list again.
- **Polling** where notifications do not reach (NFS, SMB, FUSE mounts, a
  kernel's watch limit reached): the hub looks at the directories (a
  ``stat`` each) every ``poll_interval`` while someone waits, and wakes one
  sleeper to list when one changed.
- **Timers**: a hidden name's time is in its name; the hub wakes one sleeper
  when it is due, and a sleeper may ask to be woken when a name of its own
  listing is.
- **This process's publishes** tell the watch at once, on any filesystem.

Sleepers are woken one at a time: a sleeper that was woken and claimed
something wakes the next (there may be more), one that found nothing does
not (the next would find nothing either). So a message that lands while a
thousand wait costs one attempt in this process, not a thousand.

A notification is a hint, like a listing. One that is lost or repeated costs
latency or a wasted attempt, never a message: the hub's periodic look at the
directories catches a change that no notification announced, and what a
sleeper is handed is claimed by the usual rename, which one consumer wins.
Nothing here decides what is claimable; it decides only when to look.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable

ARRIVALS = 4096  # names a watch keeps for its sleepers; older ones mean "list again"
MAX_DUE = 100_000  # hidden names a watch keeps the times of; past that it lists again instead
LINE_GRACE = 0.2  # a process none of whose receives waited for this long leaves the queue's line

_epochs = itertools.count(1)  # epochs never repeat, across watches too


class _Sleeper:
    """One sleeping waiter: a thread's event, or a future on an event loop."""

    __slots__ = ("event", "future", "loop", "woken")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self.woken = False
        self.loop = loop
        if loop is None:
            self.event: threading.Event | None = threading.Event()
            self.future: asyncio.Future[None] | None = None
        else:
            self.event = None
            self.future = loop.create_future()

    def wake(self) -> None:
        self.woken = True
        if self.event is not None:
            self.event.set()
        else:
            assert self.loop is not None
            try:
                self.loop.call_soon_threadsafe(_resolve, self.future)
            except RuntimeError:  # its loop is closed: nobody waits any more
                pass


def _resolve(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class Watch:
    """What this process knows of the changes to one queue's directories, and its sleepers.

    ``version`` counts the news (a sleeper that saw version V does not sleep
    while it is still V... it looks first); ``epoch`` changes when news came
    that names nothing (list again): a listing made at another epoch may
    lack names nobody will hand over.
    """

    def __init__(
        self, path: str, message_dirs: list[str], side_dirs: list[str], poll_interval: float | None
    ) -> None:
        self.path = path
        self.message_dirs = message_dirs
        self.side_dirs = side_dirs
        self.poll_interval = poll_interval  # None: the kernel tells; else seconds between looks
        self.lock = threading.Lock()
        self.version = 0
        self.epoch = next(_epochs)
        self._log: deque[tuple[int, str]] = deque(maxlen=ARRIVALS)  # (version, ready name)
        self._recent: OrderedDict[str, None] = OrderedDict()  # names logged lately: a hint and its event
        self._due: list[tuple[int, str]] = []  # heap of (until_us, hidden name)
        self._live: dict[str, int] = {}  # hidden name -> until_us, while it exists
        self._timers: list[float] = []  # heap of monotonic times at which to wake one sleeper
        self._deferred: list[tuple[float, str]] = []  # heap of (monotonic, name): wake for it then
        self.emptied_at = -math.inf  # monotonic time the last sleeper left (math.inf: one sleeps)
        self._sleepers: OrderedDict[int, _Sleeper] = OrderedDict()  # oldest first
        self._dropped = 0  # the version of the newest name that fell out of the log
        self.on_timer: Callable[[float], None] = lambda due: None  # the hub: look again by then
        self.turns_kept = False  # whether the hub keeps this process's place in the queue's line
        self.users = 0
        self.idle_since = time.monotonic()
        self.looked_at = time.monotonic()  # the hub's last look at the directories
        self.looked_wall = time.time()
        self.prodded_at = time.monotonic()  # the last time a look made a sleeper list
        self.stamp: tuple[object, ...] | None = None  # the directories' stat at that look
        self.wds: dict[int, str] = {}  # the kernel's watches of this queue: wd -> directory
        self.keep: object = None  # what holds the queue's directories open (see fs.Pin) while watched

    # -- news: from the hub's thread, or a publish in this process -----------

    def arrived(self, name: str, delay: float = 0.0) -> None:
        """A ready name landed: log it for the sleepers and wake one, now or after
        ``delay`` seconds if it is still there then (another process's turn first)."""
        with self.lock:
            if name in self._recent:  # (a hint of this process's publish, then its event)
                return
            self._recent[name] = None
            if len(self._recent) > ARRIVALS:
                self._recent.popitem(last=False)
            self._log_name(name)
            if delay <= 0:
                self._wake_one()
                return
            due = time.monotonic() + delay
            first = not self._deferred or due < self._deferred[0][0]
            heapq.heappush(self._deferred, (due, name))
        if first:
            self.on_timer(due)

    def _log_name(self, name: str) -> None:
        self.version += 1
        if len(self._log) == ARRIVALS:
            self._dropped = self._log[0][0]
        self._log.append((self.version, name))

    def hidden(self, name: str, until_us: int) -> None:
        """A hidden name landed (a delayed publish, a lease): wake one sleeper at its time."""
        with self.lock:
            if len(self._live) >= MAX_DUE:  # too many to keep: a listing will know them
                self._changed()
                return
            self._live[name] = until_us
            due = self._due
            heapq.heappush(due, (until_us, name))
            if len(due) > 2 * len(self._live) + 1024:  # names gone since, below a live one: drop them
                self._due = [(until, live) for live, until in self._live.items()]
                heapq.heapify(self._due)
            self.version += 1

    def left(self, name: str) -> None:
        """A name left (claimed, deleted, extended...): no timer for it, and should
        it land again (a redrive resets a count), it is news again."""
        with self.lock:
            self._recent.pop(name, None)
            self._live.pop(name, None)
            due = self._due
            while due and self._live.get(due[0][1]) != due[0][0]:
                heapq.heappop(due)

    def changed(self) -> None:
        """Something changed that names no message (a slot, a setting, events lost): list again."""
        with self.lock:
            self._changed()

    def _changed(self) -> None:
        self.epoch = next(_epochs)
        self.version += 1
        self._log.clear()
        self._recent.clear()
        self._wake_one()

    def _wake_one(self) -> None:
        if self._sleepers:
            _, sleeper = self._sleepers.popitem(last=False)
            sleeper.wake()

    def wake_all(self) -> None:
        """Wake every sleeper, and make one about to sleep look first (each looks
        again; a worker being stopped returns)."""
        with self.lock:
            self.version += 1
            while self._sleepers:
                self._wake_one()

    def pass_on(self) -> None:
        """A woken sleeper claimed something: wake the next (there may be more)."""
        with self.lock:
            self._wake_one()

    # -- timers (the hub's thread) --------------------------------------------

    def next_timer(self, now_mono: float, now_us: int) -> float:
        """The monotonic time of this watch's next timer (inf: none)."""
        with self.lock:
            soonest = math.inf
            if self._timers:
                soonest = self._timers[0]
            deferred = self._deferred
            while deferred and deferred[0][1] not in self._recent:  # claimed meanwhile: no wake for it
                heapq.heappop(deferred)
            if deferred:
                soonest = min(soonest, deferred[0][0])
            if self._due:
                soonest = min(soonest, now_mono + (self._due[0][0] - now_us) / 1e6)
            return soonest

    def fire(self, now_mono: float, now_us: int) -> list[str]:
        """Wake one sleeper per timer that is due, one per hidden name whose time came
        (handed to it: claimable now), and one per name whose turn came here and that
        is still there; those names."""
        passed_over = []
        with self.lock:
            timers = self._timers
            while timers and timers[0] <= now_mono:
                heapq.heappop(timers)
                self._wake_one()
            deferred = self._deferred
            while deferred and deferred[0][0] <= now_mono:
                _, name = heapq.heappop(deferred)
                if name in self._recent:  # not claimed meanwhile (it would have left)
                    passed_over.append(name)
                    self._wake_one()
            due = self._due
            while due and due[0][0] <= now_us:
                until, name = heapq.heappop(due)
                if self._live.pop(name, None) == until:  # still there: claimable now
                    self._log_name(name)
                    self._wake_one()
        return passed_over

    # -- what a waiter asks -------------------------------------------------------

    def mark(self) -> tuple[int, int]:
        """(epoch, version) now: a listing made after this knows what was told before."""
        return self.epoch, self.version

    def news_since(self, epoch: int, version: int) -> tuple[int, int, list[str] | None]:
        """The names told since (epoch, version), and the mark now; None for the names
        when they are not all known (another epoch, or the log moved past): list again."""
        with self.lock:
            if epoch != self.epoch or version < self._dropped:
                return self.epoch, self.version, None
            names = [name for seen, name in self._log if seen > version]
            return self.epoch, self.version, names

    def sleep(self, version: int, timeout: float, due: float = math.inf) -> bool:
        """Sleep until woken or ``timeout`` seconds (``due``: a monotonic time at which the hub
        wakes one sleeper: a name of the caller's listing turns visible then); at once if the
        news moved past ``version``. Whether it was woken."""
        sleeper = self._enlist(version, None, due)
        if sleeper is None:
            return True
        assert sleeper.event is not None
        sleeper.event.wait(timeout)
        return self._leave(sleeper)

    async def sleep_async(self, version: int, timeout: float, due: float = math.inf) -> bool:
        """:meth:`sleep` on the running event loop, holding no thread."""
        sleeper = self._enlist(version, asyncio.get_running_loop(), due)
        if sleeper is None:
            return True
        assert sleeper.future is not None
        try:
            await asyncio.wait_for(sleeper.future, timeout)
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            if self._leave(sleeper):
                self.pass_on()  # woken, but leaving without a look: the next one looks
            raise
        return self._leave(sleeper)

    def _enlist(self, version: int, loop: asyncio.AbstractEventLoop | None, due: float) -> _Sleeper | None:
        with self.lock:
            if self.version != version:
                return None
            sleeper = _Sleeper(loop)
            alone, left_at = not self._sleepers, self.emptied_at
            self._sleepers[id(sleeper)] = sleeper
            self.emptied_at = math.inf
            # one timer for the soonest time: the sleeper it wakes lists, claims, and
            # asks for the next time when it sleeps again
            first = due < math.inf and (not self._timers or due < self._timers[0])
            if first:
                heapq.heappush(self._timers, due)
        # the first sleeper: the hub looks at a polled queue from now on, and puts this
        # process in a watched queue's line (unless within LINE_GRACE of the last one)
        back = alone and (self.poll_interval is not None or (
            self.turns_kept and time.monotonic() - left_at >= LINE_GRACE / 2))
        if first or back:
            self.on_timer(due if first else -math.inf)
        return sleeper

    def _leave(self, sleeper: _Sleeper) -> bool:
        with self.lock:
            self._sleepers.pop(id(sleeper), None)
            if not self._sleepers:
                self.emptied_at = time.monotonic()
            return sleeper.woken

    def has_sleepers(self) -> bool:
        return bool(self._sleepers)
