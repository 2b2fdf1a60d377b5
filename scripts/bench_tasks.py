#!/usr/bin/env python3
"""Celery over vsqs beside Celery over kombu's filesystem transport and over
Redis, in one run: end-to-end throughput, dispatch latency, and tasks lost or
run twice while workers are SIGKILLed at random.

Run from the repository root, with the project installed in .venv::

    .venv/bin/python scripts/bench_tasks.py               # full run, about 5 minutes on 2 cores
    .venv/bin/python scripts/bench_tasks.py --dramatiq    # and the Dramatiq rows: about 6 minutes
    .venv/bin/python scripts/bench_tasks.py --quick       # smoke run, about 2 minutes
    .venv/bin/python scripts/bench_tasks.py --cases throughput,dispatch --brokers vsqs,redis --repeat 3
    .venv/bin/python scripts/bench_tasks.py --pool prefork  # prefork workers (-c 1) instead of solo

Everything runs in a fresh directory under ``--dir`` (default: the system's
temporary directory, /tmp), removed at the end (``--keep`` keeps it, with every
worker's log). Every process the script starts (Celery workers, clients,
redis-server) runs in a session of its own and is killed at the end, on
Ctrl-C, SIGTERM and errors too.

Brokers (``--brokers`` takes the names). One Celery project (the same module,
written to a directory of its own for each run) with the same settings for
all: ``task_acks_late=True``, ``worker_prefetch_multiplier`` = ``--prefetch``
(default 4, Celery's default), ``task_ignore_result``, no result backend,
``worker_enable_remote_control=False`` (vsqs:// has no fanout, so its workers
have no remote control; the others are made to do the same work), and workers
``celery worker -P solo`` (``--pool prefork``: ``-P prefork -c 1``) with
``--without-gossip --without-mingle --without-heartbeat -l warning``:

* ``vsqs``: ``vsqs:///DIR/spool`` (vsqs.kombu from this checkout); transport
  options: ``visibility_timeout`` 30 s (the default), 2 s in the chaos case.
  A waiting worker wakes when a message lands (inotify).
* ``vsqs-nodurable``: the same with the transport option ``durable`` False:
  no fsync on publish, as kombu's filesystem transport (on a disk whose
  unlink of a written-back file waits for a discard, the fsync also makes
  each delete slow).
* ``filesystem``: kombu's ``filesystem://`` at its default ``polling_interval``
  of 1 s; ``data_folder_in`` = ``data_folder_out`` = DIR/data, processed
  messages moved to DIR/processed (``store_processed=True``, as its docs
  show; kombu's default moves them to the temp dir and deletes them).
* ``filesystem-0.01``: the same, tuned: ``polling_interval`` 0.01 s.
* ``redis``: ``redis://127.0.0.1:PORT/0`` on a ``redis-server`` the script
  starts on a free loopback port (``--save '' --appendonly no``, in DIR);
  flushed before each run. Transport options: none (kombu's defaults) but in
  the chaos case, ``visibility_timeout`` 5 s with ``unacked_restore_interval``
  1 s and ``unacked_restore_throttle`` 1, so that a killed worker's messages
  come back within about 6 s (by default kombu sweeps for them only about
  every 100 s). Without ``redis-server`` on PATH its rows say so (``apt-get
  install redis-server``); the other rows run.

With ``--dramatiq`` (or ``--brokers dramatiq-vsqs,dramatiq-redis``), the same
three cases also run on Dramatiq, in tables of their own: ``vsqs.dramatiq``'s
``VsqsBroker`` (visibility_timeout 30 s; 2 s in the chaos case) beside
Dramatiq's ``RedisBroker`` on the same redis-server (defaults; in the chaos
case ``heartbeat_timeout`` 5 s and ``maintenance_chance`` 100,000 of 1,000,000,
so that a killed worker's messages come back within seconds), workers
``dramatiq benchproj --processes 1 --threads 1``, actors with Dramatiq's
default middleware (a Dramatiq message is acknowledged after its actor
returns: acks-late). If vsqs.dramatiq cannot be imported, its rows fail with
the reason.

Durability differs, and on some disks that decides the throughput: vsqs
fsyncs every publish (the file and the directory) and its workers delete
each acked message; kombu's filesystem transport fsyncs nothing (a power
loss loses what the page cache held) and, here, moves a processed message
aside. On ext4 mounted with ``discard`` without a journal (this project's
benchmark disk, docs/benchmarks.md) an unlink of a file that reached the disk
waits for a discard, 0.2-3 ms: run with ``--dir /dev/shm`` (tmpfs) as well to
see the transports' own costs without the disk.

Cases (``--cases``):

* ``throughput``: ``--tasks`` (2,000) empty tasks published by one client
  process (``task.delay()`` in a loop; its time is reported separately), then
  two workers started. Each task appends its id and ``time.time()`` to a file
  of its worker process (one O_APPEND write). End to end is from the first
  worker being ready (Celery's ``worker_ready`` signal; or the first task
  starting, if earlier) to the last task's record; tasks/s is the tasks over
  that. Worker start-up (spawn to ready) is reported beside it, not in it.
* ``dispatch``: one worker, started and idle; one client process sends
  ``--samples`` (200) tasks, one at a time: it waits until the previous task
  has run, pauses a random 5-20 ms (so the worker is idle and waiting again),
  reads ``time.time()``, calls ``delay()``, reads ``time.time()`` again. The
  task reads ``time.time()`` as it starts. Latency is the task's start minus
  the time read right after ``delay()`` returned (it can be below 0: a worker
  may start the task before ``delay()`` has returned, e.g. while vsqs fsyncs
  the directory); also given from ``delay()`` being called. Three warm-up
  tasks first, not counted. At the 1 s default polling interval each sample
  takes about half a second, so ``filesystem`` gets a quarter of the samples.
* ``chaos``: ``--tasks`` acks-late tasks that sleep 5 ms and then append their
  id, published first; two workers; every 0.5-1 s (uniformly random) a killer
  SIGKILLs the process group of a random worker among those ready and starts a
  replacement, until every task has run, or nothing has run for
  ``--quiet`` seconds (15; tasks a broker lost never come), or ``--kill-for``
  seconds (60) have passed. Then no more kills: two workers run until every
  task has run or nothing has run for ``--quiet`` seconds. Lost: tasks never
  run; run twice: tasks run more than once (acks-late is at-least-once: a
  worker killed after its task ran and before the ack runs it again); left in
  the broker: messages still there at the end (ready, in flight, unacked).

Targets (the issue): 0 lost; throughput >= filesystem's and >= 0.5x Redis's;
dispatch p50 within 2 ms of Redis's. A line under each table says whether vsqs
meets them in this run. The tables are Markdown, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import _report  # noqa: E402

import vsqs  # noqa: E402

BROKERS: list[tuple[str, str]] = [
    ("vsqs", "vsqs:// (waits: inotify)"),
    ("vsqs-nodurable", "vsqs://, durable False (no fsync, as filesystem://)"),
    ("filesystem", "kombu filesystem://, polling 1 s (default)"),
    ("filesystem-0.01", "kombu filesystem://, polling 0.01 s (tuned)"),
    ("redis", "Redis (loopback)"),
]
DRAMATIQ_BROKERS: list[tuple[str, str]] = [
    ("dramatiq-vsqs", "Dramatiq: vsqs.dramatiq.VsqsBroker"),
    ("dramatiq-redis", "Dramatiq: RedisBroker (loopback)"),
]
LABELS = dict(BROKERS + DRAMATIQ_BROKERS)
CASES = ["throughput", "dispatch", "chaos"]
WORK_SECONDS = 0.005  # what a chaos task does (a sleep)
PAUSE = (0.005, 0.020)  # dispatch: the client's pause before each sample
WARMUP = 3  # dispatch: tasks sent first, not counted
KILL_EVERY = (0.5, 1.0)  # chaos: seconds between two kills
VT = {"vsqs": 2.0, "redis": 5.0}  # chaos: visibility timeouts (Dramatiq's RedisBroker: its heartbeat timeout)

# The project (Celery's or Dramatiq's head, then SHARED), written as benchproj.py to a
# directory of its own for each run; bench.json beside it says which broker. Tasks record
# in runs/PID.log, one O_APPEND write a line; a worker being ready writes ready/PGID.
CELERY_HEAD = r'''
import json, os, random, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "bench.json")) as _f:
    CONFIG = json.load(_f)
if CONFIG["broker"].startswith("vsqs:"):
    import vsqs.kombu  # noqa: F401  (registers vsqs://)

from celery import Celery
from celery.signals import worker_ready

app = Celery("benchproj", broker=CONFIG["broker"])
app.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=CONFIG["prefetch"],
    broker_transport_options=CONFIG["transport_options"],
    broker_connection_retry_on_startup=True,
    task_ignore_result=True,
    result_backend=None,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
    worker_hijack_root_logger=False,
)
task = app.task


@worker_ready.connect
def _on_ready(**kwargs):
    _ready()
'''

DRAMATIQ_HEAD = r'''
import json, os, random, sys, time

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "bench.json")) as _f:
    CONFIG = json.load(_f)

import dramatiq
from dramatiq.middleware import Middleware

if CONFIG["broker"] == "vsqs":
    from vsqs.dramatiq import VsqsBroker
    broker = VsqsBroker(os.path.join(HERE, "spool"), **CONFIG["transport_options"])
else:
    from dramatiq.brokers.redis import RedisBroker
    broker = RedisBroker(url=CONFIG["broker"], **CONFIG["transport_options"])


class _Ready(Middleware):
    def after_worker_boot(self, broker, worker):
        _ready()


broker.add_middleware(_Ready())
dramatiq.set_broker(broker)
task = dramatiq.actor
'''

SHARED = r'''
RUNS = os.path.join(HERE, "runs")
_out = [None, None]  # pid, fd


def _record(line):
    pid = os.getpid()
    if _out[0] != pid:
        _out[:] = [pid, os.open(os.path.join(RUNS, "%d.log" % pid), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)]
    os.write(_out[1], line)


@task
def empty(n):
    _record(b"%d %.6f\n" % (n, time.time()))


@task
def stamp(n):
    _record(b"%d %.6f\n" % (n, time.time()))


@task
def work(n, seconds):
    time.sleep(seconds)
    _record(b"%d %.6f\n" % (n, time.time()))


def _ready(**kwargs):
    path = os.path.join(HERE, "ready", str(os.getpgrp()))  # the worker's session: the process the script started
    with open(path + ".new", "w") as f:
        f.write("%.6f" % time.time())
    os.rename(path + ".new", path)


def send(actor, *args):
    if hasattr(actor, "delay"):
        actor.delay(*args)  # Celery
    else:
        actor.send(*args)  # Dramatiq


def _count():
    n = 0
    for name in os.listdir(RUNS):
        with open(os.path.join(RUNS, name), "rb") as f:
            n += f.read().count(b"\n")
    return n


def client(what, *args):
    """Run by the bench script in a process of its own; prints one JSON line."""
    if what == "publish":
        task, count = globals()[args[0]], int(args[1])
        extra = json.loads(args[2]) if len(args) > 2 else []
        started = time.perf_counter()
        for n in range(count):
            send(task, n, *extra)
        print(json.dumps({"seconds": time.perf_counter() - started}))
    elif what == "dispatch":
        count, low, high, warmup, patience = int(args[0]), float(args[1]), float(args[2]), int(args[3]), float(args[4])
        sent = []
        for n in range(-warmup, count):
            expected = n + warmup
            deadline = time.monotonic() + patience
            while _count() < expected:
                if time.monotonic() > deadline:
                    print(json.dumps({"error": "task %d had not run after %.0f s" % (n - 1, patience), "sent": sent}))
                    return
                time.sleep(0.002)
            time.sleep(random.uniform(low, high))
            before = time.time()
            send(stamp, n)
            after = time.time()
            if n >= 0:
                sent.append([n, before, after])
        print(json.dumps({"sent": sent}))
'''


CLIENT = "import sys, benchproj; benchproj.client(*sys.argv[1:])"


# -- processes: everything started is killed ---------------------------------------------------


class Processes:
    """Every process this script started (each in a session of its own), killed at the end."""

    def __init__(self) -> None:
        self.items: list[subprocess.Popen[bytes]] = []

    def popen(self, command: list[str], log_path: str, cwd: str | None = None,
              env: dict[str, str] | None = None, stdout: Any = None) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                       stdout=log if stdout is None else stdout, stderr=log,
                                       start_new_session=True)
        self.items.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """Signal the process's whole session (a prefork worker's children too) and reap it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        with contextlib.suppress(ProcessLookupError, PermissionError):  # children left behind
            os.killpg(process.pid, signal.SIGKILL)
        if process in self.items:
            self.items.remove(process)

    def kill_all(self) -> None:
        for process in reversed(list(self.items)):
            try:
                self.kill(process)
            except Exception as exc:  # go on with the others
                print(f"  could not kill process {process.pid}: {exc}", file=sys.stderr)


