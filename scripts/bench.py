#!/usr/bin/env python3
"""Benchmark vsqs against bare filesystem loops on the same disk.

Run from the repository root, with the project installed in .venv::

    .venv/bin/python scripts/bench.py                  # default run, about 1 minute on 2 cores
    .venv/bin/python scripts/bench.py --quick          # smoke run, a few seconds
    .venv/bin/python scripts/bench.py --json out.json  # also write the results as JSON
    .venv/bin/python scripts/bench.py --max-depth      # also depth 1,000,000 (many minutes)
    .venv/bin/python scripts/bench.py --peers          # vsqs against dirq, persist-queue, Maildir,
                                                       # vsqs 0.3 instead (scripts/bench_peers.py)
    .venv/bin/python scripts/bench.py --help           # all options

Everything runs in a fresh directory made under ``--dir`` (default:
``./.bench/``), which is removed at the end: all figures come from one disk.

What is measured, and why against a bare loop: every vsqs operation is one
or two system calls on a message file, so what the disk itself allows is a
loop of exactly those system calls with the names known in advance and
nothing else. The ratio vsqs / bare loop is the share of the disk's speed
that the library keeps; the rest is Python work in vsqs (naming, parsing,
validation, the listing), also shown as microseconds added per message,
which does not depend on how slow the kernel happens to be. The bare loops:

* bare create: open(.new, O_CREAT|O_EXCL) + write + close + rename, the
  reference for ``publish(durable=False)``;
* bare create durable: the same with fsync of the file before close and of
  the directory after the rename, the reference for ``publish(durable=True)``
  (and, one directory fsync per 100 files, for ``publish_batch``);
* bare consume: rename(name, name.x) + open/read/close + unlink, the
  reference for ``receive()`` + ``delete()``.

Method:

* Each figure is the median over repetitions; a repetition times one loop
  with ``time.perf_counter`` (wall) and ``time.process_time`` (CPU: user +
  system time of this process, so it includes the kernel's work in the
  system calls). The CPU figure is the steadier one on a shared machine and
  the targets are judged on it; the wall figure is shown beside it.
* A bare loop and its vsqs counterpart are interleaved in chunks of 100-500
  messages (ABBA order) within each repetition, so drift on a shared machine
  hits both alike. The two create loops also share one directory (the bare
  names start with "b-", which vsqs ignores), so both get inodes from the
  same block groups. This matters on ext4 without a journal: to allocate
  an inode the kernel walks past free inodes it takes for recently freed
  (recently_deleted() in find_inode_bit), and in block groups that saw
  heavy create/delete churn (earlier runs of this script, say) that walk
  made each create cost ~10x the kernel time (90-160 us instead of 9-10 us)
  for many minutes. Such a run is fair between the two loops but brings
  the ratio closer to 100%; the microseconds added are then the figure to
  read.
* Creates are measured first, before this run deletes anything.
* Message file names in the bare loops have the same shape and length as
  vsqs names. Bodies are ``--body-size`` bytes (default 100).
* receive+delete on N messages uses a fresh handle, so its time includes the
  one directory listing that every message needs. At depth D the queue is
  filled to D + warm-up messages with non-durable ``publish_batch``
  (untimed), ``--warmup`` receive+deletes (untimed: they include the first
  listing of the whole directory, shown in its own column) bring it to D,
  then ``min(D, --depth-count)`` receive+deletes are timed.
* ``os.sync()`` before each setup, so no earlier phase's write-back runs
  during a timed loop. Consumed messages are then still in the page cache
  (as when consumers keep up); ``--settled`` syncs after the setup too, so
  consumers read and delete files that are on disk.

Targets (informational; the exit status is 0 either way): non-durable
publish >= 50% of bare create; receive+delete >= 40% of bare consume;
receive+delete at depth 100,000 <= 1.5x the time per message at depth 1,000.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# the checkout this script is in, whatever vsqs the interpreter has installed (an
# editable install may point at another worktree)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
try:
    import vsqs
except ImportError as exc:
    sys.exit(f"scripts/bench.py: cannot import vsqs ({exc}); run it with .venv/bin/python")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # when imported by bench_peers.py
import _probe
import _report
from _report import cpu_model, mount_of, read_first

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
READ_SIZE = 1 << 20  # as vsqs reads
PREFILL_CHUNK = 10_000  # vsqs.MAX_BATCH
BIG_DEPTH = 100_000  # depths above this run once (they take long to fill)

DEFAULTS = {
    "count": 10_000, "durable_count": 1_000, "batch_count": 2_000, "repeat": 5, "durable_repeat": 5,
    "depths": [1_000, 100_000], "depth_count": 10_000, "depth_repeat": 3, "warmup": 100,
}
QUICK = {
    "count": 1_000, "durable_count": 50, "batch_count": 200, "repeat": 3, "durable_repeat": 1,
    "depths": [1_000, 10_000], "depth_count": 1_000, "depth_repeat": 1, "warmup": 100,
}

TARGET_PUBLISH = 0.50
TARGET_CONSUME = 0.40
TARGET_DEPTH = 1.5
TARGET_DEPTHS = (1_000, 100_000)


# -- the timed loops ------------------------------------------------------------
# Each binds what it calls to locals, the bare loops and the vsqs loops alike.


def bare_create(paths: list[str], body: bytes) -> None:
    open_, write, close, rename = os.open, os.write, os.close, os.rename
    for path in paths:
        temp = path + ".new"
        fd = open_(temp, CREATE_FLAGS, 0o666)
        write(fd, body)
        close(fd)
        rename(temp, path)


def bare_create_durable(paths: list[str], body: bytes, directory: str) -> None:
    open_, write, close, rename, fsync = os.open, os.write, os.close, os.rename, os.fsync
    for path in paths:
        temp = path + ".new"
        fd = open_(temp, CREATE_FLAGS, 0o666)
        write(fd, body)
        fsync(fd)
        close(fd)
        rename(temp, path)
        dfd = open_(directory, DIR_FLAGS)
        fsync(dfd)
        close(dfd)


def bare_create_durable_batches(batches: list[list[str]], body: bytes, directory: str) -> None:
    """As publish_batch: write and fsync every file, rename them all, one directory fsync."""
    open_, write, close, rename, fsync = os.open, os.write, os.close, os.rename, os.fsync
    for paths in batches:
        for path in paths:
            fd = open_(path + ".new", CREATE_FLAGS, 0o666)
            write(fd, body)
            fsync(fd)
            close(fd)
        for path in paths:
            rename(path + ".new", path)
        dfd = open_(directory, DIR_FLAGS)
        fsync(dfd)
        close(dfd)


def bare_consume(paths: list[str]) -> None:
    open_, read, close, rename, unlink = os.open, os.read, os.close, os.rename, os.unlink
    for path in paths:
        taken = path + ".x"
        rename(path, taken)
        fd = open_(taken, READ_FLAGS)
        read(fd, READ_SIZE)
        close(fd)
        unlink(taken)


def vsqs_publish(queue: vsqs.Queue, bodies: list[bytes], durable: bool) -> None:
    publish = queue.publish
    for body in bodies:
        publish(body, durable=durable)


def vsqs_publish_batches(queue: vsqs.Queue, batches: list[list[bytes]]) -> None:
    publish_batch = queue.publish_batch
    for bodies in batches:
        publish_batch(bodies, durable=True)


def vsqs_consume(queue: vsqs.Queue, count: int) -> None:
    receive, delete = queue.receive, queue.delete
    for _ in range(count):
        message = receive()
        if message is None:
            raise RuntimeError(f"queue {queue.path} ran dry early")
        delete(message.receipt)


def timed_at_depth(depth: int, count: int) -> int:
    """How many receive+deletes to time at ``depth``: at least two and a half
    listing windows where the depth exceeds one, so that the re-listings a
    deep queue needs are inside the timed loop, not left out."""
    window = _probe.window()  # names a handle keeps of one listing
    if window and depth > window:
        count = max(count, window * 5 // 2)
    return min(depth, count)


def timed(fn: Callable[..., None], *args: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one call."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    fn(*args)
    wall1, cpu1 = time.perf_counter(), time.process_time()
    return wall1 - wall0, cpu1 - cpu0


# -- results -------------------------------------------------------------------

Chunk = tuple[int, Callable[..., None], tuple[Any, ...]]  # messages, loop, its arguments


@dataclass
class Measure:
    key: str
    label: str
    count: int = 0  # messages per repetition
    wall: list[float] = field(default_factory=list)  # seconds per repetition
    cpu: list[float] = field(default_factory=list)
    warmup_wall: list[float] = field(default_factory=list)  # depth runs: first listing + warm-up
    notes: list[str] = field(default_factory=list)

    def add(self, count: int, wall: float, cpu: float) -> None:
        self.count = count
        self.wall.append(wall)
        self.cpu.append(cpu)

    @property
    def reps(self) -> int:
        return len(self.wall)

    def per_msg_us(self, which: str) -> list[float]:
        return [s / self.count * 1e6 for s in getattr(self, which)]

    def median_us(self, which: str) -> float:
        return statistics.median(self.per_msg_us(which))

    @property
    def rate(self) -> float:
        return 1e6 / self.median_us("wall")

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "label": self.label,
            "messages_per_rep": self.count,
            "reps": self.reps,
            "msgs_per_s": round(self.rate, 1),
            "wall_us_per_msg": round(self.median_us("wall"), 3),
            "cpu_us_per_msg": round(self.median_us("cpu"), 3),
            "wall_us_per_msg_reps": [round(x, 3) for x in self.per_msg_us("wall")],
            "cpu_us_per_msg_reps": [round(x, 3) for x in self.per_msg_us("cpu")],
            "warmup_ms_reps": [round(x * 1e3, 2) for x in self.warmup_wall],
            "notes": self.notes,
        }


def message_names(count: int, prefix: str = "9") -> list[str]:
    """Names shaped like vsqs message names (priority-time-random), as long."""
    start = time.time_ns() // 1000
    return [f"{prefix}-{start + i:016d}-{secrets.token_hex(8)}" for i in range(count)]


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


# -- environment -----------------------------------------------------------------


def vsqs_source() -> dict[str, Any]:
    """Where vsqs is imported from, and its git commit if it is a checkout."""
    where = os.path.dirname(os.path.abspath(vsqs.__file__))
    info: dict[str, Any] = {"path": where}
    try:
        head = subprocess.run(
            ["git", "-C", where, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--", "."],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        info["git"] = head + (" with uncommitted changes in vsqs/" if changed else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def environment(directory: str, args: argparse.Namespace) -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    expire = read_first("/proc/sys/vm/dirty_expire_centisecs")
    return {
        "python": f"{platform.python_version()} ({platform.python_implementation()}) {sys.executable}",
        "platform": platform.platform(),
        "vsqs": {"version": vsqs.__version__, **vsqs_source()},
        "cpus": {"count": os.cpu_count(), "affinity": affinity, "model": cpu_model()},
        "directory": directory,
        "filesystem": mount_of(directory),
        "dirty_expire_s": int(expire) / 100 if expire and expire.isdigit() else None,
        "load_average": list(os.getloadavg()),
        "body_size": args.body_size,
        "settled": args.settled,
    }


def print_environment(env: dict[str, Any]) -> None:
    fs = env["filesystem"]
    cpus = env["cpus"]
    src = env["vsqs"]
    print("vsqs benchmark")
    print(f"  python      {env['python']}")
    print(f"  platform    {env['platform']}")
    print(f"  vsqs        {src['version']} from {src['path']}" + (f" (git {src['git']})" if "git" in src else ""))
    print(f"  cpus        {cpus['count']} (usable: {cpus['affinity']}), {cpus['model']}")
    print(f"  directory   {env['directory']}")
    if fs:
        journal = {"no": ", no journal", "yes": ", journal"}.get(fs.get("journal", ""), "")
        print(f"  filesystem  {fs['type']} on {fs['device']} at {fs['mount_point']}{journal}")
        print(f"  mount opts  {fs['options']}")
    else:
        print("  filesystem  unknown (no /proc/mounts)")
    if env["dirty_expire_s"] is not None:
        print(f"  write-back  dirty data is written after {env['dirty_expire_s']:g} s (vm.dirty_expire_centisecs)")
    print("  load avg    " + " ".join(f"{x:.2f}" for x in env["load_average"]) + " at start")
    state = "on disk (--settled)" if env["settled"] else "in the page cache"
    print(f"  messages    {env['body_size']} byte bodies; consumed messages are {state}")
    print()


# -- the benchmark ------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, root: str) -> None:
        self.args = args
        self.root = root
        self.body = b"x" * args.body_size
        self.results: dict[str, Measure] = {}
        self._serial = 0

    def measure(self, key: str, label: str) -> Measure:
        if key not in self.results:
            self.results[key] = Measure(key, label)
        return self.results[key]

    def fresh_dir(self, parent: str, what: str, make: bool = True) -> str:
        self._serial += 1
        path = os.path.join(parent, f"{self._serial:04d}-{what}")
        if make:
            os.mkdir(path)
        return path

    def new_queue(self, parent: str, what: str, shards: int | None = None) -> vsqs.Queue:
        return vsqs.Queue(self.fresh_dir(parent, what, make=False), create=True, shards=shards)

    def prefill(self, queue: vsqs.Queue, count: int) -> None:
        for start in range(0, count, PREFILL_CHUNK):
            queue.publish_batch([self.body] * min(PREFILL_CHUNK, count - start), durable=False)

    @staticmethod
    def check_count(directory: str, expected: int, what: str) -> None:
        shards = os.path.join(directory, "shards")
        places = [os.path.join(shards, s) for s in os.listdir(shards)] if os.path.isdir(shards) else [directory]
        found = sum(
            1 for place in places for name in os.listdir(place) if not name.startswith(".") and name != "shards"
        )
        if found != expected:
            raise RuntimeError(f"{what}: {found} files in {directory}, expected {expected}")

    def interleave(
        self, rep: int, a: Measure, a_chunks: list[Chunk], b: Measure, b_chunks: list[Chunk]
    ) -> None:
        """Time the two loops chunk by chunk in ABBA order; one repetition of each."""
        counts = {id(a): 0, id(b): 0}
        walls = {id(a): 0.0, id(b): 0.0}
        cpus = {id(a): 0.0, id(b): 0.0}
        for i, (chunk_a, chunk_b) in enumerate(zip(a_chunks, b_chunks, strict=True)):
            pair = ((a, chunk_a), (b, chunk_b))
            for m, (count, fn, fn_args) in pair if (i + rep) % 2 == 0 else pair[::-1]:
                wall, cpu = timed(fn, *fn_args)
                counts[id(m)] += count
                walls[id(m)] += wall
                cpus[id(m)] += cpu
        for m in (a, b):
            m.add(counts[id(m)], walls[id(m)], cpus[id(m)])

    # -- 1 + 2: creates (nothing deleted until all of them are done) --

    def run_creates(self) -> None:
        """Bare creates and vsqs publishes, interleaved in chunks in one directory.

        One directory: the files of both loops get their inodes from the same
        block groups, so both meet the same kernel costs (see the module doc).
        The bare names start with "b-", which is no vsqs name.
        """
        args, body = self.args, self.body
        phase = os.path.join(self.root, "create")
        os.mkdir(phase)
        os.sync()
        b = args.batch_size
        plan = [
            # what, reps, messages, chunk, durable, batch size, bare key + label, vsqs key + label
            ("durable publish", args.durable_repeat, args.durable_count, 100, True, 0,
             "bare_create_durable", "bare create durable",
             "publish_durable", "vsqs publish(durable=True)"),
            (f"durable batches of {b}", args.durable_repeat, args.batch_count, 5 * b, True, b,
             "bare_create_durable_batch", f"bare create durable, dir fsync per {b}",
             "publish_batch_durable", f"vsqs publish_batch({b}, durable=True)"),
            ("non-durable publish", args.repeat, args.count, 500, False, 0,
             "bare_create", "bare create",
             "publish", "vsqs publish(durable=False)"),
        ]
        for what, reps, count, chunk, durable, batch, bare_key, bare_label, key, label in plan:
            progress(f"{what}: {reps} x {count} messages, bare loop and vsqs interleaved")
            for rep in range(reps):
                queue = self.new_queue(phase, key)
                directory = queue.path
                paths = [os.path.join(directory, n) for n in message_names(count, "b")]
                bare_chunks: list[Chunk] = []
                vsqs_chunks: list[Chunk] = []
                for i in range(0, count, chunk):
                    part = paths[i : i + chunk]
                    if batch:
                        batches = [part[j : j + batch] for j in range(0, len(part), batch)]
                        bare_chunks.append((len(part), bare_create_durable_batches, (batches, body, directory)))
                        bodies = [[body] * len(x) for x in batches]
                        vsqs_chunks.append((len(part), vsqs_publish_batches, (queue, bodies)))
                    elif durable:
                        bare_chunks.append((len(part), bare_create_durable, (part, body, directory)))
                        vsqs_chunks.append((len(part), vsqs_publish, (queue, [body] * len(part), True)))
                    else:
                        bare_chunks.append((len(part), bare_create, (part, body)))
                        vsqs_chunks.append((len(part), vsqs_publish, (queue, [body] * len(part), False)))
                self.interleave(rep, self.measure(bare_key, bare_label), bare_chunks,
                                self.measure(key, label), vsqs_chunks)
                self.check_count(directory, 2 * count, what)
        started = time.perf_counter()
        shutil.rmtree(phase)
        progress(f"removed the created files in {time.perf_counter() - started:.1f} s")

    # -- 2: receive + delete against bare consume --

    def run_consume(self) -> None:
        """Bare consume and receive+delete, interleaved in chunks (separate directories:
        vsqs lists its directory, and other files there would add to its work)."""
        args = self.args
        count, chunk = args.count, 500
        phase = os.path.join(self.root, "consume")
        os.mkdir(phase)
        progress(f"receive+delete: {args.repeat} x {count} messages, bare loop and vsqs interleaved")
        for rep in range(args.repeat):
            os.sync()
            directory = self.fresh_dir(phase, "bare_consume")
            paths = [os.path.join(directory, n) for n in message_names(count)]
            bare_create(paths, self.body)
            queue = self.new_queue(phase, "receive_delete")
            self.prefill(queue, count)
            queue = vsqs.Queue(queue.path)  # a fresh handle: its listing is part of the work
            if args.settled:
                os.sync()
            bare_chunks: list[Chunk] = []
            vsqs_chunks: list[Chunk] = []
            for i in range(0, count, chunk):
                part = paths[i : i + chunk]
                bare_chunks.append((len(part), bare_consume, (part,)))
                vsqs_chunks.append((len(part), vsqs_consume, (queue, len(part))))
            self.interleave(rep, self.measure("bare_consume", "bare consume"), bare_chunks,
                            self.measure("receive_delete", "vsqs receive + delete"), vsqs_chunks)
            self.check_count(directory, 0, "bare consume")
            self.check_count(queue.path, 0, "receive+delete")
            shutil.rmtree(directory)
            shutil.rmtree(queue.path)
        os.rmdir(phase)

    # -- 3: receive + delete at depth --

    def run_depths(self) -> None:
        args = self.args
        phase = os.path.join(self.root, "depth")
        os.mkdir(phase)
        expire = read_first("/proc/sys/vm/dirty_expire_centisecs")
        expire_s = int(expire) / 100 if expire and expire.isdigit() else None
        small = [d for d in args.depths if d <= BIG_DEPTH]
        big = [d for d in args.depths if d > BIG_DEPTH]

        sharded = f" ({args.shards} shards)" if args.shards > 1 else ""

        def case(depth: int) -> None:
            bare = self.measure(f"bare_depth_{depth}", f"bare consume at depth {depth:,}")
            m = self.measure(f"depth_{depth}", f"receive + delete at depth {depth:,}{sharded}")
            timed_count = timed_at_depth(depth, args.depth_count)
            progress(f"depth {depth:,}: fill {depth + args.warmup:,} (vsqs) and as many bare files, "
                     f"warm up {args.warmup}, time {timed_count:,} (rep {m.reps + 1})")
            os.sync()
            started = time.monotonic()
            bare_dir = self.fresh_dir(phase, f"bare_depth_{depth}")
            paths = [os.path.join(bare_dir, n) for n in message_names(depth + args.warmup)]
            for start in range(0, len(paths), PREFILL_CHUNK):
                bare_create(paths[start : start + PREFILL_CHUNK], self.body)
            queue = self.new_queue(phase, f"depth_{depth}", shards=args.shards)
            self.prefill(queue, depth + args.warmup)
            queue = vsqs.Queue(queue.path)
            if args.settled:
                os.sync()
            probe = _probe.Probe()
            bare_consume(paths[: args.warmup])
            warm_wall, _ = timed(vsqs_consume, queue, args.warmup)  # includes the first listing
            first_listing = probe.cache.cost
            probe.listings = 0
            paths = paths[args.warmup : args.warmup + timed_count]
            chunk = 500
            bare_chunks: list[Chunk] = []
            vsqs_chunks: list[Chunk] = []
            for i in range(0, timed_count, chunk):
                part = paths[i : i + chunk]
                bare_chunks.append((len(part), bare_consume, (part,)))
                vsqs_chunks.append((len(part), vsqs_consume, (queue, len(part))))
            self.interleave(m.reps, bare, bare_chunks, m, vsqs_chunks)
            m.warmup_wall.append(warm_wall)
            if depth > _probe.window() or m.reps == 1:
                m.notes.append(
                    f"first listing {first_listing * 1e3:.0f} ms; {probe.listings} more in the timed loop; "
                    f"handle's listing cache after it: {probe.cache_bytes() / 2**20:.1f} MB"
                )
            elapsed = time.monotonic() - started
            if not args.settled and expire_s is not None and elapsed > expire_s:
                m.notes.append(
                    f"fill + run took {elapsed:.0f} s > {expire_s:g} s write-back delay: "
                    "some consumed files were on disk"
                )
            self.check_count(queue.path, depth - timed_count, f"depth {depth}")
            del paths, bare_chunks
            shutil.rmtree(bare_dir)
            shutil.rmtree(queue.path)

        for rep in range(args.depth_repeat):
            for depth in small if rep % 2 == 0 else reversed(small):
                case(depth)
        for depth in big:
            case(depth)
        os.rmdir(phase)


# -- report ----------------------------------------------------------------------


def annotate(results: dict[str, Measure]) -> None:
    """Flag measurements whose repetitions disagree a lot (a shared, noisy machine)."""
    for m in results.values():
        cpu = m.per_msg_us("cpu")
        if len(cpu) < 2 or max(cpu) < 1.5 * min(cpu):
            continue
        note = f"CPU time per message varied {max(cpu) / min(cpu):.1f}x between repetitions"
        if "create" in m.key or "publish" in m.key:
            note += " (kernel time in inode allocation; the other loop of the pair met the same)"
        m.notes.append(note)



def ratio(results: dict[str, Measure], num: str, den: str, which: str) -> float | None:
    """Throughput of ``num`` as a share of ``den``'s (= den time / num time)."""
    if num not in results or den not in results:
        return None
    return results[den].median_us(which) / results[num].median_us(which)


