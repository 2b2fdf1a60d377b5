"""Two hosts, one spool, over real NFS and sshfs with their client caches.

Producers publish through mount A while consumers on mount B (and on A)
race for the messages: nothing is lost, nothing is held by two consumers
inside its visibility window, stale listings only delay.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
import time

import vsqs
from tests.racing import Race, run_race


def test_producers_on_one_host_consumers_on_both(shared_fs, tmp_path):
    queue = vsqs.Queue(os.path.join(shared_fs.host_a, "race"), create=True)
    path_b = os.path.join(shared_fs.host_b, "race")
    race = Race(messages=1200, lease=4.0, abandon=0.01, batch=25, durable=True, drain=12.0, deadline=150.0)
    # leases must run out and caches expire before a consumer may give up
    run_race(race, [queue.path, queue.path], [path_b, path_b, queue.path], tmp_path)
    assert queue.stats().total == 0


def _take_group(path: str, barrier, done, out) -> None:
    try:
        _take_group_logged(path, barrier, done, out)
    except BaseException as exc:  # report it, or the test would wait for a result forever
        out.put([("error", repr(exc), 0.0)])
        raise


def _take_group_logged(path: str, barrier, done, out) -> None:
    # Each consumer goes on until the two together have handled every message
    # (or the deadline, which fails the test): not until it has seen "empty"
    # for a while. A stale listing or slot chain on one mount may show the
    # group as empty or held for up to the client cache's time (CACHE_S);
    # that is a delay, and a give-up rule shorter than it made this test flaky.
    q = vsqs.Queue(path)
    barrier.wait()
    log = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and done.value < GROUP_MESSAGES:
        m = q.receive(visibility_timeout=30)
        if m is None:
            time.sleep(0.05)
            continue
        start = time.time()
        time.sleep(0.01)
        log.append((m.body.decode(), start, time.time()))
        m.delete()
        with done.get_lock():
            done.value += 1
    out.put(log)


GROUP_MESSAGES = 30


def test_group_order_holds_across_hosts(shared_fs):
    queue = vsqs.Queue(os.path.join(shared_fs.host_a, "groups"), create=True)
    queue.publish_batch([str(i) for i in range(GROUP_MESSAGES)], group="tenant")
    ctx = multiprocessing.get_context("spawn")
    barrier, done, out = ctx.Barrier(2), ctx.Value("i", 0), ctx.Queue()
    procs = [
        ctx.Process(target=_take_group, args=(path, barrier, done, out))
        for path in (queue.path, os.path.join(shared_fs.host_b, "groups"))
    ]
    for p in procs:
        p.start()
    handled = sorted(entry for _ in procs for entry in out.get(timeout=150))
    for p in procs:
        p.join(60)
    handled.sort(key=lambda entry: entry[1])
    assert [int(body) for body, *_ in handled] == list(range(GROUP_MESSAGES))  # in order, none lost
    for (_, _, end), (_, start, _) in zip(handled, handled[1:], strict=False):
        assert start >= end  # never two at once


def test_receipt_and_dedup_from_the_other_host(shared_fs):
    a = vsqs.Queue(os.path.join(shared_fs.host_a, "misc"), create=True)
    b = vsqs.Queue(os.path.join(shared_fs.host_b, "misc"))
    first = a.publish(b"x", dedup_id="order-1")
    assert b.publish(b"x", dedup_id="order-1") == first  # the other host sees the reservation
    deadline = time.monotonic() + 30
    m = None
    while m is None and time.monotonic() < deadline:
        m = b.receive(wait=1)  # the other host's listing may lag
    assert m is not None and m.id == first
    a.delete(m.receipt)  # a receipt from host B works on host A
    assert a.stats().total == 0


def test_check_fs_across_the_two_mounts(shared_fs):
    from vsqs._cli.checkfs import run_checks

    checks = {c.name: c for c in run_checks(shared_fs.host_a, shared_fs.host_b, processes=4, rounds=100)}
    assert checks["exclusive create"].status == "ok", checks["exclusive create"].detail
    assert checks["rename race"].status != "FAIL", checks["rename race"].detail
    assert checks["cross-host listing"].status != "FAIL"


def test_one_handle_takes_all_it_published(shared_fs):
    # a listing on a network filesystem is not cheap: a handle whose listing
    # was productive must list again when its cache runs out, not answer "empty"
    queue = vsqs.Queue(os.path.join(shared_fs.host_a, "alone"), create=True)
    for i in range(400):
        queue.publish(str(i).encode())
    taken = set()
    while (m := queue.receive()) is not None:
        taken.add(m.body)
        m.delete()
    assert len(taken) == 400


def test_a_waiter_on_one_host_wakes_for_a_message_published_on_the_other(shared_fs):
    """No kernel notification crosses hosts: the waiter on B polls its mount (detected by
    the mount's type) and gets what A published, each message once, within its wait."""
    from vsqs._core import inotify as _inotify

    assert not _inotify.is_local(_inotify.filesystem_type(shared_fs.host_b))  # polled, not watched
    a = vsqs.Queue(os.path.join(shared_fs.host_a, "waiting"), create=True)
    b = vsqs.Queue(os.path.join(shared_fs.host_b, "waiting"), poll_interval=0.05)
    got: list[bytes] = []

    def consume() -> None:
        while len(got) < 5:
            message = b.receive(wait=60)  # the mounts' caches hold listings for 3 s
            if message is None:
                return
            got.append(message.body)
            message.delete()

    consumer = threading.Thread(target=consume)
    consumer.start()
    for index in range(5):
        time.sleep(0.2)
        a.publish(b"%d" % index)  # (another path: no hint of this process's publish reaches B's watch)
    consumer.join(120)
    assert sorted(got) == [b"%d" % index for index in range(5)]


def test_two_hosts_creating_one_queue_at_once_both_open_it(shared_fs):
    # A Celery worker on one host and a producer on the other both declare the
    # queue as they start. The loser of the creation race may be told so in
    # other words (sshfs: EPERM) and may not see the winner's queue yet (a
    # cached lookup saying "none"); it opens the winner's queue all the same.
    script = "import sys, vsqs; vsqs.Spool(sys.argv[1], create=True).create_queue(sys.argv[2]).publish(b'x')"
    for round_ in range(20):
        name = f"race-{round_}-{os.getpid()}"
        spools = [os.path.join(host, "spool") for host in (shared_fs.host_a, shared_fs.host_b)]
        creators = [subprocess.Popen([sys.executable, "-c", script, spool, name], stderr=subprocess.PIPE, text=True)
                    for spool in spools]
        failures = [err[-800:] for p in creators if (err := p.communicate()[1]) and p.returncode]
        assert not failures, failures
        assert vsqs.Queue(os.path.join(spools[0], name)).stats().total == 2
