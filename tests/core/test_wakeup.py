"""Waiting receives wake when a message may be claimable: the watch, the hub, and their fallbacks.

The wake-up is an optimisation: these tests check that what it hands out is
right (each message once, none lost, whatever the notifications do), that
waiters are woken one at a time, and that each source of news (a publish in
another process, a release, a delayed message, a lease running out, a
group's slot freed, a poll of a filesystem without notifications) reaches a
waiter within its wait. None of them depends on how fast that happens: every
wait is many times longer than the news needs on an idle machine, and a
waiter that misses all news returns empty-handed, which the test sees.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

import vsqs
from vsqs._core import fs as _fs
from vsqs._core import hub as _hub
from vsqs._core import inotify as _inotify
from vsqs._core.wakeup import ARRIVALS, Watch

LONG = 20.0  # a wait no news on an idle machine needs more than a fraction of


@pytest.fixture
def hubs() -> Iterator[Callable[..., _hub.Hub]]:
    """Make a fresh hub (with the notifier given) this process's, for one test."""
    made: list[tuple[_hub.Hub, _hub.Hub | None]] = []

    def make(notifier: Callable[[], _hub.Notifier] | None = _inotify.Inotify) -> _hub.Hub:
        fresh = _hub.Hub(notifier)
        made.append((fresh, _hub.install(fresh)))
        return fresh

    yield make
    for fresh, old in reversed(made):
        fresh.close()
        _hub.install(old)


def _publish_elsewhere(path: str, bodies: list[bytes], pause: float = 0.0, *, on_cue: bool = False,
                       **options: object) -> subprocess.Popen:
    """Publish from another process (no hint of this process's publishes reaches the waiter).
    ``on_cue``: the process says "ready" once started, and publishes when a line is written to it."""
    code = (
        "import sys, time, vsqs\n"
        f"q = vsqs.Queue({path!r})\n"
        f"if {on_cue!r}:\n"
        "    print('ready', flush=True)\n"
        "    sys.stdin.readline()\n"
        f"for body in {bodies!r}:\n"
        f"    time.sleep({pause!r})\n"
        f"    q.publish(body, durable=False, **{options!r})\n"
    )
    if not on_cue:
        return subprocess.Popen([sys.executable, "-c", code])
    producer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert producer.stdout is not None and producer.stdout.readline() == "ready\n"
    return producer


# -- the watch, through its interface -------------------------------------------------


def _watch() -> Watch:
    return Watch("/q", ["/q"], ["/q/.groups"], None)


def test_a_watch_hands_each_sleeper_what_landed_since_it_looked():
    watch = _watch()
    epoch, version = watch.mark()
    watch.arrived("a")
    watch.arrived("b")
    assert watch.news_since(epoch, version)[2] == ["a", "b"]
    _, after_a, _ = watch.news_since(epoch, version)
    watch.arrived("c")
    assert watch.news_since(epoch, after_a)[2] == ["c"]


def test_a_name_told_twice_is_news_once_until_it_leaves():
    watch = _watch()
    epoch, version = watch.mark()
    watch.arrived("a")  # this process's publish...
    watch.arrived("a")  # ...and the kernel's event of it
    assert watch.news_since(epoch, version)[2] == ["a"]
    watch.left("a")
    watch.arrived("a")  # back again (a redrive resets the count: the same name)
    assert watch.news_since(epoch, version)[2] == ["a", "a"]


def test_news_that_cannot_be_named_means_list_again():
    watch = _watch()
    epoch, version = watch.mark()
    watch.changed()  # a slot freed, events lost...
    assert watch.news_since(epoch, version)[2] is None
    epoch, version = watch.mark()
    for index in range(ARRIVALS + 1):  # more than the log keeps
        watch.arrived(f"n{index}")
    assert watch.news_since(epoch, version)[2] is None
    assert watch.news_since(*watch.mark())[2] == []


