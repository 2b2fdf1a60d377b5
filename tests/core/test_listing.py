"""``listing``: the cache receive walks, constructed directly over a fake
layout whose listings the test chooses. Both clocks are fakes: the
monotonic clock (``time.monotonic``, which the layout advances by a
listing's cost) and the wall clock in µs (``format.now_us``). Nothing
waits; every rule is checked on both sides of its boundary."""

from __future__ import annotations

import math
import random
import time

import pytest

from vsqs._core import format as _format
from vsqs._core import listing as _listing
from vsqs._core.limits import DEFAULT_GC_GRACE
from vsqs._core.listing import (
    AGE_FACTOR,
    CHEAP_LISTING,
    EXHAUSTED_FACTOR,
    MAX_AGE,
    SWEEP_EVERY,
    Listing,
    first,
    first_messages,
)

NOW_US = 1_700_000_000_000_000  # the fake wall clock
GROUP_A = _format.group_hash("a")
GROUP_B = _format.group_hash("b")


def name(n: int, priority: int = 0, group: str = "") -> str:
    """The ready name of message ``n`` (names of one priority sort by ``n``)."""
    key = f"{_format.MAX_PRIORITY - priority}-{n:016d}-{n:016x}"
    return _format.make_stem(key, group_hash=group)


def hidden(n: int, until_us: int, count: int = 1, group: str = "") -> str:
    return _format.hidden_name(name(n, group=group), until_us, count, f"{n:012x}")


class Clocks:
    def __init__(self) -> None:
        self.mono = 5000.0
        self.wall_us = NOW_US

    def monotonic(self) -> float:
        return self.mono


class FakeLayout:
    """Listings chosen by the test: ``shards`` is a list of listings, each
    (names, is_home); a flat queue is one listing with is_home None. Each
    listing "takes" ``cost`` seconds of the fake monotonic clock."""

    def __init__(self, clocks: Clocks, names: list[str] | None = None) -> None:
        self.clocks = clocks
        self.shards: list[tuple[list[str], object]] = [(names or [], None)]
        self.cost = 0.0
        self.listings = 0  # directory listings made
        self.rounds = 0  # receive rounds started
        self.orphans: list[tuple[str, float]] = []

    def set(self, names: list[str]) -> None:
        self.shards = [(list(names), None)]

    def receive_round(self):
        self.rounds += 1
        for names, is_home in self.shards:
            self.listings += 1
            self.clocks.mono += self.cost
            yield list(names), is_home

    def remove_orphan(self, entry: str, cutoff: float) -> int:
        self.orphans.append((entry, cutoff))
        return 1


class FakeGroups:
    def __init__(self) -> None:
        self.sweeps = 0
        self.refreshes = 0

    def sweep(self) -> int:
        self.sweeps += 1
        return 0

    def refresh(self) -> None:
        self.refreshes += 1


@pytest.fixture
def clocks(monkeypatch) -> Clocks:
    clocks = Clocks()
    monkeypatch.setattr(time, "monotonic", clocks.monotonic)
    monkeypatch.setattr(_format, "now_us", lambda: clocks.wall_us)
    return clocks


@pytest.fixture
def layout(clocks) -> FakeLayout:
    return FakeLayout(clocks)


@pytest.fixture
def groups() -> FakeGroups:
    return FakeGroups()


def make(layout, groups=None, *, skew_us: int = 0, limit: int = 1, window: int | None = None) -> Listing:
    return Listing(layout, groups or FakeGroups(), skew_us, lambda: limit, window)  # type: ignore[arg-type]


def drain(listing: Listing, may_list: bool = False) -> list[str]:
    got = []
    while (candidate := listing.next_candidate(may_list)) is not None:
        got.append(candidate)
    return got


# -- delivery order -----------------------------------------------------------------


def test_the_first_call_lists_and_names_come_in_delivery_order(layout):
    names = [name(3), name(1), name(2, priority=5), name(4, priority=9), name(5)]
    layout.set(names)
    listing = make(layout)
    got = [listing.next_candidate() for _ in range(5)]
    assert got == [name(4, 9), name(2, 5), name(1), name(3), name(5)]
    assert layout.listings == 1


