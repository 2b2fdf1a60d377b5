"""``Queue.prefer_share``: a handle that takes its share of the queue first
(the partitions of a Spark micro-batch), the others' once those are taken,
never a lower priority before a higher one."""

from __future__ import annotations

import os
import shutil
import time

import pytest

import vsqs
from vsqs._core import fs as _fs
from vsqs._core import listing
from vsqs._core.format import KEY_LENGTH
from vsqs._core.limits import MAX_SHARES, SHARE_DIGITS


def share_of(message_id: str, count: int) -> int:
    return int(message_id[KEY_LENGTH - SHARE_DIGITS : KEY_LENGTH], 16) % count


def test_a_handle_takes_its_share_first_then_the_others(flat_queue):
    """(A sharded queue deals each shard's listing, one shard after another.)"""
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(200)])
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(1, 3)
    mine = [i for i in ids if share_of(i, 3) == 1]
    got = [m.id for m in handle.receive_batch(len(mine))]
    assert sorted(got) == sorted(mine)
    rest = [m.id for m in handle.receive_batch(100)] + [m.id for m in handle.receive_batch(100)]
    assert sorted(rest) == sorted(set(ids) - set(mine))


def test_handles_of_every_share_split_the_queue_without_a_lost_race(flat_queue, monkeypatch):
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(300)])
    handles = [vsqs.Queue(flat_queue.path) for _ in range(3)]
    left = [sum(1 for i in ids if share_of(i, 3) == index) for index in range(3)]
    for index, handle in enumerate(handles):
        handle.prefer_share(index, 3)
        handle.receive_batch(1)  # each lists the queue now: the same names
        left[index] -= 1
    lost = []
    rename = _fs.rename

    def noting_rename(src, dst):
        done = rename(src, dst)
        if not done:
            lost.append(src)
        return done

    monkeypatch.setattr(_fs, "rename", noting_rename)
    taken = []
    while any(left):  # in turns, as concurrent partitions would, each up to its share
        for index, handle in enumerate(handles):
            if left[index]:
                got = handle.receive_batch(min(3, left[index]))
                assert got and all(share_of(m.id, 3) == index for m in got)
                left[index] -= len(got)
                taken.extend(got)
    assert lost == []
    assert len({m.id for m in taken}) == len(taken) == 297


def test_a_share_never_puts_a_lower_priority_before_a_higher(flat_queue):
    low = flat_queue.publish_batch([b"low%d" % i for i in range(60)], priority=0)
    high = flat_queue.publish_batch([b"high%d" % i for i in range(60)], priority=5)
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(0, 2)
    order = [m.id for m in handle.receive_batch(120)]
    assert set(order[:60]) == set(high) and set(order[60:]) == set(low)
    assert [share_of(i, 2) for i in order[:60]] == sorted((share_of(i, 2) for i in order[:60]))


@pytest.mark.parametrize("back", ["released", "lease ran out"])
def test_a_lower_priority_message_back_in_the_listing_waits_for_the_higher_ones(flat_queue, back):
    low = flat_queue.publish(b"low", priority=0)
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(0, 2)
    held = handle.receive(visibility_timeout=0.2 if back == "lease ran out" else 60)
    assert held is not None and held.id == low
    high = flat_queue.publish_batch([b"high%d" % i for i in range(20)], priority=5)
    first = handle.receive()  # lists again: its share of the high ones first, the others' later
    if back == "released":
        held.release()  # back in this handle's listing at once
    else:
        time.sleep(0.3)  # its lease runs out: the listing's timer brings it back
    order = [first.id] + [m.id for _ in range(3) for m in handle.receive_batch(10)]
    assert set(order[:20]) == set(high) and order[20:] == [low]


def test_a_handle_whose_share_is_taken_goes_on_with_the_others_from_the_same_listing(flat_queue, monkeypatch):
    monkeypatch.setattr(listing, "MAX_AGE", 3600.0)  # (the listing stays fresh however slow the machine)
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(60)])
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(0, 2)
    mine = [i for i in ids if share_of(i, 2) == 0]
    assert len(handle.receive_batch(len(mine))) == len(mine)
    listings = []
    list_names = _fs.list_names

    def noting_list_names(directory):
        listings.append(directory)
        return list_names(directory)

    monkeypatch.setattr(_fs, "list_names", noting_list_names)
    got = handle.receive_batch(10)
    assert len(got) == 10 and all(share_of(m.id, 2) == 1 for m in got)
    assert listings == []  # the rest of the listing served them


def test_a_foreign_name_first_in_order_does_not_turn_sharing_off(flat_queue):
    open(os.path.join(flat_queue.path, "0README"), "w").close()  # sorts before every message
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(100)])
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(1, 2)
    got = handle.receive_batch(10)
    assert len(got) == 10 and all(share_of(m.id, 2) == 1 for m in got)
    assert len(ids) == 100


def test_a_higher_priority_message_back_in_the_listing_comes_first_after_a_foreign_name(flat_queue):
    """A foreign name sorting before every message is dealt to the rest; a
    message of a higher priority that comes back still goes first."""
    open(os.path.join(flat_queue.path, "0README"), "w").close()
    urgent = flat_queue.publish(b"urgent", priority=5)
    handle = vsqs.Queue(flat_queue.path)
    held = handle.receive(visibility_timeout=60)
    assert held is not None and held.id == urgent
    flat_queue.publish_batch([b"m%d" % i for i in range(40)])
    handle.prefer_share(0, 2)
    handle.stats()  # (no listing of the receive path: the next receive lists and deals)
    first = handle.receive()
    held.release()  # back in this handle's listing, above everything dealt
    assert handle.receive().id == urgent
    assert first is not None


def test_a_waiting_receive_takes_the_others_share_once_its_own_is_taken(flat_queue):
    ids = flat_queue.publish_batch([b"m%d" % i for i in range(40)])
    handle = vsqs.Queue(flat_queue.path)
    handle.prefer_share(0, 2)
    mine = [i for i in ids if share_of(i, 2) == 0]
    assert len(handle.receive_batch(len(mine))) == len(mine)
    got = handle.receive_batch(10, wait=5)  # the others' are ready: no wait, no empty answer
    assert len(got) == 10 and all(share_of(m.id, 2) == 1 for m in got)


def test_a_share_survives_the_queue_made_again(tmp_path):
    path = tmp_path / "q"
    vsqs.Queue(path, create=True)
    handle = vsqs.Queue(path)
    handle.prefer_share(1, 2)
    shutil.rmtree(path)
    again = vsqs.Queue(path, create=True)
    ids = again.publish_batch([b"m%d" % i for i in range(40)])
    mine = [i for i in ids if share_of(i, 2) == 1]
    assert sorted(m.id for m in handle.receive_batch(len(mine))) == sorted(mine)


@pytest.mark.parametrize(
    ("index", "count"), [(-1, 2), (2, 2), (0, 0), (True, 2), (0, 2.0), ("0", "2"), (0, MAX_SHARES + 1)]
)
def test_a_share_that_is_not_one_is_refused(flat_queue, index, count):
    with pytest.raises(vsqs.InvalidArgument, match="share"):
        flat_queue.prefer_share(index, count)