PROCS = Processes()
atexit.register(PROCS.kill_all)


def tail(path: str, lines: int = 6) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


# -- redis --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_call(port: int, *words: str) -> Any:
    """One command in RESP on a fresh connection; the reply, simply parsed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"".join([b"*%d\r\n" % len(words)] + [b"$%d\r\n%s\r\n" % (len(w.encode()), w.encode())
                                                          for w in words]))
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode()
    if line.startswith("-"):
        raise RuntimeError(f"redis: {line[1:]}")
    if line[:1] in ":":
        return int(line[1:])
    return line[1:]


class Redis:
    """A redis-server on a free loopback port, in a directory of its own; or why there is none."""

    def __init__(self, root: str) -> None:
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.version = ""
        self.missing: str | None = None  # why there is no redis-server (the Redis rows are skipped)
        self.failure: str | None = None  # why it would not start (the Redis rows fail)
        executable = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
        if executable is None:
            self.missing = "no redis-server on this machine (apt-get install redis-server)"
            return
        self.version = subprocess.run([executable, "--version"], capture_output=True, text=True,
                                      timeout=10, check=False).stdout.strip().split(" sha=")[0]
        directory = os.path.join(root, "redis")
        os.makedirs(directory, exist_ok=True)
        self.log = os.path.join(root, "redis.log")
        self.port = free_port()
        self.process = PROCS.popen([executable, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                    "--appendonly", "no", "--dir", directory, "--daemonize", "no"], self.log)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {tail(self.log)}")
            with contextlib.suppress(OSError, RuntimeError):
                if redis_call(self.port, "PING") == "PONG":
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer in 30 s: {tail(self.log)}")
            time.sleep(0.05)

    def left(self) -> int:
        """Messages still in the broker: the queue's list plus kombu's unacked hash."""
        assert self.port is not None
        return int(redis_call(self.port, "LLEN", "celery")) + int(redis_call(self.port, "HLEN", "unacked"))

    def stop(self) -> None:
        if self.process is not None:
            PROCS.kill(self.process, signal.SIGTERM)
            self.process = None


# -- a Celery project for one run ---------------------------------------------------------------


@dataclass
class Options:
    tasks: int
    samples: int
    prefetch: int
    pool: str
    quiet: float
    kill_for: float
    patience: float  # seconds without progress before a throughput run is called stalled
    directory: str  # where the run's directory is


class Project:
    """The Celery project of one (case, broker, round): its module, broker, workers and records."""

    def __init__(self, root: str, case: str, broker: str, round_: int, opts: Options, redis: Redis | None) -> None:
        self.broker, self.opts, self.redis = broker, opts, redis
        self.path = os.path.join(root, f"{case}-{broker}-{round_}")
        for sub in ("runs", "ready", "tmp"):
            os.makedirs(os.path.join(self.path, sub))
        options: dict[str, Any] = {}
        if broker in ("vsqs", "vsqs-nodurable"):
            url = "vsqs://" + os.path.join(self.path, "spool")
            if case == "chaos":
                options["visibility_timeout"] = VT["vsqs"]
            if broker == "vsqs-nodurable":
                options["durable"] = False
        elif broker.startswith("filesystem"):
            url = "filesystem://"
            data, processed = os.path.join(self.path, "data"), os.path.join(self.path, "processed")
            os.makedirs(data)
            os.makedirs(processed)
            options.update(data_folder_in=data, data_folder_out=data, processed_folder=processed,
                           store_processed=True)
            if broker == "filesystem-0.01":
                options["polling_interval"] = 0.01
        elif broker == "dramatiq-vsqs":
            url = "vsqs"
            options["visibility_timeout"] = VT["vsqs"] if case == "chaos" else 30.0
        elif broker in ("redis", "dramatiq-redis"):
            if redis is not None and redis.failure:
                raise RuntimeError(redis.failure)
            if redis is None or redis.port is None:
                raise Skipped(redis.missing if redis is not None and redis.missing else "no redis-server")
            redis_call(redis.port, "FLUSHALL")
            url = f"redis://127.0.0.1:{redis.port}/0"
            if case == "chaos" and broker == "redis":
                options.update(visibility_timeout=VT["redis"], unacked_restore_interval=1,
                               unacked_restore_throttle=1)
            elif case == "chaos":
                options.update(heartbeat_timeout=int(VT["redis"] * 1000), maintenance_chance=100_000)
        else:
            raise ValueError(broker)
        self.dramatiq = broker.startswith("dramatiq-")
        with open(os.path.join(self.path, "benchproj.py"), "w") as f:
            f.write((DRAMATIQ_HEAD if self.dramatiq else CELERY_HEAD) + SHARED)
        with open(os.path.join(self.path, "bench.json"), "w") as f:
            json.dump({"broker": url, "prefetch": opts.prefetch, "transport_options": options}, f)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY", "VSQS_"))}
        self.env.update(PYTHONPATH=os.pathsep.join([self.path, REPO]), TMPDIR=os.path.join(self.path, "tmp"),
                        PYTHONDONTWRITEBYTECODE="1")
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started: dict[int, float] = {}  # worker pid -> time.time() at spawn
        self.count = 0

    # workers

    def worker(self) -> subprocess.Popen[bytes]:
        self.count += 1
        if self.dramatiq:
            command = [sys.executable, "-m", "dramatiq", "benchproj", "--processes", "1", "--threads", "1"]
        else:
            pool = ["-P", "solo"] if self.opts.pool == "solo" else ["-P", "prefork", "-c", "1"]
            command = [sys.executable, "-m", "celery", "-A", "benchproj", "worker", *pool, "-l", "warning",
                       "-n", f"w{self.count}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"]
        started = time.time()
        process = PROCS.popen(command, os.path.join(self.path, f"worker-{self.count}.log"), cwd=self.path,
                              env=self.env)
        self.started[process.pid] = started
        self.workers.append(process)
        return process

    def ready(self) -> dict[int, float]:
        """pid -> time.time() at which that worker was ready."""
        found = {}
        for name in os.listdir(os.path.join(self.path, "ready")):
            if name.isdigit():
                with open(os.path.join(self.path, "ready", name)) as f:
                    found[int(name)] = float(f.read())
        return found

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        PROCS.kill(process)
        if process in self.workers:
            self.workers.remove(process)

    def stop(self) -> None:
        for process in list(self.workers):
            self.kill(process)

    def worker_logs(self, lines: int = 3) -> str:
        """The last lines of each worker's log that has any."""
        names = sorted(f for f in os.listdir(self.path) if f.startswith("worker-"))
        found = [f"{name}: {text}" for name in names if (text := tail(os.path.join(self.path, name), lines))]
        return " || ".join(found)[-800:]

    def check_workers(self) -> None:
        """Raise, with its log, if a worker this run did not kill has exited."""
        for process in self.workers:
            if process.poll() is not None:
                raise RuntimeError(f"a worker exited with {process.returncode}: {self.worker_logs()}")

    # records

    def runs(self) -> list[tuple[int, float]]:
        out = []
        directory = os.path.join(self.path, "runs")
        for name in os.listdir(directory):
            with open(os.path.join(directory, name), "rb") as f:
                for line in f.read().splitlines():
                    parts = line.split()
                    if len(parts) == 2:
                        out.append((int(parts[0]), float(parts[1])))
        return out

    def client(self, *args: str, timeout: float) -> dict[str, Any]:
        log = os.path.join(self.path, "client.log")
        with tempfile.TemporaryFile(dir=self.path) as out:
            process = PROCS.popen([sys.executable, "-c", CLIENT, *args], log, cwd=self.path, env=self.env,
                                  stdout=out)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                PROCS.kill(process)
                raise RuntimeError(f"client {args[0]} did not finish in {timeout:.0f} s: {tail(log)}") from None
            PROCS.kill(process)
            out.seek(0)
            text = out.read().decode(errors="replace").strip()
        if process.returncode != 0 or not text:
            raise RuntimeError(f"client {args[0]} exited with {process.returncode}: {tail(log)}")
        result: dict[str, Any] = json.loads(text.splitlines()[-1])
        if "error" in result:
            said = tail(log)
            raise RuntimeError(f"client {args[0]}: {result['error']}" + (f"; {said}" if said else ""))
        return result

    def left(self) -> int | None:
        """Messages still in the broker (ready, in flight, unacked)."""
        if self.broker in ("vsqs", "vsqs-nodurable", "dramatiq-vsqs"):
            spool = vsqs.Spool(os.path.join(self.path, "spool"))
            name = "default" if self.dramatiq else "celery"
            if name not in spool.queues():
                return 0
            stats = spool.queue(name).stats()
            return int(stats.ready + stats.in_flight + stats.delayed)
        if self.broker == "dramatiq-redis" and self.redis is not None and self.redis.port is not None:
            return int(redis_call(self.redis.port, "HLEN", "dramatiq:default.msgs"))
        if self.broker.startswith("filesystem"):
            return sum(1 for name in os.listdir(os.path.join(self.path, "data")) if name.endswith(".msg"))
        if self.broker == "redis" and self.redis is not None:
            return self.redis.left()
        return None