def test_a_fresh_cache_is_walked_without_listing_again(layout):
    layout.set([name(1), name(2), name(3)])
    layout.cost = 1.0
    listing = make(layout)
    assert [listing.next_candidate() for _ in range(3)] == [name(1), name(2), name(3)]
    assert layout.listings == 1


def test_may_list_false_never_lists(layout):
    layout.set([name(1)])
    listing = make(layout)
    assert listing.next_candidate(may_list=False) is None
    assert layout.listings == 0


# -- when a cache that still holds names is listed again ---------------------------------


def test_a_cache_is_listed_again_at_max_age(layout, clocks):
    layout.set([name(1), name(2), name(3)])
    listing = make(layout)
    assert listing.next_candidate() == name(1)
    clocks.mono += MAX_AGE * 0.999
    assert listing.next_candidate() == name(2)
    assert layout.listings == 1
    layout.set([name(2), name(3), name(0)])  # a new message that comes first
    clocks.mono += MAX_AGE * 0.001
    assert listing.next_candidate() == name(0)
    assert layout.listings == 2


def test_an_expensive_listing_is_kept_longer(layout, clocks):
    layout.cost = 1.0  # AGE_FACTOR x 1 s > MAX_AGE
    layout.set([name(1), name(2), name(3)])
    listing = make(layout)
    listing.next_candidate()
    assert listing.stale_at == clocks.mono + AGE_FACTOR * 1.0
    clocks.mono += AGE_FACTOR - 0.01
    listing.next_candidate()
    assert layout.listings == 1
    clocks.mono += 0.01
    listing.next_candidate()
    assert layout.listings == 2


def test_a_lost_race_at_the_end_of_a_priority_forces_a_listing(layout, monkeypatch):
    monkeypatch.setattr(_format, "random_below", lambda n: 5)
    layout.set([name(1, 9), name(2, 9), name(3, 9), name(4), name(5)])
    listing = make(layout)
    lost = listing.next_candidate()
    assert lost == name(1, 9)
    assert listing.skip_ahead(lost) is True
    assert listing.visible[0] == name(4)  # dropped to the end of the priority, not into the next
    layout.set([name(3, 9), name(4), name(5)])  # one of the dropped is still there
    assert listing.next_candidate() == name(3, 9)
    assert layout.listings == 2


def test_after_names_are_dropped_a_lower_priority_waits_for_a_listing(layout, skip):
    skip(2)
    listing = listed(layout, [name(n, 9) for n in range(1, 6)] + [name(6), name(7)])
    assert listing.next_candidate() == name(1, 9)
    assert listing.skip_ahead(name(1, 9)) is True  # drops name(2, 9) and name(3, 9)
    assert [listing.next_candidate(), listing.next_candidate()] == [name(4, 9), name(5, 9)]
    assert layout.listings == 1  # the priority goes on from the listing
    layout.set([name(3, 9), name(6), name(7)])  # a dropped name is still there
    assert listing.next_candidate() == name(3, 9)  # listed before priority 0
    assert layout.listings == 2
    assert drain(listing) == [name(6), name(7)]


def test_a_lower_priority_held_back_is_not_given_where_the_call_may_not_list(layout, skip):
    skip(1)
    listing = listed(layout, [name(1, 9), name(2, 9), name(3, 9), name(4)])
    assert listing.next_candidate() == name(1, 9)
    assert listing.skip_ahead(name(1, 9)) is True
    assert listing.next_candidate(may_list=False) == name(3, 9)
    assert listing.next_candidate(may_list=False) is None
    layout.set([name(4)])
    assert listing.next_candidate() == name(4)  # listed first (name(2, 9) is gone)
    assert layout.listings == 2


