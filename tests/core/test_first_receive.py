"""A message's first receive is recorded in its name (``-rFIRST``, in a queue
of format 3: docs/FORMAT.md), and a dead letter knows its source queue:
``Message.first_received_at`` and ``Message.dead_letter_source``, the SQS
face's ApproximateFirstReceiveTimestamp and DeadLetterQueueSourceArn."""

from __future__ import annotations

import json
import os
import pickle
import time

import pytest

import vsqs
from tests.conftest import message_names, message_path
from vsqs._core import format as _format
from vsqs._core import sources as _sources
from vsqs._core.format import State
from vsqs._core.layout import Layout
from vsqs._core.metadata import open_store


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def first_flags(queue: vsqs.Queue) -> list[int | None]:
    """The first-receive time of every message file of ``queue``, from its name."""
    found = []
    for name in message_names(queue.path):
        parsed = _format.parse_name(name)
        if parsed is not None and parsed.state is not State.WRITING:
            found.append(parsed.first_receive_ms)
    return found


def put(queue: vsqs.Queue, name: str, body: bytes = b"by hand") -> None:
    """A message file written by hand (another program, an older vsqs, an attacker)."""
    with open(message_path(queue, name), "wb") as file:
        file.write(body)


# -- the grammar ---------------------------------------------------------------------------------


def test_the_flag_is_parsed_and_placed_after_key_and_group():
    key = _format.new_key()
    group = _format.group_hash("g")
    plain = _format.parse_name(_format.ready_name(key))
    grouped = _format.parse_name(_format.make_stem(key, group_hash=group, origin="0123abcd", envelope=True))
    assert plain is not None and grouped is not None
    assert plain.first_receive_ms is None and grouped.first_receive_ms is None
    stem = _format.received_stem(grouped, 1_795_305_503_100_999)
    assert stem == f"{key}-g{group}-r1795305503100-o0123abcd-e"
    received = _format.parse_name(_format.hidden_name(stem, 1, 1))
    assert received is not None
    assert (received.key, received.group_hash, received.origin, received.envelope) == (key, group, "0123abcd", True)
    assert received.first_receive_ms == 1_795_305_503_100
    # the shard of a name is that of its message before the flag: KEY and GROUP keep their places
    assert _format.shard_of(str(received), 64) == _format.shard_of(key + f"-g{group}", 64)
    plain_received = _format.received_stem(plain, 5_000)
    assert plain_received == f"{key}-r0000000000005"
    assert _format.shard_of(plain_received, 64) == _format.shard_of(key, 64)


def test_only_a_first_receive_adds_the_flag_and_never_twice():
    key = _format.new_key()
    again = _format.parse_name(_format.ready_name(key, 2))  # received before, by a vsqs that did not record it
    assert again is not None and _format.received_stem(again, 10**15) == key
    forged = _format.parse_name(f"{key}-r0000000000042")  # -r with count 0: kept, not doubled
    assert forged is not None and _format.received_stem(forged, 10**15) == f"{key}-r0000000000042"


@pytest.mark.parametrize("name", [
    "9-1795305501723584-892190c0ba724662-r179530550310.1",  # 12 digits
    "9-1795305501723584-892190c0ba724662-r17953055031000.1",  # 14 digits
    "9-1795305501723584-892190c0ba724662-r1795305503100-r1795305503100.1",  # twice
    "9-1795305501723584-892190c0ba724662-o0123abcd-r1795305503100.1",  # out of order
    "9-1795305501723584-892190c0ba724662-r-1795305503100.1",
    "9-1795305501723584-892190c0ba724662-rabcdefabcdefa.1",
])
def test_a_damaged_flag_makes_a_foreign_name(name):
    assert _format.parse_name(name) is None


# -- the library -----------------------------------------------------------------------------------