def test_a_sleeper_does_not_sleep_through_news_it_has_not_seen():
    watch = _watch()
    _, version = watch.mark()
    watch.arrived("a")
    started = time.monotonic()
    assert watch.sleep(version, LONG) is True
    assert time.monotonic() - started < LONG


def test_sleepers_are_woken_one_per_name_and_pass_it_on():
    watch = _watch()
    woken: list[int] = []
    _, version = watch.mark()

    def sleep(index: int) -> None:
        if watch.sleep(version, LONG):
            woken.append(index)

    threads = [threading.Thread(target=sleep, args=(index,)) for index in range(5)]
    for thread in threads:
        thread.start()
    _until(lambda: len(watch._sleepers) == 5)  # (a read of the count only: all asleep)
    watch.arrived("a")
    _until(lambda: len(woken) == 1)
    time.sleep(0.1)
    assert len(woken) == 1  # one name, one sleeper
    watch.pass_on()  # it claimed something: the next one looks
    _until(lambda: len(woken) == 2)
    for _ in range(3):
        watch.changed()
    for thread in threads:
        thread.join(LONG)
    assert sorted(woken) == [0, 1, 2, 3, 4]
    assert woken[:2] == [0, 1]  # the oldest sleepers first


def test_a_hidden_name_wakes_one_sleeper_at_its_time_unless_it_left():
    watch = _watch()
    now_us = 1_000_000_000
    watch.hidden("gone", now_us + 1000)
    watch.hidden("due", now_us + 2000)
    watch.left("gone")
    epoch, version = watch.mark()
    watch.fire(0.0, now_us + 1500)
    assert watch.news_since(epoch, version)[2] == []
    watch.fire(0.0, now_us + 2000)
    assert watch.news_since(epoch, version)[2] == ["due"]


def _woken(queue: vsqs.Queue, **options: object) -> vsqs.Message | None:
    """``queue.receive(wait=LONG)``, which must return before its wait ran out: woken, not
    found by the one try a receive makes as its wait ends."""
    started = time.monotonic()
    message = queue.receive(wait=LONG, **options)  # type: ignore[arg-type]
    assert time.monotonic() - started < LONG, "not woken: found only as its wait ran out"
    return message


def _until(condition: Callable[[], bool], limit: float = LONG) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.005)


# -- waiting receives, end to end ---------------------------------------------------------


def test_a_waiting_receive_gets_a_message_published_by_another_process(hubs, flat_queue):
    hubs()
    producer = _publish_elsewhere(flat_queue.path, [b"hello"], pause=0.3)
    try:
        with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):  # only the notification can wake it
            message = _woken(flat_queue)
    finally:
        producer.wait()
    assert message is not None and message.body == b"hello"


def test_each_message_once_whatever_the_notifications_do(hubs, queue):
    """Notifications dropped, repeated and reordered: every message is received once."""

    class Tampering:
        def __init__(self) -> None:
            self.real = _inotify.Inotify()
            self.fd = self.real.fd
            self.count = 0

        def add(self, directory: str, mask: int) -> int:
            return self.real.add(directory, mask)

        def remove(self, wd: int) -> None:
            self.real.remove(wd)

        def read(self) -> list[_inotify.Event]:
            out = []
            for event in self.real.read():
                self.count += 1
                if self.count % 3 == 0:
                    continue  # dropped
                out += [event, event]  # repeated
            return out[::-1]  # reordered

        def close(self) -> None:
            self.real.close()

    hubs(Tampering)
    bodies = [b"%d" % index for index in range(30)]
    producer = _publish_elsewhere(queue.path, bodies, pause=0.01)
    got: list[bytes] = []
    try:
        with mock.patch.object(_hub, "CHECK_EVERY", 0.1):  # a lost notification costs this long
            deadline = time.monotonic() + 60
            while len(got) < len(bodies) and time.monotonic() < deadline:
                message = queue.receive(wait=LONG)
                if message is not None:
                    got.append(message.body)
                    message.delete()
    finally:
        producer.wait()
    assert sorted(got) == sorted(bodies)


