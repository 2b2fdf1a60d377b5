"""Hand-over: a receive asking for runs takes a FIFO group's visible prefix while
another run of the group is still in flight, as Amazon SQS FIFO delivers a
message made visible again ahead of those still in flight (docs/FORMAT.md,
Runs: Hand-over). Each rule is checked on both sides: what is handed over, and
what never is (a message after one in flight, one that may be in flight)."""

from __future__ import annotations

import os
import threading
import time

import pytest

import vsqs
from vsqs._core import format as _format
from vsqs._core import fs as _fs
from vsqs._core import groups as _groups

SHORT = 0.3  # a visibility timeout the tests wait out
LONG = 60.0


def publish(queue: vsqs.Queue, group: str, count: int) -> None:
    queue.publish_batch([f"{group}{i}" for i in range(count)], group=group)


def bodies(messages: list[vsqs.Message]) -> list[str]:
    return [m.body.decode() for m in messages]


def take(queue: vsqs.Queue, n: int = 10, **kwargs) -> list[str]:
    """What a fresh handle's receive of runs gets (no cached listing)."""
    return bodies(vsqs.Queue(queue.path).receive_batch(n, group_runs=True, **kwargs))


def groups_dir(queue: vsqs.Queue) -> str:
    return os.path.join(queue.path, _format.GROUPS_DIR)


def newest(queue: vsqs.Queue, group: str) -> int:
    names = os.listdir(groups_dir(queue))
    return max(p[2] for p in map(_format.parse_lease_name, names) if p and p[0] == _format.group_hash(group))


@pytest.mark.parametrize("extended, expected", [(0, []), (1, ["g0"]), (2, ["g0", "g1"])])
def test_the_visible_prefix_up_to_a_member_extended_is_handed_over(queue, extended, expected):
    publish(queue, "g", 3)
    run = queue.receive_batch(5, visibility_timeout=SHORT, group_runs=True)
    assert bodies(run) == ["g0", "g1", "g2"]
    run[extended].change_visibility(LONG)
    time.sleep(SHORT + 0.1)  # the others' timeouts are over; the lease is the extended member's
    assert take(queue) == expected


def test_a_member_whose_timeout_was_shortened_comes_back_behind_a_group_never_received(queue):
    queue.publish_batch(["g1-m1", "g1-m2"], group="g1")
    queue.publish(b"g2-m1", group="g2")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    assert bodies(run) == ["g1-m1", "g1-m2"]
    run[0].change_visibility(SHORT)
    time.sleep(SHORT + 0.1)
    assert take(queue, 3) == ["g2-m1", "g1-m1"]


def test_a_member_made_visible_comes_back_behind_a_group_never_received(queue):
    queue.publish_batch(["g1-m1", "g1-m2"], group="g1")
    queue.publish(b"g2-m1", group="g2")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    assert take(queue, 3) == ["g2-m1", "g1-m1"]


def test_a_deleted_member_is_passed_and_a_released_one_handed_over(queue):
    publish(queue, "g", 4)
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].delete()
    run[1].release()
    assert take(queue) == ["g1"]  # g2 is in flight: g3 waits behind it


def test_the_prefix_goes_on_past_the_run_to_messages_never_received(queue):
    publish(queue, "g", 4)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[1].change_visibility(0)
    run[0].delete()
    assert take(queue) == ["g1", "g2", "g3"]


def test_the_group_goes_on_whichever_holder_settles_last(queue):
    for first_done in ("run", "hand-over"):
        publish(queue, "g", 4)
        run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
        run[0].change_visibility(0)
        [again] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
        assert again.body == b"g0"
        holders = [run[1:], [again]] if first_done == "run" else [[again], run[1:]]
        for message in holders[0]:
            message.delete()
        assert take(queue) == []  # the other holder is still in flight
        for message in holders[1]:
            message.delete()
        assert take(queue) == ["g3"]
        vsqs.Queue(queue.path).purge()