def test_the_first_receive_is_recorded_and_kept(queue):
    queue.publish(b"a")
    before = now_ms()
    first = queue.receive(visibility_timeout=0)
    after = now_ms()
    assert first is not None and first.first_received_at is not None
    assert before <= round(first.first_received_at * 1000) <= after
    recorded = first.first_received_at
    # received again (the lease ran out: the expired name is claimed as it is)
    second = queue.receive(visibility_timeout=60)
    assert second is not None and second.receive_count == 2
    assert second.first_received_at == recorded
    # a change of visibility, then a release (ready again), then a requeue of an expired lease
    second.change_visibility(120)
    assert second.first_received_at == recorded
    second.release()
    assert first_flags(queue) == [round(recorded * 1000)]
    third = queue.receive(visibility_timeout=0)
    assert third is not None and third.receive_count == 3 and third.first_received_at == recorded
    assert queue.requeue_expired() == 1
    assert first_flags(queue) == [round(recorded * 1000)]
    fourth = queue.receive()
    assert fourth is not None and fourth.first_received_at == recorded
    assert queue.read_message(fourth.receipt).first_received_at == recorded
    assert pickle.loads(pickle.dumps(fourth)).first_received_at == recorded


def test_a_delayed_message_and_a_group_record_their_first_receive(queue):
    queue.publish(b"later", delay=0.001)
    queue.publish(b"g1", group="g")
    queue.publish(b"g2", group="g")
    time.sleep(0.01)  # (only for the delay to pass: no assertion rests on it)
    before = now_ms()
    got = queue.receive_batch(10, group_runs=True)
    after = now_ms()
    assert sorted(m.body for m in got) == [b"g1", b"g2", b"later"]
    for message in got:
        assert message.receive_count == 1
        assert before <= round(message.first_received_at * 1000) <= after


def test_a_name_without_the_flag_is_read_and_reports_no_first_receive(queue):
    key_again, key_new, key_hidden = (_format.new_key() for _ in range(3))
    put(queue, _format.ready_name(key_again, 2))  # received twice by a vsqs before -r
    put(queue, _format.hidden_name(key_hidden, 1, 1))  # in flight at an older vsqs, lease long over
    put(queue, key_new)  # never received
    got = {m.id: m for m in queue.receive_batch(10)}
    assert set(got) == {key_again, key_new, key_hidden}
    assert got[key_again].receive_count == 3 and got[key_again].first_received_at is None
    assert got[key_hidden].receive_count == 2 and got[key_hidden].first_received_at is None
    assert got[key_new].receive_count == 1 and got[key_new].first_received_at is not None


def test_forged_and_damaged_names_do_not_break_a_receive(queue):
    key = _format.new_key()
    put(queue, f"{key}-r0000000000042", b"forged")  # count 0 and -r: its (forged) time is kept
    damaged = f"{_format.new_key()}-r12.1"
    put(queue, damaged, b"damaged")  # not of the grammar: foreign, never delivered
    put(queue, _format.new_key(), b"plain")
    got = {m.body: m for m in queue.receive_batch(10)}
    assert set(got) == {b"forged", b"plain"}
    assert got[b"forged"].first_received_at == 0.042
    assert str(got[b"forged"].receipt).count("-r") == 1
    assert damaged in message_names(queue.path)  # left alone


@pytest.mark.parametrize(("flag", "seconds"), [("0000000000000", 0.0), ("9999999999999", 9_999_999_999.999)])
def test_forged_extreme_first_receives_are_reported_as_written(queue, flag, seconds):
    """Zero (falsy, yet recorded) and the largest 13 digits (year 2286): read
    as written, never taken for absent, never an error, and kept."""
    key = _format.new_key()
    put(queue, f"{key}-r{flag}.1")
    got = queue.receive()
    assert got is not None and got.first_received_at == seconds and f"-r{flag}." in got.receipt
    assert round(got.first_received_at * 1000) == int(flag)  # what the SQS face shows


def test_a_message_with_a_receipt_that_is_not_one_has_no_such_attributes(queue):
    queue.publish(b"x")
    message = queue.receive()
    assert message is not None
    for bogus in ("", "nonsense", "a:b:c:d", f"{queue.id}:../../etc/passwd"):
        message.receipt = bogus
        assert message.first_received_at is None and message.dead_letter_source is None