def test_one_message_wakes_one_of_many_waiters_in_a_process(hubs, flat_queue):
    """Twenty threads wait on one handle; a message is claimed by one rename, no lost race."""
    hubs()
    renames: list[bool] = []
    real_rename = _fs.rename

    def counting_rename(src: str, dst: str) -> bool:
        won = real_rename(src, dst)
        renames.append(won)
        return won

    listings: list[str] = []
    real_list = _fs.list_names

    def counting_list(directory: str) -> list[str]:
        listings.append(directory)
        return real_list(directory)

    results: list[vsqs.Message | None] = []

    def wait() -> None:
        results.append(flat_queue.receive(wait=3))

    producer = _publish_elsewhere(flat_queue.path, [b"one"], on_cue=True)  # (started before the waits begin)
    with mock.patch.object(_fs, "rename", counting_rename), mock.patch.object(_fs, "list_names", counting_list):
        threads = [threading.Thread(target=wait) for _ in range(20)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # (all asleep by now on an idle machine; if not, they find the message themselves)
        renames.clear()
        listings.clear()
        producer.communicate("go\n")
        _until(lambda: any(results))
        woken_listings = len(listings)
        for thread in threads:
            thread.join(LONG)
    assert [m.body for m in results if m is not None] == [b"one"]
    assert renames.count(False) == 0  # no waiter lost a race for it
    assert renames.count(True) == 1  # its one claim
    assert woken_listings <= 2  # the one woken took it (and the next, passed on, looked once): not twenty


def test_a_release_wakes_a_waiter(hubs, flat_queue):
    hubs()
    flat_queue.publish(b"x")
    held = flat_queue.receive(visibility_timeout=3600)
    assert held is not None
    other = vsqs.Queue(flat_queue.path)
    threading.Timer(0.3, held.release).start()
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(other)
    assert message is not None and message.id == held.id


def test_a_delayed_message_wakes_a_waiter_at_its_time(hubs, flat_queue):
    hubs()
    started = time.time()
    producer = _publish_elsewhere(flat_queue.path, [b"later"], pause=0.3, delay=0.5)  # while it waits
    try:
        with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):  # no look: the timer alone wakes it
            message = _woken(flat_queue)
    finally:
        producer.wait()
    assert message is not None and message.body == b"later"
    assert time.time() >= started + 0.8  # not before its time


def test_a_lease_that_runs_out_wakes_a_waiter(hubs, flat_queue):
    hubs()
    flat_queue.publish(b"x")
    taken = vsqs.Queue(flat_queue.path).receive(visibility_timeout=0.5)
    assert taken is not None
    other = vsqs.Queue(flat_queue.path)  # lists the message hidden: its time is the waiter's timer
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(other)
    assert message is not None and message.id == taken.id and message.receive_count == 2


def test_a_freed_group_slot_wakes_a_waiter_for_the_groups_next(hubs, flat_queue):
    hubs()
    flat_queue.publish_batch([b"first", b"second"], group="g")
    head = flat_queue.receive(visibility_timeout=3600)
    assert head is not None and head.body == b"first"
    other = vsqs.Queue(flat_queue.path)
    assert other.receive(wait=0) is None  # the group is held
    threading.Timer(0.3, head.delete).start()
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(other)
    assert message is not None and message.body == b"second"


# -- fallbacks ---------------------------------------------------------------------------


def test_without_notifications_a_waiter_polls(hubs, queue):
    hubs(None)  # no kernel notifier: every queue is polled
    producer = _publish_elsewhere(queue.path, [b"polled"], pause=0.3)
    try:
        with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):  # (the looks of a watched queue: not these)
            message = _woken(queue)
    finally:
        producer.wait()
    assert message is not None and message.body == b"polled"