def test_the_priority_next_below_the_dropped_names_waits_for_a_listing(layout, skip):
    skip(1)
    listing = listed(layout, [name(1, 5), name(2, 5), name(3, 5), name(4, 4)])
    assert listing.next_candidate() == name(1, 5)
    assert listing.skip_ahead(name(1, 5)) is True  # drops name(2, 5)
    assert listing.next_candidate() == name(3, 5)
    layout.set([name(4, 4)])
    assert listing.next_candidate() == name(4, 4)
    assert layout.listings == 2


def test_a_drop_at_a_higher_priority_than_an_earlier_one_holds_back_more(layout, clocks, skip):
    skip(1)
    until = NOW_US + 1_000_000
    back = [_format.hidden_name(name(n, 7), until, 1, f"{n:012x}") for n in (10, 11, 12)]
    listing = listed(layout, [name(1, 5), name(2, 5), name(3, 5), name(4, 5), *back])
    assert listing.next_candidate() == name(1, 5)
    assert listing.skip_ahead(name(1, 5)) is True  # drops name(2, 5)
    clocks.wall_us = until  # three of priority 7 come back
    assert listing.next_candidate() == back[0]
    assert listing.skip_ahead(back[0]) is True  # drops back[1]
    assert listing.next_candidate() == back[2]
    layout.set([back[1], name(3, 5), name(4, 5)])
    assert listing.next_candidate() == back[1]  # listed before priority 5 goes on
    assert layout.listings == 2


def test_after_names_are_dropped_a_group_of_a_lower_priority_waits_for_a_listing(layout, skip):
    skip(1)
    grouped = name(5, group=GROUP_A)
    listing = listed(layout, [name(1, 9), name(2, 9), name(3, 9), grouped])
    assert listing.next_candidate() == name(1, 9)
    assert listing.skip_ahead(name(1, 9)) is True  # drops name(2, 9)
    assert listing.next_candidate() == name(3, 9)
    assert listing.next_candidate(may_list=False) is None  # the group's candidate is held back
    layout.set([name(2, 9), grouped])  # the dropped name is still there
    assert listing.next_candidate() == name(2, 9)
    assert listing.next_candidate() == grouped
    assert layout.listings == 2


def test_after_names_of_a_share_are_dropped_the_rest_of_the_priority_comes_before_a_listing(layout, skip):
    skip(1)
    names = [name(n, 9) for n in range(1, 7)] + [name(7)]
    listing = make(layout)
    listing.prefer_share(0, 2)
    layout.set(names)
    listing.relist(NOW_US)
    mine = sorted(listing.visible)
    assert len(mine) >= 3 and listing.later  # (the KEY endings of name(n) deal 1, 3, 5 to share 0 of 2)
    assert listing.next_candidate() == mine[0]
    assert listing.skip_ahead(mine[0]) is True  # drops mine[1]
    others = [n for n in names[:6] if n not in mine]
    assert drain(listing) == mine[2:] + others  # priority 9 from the rest of the listing too, no listing
    assert layout.listings == 1
    layout.set([name(7)])
    assert listing.next_candidate() == name(7)  # priority 0 once listed again
    assert layout.listings == 2


# -- when a cache that ran out is listed again -------------------------------------------


def test_after_a_cheap_listing_a_cache_that_ran_out_is_listed_at_once(layout):
    layout.cost = CHEAP_LISTING / 2
    listing = make(layout)
    for expected in range(1, 4):
        assert listing.next_candidate() is None
        assert layout.listings == expected


def test_after_an_expensive_fruitless_listing_the_next_waits_by_its_cost(layout, clocks):
    layout.cost = 1.0
    listing = make(layout)
    assert listing.next_candidate() is None
    assert layout.listings == 1
    clocks.mono += EXHAUSTED_FACTOR * 1.0 - 0.01
    assert listing.next_candidate() is None
    assert layout.listings == 1
    clocks.mono += 0.01
    layout.set([name(1)])
    assert listing.next_candidate() == name(1)
    assert layout.listings == 2