def wait_ready(project: Project, processes: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.pid in project.ready() for p in processes):
        project.check_workers()
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers not ready after {timeout:.0f} s")
        time.sleep(0.05)


# -- the cases ----------------------------------------------------------------------------------


class Skipped(Exception):
    """A broker this machine cannot run (no redis-server)."""


@dataclass
class Result:
    broker: str
    error: str | None = None
    skipped: str | None = None
    values: dict[str, Any] = field(default_factory=dict)


def run_throughput(project: Project) -> dict[str, Any]:
    n = project.opts.tasks
    published = project.client("publish", "empty", str(n), timeout=600)["seconds"]
    workers = [project.worker(), project.worker()]
    last_progress, seen = time.monotonic(), 0
    while True:
        runs = project.runs()
        if len({r[0] for r in runs}) >= n:
            break
        if len(runs) > seen:
            seen, last_progress = len(runs), time.monotonic()
        elif time.monotonic() - last_progress > project.opts.patience:
            raise RuntimeError(f"stalled: {len({r[0] for r in runs})} of {n} tasks ran, then nothing for "
                               f"{project.opts.patience:.0f} s")
        project.check_workers()
        time.sleep(0.2)
    ready = project.ready()
    project.stop()
    first_ready = min(ready[p.pid] for p in workers if p.pid in ready)
    start = min(first_ready, min(t for _, t in runs))
    end = max(t for _, t in runs)
    spawn = [ready[p.pid] - project.started[p.pid] for p in workers if p.pid in ready]
    counts = Counter(i for i, _ in runs)
    return {"publish": n / published, "startup": max(spawn), "seconds": end - start, "rate": n / (end - start),
            "twice": sum(1 for c in counts.values() if c > 1)}