def slowdown(results: dict[str, Measure], deep: str, shallow: str, which: str) -> float | None:
    if deep not in results or shallow not in results:
        return None
    return results[deep].median_us(which) / results[shallow].median_us(which)


def fmt_spread(values: list[float]) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:8.1f}"
    return f"{med:8.1f} ({min(values):.1f}-{max(values):.1f})"


def print_table(results: dict[str, Measure]) -> None:
    order = report_order(results)
    width = max(len(results[k].label) for k in order)
    head = (f"{'measurement':<{width}}  {'msgs/rep':>8} {'reps':>4} {'msgs/s':>9}  "
            f"{'wall us/msg (min-max)':<24} {'CPU us/msg (min-max)':<24}")
    print(head)
    print("-" * len(head))
    for key in order:
        m = results[key]
        line = (f"{m.label:<{width}}  {m.count:>8,} {m.reps:>4} {m.rate:>9,.0f}  "
                f"{fmt_spread(m.per_msg_us('wall')):<24} {fmt_spread(m.per_msg_us('cpu')):<24}")
        if m.warmup_wall:
            line += f"warm-up {statistics.median(m.warmup_wall) * 1e3:.0f} ms"
        print(line.rstrip())
        for note in m.notes:
            print(f"{'':<{width}}  note: {note}")
    print()
    print("us = microseconds; medians, with the range over repetitions. CPU = user + system")
    print("time of this process. 'warm-up' is the untimed first listing + warm-up receives.")
    print()