def test_receipts_with_a_misplaced_or_damaged_flag_are_refused(queue):
    queue.publish(b"x")
    message = queue.receive()
    assert message is not None and "-r" in message.receipt
    queue_id, name = message.receipt.split(":")[:2]
    key, rest = name[: _format.KEY_LENGTH], name[_format.KEY_LENGTH :]
    flag, lease = rest.split(".", 1)
    for forged in (
        f"{key}{flag}{flag}.{lease}",  # twice
        f"{key}-o0123abcd{flag}.{lease}",  # after -o
        f"{key}{flag}0.{lease}",  # 14 digits
        f"{key}{flag[:-1]}.{lease}",  # 12 digits
        f"{key}-r-{flag[3:]}.{lease}",
        f"{key}{flag}",  # ready: not a receipt
        f"{key}{flag}/../../x.{lease}",
    ):
        with pytest.raises(vsqs.InvalidReceipt):
            queue.delete(f"{queue_id}:{forged}")
    with pytest.raises(vsqs.StaleReceipt):  # of the grammar, but no such file: the flag is part of the name
        queue.change_visibility(f"{queue_id}:{key}-r0000000000000.{lease}", 10)
    message.delete()
    assert queue.stats().total == 0


# -- formats: only a queue of format 3 gets -rFIRST names ------------------------------------------


def old_format_queue(path: str | os.PathLike[str], shards: int) -> vsqs.Queue:
    """A queue of format 1 (``shards`` 1) or 2, as vsqs before format 3
    created it: older vsqs share it, for which a name with -r is foreign."""
    os.makedirs(path)
    Layout.make(os.fspath(path), shards, None)
    with open(os.path.join(path, _format.METADATA_NAME), "wb") as file:
        file.write(_format.encode_metadata(_format.new_queue_id(), shards, first_receive=False))
    return vsqs.Queue(path)


@pytest.mark.parametrize("shards", [1, 4], ids=["format1", "format2"])
def test_a_queue_of_an_older_format_never_gets_the_flag(tmp_path, shards):
    queue = old_format_queue(tmp_path / "q", shards)
    queue.publish(b"plain")
    queue.publish(b"later", delay=0.001)
    queue.publish(b"g1", group="g")
    queue.publish(b"g2", group="g")
    time.sleep(0.01)  # (only for the delay to pass: no assertion rests on it)
    got = queue.receive_batch(10, group_runs=True)
    assert sorted(m.body for m in got) == [b"g1", b"g2", b"later", b"plain"]
    assert [m.first_received_at for m in got] == [None] * 4  # not recorded: reported absent, as for old names
    for message in got:
        message.release()
    again: list[vsqs.Message] = []
    for _ in range(8):  # (a group's next message comes once the one before is settled)
        batch = queue.receive_batch(10, group_runs=True)
        assert set(first_flags(queue)) <= {None}
        again += batch
        for message in batch:
            message.delete()
    assert sorted(m.receive_count for m in again) == [2] * 4
    assert [m.first_received_at for m in again] == [None] * 4
    assert not [name for name in message_names(queue.path) if "-r" in name]  # every name is one older vsqs reads


@pytest.mark.parametrize("shards", [1, 4], ids=["format1", "format2"])
def test_a_queue_of_an_older_format_still_reads_names_with_the_flag(tmp_path, shards):
    queue = old_format_queue(tmp_path / "q", shards)
    key = _format.new_key()
    put(queue, f"{key}-r0000000000042.1")
    got = queue.receive()
    assert got is not None and got.id == key and got.receive_count == 2 and got.first_received_at == 0.042


@pytest.mark.parametrize("shards", [1, 4], ids=["flat", "shards4"])
def test_a_new_queue_is_format_3_and_gets_the_flag(tmp_path, shards):
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=shards)
    with open(os.path.join(queue.path, _format.METADATA_NAME)) as file:
        assert json.load(file)["format"] == 3
    keys = {queue.publish(b"%d" % i) for i in range(8)} | {queue.publish(b"g", group="g")}
    got = queue.receive_batch(10)
    assert {m.id for m in got} == keys and all(m.first_received_at is not None for m in got)
    assert None not in first_flags(queue) and len(first_flags(queue)) == len(keys)
    for name in message_names(queue.path):  # each in its shard: the flag does not move a name
        if _format.parse_name(name) is not None:
            assert os.path.exists(message_path(queue, name))