def run_dispatch(project: Project, samples: int) -> dict[str, Any]:
    worker = project.worker()
    wait_ready(project, [worker])
    time.sleep(1.0)  # idle, waiting
    low, high = PAUSE
    sent = project.client("dispatch", str(samples), str(low), str(high), str(WARMUP), "20",
                          timeout=60 + samples * 3)["sent"]
    deadline = time.monotonic() + 20
    while True:
        started = {i: t for i, t in project.runs() if i >= 0}
        if len(started) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    project.stop()
    after = [(started[i] - a) * 1000 for i, b, a in sent if i in started]
    before = [(started[i] - b) * 1000 for i, b, a in sent if i in started]
    if len(after) < len(sent):
        raise RuntimeError(f"{len(sent) - len(after)} of {len(sent)} dispatched tasks never started")
    return {"after": after, "before": before}


def run_chaos(project: Project, rng: random.Random) -> dict[str, Any]:
    opts = project.opts
    n = opts.tasks
    published = project.client("publish", "work", str(n), json.dumps([WORK_SECONDS]), timeout=600)["seconds"]
    project.worker()
    project.worker()
    began, began_wall = time.monotonic(), time.time()
    kills, done, last_progress = 0, 0, began
    next_kill = began + rng.uniform(*KILL_EVERY)
    ended_by = "every task ran"
    while True:  # the killer
        now = time.monotonic()
        done_now = len({i for i, _ in project.runs()})
        if done_now >= n:
            break
        if done_now > done:
            done, last_progress = done_now, now
        if now - last_progress > opts.quiet:
            ended_by = f"nothing ran for {opts.quiet:.0f} s"
            break
        if now - began > opts.kill_for:
            ended_by = f"{opts.kill_for:.0f} s of kills"
            break
        project.check_workers()
        if now >= next_kill:
            ready = project.ready()
            candidates = [p for p in project.workers if p.pid in ready]
            if candidates:
                project.kill(rng.choice(candidates))
                kills += 1
                project.worker()
            next_kill = now + rng.uniform(*KILL_EVERY)
        time.sleep(0.02)
    kill_seconds = time.monotonic() - began
    last_progress = time.monotonic()
    while done < n:  # no more kills: let it finish
        done_now = len({i for i, _ in project.runs()})
        if done_now > done:
            done, last_progress = done_now, time.monotonic()
        elif time.monotonic() - last_progress > opts.quiet:
            break
        project.check_workers()
        time.sleep(0.1)
    runs = project.runs()
    project.stop()
    counts = Counter(i for i, _ in runs)
    return {"kills": kills, "kill_seconds": kill_seconds, "ended_by": ended_by, "publish": n / published,
            "lost": sum(1 for i in range(n) if counts[i] == 0),
            "twice": sum(1 for c in counts.values() if c > 1),
            "extra": sum(c - 1 for c in counts.values() if c > 1),
            "last": max(t for _, t in runs) - began_wall if runs else None,
            "left": project.left()}


