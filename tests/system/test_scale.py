"""What keeps receive cheap and a handle small: the bounded listing window,
the cheap listing triage, and the cache of receipts a handle issued."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import vsqs
from vsqs._core import format as _format
from vsqs._core import listing as _listing
from vsqs._core import receipts as _receipts
from vsqs._core import window as _window
from vsqs._core.errors import InvalidReceipt, StaleReceipt

# -- the n smallest of a listing ------------------------------------------------


@settings(deadline=None)  # no timing in tests: a loaded machine must not fail it
@given(st.lists(st.text(alphabet="0123456789ab-", max_size=6), max_size=300), st.integers(1, 320))
def test_first_is_the_sorted_prefix_as_a_heap(items, n):
    kept = _window.first(list(items), n)
    assert sorted(kept) == sorted(items)[:n]
    assert all(kept[i] <= kept[c] for i in range(len(kept)) for c in (2 * i + 1, 2 * i + 2) if c < len(kept))


def test_first_of_a_long_list_takes_the_sample_path_and_stays_exact():
    rng = random.Random(5)
    names = [_format.new_key(rng.randrange(10)) for _ in range(20_000)]
    rng.shuffle(names)
    assert _window.first(list(names), 3_000) == sorted(names)[:3_000]
    skewed = ["a"] * 10_000 + ["b"] * 10_000  # a sample cannot split ties: still exact
    rng.shuffle(skewed)
    assert _window.first(skewed, 12_000) == ["a"] * 10_000 + ["b"] * 2_000


# -- listing triage ----------------------------------------------------------------


def test_triage_sorts_names_by_state():
    key = "9-1795305501723584-892190c0ba724662"
    group = key + "-g0123456789ab"
    names = [
        key,  # ready
        key + ".2",  # ready again
        key + ".0000000000000100.1.0191cc303a5c",  # hidden, expired at 200
        key + ".0000000000000300.1.0191cc303a5c",  # hidden until 300
        key + ".new",
        group,
        group + ".0000000000000300.1.0191cc303a5c",
        "README",  # foreign, dotless: passed through, parsed when claimed
        ".vsqs.json",  # foreign, with a dot: dropped
        "9-1795305501723584-892190c0ba72466Z.1",  # foreign near miss
    ]
    found = _format.triage(names, 200)
    assert found.visible == [key, key + ".2", key + ".0000000000000100.1.0191cc303a5c", "README"]
    assert found.hidden == [(300, key + ".0000000000000300.1.0191cc303a5c")]
    assert [str(n) for n in found.grouped] == [group, group + ".0000000000000300.1.0191cc303a5c"]
    assert found.writing == [key + ".new"]
    assert _format.group_of(group) == "0123456789ab"
    assert _format.group_of(key) == ""


def test_triage_takes_names_in_flight_unparsed_and_parses_the_rest(monkeypatch):
    key = "9-1795305501723584-892190c0ba724662"
    in_flight = [f"{key[:-4]}{i:04x}.0000000000000300.1.0191cc303a5c" for i in range(3)]
    parsed = []
    parse = _format.parse_name

    def counting(name):
        parsed.append(name)
        return parse(name)

    monkeypatch.setattr(_format, "parse_name", counting)
    expired = key + ".0000000000000100.1.0191cc303a5c"
    shaped = [
        "junk.0000000000000300.x",  # foreign, of the shape, time to come: kept hidden, parsed when it comes
        "junk.0000000000000100.x",  # foreign, of the shape, time come: parsed, dropped
        "junk.\uff10000000000000300.x",  # foreign, a non-ASCII digit: parsed, dropped
    ]
    found = _format.triage([*in_flight, expired, *shaped], 200)
    assert parsed == [expired, *shaped[1:]]
    assert found.hidden == [(300, name) for name in in_flight] + [(300, shaped[0])]
    assert found.visible == [expired]


def test_a_foreign_name_shaped_as_in_flight_is_never_delivered(tmp_path):
    queue = vsqs.Queue(str(tmp_path / "q"), create=True)
    queue.publish(b"one")
    past, future = _format.now_us() - 1_000_000, _format.now_us() + 3_600_000_000
    for until in (past, future):
        (tmp_path / "q" / f"junk.{until:016d}.1.0191cc303a5c").write_bytes(b"not a message")
    assert [m.body for m in queue.receive_batch(10)] == [b"one"]
    assert queue.receive_batch(10, wait=0) == []


# -- the bounded window --------------------------------------------------------------


def _small_window(monkeypatch, size):
    """Handles made from now on keep at most ``size`` names of a listing;
    returns the sizes of the windows they kept."""
    monkeypatch.setattr(_listing, "WINDOW", size)
    kept = []
    first_messages = _window.first_messages

    def recorded(names, n):
        window = first_messages(names, n)
        kept.append(len(window[0]))
        return window

    monkeypatch.setattr(_listing, "first_messages", recorded)
    return kept


def test_a_small_window_still_delivers_everything_in_priority_order(flat_queue, monkeypatch):
    kept = _small_window(monkeypatch, 7)
    queue = vsqs.Queue(flat_queue.path)  # one delivery order across the queue: no shards
    ids = {}
    for i in range(40):
        priority = i % 4
        ids[queue.publish(b"%d" % i, priority=priority, durable=False)] = priority
    got = []
    while (m := queue.receive()) is not None:
        got.append(m.id)
        m.delete()
    assert kept and max(kept) <= 7
    assert sorted(got) == sorted(ids)
    assert got == sorted(ids, key=lambda key: (-ids[key], key))  # priority first, then send time


def test_a_small_window_lists_again_only_when_it_runs_out(flat_queue, monkeypatch):
    _small_window(monkeypatch, 10)
    queue = vsqs.Queue(flat_queue.path)  # one delivery order across the queue: no shards
    queue.publish_batch([b"%d" % i for i in range(95)], durable=False)
    from unittest import mock

    from vsqs._core import fs as _fs

    with mock.patch.object(_fs, "list_names", wraps=_fs.list_names) as listing:
        for _ in range(95):
            queue.receive().delete()
        assert queue.receive() is None
    assert 10 <= listing.call_count <= 12  # one per window of 10, and the empty end


def test_a_small_window_with_many_hidden_messages(queue, monkeypatch):
    _small_window(monkeypatch, 3)
    queue = vsqs.Queue(queue.path)
    queue.publish_batch([b"late%d" % i for i in range(8)], delay=0.3, durable=False)
    queue.publish_batch([b"now%d" % i for i in range(8)], durable=False)
    assert sorted(m.body for m in queue.receive_batch(100)) == sorted(b"now%d" % i for i in range(8))
    deadline = time.monotonic() + 10
    late = []
    while len(late) < 8 and time.monotonic() < deadline:
        late += [m.body for m in queue.receive_batch(100, wait=0.5)]
    assert sorted(late) == sorted(b"late%d" % i for i in range(8))


def test_a_small_window_with_groups(queue, monkeypatch):
    _small_window(monkeypatch, 2)
    queue = vsqs.Queue(queue.path)
    for i in range(6):
        for group in "abc":
            queue.publish(f"{group}{i}", group=group, durable=False)
    queue.publish_batch([b"plain"] * 3, durable=False)
    order = {g: [] for g in "abc"}
    plain = 0
    for _ in range(200):
        batch = queue.receive_batch(10)
        if not batch and all(len(v) == 6 for v in order.values()) and plain == 3:
            break
        for m in batch:
            if m.group is None:
                plain += 1
            else:
                order[m.group].append(m.body.decode())
            m.delete()
    assert plain == 3
    assert order == {g: [f"{g}{i}" for i in range(6)] for g in "abc"}


def test_foreign_dotless_names_first_in_order_are_never_claimed(flat_queue, monkeypatch):
    _small_window(monkeypatch, 2)
    queue = vsqs.Queue(flat_queue.path)  # one delivery order across the queue: no shards
    for name in ("0-foreign", "0", "1-1795305501723584-892190c0ba72466Z", "README"):
        with open(os.path.join(queue.path, name), "w") as f:
            f.write("not a message")
    queue.publish_batch([b"1", b"2", b"3"], durable=False)
    assert [m.body for m in queue.receive_batch(10)] == [b"1", b"2", b"3"]
    assert {"0-foreign", "0", "1-1795305501723584-892190c0ba72466Z", "README"} <= set(os.listdir(queue.path))


# -- consumers walking the same listing ---------------------------------------------------


def _count_renames(monkeypatch):
    from vsqs._core import fs as _fs

    outcomes = []
    rename = _fs.rename

    def counted(src, dst):
        ok = rename(src, dst)
        outcomes.append(ok)
        return ok

    monkeypatch.setattr(_fs, "rename", counted)
    return outcomes


def test_two_handles_on_one_listing_do_not_lose_a_race_per_message(queue, monkeypatch):
    """Two consumers that list the same names and take turns would each lose a
    race for about every message they get (each tries the name the other just
    took); a handle that lost one skips ahead a few names instead."""
    monkeypatch.setattr(_format, "_ids", random.Random(7))  # the same skips on every run
    queue.publish_batch([b"%d" % i for i in range(300)], durable=False)
    a, b = queue, vsqs.Queue(queue.path)
    renames = _count_renames(monkeypatch)
    got = []
    while True:
        batch = [m for m in (a.receive(), b.receive()) if m is not None]
        if not batch:
            break
        for m in batch:
            got.append(m.body)
            m.delete()
    assert sorted(got) == sorted(b"%d" % i for i in range(300))  # each once, none left behind
    lost = renames.count(False)
    assert lost < 60, f"{lost} lost races for 300 messages"  # about 300 without the skipping
    assert queue.stats().total == 0


def test_skipping_after_a_lost_race_never_passes_a_higher_priority(flat_queue, monkeypatch):
    """The names a handle skips after a lost race stay in the directory; if the
    skip reaches a lower priority, the handle lists again before taking one."""
    queue = flat_queue  # priority orders the whole queue only without shards
    monkeypatch.setattr(_format, "random_below", lambda n: n - 1)  # skip as far as allowed
    high = [queue.publish(b"high%d" % i, priority=5, durable=False) for i in range(3)]
    queue.publish_batch([b"low%d" % i for i in range(5)], durable=False)
    a, b = queue, vsqs.Queue(queue.path)
    b.receive().release()  # b has listed: its listing holds all eight (high[0] as released)
    first = a.receive()
    assert first.id == high[0]
    renames = _count_renames(monkeypatch)
    second = b.receive()  # loses the race for high[0], drops high[1] and high[2]...
    assert renames[0] is False
    assert second.id == high[1]  # ...and lists again before taking a low one
    assert b.receive().id == high[2]


@pytest.mark.parametrize("share", [False, True])
def test_after_a_skip_within_a_priority_a_lower_one_waits_for_a_listing(flat_queue, monkeypatch, share):
    """The skip stops inside the priority; once the rest of it is taken (with a
    share: this handle's, then the others'), the handle lists again before it
    takes a lower priority, and meets the names it dropped."""
    queue = flat_queue
    monkeypatch.setattr(_format, "random_below", lambda n: n - 1)  # skip as far as allowed: 15
    low = set(queue.publish_batch([b"low%d" % i for i in range(5)], priority=0, durable=False))
    queue.publish_batch([b"high%d" % i for i in range(40)], priority=5, durable=False)
    a, b = queue, vsqs.Queue(queue.path)
    if share:
        a.prefer_share(0, 2)
        b.prefer_share(0, 2)
    got = [a.receive()]  # a lists
    got.append(b.receive())  # b lists and takes what a would take next: a loses that race, and skips
    got += a.receive_batch(100) + a.receive_batch(100)
    kinds = ["low" if m.id in low else "high" for m in got]
    assert kinds == ["high"] * 40 + ["low"] * 5


def test_after_a_skip_a_group_of_a_lower_priority_waits_for_a_listing(flat_queue, monkeypatch):
    """A group's candidate is held back like any name: once the priority's names
    are taken, the handle lists again and meets the names it dropped first."""
    queue = flat_queue
    monkeypatch.setattr(_format, "random_below", lambda n: n - 1)  # skip as far as allowed
    low = queue.publish(b"low", group="g", priority=0, durable=False)
    high = queue.publish_batch([b"high%d" % i for i in range(6)], priority=5, durable=False)
    a, b = queue, vsqs.Queue(queue.path)
    got = [a.receive()]  # a lists: six of priority 5, the group's candidate of priority 0
    got.append(b.receive())  # b lists and takes what a would take next: a loses that race, and skips
    got += a.receive_batch(10)
    assert [m.id for m in got] == high[:2] + [high[5]] + high[2:5] + [low]


def test_a_receive_lists_for_the_names_another_thread_of_its_handle_held_back(flat_queue, monkeypatch):
    """Thread A's receive listed, then loses a race; meanwhile thread B of the same
    handle lost one too and skipped names, which holds the lower priority back
    until a listing: A lists for it (its own call had listed already, and
    skipped nothing) rather than answer nothing while messages are ready."""
    from vsqs._core import fs as _fs

    queue = flat_queue
    monkeypatch.setattr(_format, "random_below", lambda n: 2)
    low = queue.publish_batch([b"low%d" % i for i in range(3)], priority=0, durable=False)
    high = queue.publish_batch([b"high%d" % i for i in range(6)], priority=5, durable=False)
    handle = vsqs.Queue(queue.path)
    rename = _fs.rename
    taken: list[str] = []
    got_b: list[vsqs.Message] = []

    def racing(src, dst):
        if len(taken) < 2:  # another consumer takes it first (A's first claim, then B's)
            taken.append(os.path.basename(src)[: _format.KEY_LENGTH])
            os.rename(src, src + ".2795305531723584.1.0191cc303a5c")
            if len(taken) == 1:  # meanwhile thread B of this handle: loses, skips 2, takes the next 2
                thread = threading.Thread(target=lambda: got_b.extend(handle.receive_batch(2)))
                thread.start()
                thread.join()
        return rename(src, dst)

    monkeypatch.setattr(_fs, "rename", racing)
    got_a = handle.receive_batch(10, wait=0)  # thread A: lists, loses high0 (then nothing to skip)
    assert taken == high[:2]
    assert [m.id for m in got_b] == high[4:]
    assert [m.id for m in got_a] == [high[2], high[3], *low]


def test_skipping_only_drops_names_from_the_cache(flat_queue, monkeypatch):
    """A skipped message is not lost: the next listing brings it back."""
    queue = flat_queue  # (the order asserted below is one listing's: no shards)
    monkeypatch.setattr(_format, "random_below", lambda n: n - 1)
    keys = [queue.publish(b"%d" % i, durable=False) for i in range(40)]
    a, b = queue, vsqs.Queue(queue.path)
    b.receive().release()  # b has listed: its listing holds all forty (keys[0] as released)
    taken = a.receive()  # b will lose the race for it and skip 15 names a does not take
    got = [m.id for m in b.receive_batch(100)]
    assert taken.id == keys[0] and sorted(got) == keys[1:]
    assert got[:24] == keys[16:]  # the 24 after the skipped names came first, then a listing: the rest


def test_a_receive_that_skipped_lists_again_before_it_returns_nothing(queue, monkeypatch):
    """A receive that lists, loses races and skips names must not come back
    empty while a name it skipped is still there: consumers take "nothing" for
    "the queue looks empty"."""
    from vsqs._core import fs as _fs

    monkeypatch.setattr(_format, "random_below", lambda n: n - 1)
    first, middle, last = (queue.publish(b"%d" % i, durable=False) for i in range(3))
    taken = {first, last}  # another consumer takes these two just before this one tries them
    rename = _fs.rename

    def racing(src, dst):
        key = os.path.basename(src)[: _format.KEY_LENGTH]
        if key in taken:
            taken.discard(key)
            os.rename(src, src + ".2795305531723584.1.0191cc303a5c")  # the other consumer's claim
        return rename(src, dst)

    monkeypatch.setattr(_fs, "rename", racing)
    b = vsqs.Queue(queue.path)  # lists in this receive; loses first, skips middle, loses last
    m = b.receive()
    assert m is not None and m.id == middle


# -- receipts this handle issued ---------------------------------------------------------


def test_a_receipt_deleted_twice_is_stale_the_second_time(queue):
    queue.publish(b"x")
    m = queue.receive()
    queue.delete(m.receipt)
    with pytest.raises(StaleReceipt):
        queue.delete(m.receipt)


def test_an_issued_receipt_made_stale_by_change_visibility(queue):
    queue.publish(b"x")
    m = queue.receive()
    old = m.receipt
    new = queue.change_visibility(old, 30)
    with pytest.raises(StaleReceipt):
        queue.delete(old)
    queue.delete(new)
    assert queue.stats().total == 0


def test_an_issued_receipt_whose_lease_was_taken_over_is_stale(queue):
    queue.publish(b"x")
    m = queue.receive(visibility_timeout=0)
    other = vsqs.Queue(queue.path)
    taken = other.receive()
    with pytest.raises(StaleReceipt):
        queue.delete(m.receipt)
    other.delete(taken.receipt)


def test_issued_receipts_do_not_open_the_door_to_foreign_ones(tmp_path, queue):
    queue.publish(b"x")
    m = queue.receive()
    hidden = m.receipt.split(":", 1)[1]
    other_queue = vsqs.Queue(tmp_path / "other", create=True)
    with pytest.raises(InvalidReceipt):
        queue.delete(f"{other_queue.id}:{hidden}")  # a look-alike of another queue
    with pytest.raises(InvalidReceipt):
        queue.delete(m.receipt + "/../x")
    with pytest.raises(InvalidReceipt):
        queue.delete(m.receipt.encode())  # type: ignore[arg-type]
    queue.delete(m.receipt)  # the real one is still good


def test_receipts_from_another_handle_are_parsed(queue):
    queue.publish(b"x")
    m = vsqs.Queue(queue.path).receive()
    queue.delete(m.receipt)
    assert queue.stats().total == 0


def test_the_receipt_cache_is_bounded():
    issued = _receipts.IssuedReceipts(4)
    for i in range(20):
        issued.add(f"r{i}", f"n{i}", None)
    assert len(issued) <= 8
    assert issued.take("r19") == ("n19", None) and issued.take("r19") is None  # taken once
    assert issued.take("r0") is None  # forgotten: the caller parses it


def test_receipts_a_handle_forgot_still_delete(queue, monkeypatch):
    monkeypatch.setattr(_receipts, "KEPT", 4)
    queue = vsqs.Queue(queue.path)
    queue.publish_batch([b"%d" % i for i in range(20)], durable=False)
    got = queue.receive_batch(20)
    assert queue.delete_batch([m.receipt for m in got]) == [None] * 20  # the forgotten ones parse
    assert queue.stats().total == 0


def test_a_listing_that_gives_nothing_is_not_repeated_within_one_receive(flat_queue, monkeypatch):
    queue = flat_queue  # one delivery order across the queue: no shards
    from vsqs._core import fs as _fs

    monkeypatch.setattr(_listing, "CHEAP_LISTING", 3600.0)  # every listing is cheap: re-list when out
    for name in ("0", "1-foreign", "README", "9-1795305501723584-892190c0ba72466Z"):
        with open(os.path.join(queue.path, name), "w") as f:
            f.write("not a message")
    queue.publish(b"only")
    calls = []
    list_names = _fs.list_names

    def counted(directory):
        calls.append(directory)
        if len(calls) > 20:
            raise RuntimeError("listing in a loop")
        return list_names(directory)

    monkeypatch.setattr(_fs, "list_names", counted)
    assert [m.body for m in queue.receive_batch(10)] == [b"only"]
    assert queue.receive_batch(10) == []
    assert queue.receive_batch(10) == []
    assert len(calls) <= 4  # no busy loop: a listing that gave nothing is not repeated in one call


# -- publish() without options: its own short path ------------------------------


def test_plain_publish_keeps_the_checks_and_settings_of_publish_batch(queue):
    from vsqs._core.errors import InvalidArgument, MessageTooLarge, QueueFull, QueueSuspended

    queue.configure(delay=30)
    key = queue.publish(b"later", priority=3, durable=False)
    [info] = list(queue.messages())
    assert (info.id, info.state, info.priority) == (key, "delayed", 3)
    assert queue.receive() is None
    queue.configure(delay=None, max_message_bytes=4, max_messages=2)
    with pytest.raises(MessageTooLarge):
        queue.publish(b"12345")
    queue.publish(b"1234")
    with pytest.raises(QueueFull):
        queue.publish(b"x")
    with pytest.raises(InvalidArgument):
        queue.publish(b"x", priority=10)
    with pytest.raises(TypeError):
        queue.publish(12)  # type: ignore[arg-type]
    queue.configure(max_messages=None, max_message_bytes=None)
    queue.suspend("publish")
    with pytest.raises(QueueSuspended):
        queue.publish(b"x")
    queue.resume()
    assert queue.receive().body == b"1234"