def test_settings_written_to_a_queue_of_an_older_format_stay_readable_by_older_vsqs(tmp_path):
    """Settings versions keep format 2 (older vsqs refuse settings of a newer
    format, which would lock them out of a queue they share)."""
    queue = old_format_queue(tmp_path / "q", 1)
    queue.configure(visibility_timeout=12)
    directory = os.path.join(queue.path, ".settings")
    for entry in os.listdir(directory):
        with open(os.path.join(directory, entry)) as file:
            assert json.load(file)["format"] == 2


# -- dead letters ------------------------------------------------------------------------------------


@pytest.fixture(params=[1, 4], ids=["flat", "shards4"])
def spool(request, tmp_path) -> tuple[vsqs.Queue, vsqs.Queue]:
    """A queue whose messages die at their second receive, and its dead-letter queue."""
    _sources._SOURCE_NAMES.clear()
    root = vsqs.Spool(tmp_path / "spool", create=True)
    jobs = root.create_queue("jobs", max_receives=2, shards=request.param)
    dlq = root.create_queue("jobs.dlq", shards=request.param)
    return jobs, dlq


def kill(jobs: vsqs.Queue, body: bytes, **options) -> float | None:
    """Publish ``body`` and receive it until it dies; its first receive (epoch s;
    ``None`` in a queue of format 1 or 2, which does not record it)."""
    key = jobs.publish(body, **options)
    first = jobs.receive(visibility_timeout=0, wait=10)  # (a bound: it returns once the message is seen)
    assert first is not None and first.id == key
    assert (first.first_received_at is not None) == open_store(jobs.path).first_receive
    second = jobs.receive(visibility_timeout=0, wait=10)
    assert second is not None and second.id == key
    jobs.requeue_expired()  # received max_receives times: into the dead-letter queue
    return first.first_received_at


def test_a_dead_letter_knows_its_source_queue_and_first_receive(spool):
    jobs, dlq = spool
    plain_first = kill(jobs, b"plain")
    grouped_first = kill(jobs, b"grouped", group="g")
    got = {m.body: m for m in dlq.receive_batch(10, wait=10)}
    assert set(got) == {b"plain", b"grouped"}
    assert got[b"plain"].dead_letter_source == "jobs" == got[b"grouped"].dead_letter_source
    assert got[b"plain"].first_received_at == plain_first
    assert got[b"grouped"].first_received_at == grouped_first
    assert got[b"plain"].receive_count == 3
    jobs.publish(b"alive")
    alive = jobs.receive(wait=10)
    assert alive is not None and alive.dead_letter_source is None  # no dead letter


@pytest.mark.parametrize("shards", [1, 4], ids=["format1", "format2"])
def test_a_dead_letter_queue_of_an_older_format_never_gets_the_flag(tmp_path, shards):
    """A queue of format 3 whose dead-letter queue was made by an older vsqs
    (format 1 or 2, which that vsqs still serves): the dead letter leaves its
    -rFIRST behind, or older consumers of the dead-letter queue would never see it."""
    dlq = old_format_queue(tmp_path / "spool" / "jobs.dlq", shards)
    jobs = vsqs.Spool(tmp_path / "spool").create_queue("jobs", max_receives=2, shards=shards)
    kill(jobs, b"dies")
    assert first_flags(dlq) == [None]
    dead = dlq.receive(wait=10)
    assert dead is not None and dead.body == b"dies" and dead.first_received_at is None
    assert dead.dead_letter_source == "jobs"


@pytest.mark.parametrize("shards", [1, 4], ids=["format1", "format2"])
def test_a_dead_letter_queue_made_on_demand_takes_the_format_family_of_its_source(tmp_path, shards):
    """A queue of format 1 or 2 is shared with older vsqs, which bury into its
    dead-letter queue too: one made on demand at format 3 would be refused by
    them (IncompatibleFormat out of their receive). It is made at format 1."""
    jobs = old_format_queue(tmp_path / "spool" / "jobs", shards)
    jobs.configure(max_receives=2)
    kill(jobs, b"dies")
    dlq = jobs.dead_letter_queue()
    assert dlq is not None
    with open(os.path.join(dlq.path, _format.METADATA_NAME)) as file:
        assert json.load(file)["format"] == 1
    dead = dlq.receive(wait=10)
    assert dead is not None and dead.body == b"dies" and dead.dead_letter_source == "jobs"
    new = vsqs.Spool(tmp_path / "spool").create_queue("new", max_receives=2)
    kill(new, b"dies too")
    with open(os.path.join(new.dead_letter_queue().path, _format.METADATA_NAME)) as file:
        assert json.load(file)["format"] == 3


