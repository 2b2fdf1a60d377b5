"""A queue driven side by side with a model of it written from the README (with
the public docstrings, and docs/FORMAT.md where the README is silent: the rule of
groups, when a de-duplication window starts), never from the engine's code:
hypothesis's stateful testing runs random programs of publishes, receives,
deletes, releases, visibility changes, dead-letterings, purges and tidying
passes against both, on sampled settings (flat and 4 shards, group_concurrency,
max_receives, delays, dedup_window and scope, visibility_timeout, clock_skew),
and compares every answer.

What the model holds the queue to:

- **nothing lost or duplicated**: after every step the queue lists exactly the
  model's messages still in it, each once, with its state and receive count;
  the dead-letter queue exactly those dead-lettered; ``stats()`` agrees
  (ready, in_flight, delayed, dead_lettered, oldest_ready_age);
- **a receive takes only what is claimable**: visible (ready, or hidden past its
  time plus the clock skew), not due for the dead-letter queue, and in a group one
  of its first visible messages (delayed ones skipped) while fewer than
  ``group_concurrency`` are in flight; with its body, id, receive count (one
  more), send time and first receive time;
- **a receive never answers short**: ``receive_batch(n)`` answers
  ``min(n, claimable)`` ("fewer if fewer are visible"; the bodies are tiny), so
  never empty while a message is claimable, and each message at most once;
- **receipts**: one that holds its message (lease running) settles it; an old one
  (received again, moved on by a visibility change, settled, purged, dead-lettered)
  raises ``StaleReceipt``, retried at once too; one of a receive with
  ``visibility_timeout=0`` settles its message until another receive takes it; a
  visibility change answers a new receipt. An expired one may do either: the
  README does not say;
- **time**: after each step, what it hid (leases, delays) is looked at a
  millisecond before and after its time ends, by a new handle (which changes
  nothing), without waiting;
- **order**: a group's messages in publish order (each taken is one of the
  group's first ``group_concurrency`` visible ones; the order among those in one
  answer is not held: with a cached listing, a message the handle listed before
  comes ahead of an earlier one re-delivered since, and the README's "in order"
  says nothing finer for group_concurrency > 1); a handle with no cached listing,
  in a flat queue, answers the messages without a group by priority, then publish
  order (re-delivered ones in their place). The README lets a handle's cached
  listing bend the latter, so the long-lived handle is not held to it, nor is a
  sharded queue (order holds within a shard);
- **de-duplication**: while a message with the same id (per group, or per queue)
  is in the queue, or left it less than ``dedup_window`` ago, a publish stores
  nothing and answers its id. The window runs from when a publisher (or gc)
  first finds the message gone (FORMAT.md), not from when it left, which is all
  the README says: see ``dedup_holds`` (an open question, not pinned by a test);
  a purge forgets the ids of the messages it removes;
- **lazy dead-lettering**: a message received ``max_receives`` times is not
  claimable once visible, counts as ready until a receive (or a tidying pass)
  moves it; whether one did is read from the queue's listing.

Not covered, on purpose: what needs other processes or a crash (races between
consumers, killed publishers: tests/system), waiting receives (``wait``,
inotify: a fake clock cannot wake a real wait), runs (``group_runs``), the
throttle, suspend, ``max_messages``/``max_message_bytes``, retention (gc's file
times are the real clock's), redrive, stages, attributes and ``at=``: each has
tests of its own, and the model would have to know more than the README says.

Time is the machine's: the engine reads ``time.time``, ``time.time_ns`` and
``time.monotonic``, and every rule runs with those replaced by a fake clock that
only the rule ``advance`` moves (each call a microsecond after the one before,
so no expiry lands on a call's time); a call that reads it 100,000 times fails
as looping instead of hanging.

CI runs 100 derandomized examples of up to 30 steps (no database: a run cannot
go red by luck, and a failure prints its steps, which replay the same way). A
deep search, random and longer::

    VSQS_MODEL_EXAMPLES=5000 python -m pytest tests/core/model_machine.py -o timeout=0

prints a failure's steps and a ``@reproduce_failure`` line that replays it
(``VSQS_MODEL_STEPS`` sets the steps, ``VSQS_MODEL_SHRINK=0`` skips shrinking).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import vsqs

SECOND = 1_000_000  # µs
MAX_CLOCK_READS = 100_000  # in one rule: far more than any call needs
DEEP_EXAMPLES = int(os.environ.get("VSQS_MODEL_EXAMPLES") or 0)
CI_EXAMPLES = int(os.environ.get("VSQS_MODEL_CI_EXAMPLES") or 100)  # (a knob to compare settings with)
STEPS = int(os.environ.get("VSQS_MODEL_STEPS") or 30)
# A spool per example, in memory where there is a tmpfs (the fsyncs of durable
# publishes and a queue per example cost seconds on a disk); else in the temp dir.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


class FakeClock:
    """The wall clock (epoch ns) and the monotonic clock the engine sees while a rule runs.

    Each starts a second after where the one before stopped (or at the real time, if later):
    in a process, time never runs back (send times strictly increase within a process)."""

    latest_ns = 0  # where the last clock stopped

    def __init__(self) -> None:
        start = max(time.time_ns(), FakeClock.latest_ns) + 10**9
        self.wall_ns = start - start % 10**9  # whole seconds: the printed steps read plainly
        self.mono = 1000.0 + self.wall_ns / 1e9

    @property
    def now_us(self) -> int:
        return self.wall_ns // 1000

    def advance(self, seconds: float) -> None:
        self.wall_ns += int(seconds * 10**9)
        self.mono += seconds
        FakeClock.latest_ns = max(FakeClock.latest_ns, self.wall_ns)

    @contextmanager
    def looking_at(self, wall_us: int) -> Iterator[None]:
        """The engine's wall clock reads ``wall_us`` while the block runs (to look, not to act)."""
        saved = self.wall_ns
        self.wall_ns = wall_us * 1000
        try:
            with self.running(tick=False):
                yield
        finally:
            self.wall_ns = saved

    @contextmanager
    def running(self, tick: bool = True) -> Iterator[None]:
        """The engine's clock is this one while the block runs; ``tick``: a µs later than before."""
        if tick:
            self.wall_ns += 1000
            self.mono += 1e-6
            FakeClock.latest_ns = max(FakeClock.latest_ns, self.wall_ns)
        saved = time.time, time.time_ns, time.monotonic
        reads = [0]

        def read() -> None:  # a call that reads the clock without end loops: a failure, not a hang
            reads[0] += 1
            if reads[0] > MAX_CLOCK_READS:
                raise AssertionError(f"the clock was read {MAX_CLOCK_READS} times in one call: it loops")

        time.time = lambda: read() or self.wall_ns / 1e9
        time.time_ns = lambda: read() or self.wall_ns
        time.monotonic = lambda: read() or self.mono
        try:
            yield
        finally:
            time.time, time.time_ns, time.monotonic = saved