def test_the_watch_limit_degrades_to_polling_with_one_warning(hubs, tmp_path, caplog):
    class Exhausted:
        def __init__(self) -> None:
            self.real = _inotify.Inotify()
            self.fd = self.real.fd

        def add(self, directory: str, mask: int) -> int:
            raise _inotify.Unavailable("inotify watch limit reached (fs.inotify.max_user_watches)", limit=True)

        def remove(self, wd: int) -> None:
            pass

        def read(self) -> list[_inotify.Event]:
            return self.real.read()

        def close(self) -> None:
            self.real.close()

    hubs(Exhausted)
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    first, second = spool.create_queue("a"), spool.create_queue("b")
    with caplog.at_level(logging.WARNING, logger="vsqs"):
        for queue in (first, second):
            producer = _publish_elsewhere(queue.path, [b"x"], pause=0.3)
            try:
                with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
                    message = _woken(queue)
            finally:
                producer.wait()
            assert message is not None
    warnings = [r for r in caplog.records if "watch limit" in r.getMessage()]
    assert len(warnings) == 1


def test_a_network_filesystem_is_polled(tmp_path):
    table = tmp_path / "mountinfo"
    table.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /mnt/spool rw,relatime shared:2 - nfs4 server:/export rw\n"
        "41 22 0:51 / /mnt/my\\040spool rw - fuse.sshfs host:/x rw\n"
        "42 40 0:52 / /mnt/spool/local rw - tmpfs tmpfs rw\n"
    )
    kind = lambda path: _inotify.filesystem_type(path, str(table))  # noqa: E731
    assert kind("/mnt/spool/q") == "nfs4"
    assert kind("/mnt/my spool/q") == "fuse.sshfs"
    assert kind("/mnt/spool/local/q") == "tmpfs"
    assert kind("/mnt/spoolish") == "ext4"
    assert [_inotify.is_local(kind(p)) for p in ("/mnt/spool", "/mnt/my spool", "/srv", "/mnt/spool/local")] == [
        False, False, True, True]
    assert not _inotify.is_local(None)


def test_a_forked_child_waits_with_a_hub_of_its_own(hubs, flat_queue):
    hubs()
    assert flat_queue.receive(wait=0.01) is None  # the parent's hub is running
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for a message the parent publishes
        try:
            os.close(read)
            message = vsqs.Queue(flat_queue.path).receive(wait=LONG)
            os.write(write, message.body if message is not None else b"none")
        finally:
            os._exit(0)
    os.close(write)
    time.sleep(0.3)
    _publish_elsewhere(flat_queue.path, [b"to the child"]).wait()
    with os.fdopen(read, "rb") as answer:
        assert answer.read() == b"to the child"
    os.waitpid(pid, 0)


# -- asyncio -------------------------------------------------------------------------


def test_an_async_receive_waits_without_a_thread(hubs, flat_queue):
    hubs()
    threads_before = threading.active_count()

    async def main() -> list[vsqs.Message]:
        waiters = [asyncio.ensure_future(flat_queue.areceive_batch(wait=LONG)) for _ in range(200)]
        await asyncio.sleep(0.3)
        executor = min(32, (os.cpu_count() or 1) + 4)  # the default executor's threads, for the first attempts
        assert threading.active_count() <= threads_before + 1 + executor  # and the hub's: none per waiter
        flat_queue.publish(b"one")
        done, pending = await asyncio.wait(waiters, timeout=LONG, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.sleep(0.2)
        assert sum(1 for w in waiters if w.done()) == 1  # one message woke one of 200
        for waiter in pending:
            waiter.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return next(iter(done)).result()

    got = asyncio.run(main())
    assert [m.body for m in got] == [b"one"]


def test_a_cancelled_async_receive_gives_back_what_it_claimed(hubs, flat_queue):
    hubs()
    flat_queue.publish(b"kept")
    claimed = threading.Event()
    go_on = threading.Event()

    async def slow_offload(attempt: Callable[[], list[vsqs.Message]]) -> list[vsqs.Message]:
        def run() -> list[vsqs.Message]:
            got = attempt()
            claimed.set()
            go_on.wait(LONG)
            return got
        return await asyncio.get_running_loop().run_in_executor(None, run)

    async def main() -> None:
        task = asyncio.ensure_future(flat_queue.areceive_batch(wait=LONG, visibility_timeout=3600,
                                                               offload=slow_offload))
        await asyncio.get_running_loop().run_in_executor(None, claimed.wait, LONG)
        task.cancel()
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)  # the release runs in the executor

    asyncio.run(main())
    again = vsqs.Queue(flat_queue.path).receive(wait=LONG)
    assert again is not None and again.body == b"kept"  # visible again at once, not after an hour