def test_redrive_forgets_the_first_receive_with_the_count(spool):
    jobs, dlq = spool
    kill(jobs, b"again")
    assert dlq.redrive() == 1
    assert first_flags(jobs) == [None]  # never received, as far as its home queue knows
    before = now_ms()
    back = jobs.receive(wait=10)
    assert back is not None and back.receive_count == 1 and back.dead_letter_source is None
    assert round(back.first_received_at * 1000) >= before


@pytest.mark.parametrize("content", [None, b"", b"/somewhere/..", b"/x/not a queue name", b"/x/.hidden", "dir"])
def test_an_unknown_or_damaged_source_is_absent(spool, content):
    jobs, dlq = spool
    kill(jobs, b"lost")
    entry = os.path.join(dlq.path, _format.SOURCES_DIR, jobs.id)
    os.unlink(entry)
    if content == "dir":
        os.mkdir(entry)
    elif content is not None:
        with open(entry, "wb") as file:
            file.write(content)
    dead = dlq.receive(wait=10)
    assert dead is not None and dead.dead_letter_source is None
    assert dead.first_received_at is not None


@pytest.mark.parametrize("hostile", ["symlink", "fifo", "huge", "newline", "escape", "nul", "bad utf-8"])
def test_a_hostile_source_entry_is_absent_and_harmless(spool, hostile):
    """A planted entry: never followed (a symlink), never waited on (a FIFO),
    never read whole (huge), and never a name with control characters (shown
    by the SQS face in an ARN)."""
    jobs, dlq = spool
    kill(jobs, b"lost")
    entry = os.path.join(dlq.path, _format.SOURCES_DIR, jobs.id)
    os.unlink(entry)
    if hostile == "symlink":
        target = os.path.join(os.path.dirname(dlq.path), "elsewhere")
        with open(target, "wb") as file:
            file.write(jobs.path.encode())  # a good path: only the link is wrong
        os.symlink(target, entry)
    elif hostile == "fifo":
        os.mkfifo(entry)  # a reader that waited on it would hang here
    else:
        content = {
            "huge": jobs.path.encode() + b"/" * (2 << 20),
            "newline": jobs.path.encode() + b"\n",
            "escape": jobs.path.encode() + b"\x1b[2J",
            "nul": jobs.path.encode() + b"\x00",
            "bad utf-8": jobs.path.encode() + b"\xff",
        }[hostile]
        with open(entry, "wb") as file:
            file.write(content)
    dead = dlq.receive(wait=10)
    assert dead is not None and dead.body == b"lost" and dead.dead_letter_source is None


def test_the_remembered_sources_follow_a_source_queue_deleted_and_made_again(tmp_path):
    """Entries are by queue id, and a queue made again has a new id: what a
    process remembers of the old one (its name) stays right for its dead
    letters, and the new one's are looked up afresh, the dead-letter queue
    deleted and made again too."""
    _sources._SOURCE_NAMES.clear()
    root = vsqs.Spool(tmp_path / "spool", create=True)
    old = root.create_queue("jobs", max_receives=2, dead_letter="dlq")
    root.create_queue("dlq")
    kill(old, b"old")
    dead = root.queue("dlq").receive(wait=10)
    assert dead is not None and dead.dead_letter_source == "jobs"  # remembered now
    root.delete_queue("dlq")
    root.delete_queue("jobs")
    root.create_queue("dlq")
    new = root.create_queue("other", max_receives=2, dead_letter="dlq")
    kill(new, b"new")
    got = root.queue("dlq").receive(wait=10)
    assert got is not None and got.body == b"new" and got.dead_letter_source == "other"
    assert new.id != old.id


def test_a_source_entry_read_once_is_remembered(spool, monkeypatch):
    jobs, dlq = spool
    kill(jobs, b"one")
    kill(jobs, b"two")
    reads = []
    real = _sources._fs.read_control
    monkeypatch.setattr(_sources._fs, "read_control", lambda path: reads.append(path) or real(path))
    assert [m.dead_letter_source for m in dlq.receive_batch(10)] == ["jobs", "jobs"]
    assert len(reads) == 1