# -- tables -------------------------------------------------------------------------------------


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def ratio(x: float | None, reference: float | None) -> str:
    return "n/a" if x is None or not reference else f"{x / reference:.2f}"


def failed(results: list[Result]) -> str | None:
    """Why a broker has no figures: the first failure (or skip) of its rounds, else None."""
    errors = ([f"failed: {r.error}" for r in results if r.error]
              + [f"skipped: {r.skipped}" for r in results if r.skipped])
    return errors[0] if errors else None


@dataclass
class Group:
    """The rows of one framework: its vsqs row and the peers it is compared with."""

    name: str
    mine: str  # the vsqs broker's key
    refs: list[tuple[str, str]]  # (broker key, ratio column)
    redis: str  # the Redis broker's key
    send: str  # what the client calls


GROUPS = [
    Group("Celery", "vsqs", [("filesystem", "x filesystem (1 s)"), ("filesystem-0.01", "x filesystem (0.01 s)"),
                             ("redis", "x Redis")], "redis", "delay()"),
    Group("Dramatiq", "dramatiq-vsqs", [("dramatiq-redis", "x RedisBroker")], "dramatiq-redis", "send()"),
]


def throughput_table(results: dict[str, list[Result]], opts: Options,
                     group: Group) -> tuple[list[str], list[list[str]], list[str]]:
    rate = {b: statistics.median(r.values["rate"] for r in rs) for b, rs in results.items()
            if rs and not failed(rs)}
    refs = [(key, label) for key, label in group.refs if key in results]
    headers = ["broker", "tasks/s end to end", *(label for _, label in refs),
               "run (s)", "publish (tasks/s)", "worker start (s)", "run twice"]
    lines = []
    for broker, rs in results.items():
        error = failed(rs)
        if error:
            lines.append([LABELS[broker], error[:600], *([""] * (len(headers) - 2))])
            continue
        each = [r.values for r in rs]
        spread = "" if len(each) < 2 else f" ({min(v['rate'] for v in each):,.0f}-{max(v['rate'] for v in each):,.0f})"
        lines.append([LABELS[broker], f"{rate[broker]:,.0f}{spread}",
                      *(ratio(rate[broker], rate.get(key)) for key, _ in refs),
                      fmt(statistics.median(v["seconds"] for v in each), 2),
                      f"{statistics.median(v['publish'] for v in each):,.0f}",
                      fmt(statistics.median(v["startup"] for v in each), 1),
                      str(sum(v["twice"] for v in each))])
    workers = ("`dramatiq --processes 1 --threads 1`" if group.name == "Dramatiq" else
               f"-P {opts.pool}{' -c 1' if opts.pool == 'prefork' else ''}, prefetch multiplier {opts.prefetch}")
    notes = [f"{opts.tasks:,} empty tasks published first by one client process ({group.send} in a loop), then 2 "
             f"workers ({workers}); end to end from the first worker ready (or the first task, if earlier) to the "
             "last task's record; median of the rounds (range in brackets)."]
    if group.name == "Celery" and (_report.mount_of(opts.directory).get("type") or "") not in ("tmpfs", "ramfs"):
        notes.append("vsqs fsyncs each publish and deletes each acked message; kombu's filesystem transport "
                     "fsyncs nothing: on a disk whose unlink of a written-back file waits for a discard (ext4 "
                     "with discard, no journal) that sets vsqs's rate; --dir /dev/shm shows the transports "
                     "without the disk.")
    mine = group.mine
    if mine in rate:
        goals = []
        for ref, _label in refs:
            if ref not in rate:
                continue
            need = 0.5 if ref == group.redis else 1.0
            goals.append(f">= {'' if need == 1 else f'{need}x '}{LABELS[ref]}: "
                         f"{'met' if rate[mine] >= need * rate[ref] else 'missed'} ({rate[mine] / rate[ref]:.2f}x)")
        if goals:
            notes.append("Targets for vsqs: " + "; ".join(goals) + ".")
    return headers, lines, notes