# -- the model --------------------------------------------------------------------

QUEUED, DELETED, DEAD, PURGED = "queued", "deleted", "dead", "purged"


@dataclass(eq=False)
class Msg:
    id: str
    seq: int  # publish order (one process: its send times increase)
    body: bytes
    group: str | None
    priority: int
    dedup_key: tuple[str, str] | None
    sent_us: int
    where: str = QUEUED  # or DELETED, DEAD, PURGED: it left the queue
    until_us: int = 0  # hidden until then (0: ready)
    count: int = 0  # receive count
    first_received_us: int | None = None
    receipt: str | None = None  # the receipt that holds it now, if any
    gone_us: int | None = None  # when it left the queue
    seen_gone_us: int | None = None  # when a publisher first found it gone (its de-duplication window starts)
    gc_saw_gone_us: int | None = None  # when a gc pass ran after it left (and perhaps started its window)


@dataclass(eq=False)
class Held:
    msg: Msg
    zero: bool  # issued by a receive with visibility_timeout=0


MUST_WORK, MAY_WORK, STALE = "must work", "may work", "stale"


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="vsqs-model-", dir=SCRATCH)
        self.clock = FakeClock()
        self.msgs: list[Msg] = []
        self.held: dict[str, Held] = {}  # every receipt issued
        self.issued: list[str] = []  # the same, in the order issued
        self.dedup: dict[tuple[str, str], Msg] = {}
        self.disturbed: set[str] = set()  # expired receipts a tidying pass may have moved
        self.dead_ever = False  # whether a message went to the dead-letter queue (which is made then)
        self.timed: list[Msg] = []  # messages hidden until a time by the last step (see the invariants)
        self.maybe_requeued: set[tuple[str, int]] = set()  # (id, until) of expired names a gc pass may have requeued

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # -- set-up: sampled settings ---------------------------------------------------

    @initialize(
        shards=st.sampled_from([1, 4]),
        group_concurrency=st.sampled_from([1, 1, 2, 3]),
        max_receives=st.sampled_from([None, 1, 2, 3]),
        dedup_window=st.sampled_from([0, 5, 100]),
        dedup_scope=st.sampled_from(["group", "queue"]),
        visibility_timeout=st.sampled_from([30, 5]),
        delay=st.sampled_from([0, 0, 3]),
        clock_skew=st.sampled_from([0.0, 0.0, 1.0]),
    )
    def create_queue(self, shards: int, clock_skew: float, **options: Any) -> None:
        self.settings = dict(options)
        self.skew_us = int(clock_skew * SECOND)
        queue_settings = {name: value for name, value in options.items() if value is not None}
        with self.clock.running():
            spool = vsqs.Spool(self.root, create=True)
            spool.create_queue("q", shards=shards, **queue_settings)
            self.path = spool.path("q")
            self.queue = vsqs.Queue(self.path, clock_skew=clock_skew)
        self.shards = shards
        self.clock_skew = clock_skew

    def handle(self, fresh: bool) -> vsqs.Queue:
        """The long-lived handle, or a new one (another process, with no cached listing)."""
        return vsqs.Queue(self.path, clock_skew=self.clock_skew) if fresh else self.queue

    # -- what the README says about a message, now ------------------------------------

    @property
    def now(self) -> int:
        return self.clock.now_us

    def queued(self) -> list[Msg]:
        return [m for m in self.msgs if m.where == QUEUED]

    def hidden(self, m: Msg, at: int | None = None) -> bool:
        return (self.now if at is None else at) < m.until_us + self.skew_us

    def in_flight(self, m: Msg, at: int | None = None) -> bool:
        return m.where == QUEUED and m.count >= 1 and self.hidden(m, at)

    def delayed(self, m: Msg, at: int | None = None) -> bool:
        return m.where == QUEUED and m.count == 0 and self.hidden(m, at)

    def visible(self, m: Msg) -> bool:
        return m.where == QUEUED and not self.hidden(m)

    def due_for_dead_letters(self, m: Msg) -> bool:
        limit = self.settings["max_receives"]
        return limit is not None and m.count >= limit and self.visible(m)

    def state(self, m: Msg, at: int | None = None) -> str:
        return "in_flight" if self.in_flight(m, at) else "delayed" if self.delayed(m, at) else "ready"

    def claimable(self) -> tuple[list[Msg], dict[str, list[Msg]]]:
        """Messages without a group a receive may take, and for each group those it may take."""
        candidates = [m for m in self.queued() if self.visible(m) and not self.due_for_dead_letters(m)]
        plain = [m for m in candidates if m.group is None]
        groups: dict[str, list[Msg]] = {}
        for group in sorted({m.group for m in self.queued() if m.group is not None}):
            flying = sum(1 for m in self.queued() if m.group == group and self.in_flight(m))
            budget = max(0, self.settings["group_concurrency"] - flying)
            groups[group] = [m for m in candidates if m.group == group][:budget]
        return plain, groups

    def receipt_status(self, receipt: str, what: str) -> str:
        held = self.held[receipt]
        m = held.msg
        if m.receipt != receipt or m.where != QUEUED:
            return STALE
        if self.now < m.until_us:
            return MUST_WORK  # its lease runs
        if held.zero and receipt not in self.disturbed and not (m.group and what == "change_visibility"):
            # visibility 0: "holds the message only until another receive takes it: until then it
            # may still delete, release or hide it". Not hide in a group: the lease of its slot ran
            # out at once, and a receive that took another message of the group on that slot (the
            # same batch, even) leaves the receipt nothing to extend (the slot is the other's)
            return MUST_WORK
        return MAY_WORK  # expired: the README does not say

    def leave(self, m: Msg, where: str) -> None:
        m.where, m.gone_us, m.receipt = where, self.now, None
        self.dead_ever = self.dead_ever or where == DEAD

    def dead_letter_queue(self) -> vsqs.Queue:
        """The dead-letter queue (there once a message went there)."""
        queue = self.queue.dead_letter_queue(create=False)
        assert queue is not None
        return queue

    # -- the queue's answers checked against the model -------------------------------

    def took(self, got: list[vsqs.Message], n: int, vis: float | None, ordered: bool) -> None:
        plain, groups = self.claimable()
        possible = len(plain) + sum(len(ms) for ms in groups.values())
        by_id = {m.id: m for m in self.msgs}
        ids = [message.id for message in got]
        assert len(ids) == len(set(ids)), f"a message twice in one answer: {ids}"
        allowed = {m.id for m in plain} | {m.id for ms in groups.values() for m in ms}
        for message in got:
            m = by_id.get(message.id)
            assert m is not None, f"received {message.id}, never published"
            assert message.id in allowed, (
                f"received {message.id} ({self.state(m)}, count {m.count}, group {m.group}, where {m.where}), "
                "which the model says is not claimable"
            )
            assert message.body == m.body and message.group == m.group and message.priority == m.priority
            assert message.receive_count == m.count + 1, (message.receive_count, m.count)
            assert message.sent_at is not None and abs(message.sent_at * SECOND - m.sent_us) < 1000
            first = m.first_received_us or self.now  # (recorded to the millisecond)
            assert message.first_received_at is not None and abs(message.first_received_at * SECOND - first) < 1000
        assert len(got) == min(n, possible), (
            f"receive_batch({n}) answered {len(got)} while {possible} were claimable: "
            f"{[m.id for m in plain]} {[(g, [m.id for m in ms]) for g, ms in groups.items()]}"
        )
        if ordered:  # a fresh handle of a flat queue: priority, then publish order
            expected = sorted(plain, key=lambda m: (-m.priority, m.seq))
            answered = [by_id[message.id] for message in got if message.group is None]
            assert answered == expected[: len(answered)], (
                f"out of order: {[m.id for m in answered]}, expected {[m.id for m in expected[:len(answered)]]}"
            )
        event(f"receive: {min(len(got), 2)}+ of {min(possible, 2)}+ claimable"
              + (", grouped" if any(message.group for message in got) else ""))
        timeout = self.settings["visibility_timeout"] if vis is None else vis
        for message in got:
            m = by_id[message.id]
            m.count += 1
            m.first_received_us = m.first_received_us or self.now
            m.until_us = self.now + int(timeout * SECOND)
            self.timed.append(m)
            m.receipt = message.receipt
            self.issue(message.receipt, Held(m, zero=timeout == 0))

    def issue(self, receipt: str, held: Held) -> None:
        assert receipt not in self.held, "a receipt issued twice"
        self.held[receipt] = held
        self.issued.append(receipt)

    def moved_to_dead_letters(self, due: list[Msg]) -> None:
        """Which of ``due`` (due for the dead-letter queue) a pass moved: read from the listing."""
        if not due:
            return
        with self.clock.running(tick=False):
            still = {info.id for info in self.queue.messages(ids=[m.id for m in due])}
        for m in due:
            event("due for the dead-letter queue: " + ("moved" if m.id not in still else "left"))
            if m.id not in still:
                self.leave(m, DEAD)

    def dedup_holds(self, holder: Msg) -> bool | None:
        """Whether ``holder``'s de-duplication id is still held (None: either may be true).

        The README: while it is in the queue, or "was less than dedup_window seconds
        ago". docs/FORMAT.md (De-duplication) says more: the window runs from when a
        publisher (or gc) first finds the message gone, not from when it left, so a
        message deleted an hour ago still holds its id against the first publish after
        it. The model follows FORMAT.md here (see ``test_dedup.py`` for the README's
        reading, which the queue does not keep)."""
        window = self.settings["dedup_window"] * SECOND
        if holder.where == QUEUED:
            return True
        if not window:
            return False
        if holder.seen_gone_us is not None:
            return self.now - holder.seen_gone_us < window
        if holder.gc_saw_gone_us is None or self.now - holder.gc_saw_gone_us < window:
            return True  # first found gone now (or by a gc pass less than a window ago)
        return None  # a gc pass long ago may have started the window, or not

    # -- rules ---------------------------------------------------------------------

    @rule(
        items=st.lists(
            st.tuples(
                st.sampled_from([None, None, None, "a", "b"]),  # group
                st.sampled_from([None, None, 0, 0, 2, 7]),  # delay (None: the queue's setting)
                st.sampled_from([0, 0, 0, 4, 9]),  # priority
                st.sampled_from([None, None, None, "x", "y"]),  # de-duplication id
            ),
            min_size=1,
            max_size=3,
        ),
        batch=st.booleans(),
        fresh=st.booleans(),
    )
    def publish(self, items: list[tuple[str | None, float | None, int, str | None]], batch: bool,
                fresh: bool) -> None:
        """One publish per item, or one publish_batch of them all."""
        bodies = [b"body-%d-%d" % (len(self.msgs), i) for i in range(len(items))]
        invalid = [group is not None and priority != 0 for group, _, priority, _ in items]
        with self.clock.running():
            handle = self.handle(fresh)
            try:
                if batch:
                    ids = handle.publish_batch([
                        vsqs.Outgoing(body, delay=delay, priority=priority, group=group, dedup_id=dedup_id)
                        for body, (group, delay, priority, dedup_id) in zip(bodies, items, strict=True)
                    ])
                else:
                    ids = []
                    for body, (group, delay, priority, dedup_id), refused in zip(bodies, items, invalid, strict=True):
                        if refused:  # priority cannot be combined with a group
                            try:
                                handle.publish(body, group=group, delay=delay, priority=priority, dedup_id=dedup_id)
                            except vsqs.InvalidArgument:
                                ids.append(None)
                                continue
                            raise AssertionError("priority with a group was accepted")
                        ids.append(handle.publish(body, group=group, delay=delay, priority=priority,
                                                  dedup_id=dedup_id))
            except vsqs.InvalidArgument:
                assert batch and any(invalid), "publish refused valid arguments"
                return  # a batch with one bad item publishes none
        assert not (batch and any(invalid)), "priority with a group was accepted in a batch"
        assert len(ids) == len(items)
        for message_id, body, item in zip(ids, bodies, items, strict=True):
            if message_id is not None:
                self.published(message_id, body, *item)

    def published(self, message_id: str, body: bytes, group: str | None, delay: float | None, priority: int,
                  dedup_id: str | None) -> None:
        """The model's part of a publish the queue answered with ``message_id``."""
        key = None
        if dedup_id is not None:
            key = ((group or "") if self.settings["dedup_scope"] == "group" else "", dedup_id)
            holder = self.dedup.get(key)
            if holder is not None:
                held = self.dedup_holds(holder)
                event(f"publish: de-duplication id {'in the queue' if holder.where == QUEUED else 'gone'}, "
                      f"held {held}")
                if held or (held is None and message_id == holder.id):
                    assert message_id == holder.id, "a duplicate was stored"
                    if holder.where != QUEUED and holder.seen_gone_us is None and holder.gc_saw_gone_us is None:
                        holder.seen_gone_us = self.now  # its window starts now
                    return
        assert message_id not in {m.id for m in self.msgs}, "the id of another message (or a duplicate kept)"
        wait = self.settings["delay"] if delay is None else delay
        m = Msg(message_id, len(self.msgs), body, group, priority, key, self.now,
                until_us=self.now + int(wait * SECOND) if wait else 0)
        self.msgs.append(m)
        self.timed.append(m)
        if key is not None:
            self.dedup[key] = m

    @rule(
        n=st.sampled_from([1, 2, 3, 5]),
        vis=st.sampled_from([None, 0, 1, 3, 10, 100]),
        fresh=st.booleans(),
    )
    def receive_batch(self, n: int, vis: float | None, fresh: bool) -> None:
        due = [m for m in self.queued() if self.due_for_dead_letters(m)]
        with self.clock.running():
            got = self.handle(fresh).receive_batch(n, visibility_timeout=vis, wait=0)
        self.took(got, n, vis, ordered=fresh and self.shards == 1)
        self.moved_to_dead_letters(due)

    def holds(self, receipt: str) -> bool:
        m = self.held[receipt].msg
        return m.receipt == receipt and m.where == QUEUED

    def receipt(self, pick: int) -> str:
        """A receipt: ``pick`` 0..5 one that holds its message now, if there is one (0: the
        newest); 6..9 (or none holds) one issued ``pick`` - 6 receipts before the newest, stale
        or not."""
        holding = [r for r in reversed(self.issued) if self.holds(r)]
        if pick < 6 and holding:
            return holding[pick % len(holding)]
        return self.issued[max(0, len(self.issued) - 1 - pick % 6)]

    def try_receipt(self, what: str, receipt: str, fresh: bool, call: Callable[[vsqs.Queue], Any]) -> tuple[bool, Any]:
        """Run a call with a receipt; (whether it worked, its answer), checked against the receipt's status."""
        status = self.receipt_status(receipt, what)
        answer, worked = None, True
        with self.clock.running():
            try:
                answer = call(self.handle(fresh))
            except vsqs.StaleReceipt:
                worked = False
        event(f"{what}: {status}, {'worked' if worked else 'StaleReceipt'}")
        if not worked:
            assert status != MUST_WORK, f"{what}: StaleReceipt for a receipt that holds its message"
            if status == MAY_WORK:
                self.held[receipt].msg.receipt = None  # (its message is visible: nothing else changes)
            return False, None
        assert status != STALE, f"{what} with a stale receipt worked"
        return True, answer

    @rule(
        action=st.sampled_from(["release", "delete", "dead_letter", "delete_batch"]),
        pick=st.integers(0, 9),
        fresh=st.booleans(),
        retry=st.sampled_from([True, False]),  # (True first: hypothesis draws a first choice more often)
    )
    def settle(self, action: str, pick: int, fresh: bool, retry: bool) -> None:
        """Delete, release or dead-letter the message of a receipt (see ``receipt``); with
        ``retry``, once more at once through the other handle (a client's retry: stale now,
        if the first worked)."""
        if not self.issued:
            return  # (no precondition: what is drawn must not depend on the queue's answers)
        receipt = self.receipt(pick)
        self.settle_with(action, receipt, fresh)
        if retry:
            self.settle_with(action, receipt, not fresh)

    def settle_with(self, action: str, receipt: str, fresh: bool) -> None:
        m = self.held[receipt].msg

        def call(handle: vsqs.Queue) -> None:
            if action != "delete_batch":
                return getattr(handle, action)(receipt)
            (outcome,) = handle.delete_batch([receipt])
            if outcome is not None:
                raise outcome

        if action == "dead_letter" and self.settings["max_receives"] is None:  # no dead-letter queue
            with self.clock.running():
                try:
                    call(self.handle(fresh))
                except vsqs.InvalidArgument:
                    return
                except vsqs.StaleReceipt:
                    assert self.receipt_status(receipt, action) != MUST_WORK
                    return
            raise AssertionError("dead_letter worked in a queue without a dead-letter queue")
        worked, _ = self.try_receipt(action, receipt, fresh, call)
        if worked and action == "release":
            m.until_us, m.receipt = 0, None
        elif worked:
            self.leave(m, DEAD if action == "dead_letter" else DELETED)

    @rule(pick=st.integers(0, 9), timeout=st.sampled_from([0, 1, 5, 50]), fresh=st.booleans())
    def change_visibility(self, pick: int, timeout: float, fresh: bool) -> None:
        if not self.issued:
            return
        receipt = self.receipt(pick)
        worked, new = self.try_receipt("change_visibility", receipt, fresh,
                                       lambda handle: handle.change_visibility(receipt, timeout))
        if worked:
            assert new != receipt, "a change of visibility kept the receipt"
            m = self.held[receipt].msg
            m.until_us, m.receipt = self.now + timeout * SECOND, new
            self.timed.append(m)
            self.issue(new, Held(m, zero=False))

    @rule(seconds=st.sampled_from([1, 2, 3, 4, 11, 31, 101]))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(what=st.sampled_from(["requeue_expired", "collect_garbage", "purge"]), fresh=st.booleans())
    def maintain(self, what: str, fresh: bool) -> None:
        """requeue_expired() or collect_garbage() (what receive does as it goes, in bulk), or purge().

        requeue_expired() makes every hidden name whose time came ready (delayed ones
        too) and moves those due to the dead-letter queue, and answers how many moved;
        gc may do either (the README: "until a receive (or gc) reaches it")."""
        expired = [m for m in self.queued() if m.until_us and not self.hidden(m)]
        due = [m for m in self.queued() if self.due_for_dead_letters(m)]
        queued = self.queued()
        with self.clock.running():
            moved = getattr(self.handle(fresh), what)()
        if what == "purge":
            assert moved == len(queued), f"purge answered {moved}, {len(queued)} in the queue"
            for m in queued:
                self.leave(m, PURGED)
            for key in [key for key, holder in self.dedup.items() if holder in queued]:
                del self.dedup[key]  # the README: a purge forgets the ids of the messages it removes
            return
        gc = what == "collect_garbage"
        maybe = [m for m in expired if (m.id, m.until_us) in self.maybe_requeued and m not in due]
        if not gc:
            most = len(set(expired) | set(due))
            assert most - len(maybe) <= moved <= most, (moved, len(expired), len(due), len(maybe))
        self.disturbed.update(m.receipt for m in expired if m.receipt is not None)
        self.moved_to_dead_letters(due)
        for m in expired:
            if m.where == QUEUED and not gc:
                m.until_us = 0  # ready now (a receipt holding it: see receipt_status)
            elif m.where == QUEUED:
                self.maybe_requeued.add((m.id, m.until_us))
        if gc:
            for m in self.msgs:
                if m.where != QUEUED and m.seen_gone_us is None and m.gc_saw_gone_us is None:
                    m.gc_saw_gone_us = self.now

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def every_message_is_where_the_model_says_once(self) -> None:
        if not hasattr(self, "queue"):
            return
        with self.clock.running(tick=False):
            listed = [(info.id, info.state, info.receive_count) for info in self.queue.messages()]
            stats = self.queue.stats()
            dead_queue = self.dead_letter_queue() if self.dead_ever else None
            dead_listed = [(info.id, info.receive_count) for info in dead_queue.messages()] if dead_queue else []
        expected = Counter((m.id, self.state(m), m.count) for m in self.queued())
        assert Counter(listed) == expected, (
            f"queue lists {sorted(Counter(listed) - expected)}, model {sorted(expected - Counter(listed))}"
        )
        dead = Counter((m.id, m.count) for m in self.msgs if m.where == DEAD)
        assert Counter(dead_listed) == dead, (sorted(Counter(dead_listed) - dead), sorted(dead - Counter(dead_listed)))
        states = Counter(self.state(m) for m in self.queued())
        assert (stats.ready, stats.in_flight, stats.delayed) == (states["ready"], states["in_flight"],
                                                                 states["delayed"]), stats
        assert stats.dead_lettered == sum(dead.values()), stats
        visible = [m.sent_us for m in self.queued() if self.visible(m)]
        oldest = (self.now - min(visible)) / SECOND if visible else 0.0
        assert abs(stats.oldest_ready_age - oldest) < 0.01, (stats.oldest_ready_age, oldest)

    @invariant()
    def what_the_last_step_hid_turns_visible_at_its_time(self) -> None:
        """Looks at the queue (a new handle, which changes nothing) a millisecond before and
        after each time the last step set (leases, delays) ends, without waiting for it."""
        timed, self.timed = [m for m in self.timed[-3:] if m.where == QUEUED and m.until_us], []
        for m in timed:
            turns = m.until_us + self.skew_us
            for at in (turns - 1000, turns + 1000):
                if at <= self.now:
                    continue
                with self.clock.looking_at(at):
                    listed = [(info.state, info.receive_count) for info in self.handle(True).messages(ids=[m.id])]
                assert listed == [(self.state(m, at), m.count)], (
                    f"{m.id} at now + {(at - self.now) / SECOND:.3f} s: the queue says {listed}, "
                    f"the model {self.state(m, at)} (hidden until now + {(m.until_us - self.now) / SECOND:.3f} s)"
                )

    @invariant()
    def a_group_has_at_most_group_concurrency_in_flight(self) -> None:
        if not hasattr(self, "queue"):
            return
        flying = Counter(m.group for m in self.queued() if m.group is not None and self.in_flight(m))
        assert all(n <= self.settings["group_concurrency"] for n in flying.values()), flying


QueueMachine.TestCase.settings = settings(
    max_examples=DEEP_EXAMPLES or CI_EXAMPLES,
    stateful_step_count=STEPS,
    derandomize=not DEEP_EXAMPLES,  # CI: the same examples every run; deep: random
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    # VSQS_MODEL_SHRINK=0: report the first failure as found (to see quickly whether one is found at all)
    phases=[Phase.explicit, Phase.generate] if os.environ.get("VSQS_MODEL_SHRINK") == "0" else list(Phase),
)
test_queue_matches_its_readme_model = QueueMachine.TestCase