def evaluate(results: dict[str, Measure], depths: list[int]) -> list[dict[str, Any]]:
    """The ratios, each judged on CPU time when it has a target."""
    rows: list[dict[str, Any]] = []

    def share(name: str, num: str, den: str, target: float | None) -> None:
        cpu, wall = ratio(results, num, den, "cpu"), ratio(results, num, den, "wall")
        if cpu is None or wall is None:
            return
        row: dict[str, Any] = {"name": name, "kind": "share", "cpu": cpu, "wall": wall, "target": target}
        # what vsqs adds per message; the kernel's share, equal in both loops, cancels out
        row["added_cpu_us"] = results[num].median_us("cpu") - results[den].median_us("cpu")
        row["added_wall_us"] = results[num].median_us("wall") - results[den].median_us("wall")
        if target is not None:
            row["met"] = cpu >= target
            row["met_wall"] = wall >= target
        rows.append(row)

    share("vsqs publish(durable=False) / bare create", "publish", "bare_create", TARGET_PUBLISH)
    share("vsqs publish(durable=True) / bare create durable", "publish_durable",
          "bare_create_durable", None)
    share("vsqs publish_batch(durable=True) / bare durable batch", "publish_batch_durable",
          "bare_create_durable_batch", None)
    share("vsqs receive+delete / bare consume", "receive_delete", "bare_consume", TARGET_CONSUME)

    shallow, deep = TARGET_DEPTHS
    if deep not in depths:  # e.g. --quick: compare what was measured
        deep = max(d for d in depths if d > shallow) if any(d > shallow for d in depths) else deep
    for d in sorted(set(depths) - {shallow}):
        cpu = slowdown(results, f"depth_{d}", f"depth_{shallow}", "cpu")
        wall = slowdown(results, f"depth_{d}", f"depth_{shallow}", "wall")
        if cpu is None or wall is None:
            continue
        target = TARGET_DEPTH if d == deep else None
        bare_cpu = slowdown(results, f"bare_depth_{d}", f"bare_depth_{shallow}", "cpu")
        bare_wall = slowdown(results, f"bare_depth_{d}", f"bare_depth_{shallow}", "wall")
        if bare_cpu is not None and bare_wall is not None:
            rows.append({"name": f"bare consume time/msg at depth {d:,} / at depth {shallow:,}",
                         "kind": "slowdown", "cpu": bare_cpu, "wall": bare_wall, "target": None})
        row = {"name": f"receive+delete time/msg at depth {d:,} / at depth {shallow:,}",
               "kind": "slowdown", "cpu": cpu, "wall": wall, "target": target,
               "target_depth": TARGET_DEPTHS[1]}
        if target is not None:
            row["met"] = cpu <= target
            row["met_wall"] = wall <= target
        rows.append(row)
    return rows