@pytest.mark.parametrize("reason", ["claimed", "skipped", "freed", "rest_of_round"])
def test_a_cache_that_ran_out_is_listed_at_once_when_more_may_be_there(layout, monkeypatch, reason):
    layout.cost = 1.0  # never cheap: only the reason makes it list
    layout.set([name(1), name(2)])
    listing = make(layout)
    assert listing.next_candidate() == name(1)
    if reason == "claimed":
        listing.claimed += 1  # what the queue does after a claim
    elif reason == "skipped":
        monkeypatch.setattr(_format, "random_below", lambda n: 1)
        layout.set([name(1), name(2), name(3)])
        listing.relist(NOW_US)
        assert listing.next_candidate() == name(1)
        assert listing.skip_ahead(name(1))  # drops name(2), keeps the last
        assert listing.next_candidate() == name(3)
    elif reason == "freed":
        listing.slot_freed(GROUP_A)
    else:
        listing.rest_of_round = True
    before = layout.listings
    drain(listing)
    layout.set([name(7)])
    assert listing.next_candidate() == name(7)
    assert layout.listings == before + 1
    assert not (listing.skipped or listing.freed or listing.claimed)  # the new listing starts afresh


def test_without_a_reason_a_cache_that_ran_out_is_not_listed_at_once(layout):
    # the control of the test above: the same steps with no reason
    layout.cost = 1.0
    layout.set([name(1), name(2)])
    listing = make(layout)
    assert listing.next_candidate() == name(1)
    drain(listing)
    assert listing.next_candidate() is None
    assert layout.listings == 1


def test_reset_forgets_the_listing(layout):
    layout.cost = 1.0
    layout.set([name(1), name(2)])
    listing = make(layout)
    listing.next_candidate()
    listing.reset()
    assert listing.visible == [] and listing.listed_at == -math.inf
    assert listing.next_candidate() == name(1)
    assert layout.listings == 2


# -- the window ---------------------------------------------------------------------------


def test_the_window_keeps_the_first_names_in_order(layout):
    names = [name(n) for n in range(20)]
    random.Random(1).shuffle(names)
    layout.set(names)
    listing = make(layout, window=5)
    listing.relist(NOW_US)
    assert drain(listing) == [name(n) for n in range(5)]


def test_a_listing_that_fits_the_window_keeps_it_all(layout):
    layout.set([name(n) for n in range(5)])
    listing = make(layout, window=5)
    listing.relist(NOW_US)
    assert len(listing.visible) == 5


def test_a_foreign_name_never_takes_a_place_in_the_window(layout):
    foreign = ["0junk", "1-not-a-key", "0000", "9-0000000000000000-zz"]  # dotless: passed through unparsed
    layout.set(foreign + [name(n) for n in range(4)])
    listing = make(layout, window=2)
    listing.relist(NOW_US)
    assert drain(listing) == [name(0), name(1)]


def test_the_window_keeps_the_soonest_hidden_names(layout, clocks):
    layout.set([hidden(n, NOW_US + (10 - n) * 1_000_000) for n in range(10)])
    listing = make(layout, window=3)
    listing.relist(NOW_US)
    assert sorted(listing.hidden) == [
        (NOW_US + s * 1_000_000, hidden(10 - s, NOW_US + s * 1_000_000)) for s in (1, 2, 3)
    ]


def test_the_window_keeps_the_first_candidates_of_groups(layout):
    names = [name(n, group=_format.group_hash(f"g{n}")) for n in range(6)]
    layout.set(names)
    listing = make(layout, window=4)
    listing.relist(NOW_US)
    assert drain(listing) == names[:4]