def dispatch_table(results: dict[str, list[Result]], group: Group) -> tuple[list[str], list[list[str]], list[str]]:
    pooled = {b: ([x for r in rs for x in r.values["after"]], [x for r in rs for x in r.values["before"]])
              for b, rs in results.items() if rs and not failed(rs)}
    p50 = {b: percentile(a, 50) for b, (a, _) in pooled.items()}
    redis = group.redis
    headers = ["broker", "samples", "p50 (ms)", "p99 (ms)", "max (ms)", "p50 - Redis p50 (ms)",
               f"p50 from {group.send} called (ms)"]
    lines = []
    for broker, rs in results.items():
        error = failed(rs)
        if error:
            lines.append([LABELS[broker], "", error[:600], "", "", "", ""])
            continue
        after, before = pooled[broker]
        diff = "n/a" if redis not in p50 else f"{p50[broker] - p50[redis]:+.2f}"
        lines.append([LABELS[broker], str(len(after)), fmt(p50[broker], 2), fmt(percentile(after, 99), 2),
                      fmt(max(after), 2), diff, fmt(percentile(before, 50), 2)])
    notes = [f"From {group.send} returning in the client (time.time()) to the task starting in the idle worker "
             "(time.time()); one sample at a time, each after a random 5-20 ms pause; p99 is the sample at "
             "0-based rank int(0.99 n) of the n sorted."]
    if group.mine in p50 and redis in p50:
        gap = p50[group.mine] - p50[redis]
        notes.append(f"Target for vsqs: p50 within 2 ms of {LABELS[redis]}'s: {'met' if gap <= 2 else 'missed'} "
                     f"({gap:+.2f} ms).")
    return headers, lines, notes


