"""Crash points: every transition stopped after each of its system calls.

A proxy replaces the ``os`` module inside :mod:`vsqs._core.fs`; the n-th call
raises :class:`Crash` and so does every call after it, as if the process had
died there (no cleanup code gets to touch the disk). A fresh handle then
recovers the queue, and each message must be present exactly once, with its
whole body, or absent exactly where the semantics allow.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

import vsqs
from tests.conftest import message_files
from vsqs._core import fs as _fs
from vsqs._core import groups as _groups
from vsqs._core import synced as _synced

LEASE = 0.1  # short leases, so recovery by expiry is quick


class Crash(BaseException):
    """The process died here. BaseException: no `except Exception` may catch it."""


class DyingOS:
    """Stands in for ``os`` in vsqs._core.fs: dies at the n-th call of a function."""

    def __init__(self, die_at: int) -> None:
        self.die_at = die_at
        self.calls = 0
        self.opened: list[int] = []

    def __getattr__(self, name: str):
        real = getattr(os, name)
        if not callable(real) or name.startswith("O_") or name == "path":
            return real

        def call(*args, **kwargs):
            self.calls += 1
            if self.calls >= self.die_at:
                raise Crash(f"died at call {self.calls}: os.{name}")
            result = real(*args, **kwargs)
            if name == "open":
                self.opened.append(result)
            elif name == "close" and args and args[0] in self.opened:
                self.opened.remove(args[0])
            return result

        return call

    def close_leaked(self) -> None:
        """Close what the dead run opened and left open, as its death would: not
        the directories its queue handles hold (closed with the handles)."""
        for fd in self.opened:
            if _fs.is_pin(f"{_fs.PINNED}{fd}"):
                continue
            try:
                os.close(fd)
            except OSError:
                pass


def crash_everywhere(
    monkeypatch, setup: Callable[[], object], operation: Callable[[object], object], check
) -> int:
    """Run ``operation`` dying at call 1, 2, ... until it completes; ``check``
    each outcome. Returns the number of crash points tried."""
    n = 1
    while True:
        state = setup()
        dying = DyingOS(n)
        monkeypatch.setattr(_fs, "os", dying)
        completed = True
        try:
            operation(state)
        except Crash:
            completed = False
        finally:
            monkeypatch.setattr(_fs, "os", os)
            dying.close_leaked()
        check(state, completed)
        if completed:
            return n - 1
        n += 1


@pytest.fixture
def fresh(tmp_path):
    counter = iter(range(10**6))

    def make() -> vsqs.Queue:
        return vsqs.Queue(tmp_path / f"q{next(counter)}", create=True)

    return make


def recover(q: vsqs.Queue) -> vsqs.Queue:
    """What an operator or the next process does: reopen, gc, requeue."""
    q2 = vsqs.Queue(q.path)
    q2.collect_garbage(grace=0)
    q2.requeue_expired()
    return q2


def assert_one_file_per_message(q: vsqs.Queue) -> None:
    counts = message_files(q.path)
    assert all(c == 1 for c in counts.values()), counts
    assert not [n for n in os.listdir(q.path) if n.endswith(".new")], "gc left a .new file"


def test_publish(monkeypatch, fresh):
    def check(q, completed):
        q2 = recover(q)
        assert_one_file_per_message(q2)
        bodies = [m.body for m in q2.receive_batch(10)]
        assert bodies in ([], [b"payload"])
        if completed:
            assert bodies == [b"payload"]

    steps = crash_everywhere(monkeypatch, fresh, lambda q: q.publish(b"payload"), check)
    assert steps >= 6  # open, write, fsync, close, rename, directory fsync


def test_durable_batch_publish(monkeypatch, fresh):
    bodies = [b"one", b"two" * 1000, b"three"]

    def check(q, completed):
        q2 = recover(q)
        assert_one_file_per_message(q2)
        got = sorted(m.body for m in q2.receive_batch(10))
        assert set(got) <= set(bodies) and len(got) == len(set(got))
        if completed:
            assert got == sorted(bodies)

    steps = crash_everywhere(monkeypatch, fresh, lambda q: q.publish_batch(bodies), check)
    assert steps >= 3 * 4 + 3


def test_delayed_publish(monkeypatch, fresh):
    def check(q, completed):
        q2 = recover(q)
        assert_one_file_per_message(q2)
        assert all(i.state in ("delayed", "ready") for i in q2.messages())
        if completed:
            assert [i.state for i in q2.messages()] == ["delayed"]

    crash_everywhere(monkeypatch, fresh, lambda q: q.publish(b"x", delay=60), check)


def _published(fresh) -> Callable[[], vsqs.Queue]:
    def setup():
        q = fresh()
        q.publish(b"payload")
        return q

    return setup


def test_receive(monkeypatch, fresh):
    def check(q, completed):
        assert_one_file_per_message(q)
        time.sleep(LEASE * 1.2)
        m = recover(q).receive()
        assert m is not None and m.body == b"payload"
        assert m.receive_count in (1, 2)  # 2 if the crash came after the claim
        if completed:
            assert m.receive_count == 2

    steps = crash_everywhere(
        monkeypatch, _published(fresh), lambda q: q.receive(visibility_timeout=LEASE), check
    )
    assert steps >= 3  # listdir, rename, open (+ reads, close)


def _received(fresh, lease: float) -> Callable[[], tuple[vsqs.Queue, vsqs.Message]]:
    def setup():
        q = fresh()
        q.publish(b"payload")
        return q, q.receive(visibility_timeout=lease)

    return setup


def test_change_visibility(monkeypatch, fresh):
    def check(state, completed):
        q, _ = state
        assert_one_file_per_message(q)
        time.sleep(LEASE * 1.2)
        m = recover(q).receive()
        assert m is not None and (m.body, m.receive_count) == (b"payload", 2)

    crash_everywhere(
        monkeypatch,
        _received(fresh, LEASE),
        lambda s: s[0].change_visibility(s[1].receipt, LEASE),
        check,
    )


def test_release(monkeypatch, fresh):
    def check(state, completed):
        q, _ = state
        assert_one_file_per_message(q)
        time.sleep(LEASE * 1.2)
        m = recover(q).receive()
        assert m is not None and (m.body, m.receive_count) == (b"payload", 2)

    crash_everywhere(monkeypatch, _received(fresh, LEASE), lambda s: s[1].release(), check)


def test_requeue(monkeypatch, fresh):
    def check(state, completed):
        q, _ = state
        assert_one_file_per_message(q)
        m = recover(q).receive()
        assert m is not None and (m.body, m.receive_count) == (b"payload", 2)

    steps = crash_everywhere(
        monkeypatch, _received(fresh, 0), lambda s: s[0].requeue_expired(), check
    )
    assert steps >= 2  # listdir, rename


def test_delete(monkeypatch, fresh):
    def check(state, completed):
        q, _ = state
        assert_one_file_per_message(q)
        left = message_files(q.path)
        assert len(left) == (0 if completed else len(left)) and len(left) <= 1

    crash_everywhere(monkeypatch, _received(fresh, 60), lambda s: s[1].delete(), check)


def test_create_queue(monkeypatch, tmp_path):
    counter = iter(range(1000))

    def setup():
        return tmp_path / f"q{next(counter)}"

    def check(path, completed):
        # a queue whose creation died is either absent, or re-created cleanly
        q = vsqs.Queue(path, create=True)
        q.publish(b"x")
        assert q.receive().body == b"x"

    crash_everywhere(monkeypatch, setup, lambda p: vsqs.Queue(p, create=True), check)


PUBLISHER = """
import sys, vsqs
q = vsqs.Queue(sys.argv[1])
i = 0
while True:
    q.publish(str(i).encode() * 20000, durable=False)
    i += 1