@pytest.mark.parametrize("size", [0, 1, 10, 4096, 5000, 50_000])
@pytest.mark.parametrize("n", [1, 7, 100, 1000])
def test_first_is_the_n_smallest(size, n):
    rng = random.Random(size * 31 + n)
    items = [rng.randrange(size // 3 + 1) for _ in range(size)]  # duplicates too
    kept = first(list(items), n)
    assert sorted(kept) == sorted(items)[:n]
    assert all(kept[i] <= kept[c] for i in range(len(kept)) for c in (2 * i + 1, 2 * i + 2) if c < len(kept))  # a heap


def test_first_of_a_short_list_is_that_list_as_a_heap():
    items = [5, 3, 9, 1]
    kept = first(items, 10)
    assert kept is items and kept[0] == 1


def test_first_of_a_skewed_list_is_exact():
    # many equal smallest items, then a long tail: a sampled cutoff can fall too low
    items = [0] * 3 + list(range(100_000, 0, -1))
    assert first(list(items), 50) == sorted(items)[:50]


def test_first_messages_drops_foreign_names_only_when_the_window_is_full():
    names = ["0junk", name(2), name(1)]
    kept, truncated = first_messages(list(names), 3)
    assert sorted(kept) == sorted(names) and not truncated  # all fit: the claimer validates
    kept, truncated = first_messages(list(names), 2)
    assert sorted(kept) == [name(1), name(2)] and not truncated  # nothing of the grammar left out
    kept, truncated = first_messages(["0junk", "1junk", name(3), name(2), name(1)], 2)
    assert kept == [name(1), name(2)] and truncated


# -- skip_ahead ---------------------------------------------------------------------------


@pytest.fixture
def skip(monkeypatch):
    """Make the random skip of skip_ahead a chosen number; records the bound asked for."""
    asked = []

    def choose(count: int):
        monkeypatch.setattr(_format, "random_below", lambda n: asked.append(n) or count)
        return asked

    return choose


def listed(layout, names, **kwargs) -> Listing:
    layout.set(names)
    listing = make(layout, **kwargs)
    listing.relist(NOW_US)
    return listing


def test_skip_ahead_drops_the_chosen_number_of_next_names(layout, skip):
    asked = skip(3)
    listing = listed(layout, [name(n) for n in range(1, 8)])
    stale_at = listing.stale_at
    assert listing.next_candidate() == name(1)
    assert listing.skip_ahead(name(1)) is True
    assert asked == [_listing.SKIP_AFTER_LOSS]
    assert drain(listing) == [name(5), name(6), name(7)]
    assert listing.skipped and listing.stale_at == stale_at  # same priority ahead: no need to list now


def test_skip_ahead_never_drops_the_last_name(layout, skip):
    skip(10)
    listing = listed(layout, [name(1), name(2), name(3)])
    assert listing.next_candidate() == name(1)
    assert listing.skip_ahead(name(1)) is True
    assert listing.visible == [name(3)]
    assert listing.skip_ahead(name(2)) is False  # one name left: it stays
    assert drain(listing) == [name(3)]


def test_skip_ahead_of_nothing_changes_nothing(layout, skip):
    skip(0)
    listing = listed(layout, [name(1), name(2), name(3)])
    stale_at = listing.stale_at
    assert listing.next_candidate() == name(1)
    assert listing.skip_ahead(name(1)) is False
    assert not listing.skipped and listing.stale_at == stale_at
    assert drain(listing) == [name(2), name(3)]


def test_skip_ahead_never_crosses_into_another_priority(layout, skip):
    skip(10)
    listing = listed(layout, [name(1, 9), name(2), name(3)])
    assert listing.next_candidate() == name(1, 9)
    assert listing.skip_ahead(name(1, 9)) is False  # the next names are of priority 0
    assert drain(listing) == [name(2), name(3)]


# -- hidden names ----------------------------------------------------------------------------


def test_hidden_names_come_in_when_their_time_comes(layout, clocks):
    soon, later = hidden(1, NOW_US + 1_000_000), hidden(2, NOW_US + 2_000_000)
    listing = listed(layout, [soon, later, hidden(3, NOW_US - 1)])
    assert listing.next_candidate(may_list=False) == hidden(3, NOW_US - 1)  # visible already
    assert listing.next_candidate(may_list=False) is None
    clocks.wall_us = NOW_US + 1_000_000
    assert listing.next_candidate(may_list=False) == soon
    assert listing.next_candidate(may_list=False) is None
    clocks.wall_us = NOW_US + 5_000_000
    assert listing.next_candidate(may_list=False) == later


def test_the_clock_skew_delays_hidden_names(layout, clocks):
    until = NOW_US + 1_000_000
    listing = listed(layout, [hidden(1, until)], skew_us=500_000)
    clocks.wall_us = until
    assert listing.next_candidate(may_list=False) is None  # not visible until 0.5 s past its time
    listing.promote(until + 499_999)
    assert listing.visible == []
    listing.promote(until + 500_000)
    assert listing.visible == [hidden(1, until)]
    just_gone = hidden(2, NOW_US - 1)
    assert listed(layout, [just_gone], skew_us=500_000).hidden == [(NOW_US - 1, just_gone)]
    assert listed(layout, [just_gone]).visible == [just_gone]


def test_a_hidden_name_of_a_group_comes_back_among_the_groups(layout):
    until = NOW_US + 1_000_000
    held = hidden(1, until, group=GROUP_A)
    listing = listed(layout, [held, name(2, group=GROUP_A)])
    assert (until, held) in listing.hidden  # it holds the group's slot until then
    assert listing.next_candidate(may_list=False) is None
    listing.promote(until)
    assert drain(listing) == [held]


def test_a_group_whose_candidate_came_back_waits_behind_the_groups_never_received(layout):
    came_back = hidden(1, NOW_US - 1, group=GROUP_A)  # received before, its timeout over
    listing = listed(layout, [came_back, name(2, group=GROUP_B)])
    assert drain(listing) == [name(2, group=GROUP_B), came_back]


def test_a_group_held_at_the_listing_comes_back_behind_the_groups_never_received(layout):
    until = NOW_US + 1_000_000
    held = hidden(1, until, group=GROUP_A)
    listing = listed(layout, [held, name(2, group=GROUP_B)])
    listing.promote(until)
    assert drain(listing) == [name(2, group=GROUP_B), held]


def test_a_delayed_group_message_is_never_received_when_its_delay_ends(layout):
    until = NOW_US + 1_000_000
    delayed = hidden(1, until, count=0, group=GROUP_A)
    listing = listed(layout, [delayed, name(2, group=GROUP_B)])
    listing.promote(until)
    assert drain(listing) == [delayed, name(2, group=GROUP_B)]  # by name: both never received


def test_a_group_released_by_this_handle_goes_behind_the_groups_never_received(layout):
    listing = listed(layout, [name(2, group=GROUP_B)])
    released = hidden(1, NOW_US, group=GROUP_A)
    listing.remember(released)
    assert drain(listing) == [name(2, group=GROUP_B), released]


def test_groups_that_came_back_merge_with_the_ungrouped_after_the_groups_never_received(layout):
    came_back = hidden(1, NOW_US - 1, group=GROUP_A)
    listing = listed(layout, [came_back, name(2), name(3, group=GROUP_B), name(4)])
    assert drain(listing) == [name(2), name(3, group=GROUP_B), came_back, name(4)]


def test_a_group_that_came_back_keeps_its_order_across_turns(layout):
    came_back = hidden(1, NOW_US - 1, group=GROUP_A)
    a, b = [came_back, name(2, group=GROUP_A)], [name(3, group=GROUP_B), name(4, group=GROUP_B)]
    listing = listed(layout, [*a, *b], limit=2)
    assert drain(listing) == [b[0], a[0], a[1], b[1]]  # turn 1: by name, as before


def test_until_next_expiry(layout, clocks):
    listing = make(layout)
    assert listing.until_next_expiry() == math.inf
    listing = listed(layout, [hidden(1, NOW_US + 2_500_000), hidden(2, NOW_US + 9_000_000)], skew_us=500_000)
    assert listing.until_next_expiry() == 3.0
    clocks.wall_us = NOW_US + 60_000_000
    assert listing.until_next_expiry() == 0.0


# -- remember ----------------------------------------------------------------------------


def test_remember_before_any_listing_is_a_no_op(layout):
    listing = make(layout)
    listing.remember(name(1))
    listing.remember(name(2), NOW_US + 1)
    assert listing.visible == [] and listing.hidden == []


def test_remember_puts_a_handles_own_moves_in_the_cache(layout):
    listing = listed(layout, [name(5)])
    listing.block(GROUP_A)
    listing.remember(name(9))
    listing.remember(hidden(3, NOW_US + 7), NOW_US + 7)
    listing.remember(name(4, group=GROUP_A))
    assert listing.hidden == [(NOW_US + 7, hidden(3, NOW_US + 7))]
    assert GROUP_A not in listing.blocked
    assert drain(listing) == [name(4, group=GROUP_A), name(5), name(9)]


# -- groups ------------------------------------------------------------------------------


def test_each_group_offers_as_many_as_it_has_slots(layout):
    names = [name(n, group=GROUP_A) for n in (1, 2, 3)]
    assert drain(listed(layout, names, limit=1)) == names[:1]
    assert drain(listed(layout, names, limit=2)) == names[:2]


def test_groups_take_turns(layout):
    a = [name(n, group=GROUP_A) for n in (1, 2, 3)]
    b = [name(n, group=GROUP_B) for n in (4, 5, 6)]
    listing = listed(layout, a + b, limit=3)
    assert drain(listing) == [a[0], b[0], a[1], b[1], a[2], b[2]]


def test_a_groups_later_turns_wait_for_the_ungrouped(layout):
    a = [name(n, group=GROUP_A) for n in (1, 2)]
    listing = listed(layout, [*a, name(7), name(8)], limit=2)
    assert drain(listing) == [a[0], name(7), name(8), a[1]]


def test_a_groups_first_turn_goes_by_name_against_the_ungrouped(layout):
    listing = listed(layout, [name(1), name(2, group=GROUP_A), name(3), name(4, group=GROUP_A)], limit=2)
    assert drain(listing) == [name(1), name(2, group=GROUP_A), name(3), name(4, group=GROUP_A)]


def test_messages_in_flight_hold_their_groups_slots(layout):
    until = NOW_US + 10_000_000
    in_flight = hidden(1, until, group=GROUP_A)
    delayed = _format.hidden_name(name(2, group=GROUP_A), until, 0)
    waiting = [name(n, group=GROUP_A) for n in (3, 4)]
    listing = listed(layout, [in_flight, delayed, *waiting], limit=2)
    assert drain(listing) == [waiting[0]]  # one slot held, the delayed one not in the order yet
    assert (until, in_flight) in listing.hidden


def test_a_blocked_group_is_left_alone_until_the_next_listing(layout):
    names = [name(1, group=GROUP_A), name(2, group=GROUP_B)]
    listing = listed(layout, names, limit=1)
    listing.block(GROUP_A)
    assert drain(listing) == [names[1]]
    listing.relist(NOW_US)
    assert listing.blocked == set()
    assert drain(listing) == names


def test_slot_freed_lifts_the_block(layout):
    names = [name(1, group=GROUP_A), name(2, group=GROUP_A)]
    listing = listed(layout, names)
    listing.block(GROUP_A)
    listing.slot_freed(GROUP_A)
    assert GROUP_A not in listing.blocked and listing.freed
    assert drain(listing) == names[:1]


def test_group_leases_are_refreshed_with_listings_of_groups_and_swept_rarely(layout, groups, clocks):
    layout.set([name(1, group=GROUP_A)])
    listing = make(layout, groups)
    listing.relist(NOW_US)
    assert (groups.refreshes, groups.sweeps) == (1, 1)
    clocks.mono += SWEEP_EVERY
    listing.relist(NOW_US)
    assert (groups.refreshes, groups.sweeps) == (2, 1)
    clocks.mono += 0.01
    layout.set([name(2)])  # the groups are gone: refreshed once more, then left alone
    listing.relist(NOW_US)
    assert (groups.refreshes, groups.sweeps) == (3, 2)
    listing.relist(NOW_US)
    assert (groups.refreshes, groups.sweeps) == (3, 2)


def test_a_queue_without_groups_never_touches_the_leases(layout, groups):
    layout.set([name(1), hidden(2, NOW_US + 1)])
    listing = make(layout, groups)
    for _ in range(3):
        listing.relist(NOW_US)
    assert (groups.refreshes, groups.sweeps) == (0, 0)


# -- orphans ------------------------------------------------------------------------------


def test_orphaned_new_files_are_swept_at_most_once_a_minute(layout, clocks, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 1e9)
    orphan = _format.writing_name(name(1))
    layout.set([orphan, name(2)])
    listing = make(layout)
    listing.relist(NOW_US)
    assert layout.orphans == [(orphan, 1e9 - DEFAULT_GC_GRACE)]
    clocks.mono += SWEEP_EVERY
    listing.relist(NOW_US)
    assert len(layout.orphans) == 1
    clocks.mono += 0.01
    listing.relist(NOW_US)
    assert len(layout.orphans) == 2
    assert name(2) in listing.visible and orphan not in listing.visible


# -- a sharded queue's round ------------------------------------------------------------------


def shard_of(n: int) -> int:
    return n // 10


def sharded(layout: FakeLayout, shards: list[list[str]]) -> None:
    """Shard i holds ``shards[i]``; a name is at home in shard n // 10 (see ``name``)."""
    layout.shards = [
        (names, lambda text, i=i: int(text[2:18]) // 10 == i) for i, names in enumerate(shards)
    ]


def test_a_round_stops_at_the_first_shard_with_something_to_claim(layout):
    sharded(layout, [[], [name(11), name(12)], [name(21)]])
    listing = make(layout)
    listing.relist(NOW_US)
    assert layout.listings == 2 and listing.rest_of_round
    assert drain(listing) == [name(11), name(12)]


def test_when_a_shard_runs_out_the_round_goes_on(layout):
    layout.cost = 1.0  # never cheap: rest_of_round alone makes it list at once
    sharded(layout, [[], [name(11)], [name(21)]])
    listing = make(layout)
    assert listing.next_candidate() == name(11)
    assert listing.rest_of_round and layout.listings == 2
    layout.shards = [([name(21)], lambda text: shard_of(int(text[2:18])) == 2)]  # the round goes on at shard 2
    assert listing.next_candidate() == name(21)
    assert layout.rounds == 2


def test_strays_and_foreign_names_do_not_stop_a_round(layout):
    stray = name(25)  # lies in shard 0, belongs to shard 2
    sharded(layout, [[stray, "junk", hidden(3, NOW_US + 5), _format.writing_name(name(4))], [], [name(21)]])
    listing = make(layout)
    listing.relist(NOW_US)
    assert layout.listings == 3 and listing.rest_of_round
    assert drain(listing) == [name(21)]  # the stray is not offered where it lies
    assert listing.hidden == [(NOW_US + 5, hidden(3, NOW_US + 5))]  # what was passed on the way is kept
    assert [entry for entry, _ in layout.orphans] == [_format.writing_name(name(4))]


def test_a_round_with_nothing_to_claim_has_seen_every_shard(layout):
    sharded(layout, [[name(25)], [hidden(11, NOW_US + 5)], [name(1)]])  # strays only
    listing = make(layout)
    listing.relist(NOW_US)
    assert layout.listings == 3 and not listing.rest_of_round
    assert listing.visible == [] and listing.hidden == [(NOW_US + 5, hidden(11, NOW_US + 5))]


def test_a_shard_with_a_groups_candidate_stops_the_round(layout):
    grouped = name(11, group=GROUP_A)
    sharded(layout, [[], [grouped], [name(21)]])
    listing = make(layout)
    listing.relist(NOW_US)
    assert layout.listings == 2 and listing.rest_of_round
    assert drain(listing) == [grouped]