def test_an_async_receive_checks_its_arguments_before_taking_anything(flat_queue):
    flat_queue.publish(b"x")
    with pytest.raises(vsqs.InvalidArgument):
        asyncio.run(flat_queue.areceive_batch(0))
    with pytest.raises(vsqs.InvalidArgument):
        asyncio.run(flat_queue.areceive(wait=-1))
    assert flat_queue.stats().ready == 1


def test_poll_interval_is_checked(tmp_path):
    with pytest.raises(vsqs.InvalidArgument):
        vsqs.Queue(tmp_path / "q", create=True, poll_interval=0)
    with pytest.raises(vsqs.InvalidArgument):
        vsqs.Queue(tmp_path / "q", create=True, poll_interval=3601)
    queue = vsqs.Queue(Path(tmp_path / "q"), create=True, poll_interval=0.5)
    import pickle
    assert pickle.loads(pickle.dumps(queue)).receive(wait=0) is None


# -- whose turn it is --------------------------------------------------------------------


def test_each_message_has_one_order_of_waiters_that_every_process_computes_alike():
    from vsqs._core import format as _format

    waiters = {f"{'a' * 16}-{pid}-1" for pid in range(100, 110)}
    for name in ("0000000000000001-x", "0000000000000002-y"):
        ranks = sorted(_format.waiter_rank(name, waiters, me) for me in waiters)
        assert ranks == list(range(10))  # a strict order: one first, one second...
    firsts = {min(waiters, key=lambda me: _format.waiter_rank(f"m{i}", waiters, me)) for i in range(200)}
    assert len(firsts) >= 8  # the messages spread over the waiters


def test_a_process_whose_turn_it_is_not_waits_unless_the_name_left():
    watch = _watch()
    epoch, version = watch.mark()
    woken: list[bool] = []
    thread = threading.Thread(target=lambda: woken.append(watch.sleep(version, LONG)))
    thread.start()
    _until(lambda: watch.has_sleepers())
    watch.arrived("claimed-by-the-first", delay=0.05)
    watch.left("claimed-by-the-first")  # the process whose turn it was took it
    watch.arrived("left-for-us", delay=0.05)
    assert watch.fire(time.monotonic(), 0) == []  # not yet
    time.sleep(0.06)
    assert watch.fire(time.monotonic(), 0) == ["left-for-us"]
    thread.join(LONG)
    assert woken == [True]