def print_ratios(rows: list[dict[str, Any]]) -> None:
    print("Ratios (CPU time; wall clock in brackets); for shares, what vsqs adds per message")
    width = max(len(r["name"]) for r in rows) if rows else 0
    for r in rows:
        if r["kind"] == "share":
            text = (f"{r['cpu']:6.1%}  (wall {r['wall']:5.1%})   "
                    f"{r['added_cpu_us']:+6.1f} us CPU ({r['added_wall_us']:+.1f} us wall)")
        else:
            text = f"{r['cpu']:6.2f}x (wall {r['wall']:.2f}x)"
        print(f"  {r['name']:<{width}}  {text}")
    print()
    for r in rows:
        if r["target"] is None:
            continue
        verdict = "PASS" if r["met"] else "MISS"
        if r["kind"] == "share":
            figure, target = f"{r['cpu']:.1%} by CPU time (wall {r['wall']:.1%})", f">= {r['target']:.0%}"
        else:
            figure, target = f"{r['cpu']:.2f}x by CPU time (wall {r['wall']:.2f}x)", f"<= {r['target']:g}x"
        extra = ""
        if r["met"] != r["met_wall"]:
            extra = "; by wall clock it would " + ("PASS" if r["met_wall"] else "MISS")
        if r["kind"] == "slowdown" and f"{r['target_depth']:,}" not in r["name"]:
            extra += f"; the target is defined at depth {r['target_depth']:,}"
        print(f"{verdict}  {r['name']}: {figure}, target {target}{extra}")
    print()


