#!/usr/bin/env python3
"""User-space instructions per message: steady where CPU time is not.

Each figure is (a run that fills a queue and then consumes or publishes
again) minus (a run that only fills it), divided by the messages: process
start-up, imports and the fill cancel out. Run from the repository root::

    .venv/bin/python scripts/bench_instructions.py                 # vsqs: receive+delete and publish
    .venv/bin/python scripts/bench_instructions.py --peer dirq      # python-dirq QueueSimple
                                        # (with .bench-peers-venv/bin/python, made by bench_peers.py)
    .venv/bin/python scripts/bench_instructions.py --syscalls       # also count system calls (strace -c)
    .venv/bin/python scripts/bench_instructions.py --repo ../other  # measure another checkout's vsqs
    .venv/bin/python scripts/bench_instructions.py --phase-only --event instructions:k
                                        # perf only: count only the timed phase, kernel counts too
    .venv/bin/python scripts/bench_instructions.py --check scripts/instruction_budget.json
                                        # the budget: exit 1 if a path costs more than it allows

The budget (``--check``, run by tests/test_instruction_budget.py and so in
CI) names the counter, the count and the instructions per message of each
path; a figure more than its tolerance (3%) above its budget fails, one
more than that below it asks for the budget to be lowered (a saving kept).
A change that must cost more raises the budget in the same commit, and says
why. Callgrind counts the same for the same binary, inputs and environment
(the workers run with PYTHONHASHSEED=0), whatever else the machine does.

Two counters (``--counter``):

* ``perf``: ``perf stat -e instructions:u``, the CPU's own counter. Needs a
  machine whose CPU counters perf can read (not most VMs: perf answers
  ``<not supported>`` there).
* ``callgrind``: ``valgrind --tool=callgrind``, the total ``Ir`` (instructions
  executed in user space) of each run. Works anywhere valgrind does; Python
  runs about 50x slower under it, so its default is 5,000 messages and not
  20,000 (the figure then includes a listing of 5,000 names rather than
  20,000: compare figures of one counter and one count only). Its counts are
  close to perf's but not equal (valgrind emulates a CPU of its own, and the
  C library may pick other variants of memcpy and the like for it).
* ``auto`` (the default): perf if it can count ``instructions:u`` here, else
  callgrind.

Figures of user-space instructions leave out the kernel's work. The kernel's
work of a fill swings with the state of the disk (inode allocation on a
churned ext4), so a difference of two runs cannot count it: ``--phase-only``
counts only the consuming (or second publishing) phase of one run instead,
enabling perf's counters from inside the worker (perf's ``--control``). It
exists for ``--event instructions:k``, which only perf can count, so it is
refused with callgrind. ``--syscalls`` needs ``strace``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import _report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)  # the checkout measured unless --repo names another
DEFAULT_COUNT = {"perf": 20_000, "callgrind": 5_000}
LABELS = {"consume": "receive+delete", "publish": "publish", "staged": "staged publish"}
MODE_OF = {label: mode for mode, label in LABELS.items()}
CLOCK_OF_CALLS = "BENCH_CLOCK_OF_CALLS"  # set for the workers: see clock_of_calls
CALLGRIND_EVENT = "Ir"


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


def clock_of_calls(step: float) -> None:
    """Make ``time.monotonic`` advance by ``step`` seconds a call. What vsqs does
    by the monotonic clock (re-reading a listing that grew old, checking the
    queue's path once a second) then happens after as many calls in every
    run, however slowly callgrind and a busy machine make the process run:
    the counts of a run repeat. (Under callgrind and the real clock a run
    that ran slower re-lists more often, and counts several per cent more.)"""
    start = time.monotonic()
    ticks = itertools.count()
    time.monotonic = lambda: start + next(ticks) * step


def worker(peer: str, mode: str, path: str, count: int, size: int, repo: str) -> None:
    """``fill``: publish ``count`` messages (one handle); ``consume``: fill, then a
    fresh handle receives and deletes them all; ``publish``: fill, then publish
    ``count`` more (one by one); ``staged``: fill, then stage ``count`` more
    (durably, in chunks of 1,000) and commit them."""
    counters = _Counters()
    if os.environ.get(CLOCK_OF_CALLS):
        clock_of_calls(float(os.environ[CLOCK_OF_CALLS]))
    if peer == "vsqs":
        sys.path.insert(0, repo)
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
        elif mode == "staged":  # what a Spark write does: chunks of 1,000 staged, then committed
            bodies = [body_for(i, size) for i in range(count)]
            counters.on()
            for first in range(0, count, 1000):
                q.publish_staged(bodies[first : first + 1000], stage="bench")
            q.commit_stage("bench")
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


def perf_can_count(event: str = "instructions:u") -> bool:
    """Whether ``perf stat`` counts ``event`` on this machine (a VM often answers <not supported>)."""
    if shutil.which("perf") is None:
        return False
    r = subprocess.run(["perf", "stat", "-x,", "-e", event, "true"], capture_output=True, text=True, check=False)
    return r.returncode == 0 and any(
        line.split(",")[0].isdigit() for line in r.stderr.splitlines() if event.split(":")[0] in line
    )


def choose_counter(wanted: str) -> str:
    if wanted == "auto":
        if perf_can_count():
            return "perf"
        if shutil.which("valgrind"):
            return "callgrind"
        raise SystemExit("perf cannot count instructions:u here and valgrind is not installed: no counter")
    if wanted == "callgrind" and not shutil.which("valgrind"):
        raise SystemExit("--counter callgrind needs valgrind (Debian: apt install valgrind)")
    if wanted == "perf" and not perf_can_count():
        raise SystemExit("perf cannot count instructions:u on this machine (a VM?): use --counter callgrind")
    return wanted


def count_callgrind(cmd: list[str]) -> int:
    """Instructions executed in user space by ``cmd`` (callgrind's total Ir)."""
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False,
                           # one str hash, one dict layout a run; no bytecode written by one run for the next
                           env={**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"})
        if r.returncode != 0 or not os.path.exists(out):
            sys.stderr.write(r.stderr)
            raise SystemExit(f"valgrind --tool=callgrind failed (exit {r.returncode})")
        totals = {}
        with open(out, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("summary", "totals") and value.strip():
                    totals[key] = int(value.split()[0])
    if "totals" in totals or "summary" in totals:
        return totals.get("totals", totals.get("summary", 0))
    raise RuntimeError(f"callgrind wrote no total of {CALLGRIND_EVENT} in {out}")


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
                if not fields[0].isdigit():
                    raise SystemExit(f"perf cannot count {event} here ({fields[0]}): try --counter callgrind")
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


def default_python(peer: str, repo: str) -> str:
    """The interpreter of the runs: the measured checkout's .venv (vsqs) or the peers venv (dirq)."""
    venv = ".venv" if peer == "vsqs" else ".bench-peers-venv"
    for where in (repo, REPO):
        python = os.path.join(where, venv, "bin", "python")
        if os.path.exists(python):
            return python
    return sys.executable


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--peer", default="vsqs", choices=["vsqs", "dirq"])
    p.add_argument("--repo", default=REPO, metavar="PATH",
                   help="the checkout whose vsqs is measured (default: the one this script is in)")
    p.add_argument("--python", help="the interpreter of the runs (default: PATH/.venv/bin/python of --repo; "
                                    "dirq: .bench-peers-venv/bin/python)")
    p.add_argument("--counter", default="auto", choices=["perf", "callgrind", "auto"],
                   help="perf stat, valgrind's callgrind, or perf where it can count instructions:u (auto)")
    p.add_argument("--count", type=int, help="messages per run (perf: 20000; callgrind: 5000)")
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--repeat", type=int, default=3, help="pairs of runs; the median is shown")
    p.add_argument("--dir", default=os.path.join(REPO, ".bench"))
    p.add_argument("--event", default="instructions:u", help="perf's event (perf only)")
    p.add_argument("--modes", default="consume,publish",
                   help="what to count, of consume, publish, staged (vsqs only; default consume,publish)")
    p.add_argument("--syscalls", action="store_true", help="also count system calls per message (strace -c)")
    p.add_argument("--phase-only", action="store_true",
                   help="perf only: count only the consuming (publishing) phase of one run, "
                        "not (fill + it) - fill")
    _report.add_markdown_option(p)
    p.add_argument("--clock-of-calls", type=float, metavar="SECONDS",
                   help="the workers' time.monotonic advances this much a call, not with time (repeatable counts)")
    p.add_argument("--check", metavar="BUDGET",
                   help="a budget file (JSON): count with its counter and count, exit 1 past its tolerance")
    p.add_argument("--worker", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    a = p.parse_args()
    a.repo = os.path.abspath(a.repo)
    if a.worker:
        return a
    a.budget = None
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            a.budget = json.load(f)
        a.counter, a.count, a.body_size = a.budget["counter"], a.budget["count"], a.budget["body_size"]
        a.clock_of_calls, a.repeat = a.budget["clock_of_calls"], a.budget["repeat"]
        a.modes = ",".join(MODE_OF[label] for label in a.budget["per_message"])
    a.counter = choose_counter(a.counter)
    if a.counter == "callgrind":
        if a.phase_only:
            p.error("--phase-only needs perf: it exists to count the kernel's instructions "
                    "(--event instructions:k), which callgrind cannot see")
        if a.event != "instructions:u":
            p.error(f"callgrind counts user-space instructions (Ir) only, not {a.event}")
    if a.count is None:
        a.count = DEFAULT_COUNT[a.counter]
    if a.python is None:
        a.python = default_python(a.peer, a.repo)
    return a


def main() -> int:
    a = parse_args()
    if a.worker:
        worker(a.peer, a.worker[0], a.worker[1], a.count, a.body_size, a.repo)
        return 0
    event = a.event if a.counter == "perf" else CALLGRIND_EVENT
    if a.counter == "perf":
        print(f"counter: perf stat -e {a.event}" + (" (the phase alone)" if a.phase_only else ""))
    else:
        version = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
        print(f"counter: valgrind --tool=callgrind ({version.stdout.strip()}): {CALLGRIND_EVENT}, "
              "instructions executed in user space")
    source = f"vsqs from {a.repo} ({_report.git_head(a.repo)})" if a.peer == "vsqs" else "dirq"
    print(f"{source}, run by {a.python}; {a.count:,} messages of {a.body_size} bytes per run")
    if a.budget:
        python = subprocess.run([a.python, "-c", "import platform; print(platform.python_version())"],
                                capture_output=True, text=True, check=True).stdout.strip()
        if python != a.budget["python"]:
            print(f"the budget was counted with Python {a.budget['python']}, and {a.python} is {python}: "
                  "its counts are another interpreter's; count a budget with this one (see the budget file)")
            return 2
    if a.clock_of_calls:
        os.environ[CLOCK_OF_CALLS] = repr(a.clock_of_calls)  # for the workers
        print(f"the workers' monotonic clock: {a.clock_of_calls * 1e6:g} µs a call")
    os.makedirs(a.dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="instr-", dir=a.dir)
    serial = 0

    def cmd(mode: str) -> list[str]:
        nonlocal serial
        serial += 1
        return [a.python, os.path.abspath(__file__), "--peer", a.peer, "--repo", a.repo, "--count", str(a.count),
                "--body-size", str(a.body_size), "--worker", mode, os.path.join(scratch, f"q{serial}")]

    def counted(command: list[str]) -> int:
        try:
            if a.counter == "callgrind":
                return count_callgrind(command)
            return count(command, a.event, phase_only=a.phase_only)
        finally:  # now, while its files are likely still in the page cache: on a disk mounted
            # with discard, unlinking files already written back waits for the disk
            shutil.rmtree(command[-1], ignore_errors=True)

    rows: list[list[str]] = []
    medians: dict[str, float] = {}
    try:
        for mode in a.modes.split(","):
            per = []
            for _ in range(a.repeat):
                if a.phase_only:
                    per.append(counted(cmd(mode)) / a.count)
                    continue
                base = counted(cmd("fill"))
                both = counted(cmd(mode))
                per.append((both - base) / a.count)
            per.sort()
            label = LABELS[mode]
            median = per[len(per) // 2]
            medians[label] = median
            runs = ", ".join(f"{x:,.0f}" for x in per)
            print(f"{a.peer} {label:<15} {event} per message: median {median:,.0f} (runs: {runs})", flush=True)
            row = [a.peer, label, event, f"{median:,.0f}", runs]
            if a.syscalls:
                fill_cmd, mode_cmd = cmd("fill"), cmd(mode)
                base_calls, both_calls = syscalls(fill_cmd), syscalls(mode_cmd)
                for run in (fill_cmd, mode_cmd):
                    shutil.rmtree(run[-1], ignore_errors=True)
                diff = {k: (both_calls.get(k, 0) - base_calls.get(k, 0)) / a.count
                        for k in set(both_calls) | set(base_calls)}
                shown = {k: round(v, 2) for k, v in sorted(diff.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.01}
                print(f"{'':<5} {'':<15} system calls per message: {sum(diff.values()):.2f} {shown}")
                row.append(f"{sum(diff.values()):.2f} ({', '.join(f'{k} {v:g}' for k, v in shown.items())})")
            rows.append(row)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if a.markdown:
        headers = ["peer", "per message", "counter", "instructions (median)", "runs"]
        if a.syscalls:
            headers.append("system calls")
        how = "phase alone" if a.phase_only else f"(fill + it) - fill, {a.count:,} messages"
        extra = f"{'perf stat' if a.counter == 'perf' else 'callgrind'}, {how}, {a.repeat} runs"
        _report.emit([_report.provenance(a.repo, a.dir, extra), _report.table(headers, rows, right=(3,))],
                     a.markdown)
    return check_budget(a.budget, medians) if a.budget else 0


def check_budget(budget: dict, medians: dict[str, float]) -> int:
    """Compare the figures with the budget's; 1 if one costs more than it allows."""
    tolerance = budget["tolerance"]
    over = []
    for label, allowed in budget["per_message"].items():
        ratio = medians[label] / allowed
        verdict = "over budget" if ratio > 1 + tolerance else "within budget"
        if ratio < 1 - tolerance:
            verdict += f" (and {1 - ratio:.1%} under it: lower the budget to keep the saving)"
        print(f"budget {label:<15} {medians[label]:,.0f} of {allowed:,} ({ratio - 1:+.1%}): {verdict}")
        if ratio > 1 + tolerance:
            over.append(label)
    if over:
        print(f"over the instruction budget by more than {tolerance:.0%}: {', '.join(over)}; "
              "if the cost is meant, raise the budget (scripts/instruction_budget.json) and say why")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
