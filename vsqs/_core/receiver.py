"""The receive path of a handle: its listing, its lock, the throttle, group claims, and the wait.

:class:`Receiver` owns what a receive walks and holds: the listing cache
(:mod:`~vsqs._core.listing`), the lock that guards it, the receive tokens
(:mod:`~vsqs._core.throttle`), the FIFO side (:mod:`~vsqs._core.group_receive`)
and the receipts it issues. A receive that finds nothing and may wait sleeps
on the queue's watch (:mod:`~vsqs._core.wakeup`) until something may have
become claimable, in a thread (:meth:`Receiver.receive`) or on an event loop
(:meth:`Receiver.areceive`): one policy for both, :meth:`Receiver.next_step`.

:meth:`Receiver.claim` is the receive hot path: one method that binds what
it uses to locals (see docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from vsqs._core import envelope as _envelope
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import hub as _hub
from vsqs._core import retention as _retention
from vsqs._core import settings as _settings
from vsqs._core import wakeup as _wakeup
from vsqs._core.dead_letters import DeadLetters
from vsqs._core.errors import DamagedEntry, StorageError
from vsqs._core.format import SlotRef, State
from vsqs._core.group_receive import GroupReceiver
from vsqs._core.groups import GroupLeases
from vsqs._core.limits import MAX_RECEIVE_BYTES, MAX_VISIBILITY_TIMEOUT, MAX_WAIT
from vsqs._core.listing import REMOVALS_PER_CALL, Listing
from vsqs._core.message import Message, to_us
from vsqs._core.metadata import Store
from vsqs._core.receipts import HeldMessages, IssuedReceipts
from vsqs._core.rules import check_seconds
from vsqs._core.settings_store import SettingsStore
from vsqs._core.throttle import Throttle

if TYPE_CHECKING:
    from vsqs._core.message import Queue  # the queue a Message belongs to (a part never imports it)

log = logging.getLogger("vsqs")

T = TypeVar("T")
# how an asyncio receive runs each attempt (file system calls): given the attempt, its messages
Offload = Callable[[Callable[[], list[Message]]], Awaitable[list[Message]]]

_KEY_LENGTH = _format.KEY_LENGTH
_SKIPS_PER_CALL = 3  # skips ahead after lost races per receive call (see Listing.skip_ahead)


class Receiver:
    """One handle's receive path (see the module's docstring)."""

    def __init__(
        self, store: Store, settings: SettingsStore, lock: threading.Lock, groups: GroupLeases,
        receipts: IssuedReceipts, throttle: Throttle, dead_letters: DeadLetters[Any], skew_us: int,
        poll_interval: float | None, share: tuple[int, int] | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._lock = lock  # the handle's: it guards the listing, and the group leases (gc sweeps them too)
        self._groups = groups
        self._skew_us = skew_us
        self._listing = Listing(store.layout, groups, skew_us, lambda: settings.current()["group_concurrency"],
                                retention=lambda: settings.current()["retention"])
        self.listing = self._listing  # the queue's publishes mark it (Listing.published)
        if share is not None:  # (the handle's, kept when it opens its queue again)
            self._listing.prefer_share(*share)
        self._receipts = receipts
        self._throttle = throttle
        self._group_receiver = GroupReceiver(store, groups, self._listing, lock, receipts, throttle, dead_letters,
                                             skew_us)
        self._poll_interval = poll_interval

    # -- what the rest of the handle asks of the receive side ---------------------------

    def held(self, one_slot: bool) -> HeldMessages:
        """The moves of held messages (change of visibility, release), which this
        handle's listing sees at once (``one_slot``: group_concurrency is 1)."""
        return HeldMessages(self._store, self._groups, self._lock, self._listing, self._skew_us, one_slot)

    def settled(self, text: str, slot: SlotRef, deleted: bool, issued: bool, one_slot: bool) -> None:
        """A message of a group was deleted (or not: ``deleted``): its slot is freed if it may be."""
        self._group_receiver.settled(text, slot, deleted, issued, one_slot)

    def forget_listing(self) -> None:
        """Forget the listing (after a purge): the next receive lists again."""
        with self._lock:
            self._listing.reset()

    def terms(self, visibility_timeout: float | None, wait: float | None) -> tuple[int, float, dict[str, Any]]:
        """The lease (microseconds) and the wait (seconds) a receive asked for, checked,
        the queue's settings filling in what it left out; and the settings."""
        layout = self._store.layout
        if time.monotonic() >= layout.check_at:  # still the queue's directory at its path? (once a second)
            layout.check()
        settings_store = self._settings
        settings = settings_store.current()
        if visibility_timeout is None:  # the setting was validated when it was read
            lease_us = settings_store.lease_us
        else:
            lease_us = to_us(check_seconds(visibility_timeout, "visibility_timeout", MAX_VISIBILITY_TIMEOUT))
        if wait is None:
            wait = settings["receive_wait"]  # validated when it was read
        elif type(wait) is not int or wait:  # 0 needs no check
            wait = check_seconds(wait, "wait", MAX_WAIT)
        return lease_us, wait, settings

    def receive(
        self, queue: Queue, max_messages: int, visibility_timeout: float | None, wait: float | None,
        read_bodies: bool, group_runs: bool, stopped: Callable[[], bool] | None = None,
    ) -> list[Message]:
        """Claim up to ``max_messages``; with a wait, sleep on the queue's watch until
        something may be claimable, for at most ``wait`` seconds (or until woken with
        ``stopped()`` true)."""
        lease_us, wait, settings = self.terms(visibility_timeout, wait)
        if group_runs:  # (the listing keeps each group's next names only once runs are asked for)
            self._group_receiver.want_runs()
        if settings["suspended"]:
            _settings.check_suspended("receive", settings, queue.path)
        if not wait:
            return self.claim(queue, max_messages, lease_us, read_bodies, settings, group_runs)
        deadline = time.monotonic() + wait
        watch = self.watch()
        woken = False
        try:
            got: list[Message] | None = [] if self.unchanged(watch) else None
            while True:
                if got is None:
                    got = self.claim(queue, max_messages, lease_us, read_bodies, settings, group_runs)
                step = self.next_step(watch, got, deadline, woken)
                if step is None:
                    return got
                version, due = step
                if stopped is not None and stopped():  # (asked before the sleep: a stop meanwhile bumps the version)
                    return []
                woken = watch.sleep(version, deadline - time.monotonic(), due)
                if stopped is not None and stopped():
                    if woken:
                        watch.pass_on()
                    return []
                got = None
                if woken and watch.epoch != self._listing.watch_epoch:  # (a setting may have changed)
                    self._settings.expire()
                settings = self._settings.current()
                if settings["suspended"]:  # a long poll notices a suspension too
                    _settings.check_suspended("receive", settings, queue.path)
        except BaseException:
            if woken:
                watch.pass_on()  # woken for a message it will not take: the next sleeper looks
            raise
        finally:
            self.unwatch(watch)

    async def areceive(
        self, queue: Queue, max_messages: int, visibility_timeout: float | None, wait: float | None,
        read_bodies: bool, group_runs: bool, offload: Offload | None,
    ) -> list[Message]:
        """:meth:`receive` for an event loop: each attempt, and what touches the disk
        between them, runs through ``offload`` (default: a thread of the loop's
        executor); the wait holds no thread. If the caller is cancelled while an
        attempt runs, what it claims is released."""
        run: Offload = offload or _to_thread
        started = time.monotonic()
        wait_state = _AsyncWait()

        def attempt() -> list[Message]:
            """One try, in the worker thread: the claim, and the next step (what it reads)."""
            if wait_state.watch is None:  # the first: the terms, and the watch if it may wait
                _, waits, _ = self.terms(visibility_timeout, wait)
                wait_state.deadline = started + waits
            got = self.receive(queue, max_messages, visibility_timeout, 0, read_bodies, group_runs)
            if got or time.monotonic() >= wait_state.deadline:
                wait_state.step = None
                return got
            if wait_state.watch is None:
                watch = self.watch()
                with wait_state.lock:
                    if wait_state.done:  # the caller is gone (cancelled): nobody will unwatch it
                        self.unwatch(watch)
                        wait_state.step = None
                        return got
                    wait_state.watch = watch
            wait_state.step = self.next_step(wait_state.watch, got, wait_state.deadline, False)
            return got

        try:
            while True:
                got = await _shielded(run, attempt)
                watch, step = wait_state.watch, wait_state.step
                if wait_state.woken and watch is not None and (got or step is None):
                    watch.pass_on()  # there may be more (or its time ran out): the next sleeper looks
                if step is None:
                    return got
                assert watch is not None
                wait_state.woken = False
                version, due = step
                wait_state.woken = await watch.sleep_async(version, wait_state.deadline - time.monotonic(), due)
                if wait_state.woken and watch.epoch != self._listing.watch_epoch:  # (a setting may have changed)
                    self._settings.expire()
        except BaseException:
            if wait_state.woken and wait_state.watch is not None:
                wait_state.watch.pass_on()  # woken for a message it will not take: the next sleeper looks
            raise
        finally:
            with wait_state.lock:
                wait_state.done = True
                watch = wait_state.watch
            if watch is not None:
                self.unwatch(watch)

    # -- the wait: one policy for both ------------------------------------------

    def watch(self) -> _wakeup.Watch:
        """The queue's watch in this process, used until :meth:`unwatch`."""
        layout = self._store.layout
        watch = _hub.hub().acquire(layout.path, layout.message_dirs(), self._poll_interval, self._settings.mode,
                                   keep=layout)
        with self._lock:
            self._listing.watch = watch
        return watch

    def unwatch(self, watch: _wakeup.Watch) -> None:
        _hub.hub().release(watch)

    def unchanged(self, watch: _wakeup.Watch) -> bool:
        """Whether the listing shows all that ``watch`` was told and has nothing to try now,
        where the kernel tells of every change: a waiting receive then sleeps at once (a
        worker's next receive lists nothing; the watch wakes it for what comes)."""
        if watch.poll_interval is not None:  # polled: the listing may lag behind the directory
            return False
        with self._lock:
            listing = self._listing
            return (
                listing.watch is watch and listing.listed_at > -math.inf
                and (listing.watch_epoch, listing.watch_version) == watch.mark()
                and not listing.visible and not listing.later and not listing.grouped
                and listing.until_next_expiry() > 0
                # and nothing it knows says "list again when out": this handle claimed from
                # the listing, skipped names, freed a slot, or has shards left to go round
                and not (listing.claimed or listing.skipped or listing.freed or listing.rest_of_round)
            )

    def next_step(
        self, watch: _wakeup.Watch, got: list[Message], deadline: float, woken: bool
    ) -> tuple[int, float] | None:
        """After an attempt: None when the receive is done (it got something, or its time
        is up); else the watch's version to sleep from and the monotonic time at which
        something of the listing turns visible (a delayed message, a lease running out,
        the throttle's next window). News the watch had already makes the version old,
        so the sleep returns at once and the next attempt tries it."""
        if got:
            if woken:
                watch.pass_on()  # there may be more: the next sleeper looks
            return None
        now = time.monotonic()
        if now >= deadline:
            if woken:  # woken as its time ran out: what woke it is for the next sleeper
                watch.pass_on()
            return None
        with self._lock:
            version, news = self._listing.absorb(watch)
            due = now + self._listing.until_next_expiry()
        throttle = self._settings.current()["throttle"]
        if throttle is not None:  # (only if it is what held the receive back)
            count, seconds = throttle
            wall = time.time()
            if self._throttle.exhausted(count, seconds, wall):
                due = min(due, now + (math.floor(wall / seconds) + 1) * seconds - wall)
        return (-1 if news else version), due

    def claim(  # noqa: C901 - the receive hot path, kept in one function on purpose
        self, queue: Queue, limit: int, lease_us: int, read_bodies: bool, settings: Mapping[str, Any],
        group_runs: bool,
    ) -> list[Message]:
        """Claim up to ``limit`` messages, walking the listing cache: one rename
        each (and a slot lease first for a message of a group). The hot path:
        everything it uses is bound to locals, the common case of
        Listing.next_candidate is inlined, and the path of a name is built inline."""
        got: list[Message] = []
        failure: StorageError | None = None  # raised only if nothing else was claimed
        max_receives, throttle = settings["max_receives"], settings["throttle"]
        # a message sent before kept_from (µs) is past retention: removed, never delivered (None: no retention).
        # A group's messages after its candidate were sent after it: a candidate kept vouches for its run
        kept_from = settings["retention"]
        if kept_from is not None:
            kept_from = _settings.retained_from_us(kept_from, _format.now_us(), self._skew_us)
        store = self._store
        layout, cache, lock, queue_id = store.layout, self._listing, self._lock, store.id
        prefix, locate, first_receive = layout.prefix, layout.locate, store.first_receive  # (format 3: -rFIRST)
        # listings this call may make that give nothing: one, or in a sharded
        # queue one per shard (another consumer may have emptied the shard that
        # was listed); renewed by each claim that succeeds, so no spinning on
        # names that fail
        fruitless = layout.shards
        lists_left = fruitless
        skips = _SKIPS_PER_CALL
        held = 0  # bytes of the bodies read so far (see MAX_RECEIVE_BYTES)
        answered: set[str] | None = None  # ids of ``got[:len(answered)]``, once a lease that ran out is met
        again: list[tuple[str, int]] = []  # this call's own claims met again: back in the cache when it ends
        # messages past retention this call may remove (a receive's work stays bounded however many
        # there are: the rest are skipped, never delivered, and left to the next call or gc)
        removals = REMOVALS_PER_CALL
        expired: list[str] = []  # names past retention the call's listings kept aside (Listing.expired)
        gone = 0  # messages past retention this call removed
        while len(got) < limit:
            with lock:
                if (cache.visible and not (cache.hidden or cache.grouped) and time.monotonic() < cache.stale_at
                        and (cache.list_before is None or cache.visible[0] < cache.list_before)):
                    name: str | None = heapq.heappop(cache.visible)  # the common case of next_candidate, inlined
                else:
                    listings = cache.listings
                    # (names held back after a drop, perhaps another thread's, are listed for: skip_ahead)
                    name = cache.next_candidate(lists_left > 0 or cache.list_before is not None)
                    if cache.listings != listings:
                        # a listing that went round every shard has seen them all: no more this call
                        lists_left = lists_left - 1 if cache.rest_of_round else 0
                        again.clear()  # (in the new listing, if still there: kept once)
                        if cache.expired:  # members of groups past retention: removed when the call ends
                            expired.extend(cache.expired)
                            cache.expired = []
            if name is None:
                break
            parsed = _format.parse_name(name)  # the one parse of this name on its way out
            if parsed is None or parsed.state is State.WRITING:
                continue  # a foreign name the listing passed through unparsed
            if kept_from is not None and parsed.sent_us < kept_from:  # past retention: never delivered
                if not removals:
                    continue  # this call's removals are spent: left to the next call or gc
                outcome = _retention.remove_candidate(layout, lock, cache, name, parsed)
                if outcome is not None:  # (None: damage, never removed: claimed and reported as before)
                    removals -= 1
                    if outcome is True:  # it went: as after a claim, the call may list again
                        gone += 1
                        cache.claimed += 1
                        lists_left = fruitless
                    elif outcome is not False:
                        failure = failure or outcome
                    continue
            if parsed.until_us and got:  # a lease that ran out (hidden): perhaps one this call gave
                answered = answered or set()
                answered.update(message.id for message in got[len(answered):])
                if parsed.key in answered:  # (a short visibility timeout): each message once an answer;
                    again.append((name, parsed.until_us))  # a candidate for the next call, and this one goes on
                    continue
            if max_receives is not None and parsed.receive_count >= max_receives:
                buried = self._group_receiver.bury(parsed)  # (its group, if any, goes on with its next)
                if isinstance(buried, StorageError):
                    failure = failure or buried
                elif buried:  # its group's next is not in the listing: list again
                    lists_left = max(lists_left, 1)
                continue
            if throttle is not None:
                with lock:
                    allowed = self._throttle.take(throttle[0], throttle[1], time.time())
                if not allowed:
                    with lock:
                        cache.remember(name)  # still a candidate later
                    break
            if parsed.group_hash:  # a slot lease first, and perhaps a run (see group_receive)
                taken = self._group_receiver.claim(queue, name, parsed, lease_us, limit - len(got), read_bodies,
                                                   MAX_RECEIVE_BYTES - held, group_runs, settings)
                got, held, failure = got + taken.messages, held + taken.held, failure or taken.failure
                lists_left = fruitless if taken.moved else lists_left
                if held >= MAX_RECEIVE_BYTES:
                    break
                continue
            count = parsed.receive_count + 1
            now = time.time_ns() // 1000  # (now_us(), inlined)
            stem = _format.received_stem(parsed, now) if count == 1 and first_receive else parsed.stem
            new = _format.hidden_name(stem, now + lease_us, count)
            if locate is None:
                source, path = prefix + name, prefix + new
            else:  # (the shard of ``new`` is the shard of ``name``: KEY and GROUP stay)
                shard = locate(name)
                source, path = shard + name, shard + new
            if not _fs.rename(source, path):
                if skips:
                    with lock:
                        skips -= 1
                        if cache.skip_ahead(name):
                            lists_left = max(lists_left, 1)  # the names dropped may be there: list before giving up
                continue  # another consumer got it first
            cache.claimed += 1
            lists_left = fruitless
            header = None
            if read_bodies:
                try:
                    data = _fs.read(path)
                    if data is None:
                        continue  # only if another host's clock is far ahead: it took our lease
                    held += len(data)
                    if parsed.envelope:
                        data, header = _envelope.decode_content(parsed, data, path)
                except DamagedEntry as exc:  # no message: a FIFO, a directory... or far too large
                    # skipped, left in place (hidden until its lease ends, then claimed
                    # again, or moved to the dead-letter queue after max_receives)
                    layout.report_damage(path, str(exc.strerror))
                    continue
                except StorageError as exc:  # unreadable (permissions) or corrupt
                    # a corrupt file stays in flight and comes back with its lease (and
                    # goes to the dead-letter queue after max_receives); the rest go on
                    log.warning("%s", exc)
                    failure = failure or exc
                    continue
            else:
                data = None
            receipt = _format.make_receipt(queue_id, new)
            self._receipts.add(receipt, new, None)
            got.append(Message(queue, name[:_KEY_LENGTH], data, receipt, count, None, header))  # sent_at: from the id
            if held >= MAX_RECEIVE_BYTES:
                break  # the bodies held: at most MAX_RECEIVE_BYTES plus one message
        if again:
            with lock:
                for name, until_us in again:
                    cache.remember(name, until_us)
        if kept_from is not None:
            if expired:
                removed, failed = _retention.remove_listed(layout, expired[:removals])
                gone, failure = gone + removed, failure or failed
            if gone:
                log.debug("queue %s: a receive removed %d messages past retention", _fs.shown(layout.path), gone)
        if failure is not None and not got:
            raise failure
        return got


