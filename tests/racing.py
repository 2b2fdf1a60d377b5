"""Producers and consumers racing on one queue in real processes, and the
checks that every message came through once, never held by two at once.

Used by tests/system/test_concurrency.py (one directory) and tests/system/netfs (two
mounts of one directory).
"""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from collections import defaultdict
from dataclasses import dataclass

import vsqs


@dataclass(frozen=True)
class Race:
    messages: int  # in all, split between the producers
    lease: float  # visibility timeout; abandoned messages come back after it
    abandon: float  # share of deliveries a consumer "forgets" to delete
    batch: int = 50  # messages per publish_batch
    durable: bool = False
    drain: float = 2.5  # seconds a consumer waits, idle, once the producers are done
    deadline: float = 120.0


def _produce(race: Race, path: str, index: int, count: int, barrier, out: str) -> None:
    q = vsqs.Queue(path)
    barrier.wait()
    ids = []
    for start in range(0, count, race.batch):
        bodies = [f"{index}:{i}" for i in range(start, min(start + race.batch, count))]
        ids += q.publish_batch(bodies, durable=race.durable)
    with open(out, "w") as f:
        json.dump(ids, f)


def _consume(race: Race, path: str, index: int, barrier, done, out: str) -> None:
    q = vsqs.Queue(path)
    rng = random.Random(index)
    log = []  # (id, body, received_after, lease_until, deleted)
    stale = []  # (id, when, lease_until)
    barrier.wait()
    idle_since = None
    deadline = time.monotonic() + race.deadline
    while time.monotonic() < deadline:
        batch = q.receive_batch(10, visibility_timeout=race.lease, wait=0.2)
        now = time.time()
        if not batch:
            if done.is_set():
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since > race.drain:
                    break  # abandoned messages had time to come back
            continue
        idle_since = None
        for m in batch:
            until = int(m.receipt.split(":")[1].rsplit(".", 3)[1]) / 1e6
            deleted = False
            if rng.random() >= race.abandon:
                try:
                    m.delete()
                    deleted = True
                except vsqs.StaleReceipt:
                    # legitimate only if this consumer was too slow: its lease ran out
                    stale.append((m.id, time.time(), until))
            log.append((m.id, m.body.decode(), now, until, deleted))
    with open(out, "w") as f:
        json.dump({"log": log, "stale": stale}, f)


