"""A handle's cached view of its queue's directory, walked by receive.

Receive must not list the directory on every call: a handle lists once,
keeps the names sorted in heaps (visible ones by delivery order, a group's
next ones by turn, hidden ones by the time they turn visible) and walks them,
listing again when they run out or grow old. Everything here is called with
the queue's lock held.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

from vsqs._core import format as _format
from vsqs._core import settings as _settings
from vsqs._core.format import State
from vsqs._core.groups import GroupLeases
from vsqs._core.layout import Layout
from vsqs._core.limits import DEFAULT_GC_GRACE, MAX_RUN, MAX_SHARES, SHARE_DIGITS
from vsqs._core.wakeup import Watch
from vsqs._core.window import deal, first, first_messages

# A cached listing is re-read when it runs out, or when older than
# max(MAX_AGE, AGE_FACTOR x the time the last listing took), so that
# listing costs stay a small share of the time at any depth.
MAX_AGE = 2.0
AGE_FACTOR = 20.0
EXHAUSTED_FACTOR = 4.0
CHEAP_LISTING = 0.001  # a listing this fast is repeated whenever the cache runs out
SWEEP_EVERY = 60.0  # seconds between bulk passes (superseded group leases, orphaned .new files)

# At most this many names of a listing are kept per handle (visible ones; as
# many hidden ones): the first ones in delivery order. A deeper queue is
# listed again when they run out, so a handle's memory does not grow with
# the queue (90-110 bytes a name: some 9-11 MB at most).
WINDOW = 100_000
# After losing the race for a name to another consumer, a handle drops a random
# 0..SKIP_AFTER_LOSS-1 of the next names of the same priority from its cache (never
# its last name): the winner is likely to take them next, and consumers that walk
# the same listing in the same order would otherwise lose a race for about every
# name they get. The names dropped are still in the directory: the handle lists
# again before its cache runs dry, and before it goes on to a lower priority (see
# skip_ahead), so a receive returns nothing only if every name of its latest
# listing was tried, and never passes a higher priority it dropped.
SKIP_AFTER_LOSS = 16
# At most this many messages past retention (see Retention in docs/FORMAT.md) are
# removed by one receive call, and kept for it by one listing: a receive that
# meets more skips the rest (never delivered) and leaves them to the next call or
# gc, so that a ``wait=0`` receive costs bounded work however many there are.
REMOVALS_PER_CALL = 1_000
# A group's candidate that came back (received before: COUNT >= 1) goes after the
# candidates of its turn never received (see _place)
CAME_BACK = 1


class Listing:
    """The cache: its heaps and what is known of the listing they came from.

    The receive hot path reads ``visible``, ``hidden``, ``grouped``,
    ``stale_at``, ``list_before`` and ``rest_of_round`` directly and pops
    ``visible`` itself in the common case; everything else goes through the
    methods.
    """

    def __init__(
        self,
        layout: Layout,
        groups: GroupLeases,
        skew_us: int,
        group_limit: Callable[[], int],
        window: int | None = None,
        retention: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._layout = layout
        self._groups = groups
        self._skew_us = skew_us
        self._group_limit = group_limit  # the queue's group_concurrency now
        self._retention = retention  # the queue's retention now
        self.window = WINDOW if window is None else window  # (the module's, looked up now: a test seam)
        self._groups_seen = False
        self.runs_wanted = False  # keep each group's next names (runs): once a receive asked for runs
        self._groups_swept_at = -math.inf
        self._orphans_swept_at = -math.inf
        # the queue's watch once this handle waited, and how much of its news this cache knows
        self.watch: Watch | None = None
        self.watch_epoch, self.watch_version = 0, 0
        self.listings = 0  # how many listings this cache made: a receive tells a new one by it, not by a clock
        self._share: frozenset[str] | None = None  # the KEY endings of the share this handle takes first
        self.reset()

    def prefer_share(self, index: int, count: int) -> None:
        """Take the ready messages of share ``index`` of ``count`` (at most
        MAX_SHARES) first, from the next listing on (see :func:`deal`)."""
        self._share = frozenset(f"{i:0{SHARE_DIGITS}x}" for i in range(index, MAX_SHARES, count))

    def reset(self) -> None:
        """Forget the listing (after a purge): the next receive lists again."""
        self.visible: list[str] = []  # heap: smallest name = next to deliver
        self.later: list[str] = []  # heap: the rest of the listing's visible names, once ``visible`` runs out (deal)
        self.dealt = ""  # the PRIO digit of the names dealt to ``visible`` while ``later`` holds the rest
        # heap of (place, name) for messages of groups (see _place): groups take
        # turns, and within a turn a group never received goes before one that came back
        self.grouped: list[tuple[int, str]] = []
        self.hidden: list[tuple[int, str]] = []  # heap by the time they turn visible
        self.blocked: set[str] = set()  # groups to leave alone until the next listing
        # group -> the names that follow its candidate in the group's order, as
        # listed (only with one slot a group: a receive may take them as a run)
        self.runs: dict[str, list[str]] = {}
        # group -> its names as listed, when it had messages in flight and runs are
        # wanted with one slot a group: what a hand-over judges (see GroupReceiver)
        self.views: dict[str, list[_format.Name]] = {}
        self.listed_at = -math.inf  # time.monotonic() of the listing
        self.cost = 0.0  # seconds the listing took
        self.stale_at = -math.inf  # time.monotonic() from which it is re-read even if not used up
        self.claimed = 0  # messages claimed from this listing
        # a sharded queue's listing stopped at a shard with candidates before
        # going round them all: once they are used up, the next shards are listed
        self.rest_of_round = False
        self.skipped = False  # names of this listing were dropped after a lost race: list again when out
        # after names were dropped (skip_ahead): a candidate not below this bound (of a lower
        # priority than theirs) waits for a listing, in case some of them are still there
        self.list_before: str | None = None
        self.freed = False  # this handle freed a group's slot since the listing: list again when out
        self.published = False  # this handle published since the listing: list again when out
        # names past retention the listing kept aside, never candidates: members of groups met
        # before their group's candidate, ready names left out of its window (_without_expired);
        # the receive that made the listing removes them
        self.expired: list[str] = []

    def next_candidate(self, may_list: bool = True) -> str | None:
        """The next name to try to claim (not yet validated). The directory is
        listed again if the cache is stale and ``may_list``."""
        if not self.visible and self.later:  # this handle's share is taken: the others' next
            self.visible, self.later = self.later, []
        if self.hidden:
            self.promote(_format.now_us())
        while self.grouped and _format.group_of(self.grouped[0][1]) in self.blocked:
            heapq.heappop(self.grouped)  # not a candidate: a cache left with only these has run out
        if self.visible or self.grouped:
            stale = time.monotonic() >= self.stale_at or self._held_back()
        else:
            # ran out: at once if the last listing was of use (this handle claimed
            # from it: more may have come since), if names were left behind, if
            # this handle freed a group's slot or published; after a listing that gave nothing
            # to claim, not too often (by its cost). Never on a timing heuristic
            # alone while a message this handle could claim may be ready.
            age = time.monotonic() - self.listed_at
            stale = (
                self.claimed > 0
                or self.skipped
                or self.freed
                or self.published
                or self.rest_of_round
                or self.cost < CHEAP_LISTING
                or age >= EXHAUSTED_FACTOR * self.cost
            )
        if stale and may_list:
            self.skipped = False
            self.relist(_format.now_us())
        elif self._held_back():  # (only where this call may not list)
            return None
        while self.grouped:
            place, name = self.grouped[0]
            if self.visible and (place > CAME_BACK or self.visible[0] < name):  # past the first turn
                break
            heapq.heappop(self.grouped)
            if _format.group_of(name) not in self.blocked:
                return name
        return heapq.heappop(self.visible) if self.visible else None

    def _held_back(self) -> bool:
        """Whether the next candidate waits for a listing (see ``list_before``)."""
        if self.list_before is None:
            return False
        if self.grouped:  # the group's candidate, if it comes before the next visible name (as below)
            place, name = self.grouped[0]
            if not self.visible or (place <= CAME_BACK and name <= self.visible[0]):
                return name >= self.list_before
        return bool(self.visible) and self.visible[0] >= self.list_before

    def skip_ahead(self, lost: str) -> bool:
        """After losing the race for ``lost``: drop a random few of the next
        visible names of the same priority (see SKIP_AFTER_LOSS); whether any was dropped."""
        visible = self.visible
        skip = _format.random_below(SKIP_AFTER_LOSS)
        priority = lost[:1]  # the first character of a name: its priority
        dropped = False
        while skip and len(visible) > 1 and visible[0][:1] == priority:  # the last name stays
            heapq.heappop(visible)
            skip -= 1
            dropped = True
        if dropped:
            self.skipped = True  # once the cache runs out, list again at once
            # list again before going on to a lower priority (now, or once this one's
            # names are taken, from ``later`` too), in case some of the dropped are still there
            bound = chr(ord(priority) + 1)
            self.list_before = bound if self.list_before is None else min(self.list_before, bound)
        return dropped

    def promote(self, now: int) -> None:
        """Move hidden names whose time has come to the visible heaps."""
        while self.hidden and self.hidden[0][0] + self._skew_us <= now:
            name = heapq.heappop(self.hidden)[1]
            if group := _format.group_of(name):
                # back in its group's order, before the names kept as the run of the
                # group's candidate: that run is not this name's
                self.runs.pop(group, None)
                heapq.heappush(self.grouped, (_place(0, _format.parse_name(name)), name))
            else:
                self._push_ready(name)

    def _push_ready(self, name: str) -> None:
        """Back among the ready names: after the names of ``later`` if its
        priority is below the dealt one's (see deal), else in ``visible``."""
        if self.later and name[:1] > self.dealt:
            heapq.heappush(self.later, name)
        else:
            heapq.heappush(self.visible, name)

    def skip_removed(self, group: str) -> bool:
        """The group's candidate left the queue (moved to the dead-letter queue, or
        removed past retention): the next name of its run (as listed) is its
        candidate now; if none was kept, list again before the next candidate (the
        group's next message may come before it). Whether the listing must be made
        for the group to go on."""
        following = self.runs.pop(group, None)
        if following:
            heapq.heappush(self.grouped, (_place(0, _format.parse_name(following[0])), following[0]))
            self.runs[group] = following[1:]
            return False
        self.stale_at = -math.inf
        self.freed = True
        return True

    def want_runs(self) -> None:
        """From now on keep each group's next names at every listing, and list
        again now, so that the receive asking for runs finds them."""
        if not self.runs_wanted:
            self.runs_wanted = True
            self.stale_at = -math.inf

    def take_run(self, group: str) -> list[str]:
        """The names listed after ``group``'s candidate, in order (forgotten as
        they are taken: a run is taken from a listing once)."""
        return self.runs.pop(group, None) or []

    def remember(self, name: str, until_us: int = 0) -> None:
        """Put a name this handle just made into the cache, so it sees its own moves."""
        if self.listed_at == -math.inf:
            return
        if until_us:
            heapq.heappush(self.hidden, (until_us, name))
        elif _format.group_of(name):
            self.blocked.discard(_format.group_of(name))
            self.runs.pop(_format.group_of(name), None)  # the group's order changed
            heapq.heappush(self.grouped, (_place(0, _format.parse_name(name)), name))
        else:
            self._push_ready(name)

    def slot_freed(self, group: str) -> None:
        """This handle freed a slot of ``group`` (or moved its lease): its view of
        the group is stale. Lift the group's block, and list again once the cache
        runs out, so the group's next message is seen whatever the listing cost."""
        self.blocked.discard(group)
        self.runs.pop(group, None)  # the group's order may have changed
        self.freed = True

    def block(self, group: str) -> None:
        """Leave ``group`` alone until the next listing (its slots are all held)."""
        self.blocked.add(group)

    def absorb(self, watch: Watch) -> tuple[int, bool]:
        """Take in what ``watch`` told since this cache last looked: the names that landed
        (ready ones to try, hidden ones to wait for), or, when it cannot name them all, a
        listing at the next try. The watch's version now, and whether there is anything new."""
        epoch, version, names = watch.news_since(self.watch_epoch, self.watch_version)
        self.watch_epoch, self.watch_version = epoch, version
        if names is None:
            self.freed = True  # list again, now: this cache may lack names nobody will tell of
            self.stale_at = -math.inf
            return version, True
        if not names or self.listed_at == -math.inf:  # (never listed: the next try lists)
            return version, bool(names)
        for text in names:
            name = _format.parse_name(text)
            if name is None:
                continue
            if name.state is State.HIDDEN:
                heapq.heappush(self.hidden, (name.until_us, text))
            else:
                self.remember(text)
        return version, True

    def until_next_expiry(self) -> float:
        """Seconds until the first hidden name of the cache turns visible."""
        if not self.hidden:
            return math.inf
        return max(0.0, (self.hidden[0][0] + self._skew_us - _format.now_us()) / 1e6)

    def relist(self, now: int) -> None:
        """List the directory; keep the first names of each kind (see WINDOW)."""
        started = time.monotonic()
        # cleared before the directories are read: a publish whose flag comes later (another
        # thread of this handle) may have renamed after the read, and keeps it set
        self.published = False
        if self.watch is not None:  # what the watch told before this listing, the listing shows
            self.watch_epoch, self.watch_version = self.watch.mark()
        self.runs = {}
        self.views = {}
        self.expired = []
        kept_from = _settings.retained_from_us(self._retention(), now, self._skew_us)
        found, grouped, more_shards = self._list(now, kept_from)
        visible, _ = first_messages(found.visible, self.window)  # (names left out: listed again when out)
        visible, later = deal(visible, self._share) if self._share is not None and visible else (visible, [])
        kept_grouped = first(grouped, self.window)
        hidden = first(found.hidden, self.window)  # the soonest to turn visible; later ones wait for a listing
        if found.writing and time.monotonic() - self._orphans_swept_at > SWEEP_EVERY:
            # a bulk pass at most once a minute: .new files of publishers that died
            self._orphans_swept_at = time.monotonic()
            cutoff = time.time() - DEFAULT_GC_GRACE
            for orphan in found.writing:
                self._layout.remove_orphan(orphan, cutoff)
        if found.grouped or self._groups_seen:
            if time.monotonic() - self._groups_swept_at > SWEEP_EVERY:
                self._groups.sweep()  # a bulk pass, at most once a minute per handle
                self._groups_swept_at = time.monotonic()
            self._groups.refresh()
            self._groups_seen = bool(found.grouped)
        self.visible, self.later, self.grouped, self.hidden = visible, later, kept_grouped, hidden
        self.dealt = visible[0][:1] if later else ""  # the priority of the names dealt to this handle
        self.rest_of_round = more_shards
        self.claimed = 0
        self.blocked = set()
        self.freed = False
        self.list_before = None
        self.listed_at = time.monotonic()
        self.listings += 1
        self.cost = self.listed_at - started
        self.stale_at = self.listed_at + max(MAX_AGE, AGE_FACTOR * self.cost)

    def _without_expired(self, names: list[str], kept_from: int) -> list[str]:
        """``names`` (ready, ungrouped) without those past retention (SENT before
        ``kept_from``), when there are more than the window holds: the oldest sort
        first, and would fill the window while a message retained waits behind
        them. Up to REMOVALS_PER_CALL of them are kept in ``expired`` for removal,
        the rest wait for a later listing or gc (a foreign name of their shape is
        dropped too: it is never delivered)."""
        oldest = f"{kept_from:016d}"  # (SENT is 16 digits at [2:18]: compared as text, as a number)
        expired = self.expired
        kept: list[str] = []
        for name in names:
            if name[2:18] >= oldest:
                kept.append(name)
            elif len(expired) < REMOVALS_PER_CALL:
                parsed = _format.parse_name(name)
                if parsed is not None and parsed.state is not State.WRITING and parsed.sent_us < kept_from:
                    expired.append(name)
        return kept

    def _list(self, now: int, kept_from: int | None) -> tuple[_format.Triage, list[tuple[int, str]], bool]:
        """One listing sorted out for receive: the names by state, the groups'
        candidates, and whether other shards may hold more.

        The layout's receive round gives one listing (a flat queue) or the
        shards one at a time; it stops at the first with something to claim
        now. Hidden names and ``.new`` files of the shards passed on the way
        are kept too (their visible names are not: by then they were all
        foreign, or strays of other shards)."""
        visible_from = now - self._skew_us
        passed = _format.Triage([], [], [], [])
        candidates: list[tuple[int, str]] = []
        for names, is_home in self._layout.receive_round():
            found = _format.triage(names, visible_from)
            if kept_from is not None and len(found.visible) > self.window:  # (before a shard is judged empty)
                found = found._replace(visible=self._without_expired(found.visible, kept_from))
            grouped = self._group_candidates(found.grouped, now, found.hidden, kept_from) if found.grouped else []
            if is_home is None:
                return found, grouped, False
            candidates.extend(grouped)
            if grouped or any(_format.is_message_name(name) and is_home(name) for name in found.visible):
                found.hidden.extend(passed.hidden)
                found.writing.extend(passed.writing)
                found.grouped.extend(passed.grouped)
                return found, candidates, True
            passed.hidden.extend(found.hidden)
            passed.writing.extend(found.writing)
            passed.grouped.extend(found.grouped)
        return passed, candidates, False

    def _group_candidates(
        self, members_of_groups: list[_format.Name], now: int, hidden: list[tuple[int, str]],
        kept_from: int | None = None,
    ) -> list[tuple[int, str]]:
        """Each group's next messages in order, as many as it has free slots. A
        member past retention (SENT before ``kept_from``) is never a candidate: the
        group's next one is, and the member is kept in ``expired`` for removal
        (up to REMOVALS_PER_CALL a listing), so a group whose head ran out of
        retention costs no listing per member."""
        expired = self.expired
        groups: dict[str, list[_format.Name]] = {}
        for name in members_of_groups:
            groups.setdefault(name.group_hash, []).append(name)
        limit = self._group_limit()
        skew = self._skew_us
        room = self.window  # names kept for runs, in all (a bound on the memory)
        candidates: list[tuple[int, str]] = []
        for members in groups.values():
            members.sort(key=lambda name: name.key)
            held = [m for m in members if m.state is State.HIDDEN and m.receive_count and m.until_us + skew > now]
            for m in held:  # back in play when its lease runs out
                hidden.append((m.until_us, str(m)))
            if held and limit == 1 and self.runs_wanted:
                self._hand_over_candidate(members, now, kept_from, candidates, hidden)
                continue
            free = limit - len(held)
            turn = 0
            run: list[str] | None = None
            for m in members:
                if m.state is State.HIDDEN and m.until_us + skew > now:
                    if not m.receive_count:  # delayed: in the group's order at its time (a timer then)
                        hidden.append((m.until_us, str(m)))
                    continue  # in flight, or delayed: not yet in the group's order
                if run is not None:  # the names after a lone slot's candidate (see take_run)
                    if kept_from is not None and m.sent_us < kept_from:
                        break  # past retention (its name of another priority than its candidate's)
                    run.append(str(m))
                    if len(run) >= MAX_RUN - 1 or room <= 0:
                        break
                    room -= 1
                    continue
                if kept_from is not None and m.sent_us < kept_from:  # past retention (its slots held or not)
                    if len(expired) < REMOVALS_PER_CALL:
                        expired.append(str(m))
                    continue
                if free <= 0:
                    break
                candidates.append((_place(turn, m), str(m)))
                turn += 1
                free -= 1
                if limit == 1 and self.runs_wanted:
                    run = self.runs[m.group_hash] = []
        return candidates

    def _hand_over_candidate(
        self, members: list[_format.Name], now: int, kept_from: int | None,
        candidates: list[tuple[int, str]], hidden: list[tuple[int, str]],
    ) -> None:
        """A group with messages in flight, one slot and runs wanted: its first
        message is a candidate if it is visible (a hand-over, see FORMAT.md, Runs),
        and its names (those past retention left out: never delivered) are kept
        for the hand-over to judge."""
        skew = self._skew_us
        view = [m for m in members if kept_from is None or m.sent_us >= kept_from]
        self.views[members[0].group_hash] = view
        candidate = None
        for m in view:
            if m.state is State.HIDDEN and m.until_us + skew > now:
                if not m.receive_count:  # delayed: in the group's order at its time (a timer then)
                    hidden.append((m.until_us, str(m)))
                continue
            candidate = candidate or m
        first_in_flight = next((m.key for m in view if m.receive_count and m.state is State.HIDDEN
                                and m.until_us + skew > now), None)
        if candidate is not None and (first_in_flight is None or candidate.key < first_in_flight):
            candidates.append((_place(0, candidate), str(candidate)))

    def view(self, group: str) -> list[_format.Name] | None:
        """The group's names as listed, if a hand-over may be judged from them."""
        return self.views.get(group)


def _place(turn: int, name: _format.Name | None) -> int:
    """Where a group's candidate goes in the heap: by turn, and within a turn the
    groups never received first, then those whose candidate came back (received
    before and visible again: COUNT >= 1), as Amazon SQS FIFO serves groups.
    In the first turn, ungrouped names merge with that sequence by name."""
    return 2 * turn + (CAME_BACK if name is not None and name.receive_count else 0)