async def _to_thread(fn: Callable[[], T]) -> T:
    return await asyncio.get_running_loop().run_in_executor(None, fn)


class _AsyncWait:
    """What an asyncio receive's attempts (in worker threads) tell its loop."""

    __slots__ = ("deadline", "done", "lock", "step", "watch", "woken")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False  # the receive returned (or was cancelled): an attempt still running unwatches itself
        self.watch: _wakeup.Watch | None = None
        self.deadline = 0.0
        self.step: tuple[int, float] | None = None
        self.woken = False


class _Handover:
    """An attempt's messages on their way from its thread to the caller, who may be
    gone (cancelled) by the time they are claimed: then they go back at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.abandoned = False
        self.got: list[Message] = []


async def _shielded(run: Offload, fn: Callable[[], list[Message]]) -> list[Message]:
    """``await run(fn)``; if the caller is cancelled meanwhile (a task cancelled, or the
    loop shutting down), the attempt goes on and the messages it claimed are released
    (visible again at once) by its own thread, not left hidden for nobody."""
    handover = _Handover()

    def attempt() -> list[Message]:
        got = fn()
        with handover.lock:
            if not handover.abandoned:
                handover.got = got
                return got
        _release_all(got)
        return []

    task = asyncio.ensure_future(run(attempt))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with handover.lock:
            handover.abandoned = True
            claimed, handover.got = handover.got, []
        if claimed:  # the attempt had finished: its messages never reached the caller
            try:
                threading.Thread(target=_release_all, args=(claimed,), name="vsqs-give-back").start()
            except RuntimeError:  # (no new thread at interpreter shutdown: here, then)
                _release_all(claimed)
        raise


def _release_all(messages: list[Message]) -> None:
    for message in messages:
        try:
            message.release()
        except Exception as exc:  # (gone, or the queue suspended: it comes back with its lease)
            log.info("could not release %s after a cancelled receive: %s", message.id, exc)