def report_order(results: dict[str, Measure]) -> list[str]:
    order = [
        "bare_create", "publish",
        "bare_create_durable", "publish_durable",
        "bare_create_durable_batch", "publish_batch_durable",
        "bare_consume", "receive_delete",
    ]
    for depth in sorted(int(k[6:]) for k in results if k.startswith("depth_")):
        order += [f"bare_depth_{depth}", f"depth_{depth}"]
    return [k for k in order if k in results]


def markdown(results: dict[str, Measure], rows: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The table and the ratios as markdown, after a line saying where they come from."""
    def spread(m: Measure, which: str) -> str:
        values = m.per_msg_us(which)
        med = statistics.median(values)
        return f"{med:.1f}" if len(values) == 1 else f"{med:.1f} ({min(values):.1f}–{max(values):.1f})"

    table, notes = [], []
    for key in report_order(results):
        m = results[key]
        warm = f"{statistics.median(m.warmup_wall) * 1e3:.0f}" if m.warmup_wall else ""
        table.append([m.label, f"{m.count:,}", m.reps, f"{m.rate:,.0f}", spread(m, "wall"), spread(m, "cpu"), warm])
        notes += [f"* {m.label}: {note}" for note in m.notes]
    ratios = []
    for r in rows:
        if r["kind"] == "share":
            figures = [f"{r['cpu']:.1%}", f"{r['wall']:.1%}", f"{r['added_cpu_us']:+.1f}", f"{r['added_wall_us']:+.1f}"]
            target = f"≥ {r['target']:.0%}" if r["target"] is not None else ""
        else:
            figures = [f"{r['cpu']:.2f}x", f"{r['wall']:.2f}x", "", ""]
            target = f"≤ {r['target']:g}x" if r["target"] is not None else ""
        if target:
            target += ": " + ("met" if r["met"] else "missed")
        ratios.append([r["name"], *figures, target])
    extra = (f"{args.body_size}-byte bodies, consumed messages "
             + ("on disk (--settled)" if args.settled else "in the page cache"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [
        _report.provenance(repo, args.dir, extra),
        _report.table(["measurement", "msgs/rep", "reps", "msgs/s", "wall µs/msg (min–max)",
                       "CPU µs/msg (min–max)", "warm-up ms"], table, right=(1, 2, 3, 6)),
        "\n".join(notes),
        _report.table(["ratio (throughput share, or slowdown with depth)", "CPU", "wall",
                       "vsqs adds, CPU µs/msg", "wall µs/msg", "target"], ratios, right=(1, 2, 3, 4)),
    ]


# -- main ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Benchmark vsqs against bare filesystem loops on the same disk.",
        epilog="Exit status 0 whether or not the targets are met.",
    )
    p.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench"),
                   help="make the scratch directory under this one (default: ./.bench)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run of a few seconds")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="also emit the results as JSON, to PATH or (no PATH) to stdout")
    _report.add_markdown_option(p)
    p.add_argument("--body-size", type=int, default=100, metavar="BYTES", help="message body size (100)")
    p.add_argument("--count", type=int, metavar="N",
                   help="messages per repetition, non-durable publish and receive+delete (10000)")
    p.add_argument("--durable-count", type=int, metavar="N", help="messages per durable publish repetition (1000)")
    p.add_argument("--batch-count", type=int, metavar="N", help="messages per publish_batch repetition (2000)")
    p.add_argument("--batch-size", type=int, default=100, metavar="N", help="messages per publish_batch call (100)")
    p.add_argument("--repeat", type=int, metavar="N", help="repetitions of the cheap measurements (5)")
    p.add_argument("--durable-repeat", type=int, metavar="N", help="repetitions of the durable ones (5)")
    p.add_argument("--max-depth", type=int, nargs="?", const=1_000_000, metavar="DEPTH",
                   help="deepest queue: alone, adds depth 1,000,000 (many minutes: filling, "
                        "and removing files that were written back)")
    p.add_argument("--depth-count", type=int, metavar="N",
                   help="receive+deletes timed at each depth: min(depth, N) (10000)")
    p.add_argument("--depth-repeat", type=int, metavar="N",
                   help=f"repetitions per depth up to {BIG_DEPTH:,}; deeper ones run once (3)")
    p.add_argument("--warmup", type=int, metavar="N", help="untimed receive+deletes before each depth run (100)")
    p.add_argument("--shards", type=int, default=1, metavar="N",
                   help="make the queues of the depth runs with N shards (1: none; the bare loop "
                        "stays in one directory)")
    p.add_argument("--settled", action="store_true",
                   help="sync before timing receives, so consumed messages are on disk")
    p.add_argument("--peers", action="store_true",
                   help="instead, run scripts/bench_peers.py: vsqs against dirq, persist-queue, "
                        "mailbox.Maildir and vsqs 0.3 (it takes --dir, --quick, --json, --markdown, --body-size "
                        "and its own options, see bench_peers.py --help)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    if args.max_depth is not None:
        args.depths = [d for d in args.depths if d < args.max_depth] + [args.max_depth]
    for name in ("count", "durable_count", "batch_count", "batch_size", "repeat", "durable_repeat",
                 "depth_count", "depth_repeat", "body_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.batch_size > PREFILL_CHUNK:
        p.error(f"--batch-size must be at most {PREFILL_CHUNK}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--peers" in argv:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import bench_peers

        return bench_peers.main([a for a in argv if a != "--peers"])
    args = parse_args(argv)
    parent = os.path.abspath(args.dir)
    made_parent = not os.path.exists(parent)
    os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="run-", dir=parent)
    started = time.perf_counter()
    try:
        env = environment(root, args)
        print_environment(env)
        bench = Bench(args, root)
        bench.run_creates()
        bench.run_consume()
        bench.run_depths()
    finally:
        progress("removing the scratch directory")
        shutil.rmtree(root, ignore_errors=True)
        if made_parent:
            with contextlib.suppress(OSError):  # not empty: someone else's files
                os.rmdir(parent)
    elapsed = time.perf_counter() - started
    annotate(bench.results)
    print_table(bench.results)
    rows = evaluate(bench.results, args.depths)
    print_ratios(rows)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"total time {elapsed:.0f} s (setup and clean-up included); load avg {load} at the end")
    if args.json:
        doc = {
            "environment": env,
            "config": {k: v for k, v in vars(args).items() if k not in ("json", "dir")},
            "results": [m.as_dict() for m in bench.results.values()],
            "ratios": rows,
            "total_seconds": round(elapsed, 1),
        }
        text = json.dumps(doc, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    if args.markdown:
        _report.emit(markdown(bench.results, rows, args), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
