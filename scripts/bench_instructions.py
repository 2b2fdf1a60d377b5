#!/usr/bin/env python3
"""User-space instructions per message, counted by ``perf stat``: steady where CPU time is not.

Each figure is (a run that fills a queue and then consumes or publishes
again) minus (a run that only fills it), divided by the messages: process
start-up, imports and the fill cancel out. Run from the repository root::

    .venv/bin/python scripts/bench_instructions.py                 # vsqs: receive+delete and publish
    .venv/bin/python scripts/bench_instructions.py --peer dirq \\
        --python .bench-peers-venv/bin/python                        # python-dirq QueueSimple
    .venv/bin/python scripts/bench_instructions.py --syscalls       # also count system calls (strace -c)
    .venv/bin/python scripts/bench_instructions.py --phase-only --event instructions:k
                                        # count only the timed phase (perf's --control): kernel counts too

Needs ``perf`` (``instructions:u`` must be countable) and, for ``--syscalls``,
``strace``. Figures of ``instructions:u`` leave out the kernel's work. The
kernel's work of a fill swings with the state of the disk (inode allocation
on a churned ext4), so a difference of two runs cannot count it:
``--phase-only`` counts only the consuming (or second publishing) phase of
one run instead, enabling the counters from inside the worker.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def body_for(i: int, size: int) -> bytes:
    head = f"m{i}:".encode()
    return head + b"x" * max(0, size - len(head))


class _Counters:
    """perf stat's counters, switched on and off by the worker (--phase-only)."""

    def __init__(self) -> None:
        ctl, ack = os.environ.get("BENCH_PERF_CTL"), os.environ.get("BENCH_PERF_ACK")
        self.ctl = open(ctl, "w") if ctl else None  # noqa: SIM115 - held for the run
        self.ack = open(ack) if ack else None  # noqa: SIM115

    def _say(self, what: str) -> None:
        if self.ctl and self.ack:
            self.ctl.write(what + "\n")
            self.ctl.flush()
            self.ack.readline()

    def on(self) -> None:
        self._say("enable")

    def off(self) -> None:
        self._say("disable")


def worker(peer: str, mode: str, path: str, count: int, size: int) -> None:
    """``fill``: publish ``count`` messages (one handle); ``consume``: fill, then a
    fresh handle receives and deletes them all; ``publish``: fill, then publish
    ``count`` more (one by one)."""
    counters = _Counters()
    if peer == "vsqs":
        sys.path.insert(0, REPO)
        import vsqs

        q = vsqs.Queue(path, create=True)
        for i in range(count):
            q.publish(body_for(i, size), durable=False)
        if mode == "consume":
            q = vsqs.Queue(path)  # a fresh handle: its first receive lists the directory
            receive, delete, n = q.receive, q.delete, 0
            counters.on()
            while (m := receive()) is not None:
                m.body  # noqa: B018
                delete(m.receipt)
                n += 1
            counters.off()
            assert n == count, (n, count)
        elif mode == "publish":
            publish = q.publish
            counters.on()
            for i in range(count):
                publish(body_for(i, size), durable=False)
            counters.off()
    elif peer == "dirq":
        from dirq.QueueSimple import QueueSimple

        q = QueueSimple(path)
        for i in range(count):
            q.add(body_for(i, size))
        if mode == "consume":
            q = QueueSimple(path)
            n = 0
            counters.on()
            name = q.first()
            while name:
                if q.lock(name):
                    q.get(name)
                    q.remove(name)
                    n += 1
                name = q.next()
            counters.off()
            assert n == count, (n, count)
        elif mode == "publish":
            add = q.add
            counters.on()
            for i in range(count):
                add(body_for(i, size))
            counters.off()
    else:
        raise SystemExit(f"unknown peer {peer!r}")


def count(cmd: list[str], event: str, phase_only: bool = False) -> int:
    with tempfile.NamedTemporaryFile("r", suffix=".perf") as out, tempfile.TemporaryDirectory() as fifos:
        perf = ["perf", "stat", "-x,", "-e", event, "-o", out.name]
        env = dict(os.environ)
        if phase_only:  # counters start off; the worker switches them on for its phase
            ctl, ack = os.path.join(fifos, "ctl"), os.path.join(fifos, "ack")
            os.mkfifo(ctl)
            os.mkfifo(ack)
            perf += ["-D", "-1", "--control", f"fifo:{ctl},{ack}"]
            env.update(BENCH_PERF_CTL=ctl, BENCH_PERF_ACK=ack)
        r = subprocess.run([*perf, *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                           check=False)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            raise SystemExit(f"perf stat failed (exit {r.returncode})")
        for line in out.read().splitlines():
            fields = line.split(",")
            if len(fields) > 2 and fields[2].startswith(event.split(":")[0]):
                return int(fields[0])
    raise RuntimeError(f"perf printed no count of {event}")


def syscalls(cmd: list[str]) -> dict[str, int]:
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        subprocess.run(["strace", "-f", "-c", "-o", out.name, *cmd], check=True, stdout=subprocess.DEVNULL)
        calls: dict[str, int] = {}
        for line in out.read().splitlines():
            fields = line.split()
            if len(fields) >= 5 and fields[-1] not in ("syscall", "total") and fields[3].isdigit():
                calls[fields[-1]] = int(fields[3])
        return calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", default="vsqs", choices=["vsqs", "dirq"])
    p.add_argument("--python", default=sys.executable, help="the interpreter of the runs (dirq: the peers venv)")
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3, help="pairs of runs; the median is shown")
    p.add_argument("--dir", default=os.path.join(REPO, ".bench"))
    p.add_argument("--event", default="instructions:u")
    p.add_argument("--syscalls", action="store_true", help="also count system calls per message (strace -c)")
    p.add_argument("--phase-only", action="store_true",
                   help="count only the consuming (publishing) phase of one run, not (fill + it) - fill")
    p.add_argument("--worker", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.peer, a.worker[0], a.worker[1], a.count, a.body_size)
        return 0
    os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="instr-", dir=a.dir)
    serial = 0

    def cmd(mode: str) -> list[str]:
        nonlocal serial
        serial += 1
        return [a.python, os.path.abspath(__file__), "--peer", a.peer, "--count", str(a.count),
                "--body-size", str(a.body_size), "--worker", mode, os.path.join(scratch, f"q{serial}")]

    try:
        for mode in ("consume", "publish"):
            per = []
            for _ in range(a.repeat):
                if a.phase_only:
                    per.append(count(cmd(mode), a.event, phase_only=True) / a.count)
                    continue
                base = count(cmd("fill"), a.event)
                both = count(cmd(mode), a.event)
                per.append((both - base) / a.count)
            per.sort()
            label = "receive+delete" if mode == "consume" else "publish"
            print(f"{a.peer} {label:<15} {a.event} per message: median {per[len(per) // 2]:,.0f} "
                  f"(runs: {', '.join(f'{x:,.0f}' for x in per)})")
            if a.syscalls:
                base, both = syscalls(cmd("fill")), syscalls(cmd(mode))
                diff = {k: (both.get(k, 0) - base.get(k, 0)) / a.count for k in set(both) | set(base)}
                shown = {k: round(v, 2) for k, v in sorted(diff.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.01}
                print(f"{'':<5} {'':<15} system calls per message: {sum(diff.values()):.2f} {shown}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
