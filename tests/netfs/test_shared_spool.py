"""Two hosts, one spool, over real NFS and sshfs with their client caches.

Producers publish through mount A while consumers on mount B (and on A)
race for the messages: nothing is lost, nothing is held by two consumers
inside its visibility window, stale listings only delay.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections import defaultdict

import vsqs

MESSAGES = 1200
LEASE = 4.0
ABANDON = 0.01
DEADLINE = 150.0


def _produce(path: str, index: int, count: int, barrier, out: str) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    ids = []
    for start in range(0, count, 25):
        ids += q.publish_batch([f"{index}:{i}" for i in range(start, min(start + 25, count))])
    with open(out, "w") as f:
        json.dump(ids, f)


def _consume(path: str, index: int, barrier, done, out: str) -> None:
    q = vsqs.Queue(path)
    rng = random.Random(index)
    log, stale = [], []
    barrier.wait()
    idle_since = None
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        batch = q.receive_batch(5, visibility_timeout=LEASE, wait=0.5)
        now = time.time()
        if not batch:
            if done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > LEASE + 8:  # leases ran out, caches expired
                    break
            continue
        idle_since = None
        for m in batch:
            until = int(m.receipt.split(":")[1].rsplit(".", 3)[1]) / 1e6
            deleted = False
            if rng.random() >= ABANDON:
                try:
                    m.delete()
                    deleted = True
                except vsqs.StaleReceipt:
                    stale.append((m.id, time.time(), until))
            log.append((m.id, m.body.decode(), now, until, deleted))
    with open(out, "w") as f:
        json.dump({"log": log, "stale": stale}, f)


def test_producers_on_one_host_consumers_on_both(shared_fs, tmp_path):
    queue = vsqs.Queue(os.path.join(shared_fs.host_a, "race"), create=True)
    path_b = os.path.join(shared_fs.host_b, "race")
    ctx = multiprocessing.get_context("spawn")
    barrier, done = ctx.Barrier(5), ctx.Event()
    producers = [
        ctx.Process(target=_produce, args=(queue.path, i, MESSAGES // 2, barrier, str(tmp_path / f"p{i}")))
        for i in range(2)
    ]
    consumers = [
        ctx.Process(target=_consume, args=(path, i, barrier, done, str(tmp_path / f"c{i}")))
        for i, path in enumerate([path_b, path_b, queue.path])
    ]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join(DEADLINE)
        assert p.exitcode == 0
    done.set()
    for p in consumers:
        p.join(DEADLINE + 60)
        assert p.exitcode == 0

    published = {}
    for i in range(2):
        with open(tmp_path / f"p{i}") as f:
            for n, message_id in enumerate(json.load(f)):
                published[message_id] = f"{i}:{n}"
    deliveries = defaultdict(list)
    for i in range(3):
        with open(tmp_path / f"c{i}") as f:
            doc = json.load(f)
        for message_id, body, received, until, deleted in doc["log"]:
            deliveries[message_id].append((until, received, deleted, body))
        for message_id, when, until in doc["stale"]:
            assert when >= until, f"delete of {message_id} refused inside its own lease"
    assert set(deliveries) == set(published), "lost messages"
    for message_id, got in deliveries.items():
        assert {body for *_, body in got} == {published[message_id]}
        assert sum(deleted for _, _, deleted, _ in got) == 1
        got.sort()
        for (until, _, deleted, _), (_, received_next, _, _) in zip(got, got[1:], strict=False):
            assert not deleted and received_next >= until, "held by two consumers at once"
    assert queue.stats().total == 0


def _take_group(path: str, barrier, out) -> None:
    try:
        _take_group_logged(path, barrier, out)
    except BaseException as exc:  # report it, or the test would wait for a result forever
        out.put([("error", repr(exc), 0.0)])
        raise


def _take_group_logged(path: str, barrier, out) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    log = []
    deadline = time.monotonic() + 60
    idle = 0
    while time.monotonic() < deadline and idle < 40:
        m = q.receive(visibility_timeout=30)
        if m is None:
            idle += 1
            time.sleep(0.05)
            continue
        idle = 0
        start = time.time()
        time.sleep(0.01)
        log.append((m.body.decode(), start, time.time()))
        m.delete()
    out.put(log)


def test_group_order_holds_across_hosts(shared_fs):
    queue = vsqs.Queue(os.path.join(shared_fs.host_a, "groups"), create=True)
    queue.publish_batch([str(i) for i in range(30)], group="tenant")
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_take_group, args=(path, barrier, out))
        for path in (queue.path, os.path.join(shared_fs.host_b, "groups"))
    ]
    for p in procs:
        p.start()
    handled = sorted(entry for _ in procs for entry in out.get(timeout=120))
    for p in procs:
        p.join(60)
    handled.sort(key=lambda entry: entry[1])
    assert [int(body) for body, *_ in handled] == list(range(30))  # in order, none lost
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
    from vsqs._checkfs import run_checks

    checks = {c.name: c for c in run_checks(shared_fs.host_a, shared_fs.host_b, processes=4, rounds=100)}
    assert checks["exclusive create"].status == "ok", checks["exclusive create"].detail
    assert checks["rename race"].status != "FAIL", checks["rename race"].detail
    assert checks["cross-host listing"].status != "FAIL"
