"""Real processes racing on one queue, released together by a start barrier."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections import defaultdict

import vsqs

from .conftest import message_files

PRODUCERS = CONSUMERS = 4
MESSAGES = 20_000
LEASE = 1.0  # short, so abandoned messages come back within the test
ABANDON = 0.005  # share of deliveries a consumer "forgets" to delete
DEADLINE = 120.0


def _producer(path: str, index: int, barrier, out: str) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    ids = []
    per = MESSAGES // PRODUCERS
    for start in range(0, per, 50):
        bodies = [f"{index}:{i}" for i in range(start, min(start + 50, per))]
        ids += q.publish_batch(bodies, durable=False)
    with open(out, "w") as f:
        json.dump(ids, f)


def _consumer(path: str, index: int, barrier, producers_done, out: str) -> None:
    q = vsqs.Queue(path)
    rng = random.Random(index)
    log = []  # (id, body, received_after, lease_until, deleted)
    stale = []  # (id, when, lease_until)
    barrier.wait()
    idle_since = None
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        batch = q.receive_batch(10, visibility_timeout=LEASE, wait=0.2)
        now = time.time()
        if not batch:
            if producers_done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > LEASE * 2.5:
                    break  # abandoned messages had time to come back
            continue
        idle_since = None
        for m in batch:
            until = int(m.receipt.rsplit(".", 3)[1]) / 1e6
            deleted = False
            if rng.random() >= ABANDON:
                try:
                    m.delete()
                    deleted = True
                except vsqs.StaleReceipt:
                    # legitimate only if this consumer was too slow: its lease ran out
                    stale.append((m.id, time.time(), until))
            log.append((m.id, m.body.decode(), now, until, deleted))
    with open(out, "w") as f:
        json.dump({"log": log, "stale": stale}, f)


def test_four_producers_four_consumers(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PRODUCERS + CONSUMERS)
    producers_done = ctx.Event()
    producers = [
        ctx.Process(target=_producer, args=(q.path, i, barrier, str(tmp_path / f"p{i}.json")))
        for i in range(PRODUCERS)
    ]
    consumers = [
        ctx.Process(
            target=_consumer,
            args=(q.path, i, barrier, producers_done, str(tmp_path / f"c{i}.json")),
        )
        for i in range(CONSUMERS)
    ]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join(DEADLINE)
        assert p.exitcode == 0
    producers_done.set()
    for p in consumers:
        p.join(DEADLINE + 30)
        assert p.exitcode == 0

    published = {}
    for i in range(PRODUCERS):
        with open(tmp_path / f"p{i}.json") as f:
            for n, message_id in enumerate(json.load(f)):
                published[message_id] = f"{i}:{n}"
    assert len(published) == MESSAGES

    deliveries = defaultdict(list)
    for i in range(CONSUMERS):
        with open(tmp_path / f"c{i}.json") as f:
            doc = json.load(f)
        for message_id, body, received, until, deleted in doc["log"]:
            deliveries[message_id].append((until, received, deleted, body))
        for message_id, when, until in doc["stale"]:
            assert when >= until, f"delete of {message_id} refused inside its own lease"

    # nothing lost: every published message was delivered with its body, and deleted once
    assert set(deliveries) == set(published)
    for message_id, got in deliveries.items():
        assert {body for *_, body in got} == {published[message_id]}
        assert sum(deleted for _, _, deleted, _ in got) == 1, got
    # never held by two consumers at once: a re-delivery comes after the lease ran out
    # (claims happen in the order of their lease ends; `received` is stamped later)
    redelivered = 0
    for got in deliveries.values():
        got.sort()
        for (until, _, deleted, _), (_, received_next, *_rest) in zip(got, got[1:], strict=False):
            assert not deleted, "delivered again after a successful delete"
            assert received_next >= until, "delivered again inside a visibility window"
            redelivered += 1
    assert redelivered > 0  # the abandoned ones came back (so the check above ran)
    assert q.stats().total == 0 and message_files(q.path) == {}


def _create(path: str, barrier, out) -> None:
    barrier.wait()
    out.put(vsqs.Queue(path, create=True).id)


def test_racing_creators_agree_on_one_queue(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    for attempt in range(3):
        path = str(tmp_path / f"q{attempt}")
        barrier, out = ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_create, args=(path, barrier, out)) for _ in range(4)]
        for p in procs:
            p.start()
        ids = {out.get(timeout=60) for _ in procs}
        for p in procs:
            p.join(60)
        assert len(ids) == 1 and ids == {vsqs.Queue(path).id}
        assert [n for n in os.listdir(tmp_path) if "creating" in n] == []


THROTTLE = (5, 0.5)


def _throttled_receiver(path: str, barrier, out) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    log = []
    deadline = time.time() + 2.2
    while time.time() < deadline:
        before = time.time()
        m = q.receive(visibility_timeout=60)
        after = time.time()
        if m is not None:
            log.append((before, after))
        else:
            time.sleep(0.01)
    out.put(log)


def test_throttle_holds_across_four_processes(tmp_path):
    q = vsqs.Queue(tmp_path / "q", create=True)
    q.configure(throttle=THROTTLE)
    q.publish_batch([b"x"] * 200, durable=False)
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_throttled_receiver, args=(q.path, barrier, out)) for _ in range(4)]
    for p in procs:
        p.start()
    logs = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(60)
    per_window = defaultdict(int)
    received = 0
    for log in logs:
        for before, after in log:
            received += 1
            window = int(before // THROTTLE[1])
            if window == int(after // THROTTLE[1]):
                per_window[window] += 1
    assert received > THROTTLE[0]  # it did let receives through, window after window
    assert max(per_window.values()) <= THROTTLE[0], dict(per_window)