def test_the_line_holds_the_living_and_loses_the_dead(tmp_path):
    from vsqs._core import format as _format
    from vsqs._core.turns import Turns

    queue = vsqs.Queue(tmp_path / "q", create=True)
    mine = Turns(queue.path, None)
    boot = mine.me.split("-", 1)[0]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    waiting = Path(queue.path, _format.WAITING_DIR)
    waiting.mkdir()
    alive = _format.waiter_name(boot, os.getppid(), _proc_start(os.getppid()))
    gone = _format.waiter_name(boot, int(dead.stdout), 12345)
    foreign_old = _format.waiter_name("f" * 16, 42, 1)
    for name in (alive, gone, foreign_old, "not-a-waiter"):
        (waiting / name).touch()
    os.utime(waiting / foreign_old, (time.time() - 7200, time.time() - 7200))
    assert mine.start()
    assert mine.others == {alive}
    assert sorted(os.listdir(waiting)) == sorted([alive, "not-a-waiter"])  # the dead and the old went
    mine.enter()
    other = Turns(queue.path, None)
    other.me = _format.waiter_name(boot, 1, 1)  # (a process that will look dead)
    other.enter()
    mine.seen(other.me, True)
    name = next(f"m{i}" for i in range(1000) if _format.waiter_rank(f"m{i}", mine.others | {mine.me}, other.me) == 0)
    assert mine.delay(name) > 0  # the other comes first for this one
    mine.passed_over(name)  # it did not claim it: it is gone, so it leaves the line
    assert other.me not in mine.others and not (waiting / other.me).exists()
    mine.leave()
    assert not (waiting / mine.me).exists()