def chaos_table(results: dict[str, list[Result]], opts: Options,
                group: Group) -> tuple[list[str], list[list[str]], list[str]]:
    headers = ["broker", "tasks", "kills", "lost", "run twice", "extra runs", "left in broker",
               "last task ran at (s)", "kills ended by"]
    lines = []
    for broker, rs in results.items():
        error = failed(rs)
        if error:
            lines.append([LABELS[broker], "", "", error[:600], "", "", "", "", ""])
            continue
        each = [r.values for r in rs]

        def joined(key: str, digits: int | None = None, each: list[dict[str, Any]] = each) -> str:
            values = [v[key] for v in each]
            return " / ".join("n/a" if x is None else (f"{x:.{digits}f}" if digits is not None else str(x))
                              for x in values)

        lines.append([LABELS[broker], str(opts.tasks), joined("kills"), joined("lost"), joined("twice"),
                      joined("extra"), joined("left"), joined("last", 1), " / ".join(v["ended_by"] for v in each)])
    if group.name == "Dramatiq":
        workers = "`dramatiq --processes 1 --threads 1`"
        timeouts = (f"VsqsBroker visibility_timeout {VT['vsqs']:.0f} s; RedisBroker heartbeat_timeout "
                    f"{VT['redis']:.0f} s with maintenance_chance 100,000 (10% of its commands do maintenance)")
    else:
        workers = f"-P {opts.pool}, prefetch multiplier {opts.prefetch}"
        timeouts = (f"vsqs visibility_timeout {VT['vsqs']:.0f} s; Redis visibility_timeout {VT['redis']:.0f} s "
                    "(unacked_restore_interval 1, unacked_restore_throttle 1); filesystem has none (a message is "
                    "gone from the queue once a worker has read it)")
    notes = [f"{opts.tasks:,} acks-late tasks of {WORK_SECONDS * 1000:.0f} ms (a sleep), published first; 2 workers "
             f"({workers}); a random ready worker's process group SIGKILLed every {KILL_EVERY[0]}-{KILL_EVERY[1]} s "
             f"and replaced, until every task ran, nothing ran for {opts.quiet:.0f} s, or {opts.kill_for:.0f} s; "
             f"then no kills until every task ran or nothing ran for {opts.quiet:.0f} s. {timeouts}. 'last task "
             "ran at': seconds from the first workers' spawn. Rounds separated by '/'."]
    if group.mine in results and not failed(results[group.mine]):
        lost = sum(r.values["lost"] for r in results[group.mine])
        notes.append(f"Target for vsqs: 0 lost: {'met' if lost == 0 else 'missed'} ({lost} lost).")
    return headers, lines, notes


# -- main ---------------------------------------------------------------------------------------