def test_a_hand_over_taken_again_from_its_holder(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [second] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    second.change_visibility(0)
    [third] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    assert (third.body, third.receive_count) == (b"g0", 3)
    with pytest.raises(vsqs.StaleReceipt):
        second.delete()
    third.delete()
    run[1].delete()
    run[2].delete()
    assert queue.stats().total == 0
    publish(queue, "g", 1)
    assert take(queue) == ["g0"]  # the slot was freed


def test_a_member_not_listed_may_be_in_flight_and_ends_the_prefix(queue, monkeypatch):
    publish(queue, "g", 3)
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    run[2].change_visibility(0)
    missing = run[1].id  # a listing that misses g1's name (being renamed as it was read)
    triage = _format.triage
    monkeypatch.setattr(_format, "triage", lambda names, *a: triage([n for n in names if missing not in n], *a))
    assert take(queue) == ["g0"]  # not g2: g1, named by the run's record, may be in flight


def test_a_deleted_member_not_listed_is_passed(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[1].delete()
    run[0].change_visibility(0)
    run[2].change_visibility(0)
    assert take(queue) == ["g0", "g2"]


def test_without_a_record_nothing_is_handed_over_until_the_lease_runs_out(queue, monkeypatch):
    publish(queue, "g", 2)
    monkeypatch.setattr(_groups.GroupLeases, "write_record", lambda *a: None)  # a crash before it
    run = queue.receive_batch(2, visibility_timeout=SHORT * 2, group_runs=True)
    run[0].change_visibility(0)
    assert take(queue) == []
    time.sleep(SHORT * 2 + 0.1)
    assert take(queue) == ["g0", "g1"]


@pytest.mark.parametrize("planted", ["garbage", "empty", "a FIFO", "a directory", "too large", "a later run"])
def test_a_record_that_cannot_be_trusted_hands_nothing_over(queue, planted):
    publish(queue, "g", 2)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    gen = newest(queue, "g")
    path = os.path.join(groups_dir(queue), _format.run_record_name(_format.group_hash("g"), 0, gen))
    os.unlink(path)
    if planted == "a FIFO":
        os.mkfifo(path)
    elif planted == "a directory":
        os.mkdir(path)
    else:
        content = {
            "garbage": b"1 not-a-key\n",
            "empty": b"",
            "too large": b"1 " + b" ".join([run[0].id.encode()] * 5000) + b"\n",
            "a later run": f"{gen + 1} {run[0].id}\n".encode(),
        }[planted]
        with open(path, "wb") as f:
            f.write(content)
    run[0].change_visibility(0)
    assert take(queue) == []
    run[1].delete()
    assert queue.stats().total == 1  # nothing lost: g0 waits for the lease


def test_two_receivers_racing_hand_the_prefix_over_once(queue):
    publish(queue, "g", 3)
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    run[1].change_visibility(0)
    handles = [vsqs.Queue(queue.path) for _ in range(4)]
    for handle in handles:
        handle.stats()  # opened
    got: list[list[str]] = []
    start = threading.Barrier(len(handles))

    def receive(handle: vsqs.Queue) -> None:
        start.wait()
        got.append(bodies(handle.receive_batch(10, visibility_timeout=LONG, group_runs=True)))

    threads = [threading.Thread(target=receive, args=(handle,)) for handle in handles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    taken = [b for answer in got for b in answer]
    assert sorted(taken) == ["g0", "g1"] and [a for a in got if a] in ([["g0", "g1"]], [["g0"]])


def test_a_hand_over_of_one_message_carries_a_run_receipt(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [again] = vsqs.Queue(queue.path).receive_batch(10, group_runs=True)
    slot = _format.parse_receipt(queue.id, again.receipt)[2]
    assert slot is not None and (slot.size, slot.member) == (1, 0) and slot.run == slot.gen


def test_without_runs_a_receive_hands_nothing_over(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    assert bodies(vsqs.Queue(queue.path).receive_batch(10)) == []


def test_a_settled_run_leaves_no_marks_behind(queue):
    publish(queue, "g", 2)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [again] = vsqs.Queue(queue.path).receive_batch(10, group_runs=True)
    for message in (again, run[1]):
        message.delete()
    marks = [n for n in os.listdir(groups_dir(queue)) if _format.parse_run_mark(n)]
    assert marks == []


def test_a_hand_over_that_takes_nothing_leaves_the_group_to_the_runs_left(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    again = run[0].change_visibility(0)
    real = _groups.GroupLeases.take_over

    def take_over(self, group, gen, until):  # the run settles between the hand-over's generation and its renames
        slot = real(self, group, gen, until)
        monkeypatch.setattr(_groups.GroupLeases, "take_over", real)
        queue.delete(again)
        run[1].delete()  # the run's last mark: its settle loses the next generation to the hand-over
        return slot

    monkeypatch.setattr(_groups.GroupLeases, "take_over", take_over)
    assert take(queue, visibility_timeout=600) == []  # A's name moved since the listing: nothing taken
    assert bodies(vsqs.Queue(queue.path).receive_batch(10)) == ["C"]  # the slot was freed, not held 600 s


def test_two_runs_settling_at_once_free_the_slot(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [handed] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    real = _groups.GroupLeases._next
    state: dict = {"step": 0}

    def _next(self, group, index, gen, content, lone=True):
        if state["step"] == 0:  # the run's settle, about to make the next generation
            state["step"] = 1
            state["held"] = (self, group, index, gen, content, lone)
            handed.delete()  # the hand-over's run settles meanwhile...
            return state["result"]
        if state["step"] == 1:  # ...and loses its generation to the run's, made first
            state["step"] = 2
            state["result"] = real(*state["held"])
        return real(self, group, index, gen, content, lone)

    monkeypatch.setattr(_groups.GroupLeases, "_next", _next)
    run[1].delete()
    monkeypatch.setattr(_groups.GroupLeases, "_next", real)
    assert bodies(vsqs.Queue(queue.path).receive_batch(10)) == ["C"]


def test_a_member_whose_timeout_ran_out_is_done_for_its_run_once_handed_over(flat_queue):
    queue = flat_queue
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(2, visibility_timeout=600, group_runs=True)
    run[0].change_visibility(SHORT)
    time.sleep(SHORT + 0.1)
    [again] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    assert again.body == b"A"
    again.delete()
    run[1].delete()
    assert take(queue) == ["C"]  # the first run is over, though A's first receipt never settled it


def test_a_member_released_by_a_vsqs_without_records_is_not_taken_for_deleted(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    released = queue.current_receipt(run[0].receipt)
    name = _format.parse_receipt(queue.id, released)[0]
    os.rename(os.path.join(queue.path, str(name)), os.path.join(queue.path, _format.ready_name(name.stem, 1)))
    slot = _format.parse_receipt(queue.id, released)[2]
    mark = _format.run_mark_name(_format.group_hash("g"), 0, slot.run, 0)  # an older release: the done mark only
    open(os.path.join(groups_dir(queue), mark), "wb").close()
    run[1].change_visibility(0)
    missing = run[0].id  # a listing that misses A's ready name
    triage = _format.triage
    monkeypatch.setattr(_format, "triage", lambda names, *a: triage([n for n in names if missing not in n], *a))
    assert take(queue) == []  # not B: A may be there


def test_a_purge_of_one_handed_over_message_leaves_the_group_held(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [handed] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=2 * LONG, group_runs=True)
    vsqs.Queue(queue.path).purge(ids=[handed.id])
    missing = run[1].id  # B is in flight; a listing that misses it
    triage = _format.triage
    monkeypatch.setattr(_format, "triage", lambda names, *a: triage([n for n in names if missing not in n], *a))
    assert bodies(vsqs.Queue(queue.path).receive_batch(10)) == []  # not C


def test_a_member_dead_lettered_is_passed_by_the_hand_over(tmp_path):
    queue = vsqs.Queue(tmp_path / "q", create=True)
    queue.configure(max_receives=2)
    queue.publish_batch([b"A", b"B", b"C"], group="g")
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].change_visibility(0)
    [again] = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    again.change_visibility(0)  # A, received twice: the next receive moves it to the dead-letter queue
    run[1].change_visibility(0)
    assert take(queue) == ["B"]
    assert queue.stats().dead_lettered == 1


def missing_from_listings(monkeypatch, message_id: str) -> None:
    """Listings miss the message's name from now on (being renamed as each is read)."""
    triage = _format.triage
    monkeypatch.setattr(_format, "triage", lambda names, *a: triage([n for n in names if message_id not in n], *a))


def test_a_member_redriven_back_after_its_gone_mark_is_not_passed(flat_queue):
    queue = flat_queue
    queue.configure(max_receives=5)
    queue.publish_batch(["g0", "g1", "g2"], group="g")
    run = queue.receive_batch(3, visibility_timeout=LONG, group_runs=True)
    run[0].dead_letter()
    run[1].release()
    assert queue.dead_letter_queue().redrive() == 1  # g0 back, the same KEY
    assert take(queue) == ["g0", "g1"]


def test_a_whole_purge_frees_no_slot_a_hand_over_took_meanwhile(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch(["g0", "g1"], group="g")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].release()
    other, real, held = vsqs.Queue(queue.path), _fs.remove_message, []

    def remove(path, *a, **k):
        if not held:  # the purge has listed: a receive hands g0 over now
            held.extend(other.receive_batch(10, visibility_timeout=LONG / 2, group_runs=True))
        return real(path, *a, **k)

    monkeypatch.setattr(_fs, "remove_message", remove)
    queue.purge()
    monkeypatch.setattr(_fs, "remove_message", real)
    assert bodies(held) == ["g0"]
    queue.publish(b"g2", group="g")
    missing_from_listings(monkeypatch, held[0].id)
    assert take(queue) == []  # not g2: g0 is in flight


def test_a_purge_of_some_ids_during_a_run_claim_frees_no_slot(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch(["A", "B", "C"], group="g")
    other, real, purged = vsqs.Queue(queue.path), _fs.rename, []

    def rename(src, dst, *a, **k):
        moved = real(src, dst, *a, **k)
        if not purged and moved:  # A in flight, the run's record not yet written
            purged.append(other.purge(ids=[_format.parse_name(os.path.basename(dst)).key]))
        return moved

    monkeypatch.setattr(_fs, "rename", rename)
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    monkeypatch.setattr(_fs, "rename", real)
    assert purged == [1] and bodies(run) == ["B"]
    missing_from_listings(monkeypatch, run[0].id)
    assert bodies(vsqs.Queue(queue.path).receive_batch(10)) == []  # not C: B is in flight


@pytest.mark.parametrize("member", [1, 4])
def test_a_run_receipt_naming_another_member_marks_nothing(flat_queue, monkeypatch, member):
    queue = flat_queue
    queue.publish_batch(["A", "B", "C", "D"], group="g")
    run = queue.receive_batch(4, visibility_timeout=LONG, group_runs=True)
    run[0].delete()
    run[2].release()
    head, ref = run[3].receipt.rsplit(":", 1)
    s, gen, r, _, k = ref.split(".")
    forged = f"{head}:{s}.{gen}.{r}.{member % 4}.{k if member < 4 else 3}"  # B's index; a run of 3
    vsqs.Queue(queue.path).delete(forged)  # D is deleted, but B must not be marked
    missing_from_listings(monkeypatch, run[1].id)
    assert take(queue) == []  # not C: B is in flight


def test_a_member_dead_lettered_by_requeue_expired_does_not_hold_its_run(flat_queue):
    queue = flat_queue
    queue.configure(max_receives=1)
    queue.publish_batch(["A", "B"], group="g")
    run = queue.receive_batch(2, visibility_timeout=SHORT, group_runs=True)
    b = run[1].change_visibility(LONG)
    time.sleep(SHORT + 0.1)
    assert queue.requeue_expired() == 1  # A, received once: dead-lettered
    queue.delete(b)
    queue.publish(b"C", group="g")
    assert take(queue) == ["C"]


def test_an_extension_while_a_hand_over_writes_its_record_keeps_it(flat_queue, monkeypatch):
    queue = flat_queue
    queue.publish_batch(["A", "B"], group="g")
    run = queue.receive_batch(2, visibility_timeout=LONG, group_runs=True)
    run[0].release()
    real, extended = _fs.rename, []

    def rename(src, dst, *a, **k):
        moved = real(src, dst, *a, **k)
        if not extended:  # the hand-over moved A; B's holder extends from another thread meanwhile
            thread = threading.Thread(target=lambda: extended.append(run[1].change_visibility(2 * LONG)))
            thread.start()
            extended.append(thread)
        return moved

    monkeypatch.setattr(_fs, "rename", rename)
    got = vsqs.Queue(queue.path).receive_batch(10, visibility_timeout=LONG, group_runs=True)
    monkeypatch.setattr(_fs, "rename", real)
    extended[0].join()
    assert bodies(got) == ["A"]
    got[0].delete()
    queue.delete(extended[1])
    queue.publish(b"C", group="g")
    assert take(queue) == ["C"]  # nothing in flight: the slot was freed through the records