"""


def test_killed_publisher_leaves_only_whole_messages(queue):
    child = subprocess.Popen([sys.executable, "-c", PUBLISHER, queue.path])
    deadline = time.monotonic() + 30
    while queue.stats().ready < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    queue.collect_garbage(grace=0)
    assert_one_file_per_message(queue)
    messages = queue.receive_batch(10_000)
    assert len(messages) >= 20
    for m in messages:
        number = m.body[: len(m.body) // 20000]
        assert m.body == number * 20000  # whole, never torn


def _spooled(tmp_path):
    counter = iter(range(10**6))

    def make():
        spool = vsqs.Spool(tmp_path / f"s{next(counter)}", create=True)
        q = spool.create_queue("jobs", max_receives=1)
        q.publish(b"payload")
        q.receive(visibility_timeout=0)  # used up its receives; due for the dlq
        vsqs.Queue(spool.path("jobs.dlq"), create=True)
        return spool

    return make


def _copies_in(spool) -> int:
    total = 0
    for name in ("jobs", "jobs.dlq"):
        counts = message_files(spool.path(name))
        assert all(c == 1 for c in counts.values())
        total += sum(counts.values())
    return total


def test_dead_lettering(monkeypatch, tmp_path):
    def check(spool, completed):
        assert _copies_in(spool) == 1
        if completed:
            assert message_files(spool.path("jobs.dlq")) != {}

    crash_everywhere(monkeypatch, _spooled(tmp_path), lambda s: s.queue("jobs").receive(), check)


def test_redrive(monkeypatch, tmp_path):
    make = _spooled(tmp_path)

    def setup():
        spool = make()
        spool.queue("jobs").requeue_expired()
        assert message_files(spool.path("jobs.dlq")) != {}
        return spool

    def check(spool, completed):
        assert _copies_in(spool) == 1
        if completed:
            m = spool.queue("jobs").receive()
            assert (m.body, m.receive_count) == (b"payload", 1)

    steps = crash_everywhere(monkeypatch, setup, lambda s: s.queue("jobs.dlq").redrive(), check)
    assert steps >= 3


def _grouped(fresh) -> Callable[[], vsqs.Queue]:
    def setup():
        q = fresh()
        q.publish_batch([b"first", b"second"], group="g")
        return q

    return setup


def test_group_claim(monkeypatch, fresh):
    # a lease file left empty by a dying writer holds its group for _WRITE_GRACE
    # (10 s); shorten it so recovery here is quick
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)

    def check(q, completed):
        assert_one_file_per_message(q)
        time.sleep(LEASE * 1.2)
        m = recover(q).receive()
        assert m is not None and m.body == b"first"  # the group resumes, in order
        assert vsqs.Queue(q.path).receive() is None  # and is held again
        m.delete()
        assert vsqs.Queue(q.path).receive().body == b"second"

    steps = crash_everywhere(
        monkeypatch, _grouped(fresh), lambda q: q.receive(visibility_timeout=LEASE), check
    )
    assert steps >= 5  # listing, lease read/create, rename, read


def test_group_delete(monkeypatch, fresh):
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)

    def setup():
        q = _grouped(fresh)()
        return q, q.receive(visibility_timeout=LEASE)

    def check(state, completed):
        q, _ = state
        assert_one_file_per_message(q)
        time.sleep(LEASE * 1.2)  # an unfreed slot runs out with its lease
        m = recover(q).receive()
        assert m is not None and m.body == (b"second" if completed else m.body)
        assert m.body in (b"first", b"second")

    crash_everywhere(monkeypatch, setup, lambda s: s[1].delete(), check)


def _run_setup(fresh, taken: int = 0) -> Callable[[], tuple[vsqs.Queue, list[vsqs.Message]]]:
    """A queue with m0..m3 in one group; ``taken``: a run of that many received first."""
    def setup():
        q = fresh()
        q.publish_batch([f"m{i}".encode() for i in range(4)], group="g")
        return q, (q.receive_batch(taken, visibility_timeout=LEASE, group_runs=True) if taken else [])

    return setup


def _group_goes_on_in_order(q: vsqs.Queue, wait: float = LEASE) -> None:
    """Once the leases ran out (``wait``), the group's messages left are
    taken again, all in one run, in order, by one receiver only."""
    assert_one_file_per_message(q)
    _lease_covers_the_group(q)
    time.sleep(wait * 1.2)  # leases (and a lease file a dying writer left empty) run out
    left = sorted(info.id for info in q.messages())
    run = recover(q).receive_batch(10, visibility_timeout=30, group_runs=True)
    assert [m.id for m in run] == left
    assert vsqs.Queue(q.path).receive_batch(10, group_runs=True) == []  # held by that one run


def _lease_covers_the_group(q: vsqs.Queue) -> None:
    """The slot lease (when it can be read) lasts at least as long as every
    message of the group in flight: what a reader of any version relies on."""
    from vsqs._core import format as _format

    leases = os.path.join(q.path, _format.GROUPS_DIR)
    gens = [p[2] for p in map(_format.parse_lease_name, os.listdir(leases) if os.path.isdir(leases) else [])
            if p]
    names = [_format.parse_name(n) for n in os.listdir(q.path)]
    in_flight = [n.until_us for n in names if n and n.state is _format.State.HIDDEN and n.receive_count]
    if not gens or not in_flight:
        return
    with open(os.path.join(leases, _format.lease_name(_format.group_hash("g"), 0, max(gens))), "rb") as f:
        lease = _format.decode_lease(f.read())
    if lease is not None:  # (an empty one, its writer dead, holds the group for _WRITE_GRACE)
        assert lease >= max(in_flight)


def test_group_run_claim(monkeypatch, fresh):
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)
    steps = crash_everywhere(
        monkeypatch, _run_setup(fresh),
        lambda s: s[0].receive_batch(10, visibility_timeout=LEASE, group_runs=True),
        lambda s, completed: _group_goes_on_in_order(s[0]),
    )
    assert steps >= 8  # listing, lease, a rename and a read per member


def test_group_run_extend(monkeypatch, fresh):
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)
    crash_everywhere(
        monkeypatch, _run_setup(fresh, 3),
        lambda s: s[0].change_visibility(s[1][1].receipt, LEASE * 2),
        lambda s, completed: _group_goes_on_in_order(s[0], LEASE * 2),
    )


def test_group_run_last_delete(monkeypatch, fresh):
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)

    def setup():
        q, run = _run_setup(fresh, 3)()
        run[0].delete()
        run[2].delete()
        return q, run

    def check(state, completed):
        q, _ = state
        if completed:
            assert q.stats().total == 1
        _group_goes_on_in_order(q)

    steps = crash_everywhere(monkeypatch, setup, lambda s: s[1][1].delete(), check)
    assert steps >= 4  # the unlink, its mark, the other marks, the lease


def test_group_hand_over(monkeypatch, fresh):
    monkeypatch.setattr(_groups, "_WRITE_GRACE", LEASE)

    def setup():
        q, run = _run_setup(fresh, 3)()
        run[0].change_visibility(0)  # m0 visible ahead of m1, m2 in flight: a hand-over's prefix
        return q, run

    def check(state, completed):
        q, _ = state
        if completed:
            assert vsqs.Queue(q.path).receive_batch(10, group_runs=True) == []  # m0 handed over, m1 in flight
        _group_goes_on_in_order(q)

    steps = crash_everywhere(
        monkeypatch, setup, lambda s: vsqs.Queue(s[0].path).receive_batch(10, visibility_timeout=LEASE,
                                                                          group_runs=True),
        check,
    )
    assert steps >= 6  # listing, the chain, its record, marks, the new generation, the rename, the record


def test_dedup_publish(monkeypatch, fresh):
    from vsqs._core import dedup as _dedup

    monkeypatch.setattr(_dedup, "WRITE_GRACE", LEASE)  # a torn reservation waits this long

    def check(q, completed):
        q2 = recover(q)  # gc removes the .new of the dead publisher
        assert_one_file_per_message(q2)
        # the id is never held by a message that does not exist: publishing again
        # ends with exactly one message carrying it
        again = q2.publish(b"payload", dedup_id="order-1")
        assert [m.id for m in q2.receive_batch(10)] == [again]

    steps = crash_everywhere(monkeypatch, fresh, lambda q: q.publish(b"payload", dedup_id="order-1"), check)
    assert steps >= 8  # the .new write, the reservation's create, the rename...


# -- stages: files written, synced together, renamed, the directory synced once --

STAGED = [b"one", b"two" * 1000, b"three", b"four", b"five"]


@pytest.fixture
def small_sync_batches(monkeypatch):
    """Hand files to the fsync threads two at a time, so five messages take
    the threaded path (two batches) and the last one follows at the end."""
    monkeypatch.setattr(_synced, "SYNC_BATCH", 2)


def _visible(q: vsqs.Queue) -> list[bytes]:
    return sorted(m.body for m in q.receive_batch(100))


def test_staged_publish(monkeypatch, fresh, small_sync_batches):
    def check(q, completed):
        q2 = recover(q)
        assert q2.stats().total == 0  # nothing is visible before the commit
        assert q2.stages() == ["s"] or (not completed and q2.stages() == [])
        published = q2.commit_stage("s")
        got = _visible(q2)
        assert len(got) == published
        assert set(got) <= set(STAGED) and len(got) == len(set(got))  # whole bodies, once each
        assert_one_file_per_message(q2)
        if completed:
            assert got == sorted(STAGED)

    steps = crash_everywhere(monkeypatch, fresh, lambda q: q.publish_staged(STAGED, stage="s"), check)
    assert steps >= 5 * 5 + 1  # open, write, fsync, close, rename each; one directory fsync


@pytest.mark.parametrize("publish", ["staged", "batch"])
def test_many_messages_are_durable_before_they_are_named(monkeypatch, fresh, small_sync_batches, publish):
    """The order of the steps of a staged publish and a durable batch publish:
    every file is fsynced before any is renamed to its name, and the
    directory is fsynced after the last rename."""
    q = fresh()
    calls: list[str] = []

    class Recording:
        def __getattr__(self, name: str):
            real = getattr(os, name)
            if not callable(real) or name.startswith("O_") or name == "path":
                return real

            def call(*args, **kwargs):
                calls.append(name)
                return real(*args, **kwargs)

            return call

    monkeypatch.setattr(_fs, "os", Recording())
    if publish == "staged":
        q.publish_staged(STAGED, stage="s")
    else:
        q.publish_batch(STAGED)
    monkeypatch.setattr(_fs, "os", os)
    assert calls.count("fsync") == len(STAGED) + 1
    first_rename = calls.index("rename")
    assert calls[:first_rename].count("fsync") == len(STAGED)  # all synced before the first rename
    assert calls[first_rename:].count("rename") == len(STAGED)
    last_rename = len(calls) - 1 - calls[::-1].index("rename")
    assert "fsync" in calls[last_rename:]  # the directory, after the last rename


def test_stage_commit(monkeypatch, fresh, small_sync_batches):
    def setup():
        q = fresh()
        q.publish_staged(STAGED, stage="s")
        return q

    def check(q, completed):
        q2 = recover(q)
        if not completed:
            q2.commit_stage("s")  # the job's commit, run again after the crash: it publishes the rest
        assert q2.stages() == []
        assert _visible(q2) == sorted(STAGED)  # nothing lost, nothing twice
        assert_one_file_per_message(q2)

    steps = crash_everywhere(monkeypatch, setup, lambda q: q.commit_stage("s"), check)
    assert steps >= len(STAGED) + 1  # a rename each; one directory fsync


def test_purge_forgetting_dedup_ids(monkeypatch, fresh):
    def setup():
        q = fresh()
        q.configure(dedup_window=3600)
        return q, q.publish(b"purged", dedup_id="x"), q.publish(b"kept", dedup_id="y")

    def check(state, completed):
        q, purged, kept = state
        q2 = recover(q)
        assert_one_file_per_message(q2)
        left = {m.id for m in q2.messages()}
        assert kept in left and left <= {purged, kept}  # the purge never touches the other message
        assert q2.publish(b"kept again", dedup_id="y") == kept  # nor its id
        again = q2.publish(b"purged again", dedup_id="x")
        if completed:
            assert again != purged  # freed: stored
        # held (by its message, or by the window after a crash before the ids were freed): nothing stored
        assert {m.id for m in q2.messages()} == left if again == purged else left | {again}

    steps = crash_everywhere(monkeypatch, setup, lambda s: s[0].purge(ids=[s[1]]), check)
    assert steps >= 3  # the listing, the unlink, the reservation's create
