"""Chaos: producers and consumers SIGKILLed at random while they work.

Producers log each id after its publish returned; consumers log each receive
before they delete and each delete after it returned. The harness kills
random processes with SIGKILL and starts replacements. At the end: every
message whose publish returned was delivered and deleted; a message was
delivered more than once only if a consumer that had it was killed or lost
its lease; nothing is left that gc cannot clean. ``scripts/chaos.py`` runs
the long form; the test suite a short one.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import vsqs

LEASE = 2.0


def _producer(path: str, logdir: str, index: int, incarnation: int, quota: int, pause: float) -> None:
    q = vsqs.Queue(path)
    log = os.path.join(logdir, f"p{index}")
    done = _lines(log)
    with open(log, "a") as out:
        for n in range(done, quota):
            message_id = q.publish(f"{index}:{n}".encode())
            out.write(f"{message_id}\n")
            out.flush()
            time.sleep(pause)  # a steady trickle, so the killing happens mid-stream


def _lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.endswith("\n"))


def _consumer(path: str, logdir: str, index: int, incarnation: int) -> None:
    q = vsqs.Queue(path)
    with open(os.path.join(logdir, f"c{index}.{incarnation}"), "a") as out:
        while True:
            batch = q.receive_batch(5, visibility_timeout=LEASE, wait=0.2)
            for m in batch:
                out.write(f"recv {m.id}\n")
                out.flush()
                try:
                    m.delete()
                    out.write(f"del {m.id}\n")
                except vsqs.StaleReceipt:
                    out.write(f"stale {m.id}\n")
                out.flush()


@dataclass
class Report:
    published: int = 0
    deleted: int = 0
    deleted_unlogged: int = 0
    lost: int = 0
    deleted_twice: int = 0
    duplicates: int = 0
    duplicates_unexplained: int = 0
    kills: Counter = field(default_factory=Counter)
    left_after_gc: int = 0
    seconds: float = 0.0

    def ok(self) -> bool:
        return not (self.lost or self.deleted_twice or self.duplicates_unexplained or self.left_after_gc)

    def __str__(self) -> str:
        return (
            f"published {self.published:,} (acknowledged), deleted {self.deleted:,} "
            f"(+{self.deleted_unlogged} by consumers killed before they logged it), lost {self.lost}, "
            f"deleted twice {self.deleted_twice}, delivered more than once {self.duplicates} "
            f"(unexplained {self.duplicates_unexplained}), killed {dict(self.kills)}, "
            f"left after gc {self.left_after_gc}, {self.seconds:.1f}s"
        )


def run(
    path: str,
    logdir: str,
    *,
    messages: int = 2000,
    producers: int = 4,
    consumers: int = 4,
    kill_every: float = 0.3,
    pause: float = 0.002,
    seed: int = 1,
    deadline: float = 120.0,
) -> Report:
    rng = random.Random(seed)
    ctx = multiprocessing.get_context("spawn")
    vsqs.Queue(path, create=True)
    quota = messages // producers
    incarnations: Counter[str] = Counter()
    live: dict[str, multiprocessing.process.BaseProcess] = {}
    killed: set[str] = set()  # consumer log names whose process was killed
    report = Report()
    started = time.monotonic()

    def start(role: str, index: int) -> None:
        key = f"{role}{index}"
        incarnation = incarnations[key]
        incarnations[key] += 1
        if role == "p":
            proc = ctx.Process(target=_producer, args=(path, logdir, index, incarnation, quota, pause))
        else:
            proc = ctx.Process(target=_consumer, args=(path, logdir, index, incarnation))
        proc.start()
        live[f"{key}.{incarnation}"] = proc

    for i in range(producers):
        start("p", i)
    for i in range(consumers):
        start("c", i)

    def producers_done() -> bool:
        return all(not (name.startswith("p") and proc.is_alive()) for name, proc in live.items()) and all(
            _lines(os.path.join(logdir, f"p{i}")) >= quota for i in range(producers)
        )

    next_kill = time.monotonic() + kill_every
    q = vsqs.Queue(path)
    drain_kills = 0
    while time.monotonic() - started < deadline:
        for name, proc in list(live.items()):  # a producer that finished its quota is done
            if name.startswith("p") and not proc.is_alive() and proc.exitcode == 0:
                live.pop(name)
        draining = producers_done()
        if draining and (drain_kills >= consumers or not q.stats().total):
            break
        if time.monotonic() >= next_kill:
            next_kill += kill_every
            drain_kills += draining
            name = rng.choice([n for n, p in live.items() if p.is_alive()])
            live[name].kill()
            live[name].join()
            live.pop(name)
            report.kills[name[0]] += 1
            role, rest = name[0], name[1:]
            index = int(rest.split(".")[0])
            if role == "c":
                killed.add(f"c{rest}")
            start(role, index)
        time.sleep(0.02)

    # let the consumers drain, with no more kills: leases of the killed run out
    while time.monotonic() - started < deadline and q.stats().total:
        time.sleep(0.2)
    time.sleep(LEASE * 1.5)
    for proc in live.values():
        if proc.is_alive():
            proc.kill()  # consumers loop for ever; nothing is in flight by now
            proc.join(10)
    report.seconds = time.monotonic() - started

    acked = []
    for i in range(producers):
        with open(os.path.join(logdir, f"p{i}")) as f:
            acked += [line.strip() for line in f if line.strip()]
    receives: dict[str, list[str]] = defaultdict(list)
    deletes: Counter[str] = Counter()
    stale: set[str] = set()
    for entry in os.listdir(logdir):
        if not entry.startswith("c"):
            continue
        with open(os.path.join(logdir, entry)) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 2:
                    continue  # a line cut short by SIGKILL
                kind, message_id = parts
                if kind == "recv":
                    receives[message_id].append(entry)
                elif kind == "del":
                    deletes[message_id] += 1
                else:
                    stale.add(message_id)
    report.published = len(acked)
    report.deleted = sum(1 for message_id in acked if deletes[message_id])
    left = {info.id for info in q.messages()}
    for message_id in acked:
        if deletes[message_id] or message_id in left:
            continue
        if receives[message_id] and set(receives[message_id]) <= killed:
            report.deleted_unlogged += 1  # its consumer deleted it, then died before saying so
        else:
            report.lost += 1
    report.lost += len(left & set(acked))  # still there at the end: never delivered and deleted
    report.deleted_twice = sum(1 for count in deletes.values() if count > 1)
    for message_id, who in receives.items():
        if len(who) > 1:
            report.duplicates += 1
            if not (set(who[:-1]) & killed or message_id in stale or len(set(who)) < len(who)):
                report.duplicates_unexplained += 1
    q.collect_garbage(grace=0)
    report.left_after_gc = sum(1 for name in os.listdir(path) if not name.startswith("."))
    return report