def filesystem_type(path: str) -> str:
    fs = _report.mount_of(path)
    return fs.get("type", "unknown") if fs else "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=None, help="tasks in the throughput and chaos cases "
                                                                "(2000; --quick 300)")
    parser.add_argument("--samples", type=int, default=None, help="dispatch samples per broker (200; --quick 40); "
                                                                  "filesystem at 1 s polling gets a quarter")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--brokers", default=",".join(k for k, _ in BROKERS),
                        help=f"comma-separated, of: {', '.join(k for k, _ in BROKERS + DRAMATIQ_BROKERS)} "
                             "(default: the first four)")
    parser.add_argument("--dramatiq", action="store_true",
                        help="add the Dramatiq rows (dramatiq-vsqs, dramatiq-redis) to --brokers")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each case (brokers interleaved)")
    parser.add_argument("--prefetch", type=int, default=4, help="worker_prefetch_multiplier (default 4)")
    parser.add_argument("--pool", choices=["solo", "prefork"], default="solo",
                        help="worker pool: solo, or prefork with -c 1")
    parser.add_argument("--quiet", type=float, default=None,
                        help="chaos: seconds without progress that end a phase (15; --quick 10)")
    parser.add_argument("--kill-for", type=float, default=None, help="chaos: the longest kill phase (60; --quick 20)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: small numbers")
    parser.add_argument("--seed", type=int, default=None, help="the killer's random seed")
    parser.add_argument("--dir", default=tempfile.gettempdir(),
                        help="where the run's directory goes (a local filesystem; default: the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (workers' logs)")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    brokers = [b for b in args.brokers.split(",") if b]
    if args.dramatiq:
        brokers += [k for k, _ in DRAMATIQ_BROKERS if k not in brokers]
    unknown = [c for c in cases if c not in CASES] + [b for b in brokers if b not in LABELS]
    if unknown:
        parser.error(f"unknown cases or brokers: {', '.join(unknown)}")
    opts = Options(tasks=args.tasks or (300 if args.quick else 2000),
                   samples=args.samples or (40 if args.quick else 200),
                   prefetch=args.prefetch, pool=args.pool,
                   quiet=args.quiet or (10.0 if args.quick else 15.0),
                   kill_for=args.kill_for or (20.0 if args.quick else 60.0),
                   patience=60.0, directory=args.dir)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (a shell's background job starts with it ignored)
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="bench-tasks-", dir=args.dir)
    began = time.monotonic()
    # (the commit at the start of the run: others may commit during it)
    provenance = _report.provenance(REPO, args.dir, f"{opts.tasks:,} tasks, {opts.samples} dispatch samples, "
                                                    f"{args.repeat} round(s), killer seed {seed}")
    redis: Redis | None = None
    results: dict[str, dict[str, list[Result]]] = {c: {b: [] for b in brokers} for c in cases}
    try:
        import celery  # type: ignore[import-untyped]
        import kombu  # type: ignore[import-untyped]

        print(f"command: `{_report.command_line()}`")
        print(f"machine: {os.cpu_count()} cores; {args.dir} is {filesystem_type(root)} "
              f"({_report.machine(root)}); {platform.system()} {platform.release()}; "
              f"load average at the start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        try:
            import dramatiq
            dramatiq_version = f", dramatiq {dramatiq.__version__}"
        except ImportError:
            dramatiq_version = ", dramatiq not installed"
        print(f"versions: vsqs {vsqs.__version__} at {_report.git_head(REPO)}, celery {celery.__version__}, "
              f"kombu {kombu.__version__}{dramatiq_version}, Python {platform.python_version()}; "
              f"killer seed {seed}")
        if "redis" in brokers or "dramatiq-redis" in brokers:
            try:
                redis = Redis(root)
            except Exception as exc:  # the Redis rows fail with the reason; the others run
                redis = Redis.__new__(Redis)
                redis.port, redis.process, redis.version, redis.missing = None, None, "", None
                redis.failure = f"redis-server: {exc}"
            print(f"redis: {redis.missing or redis.failure or f'{redis.version} on 127.0.0.1:{redis.port}'}")
        print(flush=True)
        for round_ in range(1, args.repeat + 1):
            for case in cases:
                for broker in brokers:
                    label = f"[round {round_}/{args.repeat}] {case}: {broker}"
                    print(f"{label} ...", end=" ", flush=True)
                    result = Result(broker)
                    t0 = time.monotonic()
                    project = None
                    try:
                        project = Project(root, case, broker, round_, opts, redis)
                        if case == "throughput":
                            result.values = run_throughput(project)
                            summary = f"{result.values['rate']:,.0f} tasks/s"
                        elif case == "dispatch":
                            samples = max(10, opts.samples // 4) if broker == "filesystem" else opts.samples
                            result.values = run_dispatch(project, samples)
                            summary = f"p50 {percentile(result.values['after'], 50):.2f} ms"
                        else:
                            result.values = run_chaos(project, rng)
                            v = result.values
                            summary = f"{v['kills']} kills, {v['lost']} lost, {v['twice']} run twice"
                    except Skipped as exc:
                        result.skipped = str(exc)
                        summary = f"skipped: {exc}"
                    except Exception as exc:
                        result.error = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                        if project is not None:  # what the workers said last
                            said = project.worker_logs()
                            if said:
                                result.error += f"; workers' logs: {said}"
                        summary = "failed: " + result.error[:300]
                        if os.environ.get("BENCH_TASKS_TRACEBACK"):
                            traceback.print_exc()
                    finally:
                        if project is not None:
                            project.stop()
                            if not args.keep:
                                shutil.rmtree(project.path, ignore_errors=True)
                    results[case][broker].append(result)
                    print(f"{summary} ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        if redis is not None:
            redis.stop()
        PROCS.kill_all()
        if args.keep:
            print(f"\nkept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print()
    print(provenance)
    for group in GROUPS:
        keys = [key for key, _ in (BROKERS if group.name == "Celery" else DRAMATIQ_BROKERS)]
        for case in cases:
            mine = {b: rs for b, rs in results[case].items() if b in keys}
            if not mine:
                continue
            if case == "throughput":
                title, (headers, lines, notes) = "throughput", throughput_table(mine, opts, group)
            elif case == "dispatch":
                title, (headers, lines, notes) = "dispatch latency", dispatch_table(mine, group)
            else:
                title, (headers, lines, notes) = "chaos (workers SIGKILLed at random)", chaos_table(mine, opts, group)
            print(f"\n### {group.name}: {title}\n")
            print(_report.table(headers, lines, right=tuple(range(1, len(headers) - (case == "chaos")))))
            print()
            for note in notes:
                print(f"* {note}")
    if redis is not None and redis.missing:
        print(f"\n* Redis rows skipped: {redis.missing}.")
    print(f"\nrun time: {time.monotonic() - began:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        PROCS.kill_all()
        sys.exit(130)