def run_race(race: Race, producer_paths: list[str], consumer_paths: list[str], logdir) -> int:
    """Run the race (paths may be one queue seen through different mounts);
    check it; return how many deliveries were re-deliveries."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(producer_paths) + len(consumer_paths))
    done = ctx.Event()
    per = race.messages // len(producer_paths)
    producers = [
        ctx.Process(target=_produce, args=(race, path, i, per, barrier, str(logdir / f"p{i}.json")))
        for i, path in enumerate(producer_paths)
    ]
    consumers = [
        ctx.Process(target=_consume, args=(race, path, i, barrier, done, str(logdir / f"c{i}.json")))
        for i, path in enumerate(consumer_paths)
    ]
    for p in producers + consumers:
        p.start()
    for p in producers:
        p.join(race.deadline)
        assert p.exitcode == 0
    done.set()
    for p in consumers:
        p.join(race.deadline + 60)
        assert p.exitcode == 0

    published = {}
    for i in range(len(producers)):
        with open(logdir / f"p{i}.json") as f:
            for n, message_id in enumerate(json.load(f)):
                published[message_id] = f"{i}:{n}"
    assert len(published) == per * len(producers)
    deliveries = defaultdict(list)
    for i in range(len(consumers)):
        with open(logdir / f"c{i}.json") as f:
            doc = json.load(f)
        for message_id, body, received, until, deleted in doc["log"]:
            deliveries[message_id].append((until, received, deleted, body))
        for message_id, when, until in doc["stale"]:
            assert when >= until, f"delete of {message_id} refused inside its own lease"

    # nothing lost: every published message was delivered with its body, and deleted once
    assert set(deliveries) == set(published), "messages lost"
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
    return redelivered


# -- groups taken in runs (receive_batch(group_runs=True)) ---------------------


def _consume_runs(path: str, index: int, total: int, barrier, deleted, deadline: float, out: str) -> None:
    """Take runs of groups; settle each member at random (delete, release, made
    visible, or extended first); log each run: its group, its bodies, when it
    was received, and for each member how it was settled and when that began."""
    q = vsqs.Queue(path)
    rng = random.Random(index)
    runs = []
    barrier.wait()
    end = time.monotonic() + deadline
    while deleted.value < total and time.monotonic() < end:
        batch = q.receive_batch(rng.randint(1, 10), visibility_timeout=60, group_runs=True)
        received = time.time()
        by_group: dict[str, list[vsqs.Message]] = defaultdict(list)
        for m in batch:
            by_group[m.group].append(m)
        for group, run in by_group.items():
            settled = {}
            for m in rng.sample(run, len(run)):  # settled in any order
                settling = time.time()
                choice = rng.random()
                if choice < 0.1:
                    m.release()
                    settled[m.body.decode()] = ("visible", settling)
                elif choice < 0.15:
                    m.change_visibility(0)
                    settled[m.body.decode()] = ("visible", settling)
                else:
                    if choice < 0.25:
                        m.change_visibility(120)
                    settling = time.time()
                    m.delete()
                    settled[m.body.decode()] = ("deleted", settling)
                    with deleted.get_lock():
                        deleted.value += 1
            runs.append((group, [m.body.decode() for m in run], received, settled))
    with open(out, "w") as f:
        json.dump(runs, f)


def run_group_race(paths: list[str], logdir, groups: int, per_group: int, deadline: float = 120.0) -> int:
    """Consumers (one per path) take runs of ``groups`` groups of ``per_group``
    messages each, already published; check that each run was the group's
    visible prefix (every message of the group before its last one and not in
    it was deleted before it was received: none passed over, none in flight
    elsewhere ahead of it), that no message was held by two consumers at once,
    and that each message was deleted once; return how many runs had more than
    one message."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(paths))
    deleted = ctx.Value("i", 0)
    total = groups * per_group
    consumers = [
        ctx.Process(target=_consume_runs, args=(path, i, total, barrier, deleted, deadline, str(logdir / f"r{i}.json")))
        for i, path in enumerate(paths)
    ]
    for p in consumers:
        p.start()
    for p in consumers:
        p.join(deadline + 60)
        assert p.exitcode == 0
    runs = []
    for i in range(len(consumers)):
        with open(logdir / f"r{i}.json") as f:
            runs += json.load(f)
    assert deleted.value == total, "messages left undeleted"
    longer = 0
    for g in range(groups):
        order = {f"{g}:{n}": n for n in range(per_group)}
        group_runs = sorted((r for r in runs if r[0] == f"g{g}"), key=lambda r: r[2])
        deleted_at = {body: at for _, _, _, settled in group_runs for body, (how, at) in settled.items()
                      if how == "deleted"}
        assert sorted(deleted_at, key=order.__getitem__) == list(order), f"group g{g}: not each deleted once"
        assert sum(how == "deleted" for r in group_runs for how, _ in r[3].values()) == per_group
        held_until: dict[str, float] = {}  # when each message's last holder began to settle it
        for _, bodies, received, settled in group_runs:
            positions = [order[body] for body in bodies]
            assert positions == sorted(positions), f"group g{g}: a run out of order: {bodies}"
            ahead = [body for body, n in order.items() if n < positions[-1] and body not in bodies]
            late = [body for body in ahead if deleted_at[body] > received]
            assert not late, f"group g{g}: {bodies} received while {late} ahead of it were not deleted"
            for body in bodies:
                assert received >= held_until.get(body, 0.0), f"{body} held by two consumers at once"
                held_until[body] = settled[body][1]
            longer += len(bodies) > 1
    return longer