def _proc_start(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def test_processes_waiting_in_line_each_get_their_own_messages_once(hubs, flat_queue):
    code = (
        "import sys, vsqs\n"
        f"q = vsqs.Queue({flat_queue.path!r})\n"
        "while True:\n"
        "    m = q.receive(wait=30)\n"
        "    if m is None or m.body == b'stop':\n"
        "        break\n"
        "    print(m.body.decode(), flush=True)\n"
        "    m.delete()\n"
    )
    consumers = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    waiting = Path(flat_queue.path, ".waiting")
    _until(lambda: waiting.is_dir() and len(os.listdir(waiting)) == 4, 60)
    bodies = [b"%d" % index for index in range(40)]
    for body in bodies:
        flat_queue.publish(body, durable=False)
        time.sleep(0.01)
    for _ in consumers:
        flat_queue.publish(b"stop", durable=False)
    got = []
    for consumer in consumers:
        out, _ = consumer.communicate(timeout=60)
        got += out.split()
    assert sorted(got) == sorted(body.decode() for body in bodies)
    _until(lambda: not os.listdir(waiting), 10)  # each left the line as it exited


# -- odd spools, shards and cancelled waits ----------------------------------------------


def test_a_directory_planted_in_the_line_stops_no_waiting_receive(hubs, flat_queue):
    from vsqs._core import format as _format
    from vsqs._core.turns import Turns

    boot = Turns(flat_queue.path, None).me.split("-", 1)[0]
    planted = Path(flat_queue.path, _format.WAITING_DIR, _format.waiter_name(boot, 999_999_999, 1))
    planted.mkdir(parents=True)  # named like a dead process's entry: its removal fails
    hubs()
    producer = _publish_elsewhere(flat_queue.path, [b"still"], pause=0.3)
    try:
        message = _woken(flat_queue)
    finally:
        producer.wait()
    assert message is not None and message.body == b"still"


def test_a_queue_whose_line_vanished_holds_up_no_other_queues_timers(hubs, tmp_path):
    import shutil

    hubs()
    spool = vsqs.Spool(tmp_path / "spool", create=True)
    first, second = spool.create_queue("a"), spool.create_queue("b")
    assert first.receive(wait=0.05) is None  # in line on a...
    _until(lambda: not os.listdir(Path(first.path, ".waiting")))  # ...and out of it, no longer waiting
    shutil.rmtree(Path(first.path, ".waiting"))
    waiting_on_first = threading.Thread(target=lambda: first.receive(wait=3))
    waiting_on_first.start()  # (its hub tries to put it in a line that is gone)
    second.publish(b"later", delay=0.5)
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(second)
    waiting_on_first.join(LONG)
    assert message is not None and message.body == b"later"


def test_a_receive_after_a_claim_lists_the_other_shards_before_it_sleeps(hubs, tmp_path):
    """The events of its own claims reach the watch late (here: never): a receive must not
    take its listing for current while the listing itself says "list again" (other shards)."""

    class Deaf:
        def __init__(self) -> None:
            self.real = _inotify.Inotify()
            self.fd = self.real.fd

        def add(self, directory: str, mask: int) -> int:
            return self.real.add(directory, mask)

        def remove(self, wd: int) -> None:
            self.real.remove(wd)

        def read(self) -> list[_inotify.Event]:
            self.real.read()
            return []  # every event lost

        def close(self) -> None:
            self.real.close()

    hubs(Deaf)
    queue = vsqs.Queue(tmp_path / "q", create=True, shards=4)
    queue.publish_batch([b"%d" % index for index in range(40)], durable=False)
    got = []
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        for _ in range(40):
            message = _woken(queue)
            assert message is not None
            got.append(message.body)
            message.delete()
    assert len(set(got)) == 40


def test_a_group_slot_freed_in_a_groups_directory_made_after_the_wait_began(hubs, flat_queue):
    hubs()
    waiter = vsqs.Queue(flat_queue.path)
    assert waiter.receive(wait=0.05) is None  # its watch is made: no .groups yet
    flat_queue.publish_batch([b"first", b"second"], group="g")
    head = flat_queue.receive(visibility_timeout=3600)  # makes .groups
    assert head is not None and head.body == b"first"
    threading.Timer(0.5, head.delete).start()
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(waiter)
    assert message is not None and message.body == b"second"


def test_stopping_a_worker_whose_thread_is_claiming_returns_at_once(hubs, flat_queue):
    hubs()
    claiming = threading.Event()
    real_list = _fs.list_names

    def slow_list(directory: str) -> list[str]:
        claiming.set()
        time.sleep(0.3)
        return real_list(directory)

    worker = vsqs.Worker(flat_queue, lambda m: None, wait=3600)
    runner = threading.Thread(target=worker.work)
    with mock.patch.object(_fs, "list_names", slow_list):
        runner.start()
        assert claiming.wait(LONG)
        worker.stop()  # while its thread lists, before it sleeps
        runner.join(LONG)
    assert not runner.is_alive()


def test_an_async_receive_cut_short_by_the_loop_ending_gives_back_its_message(hubs, flat_queue):
    hubs()
    flat_queue.publish(b"kept")
    started = threading.Event()

    async def slow_offload(attempt: Callable[[], list[vsqs.Message]]) -> list[vsqs.Message]:
        def run() -> list[vsqs.Message]:
            started.set()
            time.sleep(0.3)
            return attempt()
        return await asyncio.get_running_loop().run_in_executor(None, run)

    async def main() -> None:
        asyncio.ensure_future(flat_queue.areceive_batch(visibility_timeout=3600, offload=slow_offload))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, LONG)
        # main returns: asyncio.run cancels the receive, its attempt still running

    asyncio.run(main())
    again = vsqs.Queue(flat_queue.path).receive(wait=LONG)
    assert again is not None and again.body == b"kept"


def test_a_delayed_message_of_a_group_wakes_a_waiter_that_listed_it_before(hubs, flat_queue):
    flat_queue.publish(b"later", delay=1, group="g")  # before any watch: only a listing knows it
    hubs()
    with mock.patch.object(_hub, "CHECK_EVERY", 3600.0):
        message = _woken(flat_queue)
    assert message is not None and message.body == b"later"


def test_cancelled_async_receives_leave_no_watch_in_use(hubs, flat_queue):
    hub = hubs()

    async def main() -> None:
        for _ in range(5):
            task = asyncio.ensure_future(flat_queue.areceive(wait=5))
            await asyncio.sleep(0)  # cancelled during its first attempt
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        await asyncio.sleep(0.5)  # the abandoned attempts finish in their threads

    asyncio.run(main())
    with mock.patch.object(_hub, "LINGER", 0.0):
        _until(lambda: flat_queue.path not in hub.watches)  # unused: dropped (not held for ever)
