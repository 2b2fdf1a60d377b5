#!/usr/bin/env python3
"""Measure how soon a waiting consumer wakes when a message lands, beside
Redis's LPUSH -> BLPOP on the same host in the same run, and what idle
waiters cost in CPU.

Run from the repository root, with the project installed in .venv::

    .venv/bin/python scripts/bench_latency.py                 # default run, about 6 minutes on 2 cores
    .venv/bin/python scripts/bench_latency.py --quick         # smoke run, about 1.5 minutes
    .venv/bin/python scripts/bench_latency.py --cases library,redis --samples 500
    .venv/bin/python scripts/bench_latency.py --markdown      # also the results as markdown
    .venv/bin/python scripts/bench_latency.py --install-redis # apt-get install redis-server if it is missing

Everything runs in a fresh directory made under ``--dir`` (default:
``./.bench/``), removed at the end; every process the script starts (consumers,
gateways, redis-server) is stopped at the end, on Ctrl-C and on errors too.

What is measured. Latency is the time from the call that makes a message
claimable returning (a publish, a release, a delete of a group's head; for
the CLI, the ``vsqs publish`` process having exited) to the waiting
consumer's receive returning, both read with ``time.monotonic()``
(CLOCK_MONOTONIC is one clock for every process of a Linux host). Each sample
starts with the consumer already asleep in a long receive (``wait=20``): the
consumer says it is about to call receive, the producer pauses a random 20-80
ms, then acts. Publishes are ``durable=False`` (no fsync: what is measured is
the wake-up, not the disk). Cases (``--cases`` takes the names):

* ``library``: ``Queue.publish`` -> ``Queue.receive(wait=20)`` in another process.
* ``cli``: ``vsqs publish --no-durable`` (a new process) -> library, from the
  CLI process's exit; may be negative (the consumer got the message before
  the CLI process had finished exiting).
* ``sqs``: library publish -> boto3 ``ReceiveMessage(WaitTimeSeconds=20)``
  against ``vsqs serve --workers 1`` on loopback (SigV4-signed).
* ``sqs-workers``: boto3 ``SendMessage`` -> boto3 long poll, both through
  ``vsqs serve --workers 2``; the sender opens a fresh connection each sample,
  so the two requests land on the same worker or on different ones (which, is
  read from /proc and reported under the table).
* ``release``: consumer A (this process) holds a message, B waits; from A's
  ``release()`` returning.
* ``delay``: ``publish(delay=0.2)``; the lateness of B's receive past publish
  returning + 0.2 s.
* ``group``: two messages of group "g"; A holds the first, B waits; from A's
  ``delete()`` returning to B getting the second.
* ``load``: a steady 1,000 messages a second (``publish_batch`` of 10 every 10
  ms) into the queue, four consumer processes doing ``receive_batch(10,
  wait=20)`` + ``delete_batch``; probe messages published among them (from this
  process), latency from the probe's publish returning to the receive that got
  it returning, in whichever consumer.
* ``redis``: the anchor, LPUSH -> BLPOP (RESP spoken directly on a socket) on a
  ``redis-server`` this script starts on loopback (``--save '' --appendonly
  no``); skipped, with the reason, if there is no ``redis-server``.
* ``netfs`` (only with ``--other``): ``--dir`` on a network filesystem and
  ``--other`` the same directory through a second mount (another host, as the
  netfs kit makes them: ``../shared/netfs``); publish through one, the
  consumer waits through the other, where no notification reaches it and it
  polls (a ``stat`` every 0.1 s, then the mount's caches).

The table gives p50, p99 and the maximum, and p50 over Redis's p50 measured
in the same run. p99 is the sample at 0-based rank int(0.99 n) of the n
sorted: the 2nd highest of 200 samples, the highest of 100 or fewer.

Then two CPU figures, from utime + stime in /proc/PID/stat before and after
a window: ``--idle-procs`` processes (default 100) each looping
``receive(wait=20)`` on an empty queue, over ``--window`` seconds (30); and
``vsqs serve --workers 1`` holding ``--polls`` (1,000) idle long polls (raw
``GET /queues/Q/messages?wait=20`` from one asyncio process, httpx clients of
50 connections each, each poll re-issued when it returns; their first waits
are spread over 1-20 s, so that about 1/20 of them return each second, the
steady state, rather than all at once every 20 s) over the same window,
beside the same gateway with no polls. In % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import http.client
import multiprocessing
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))

import _report  # noqa: E402

import vsqs  # noqa: E402

WAIT = 20  # seconds every consumer's receive waits
PAUSE = (0.020, 0.080)  # random pause between the consumer saying it waits and the producer acting
DELAY = 0.2  # the delayed message's delay
LOAD_BATCH, LOAD_EVERY = 10, 0.010  # the load case: 10 messages every 10 ms
LOAD_CONSUMERS = 4
API_KEY = "bench-latency-api-key"
AWS_KEY_ID, AWS_SECRET = "AKIDBENCHLATENCY", "bench-latency-secret"
REGION = "us-east-1"

CASES: list[tuple[str, str]] = [
    ("library", "library -> library (another process)"),
    ("cli", "vsqs publish (CLI exit) -> library"),
    ("sqs", "library -> gateway long poll (boto3)"),
    ("sqs-workers", "gateway -> gateway, --workers 2 (boto3)"),
    ("release", "release -> next waiter"),
    ("delay", "delay 0.2 s: lateness"),
    ("group", "group: head deleted -> next waiter"),
    ("load", "library under load (1,000 msg/s, 4 consumers)"),
    ("redis", "Redis LPUSH -> BLPOP (anchor)"),
    ("netfs", "library -> library across two mounts (--other)"),
]
LABELS = dict(CASES)


# -- processes: everything started is stopped --------------------------------------------------


class Processes:
    """Every process this script started, so that all of them are stopped at the end."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def popen(self, command: list[str], log_path: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """A server process in a session of its own (its workers too), logging to ``log_path``."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       env=env, start_new_session=True)
        self.items.append(process)
        return process

    def child(self, process: Any) -> Any:
        process.daemon = True
        process.start()
        self.items.append(process)
        return process

    def stop(self, process: Any) -> None:
        """SIGTERM (the whole session of a server), then SIGKILL after 10 s."""
        try:
            if isinstance(process, subprocess.Popen):
                if process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signal.SIGTERM)
                    try:
                        process.wait(10)
                    except subprocess.TimeoutExpired:
                        pass
                with contextlib.suppress(ProcessLookupError, PermissionError):  # workers left behind
                    os.killpg(process.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5)
            elif process.pid is not None:
                if process.is_alive():
                    process.terminate()
                    process.join(5)
                if process.is_alive():
                    process.kill()
                    process.join(5)
        finally:
            if process in self.items:
                self.items.remove(process)

    def stop_all(self) -> None:
        for process in reversed(list(self.items)):
            try:
                self.stop(process)
            except Exception as exc:  # go on with the others
                print(f"  could not stop process {process.pid}: {exc}", file=sys.stderr)


PROCS = Processes()
CHILD_LOGS: list[str] = []  # the log of every child process a case started, in order
CTX = multiprocessing.get_context("forkserver")


def _child_init(log_path: str) -> None:
    """In a child process: stdout and stderr to ``log_path``; die with the forkserver."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read().strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


# -- /proc ------------------------------------------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                found += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return found


def own_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (a gateway's worker processes)."""
    return own_cpu(pid) + sum(tree_cpu(child) for child in _children(pid))


def exact_cpu(pids: list[int]) -> float:
    """CPU seconds of these processes' threads now alive, from /proc/PID/task/TID/schedstat
    (nanoseconds; /proc/PID/stat counts clock ticks, 10 ms, too coarse for idle processes)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as f:
                    total += int(f.read().split()[0])
    return total / 1e9


def _descendants(pid: int) -> list[int]:
    out = [pid]
    for child in _children(pid):
        out += _descendants(child)
    return out


def _tcp_table() -> dict[int, tuple[int, int]]:
    """socket inode -> (local port, remote port), for this network namespace's TCP sockets."""
    table: dict[int, tuple[int, int]] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name, encoding="ascii") as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) < 10 or parts[9] == "0":
                continue
            table[int(parts[9])] = (int(parts[1].rsplit(":", 1)[1], 16), int(parts[2].rsplit(":", 1)[1], 16))
    return table


def _socket_inodes(pid: int) -> set[int]:
    found: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                found.add(int(target[8:-1]))
    return found


def serving_processes(client_pid: int, port: int, server_pid: int) -> set[int]:
    """The processes of the server at ``server_pid`` holding the other end of
    ``client_pid``'s connections to ``port`` (which gateway worker serves it)."""
    table = _tcp_table()
    ports = {table[i][0] for i in _socket_inodes(client_pid) if i in table and table[i][1] == port}
    found = set()
    for pid in _descendants(server_pid):
        for inode in _socket_inodes(pid):
            if inode in table and table[inode][0] == port and table[inode][1] in ports:
                found.add(pid)
    return found


# -- servers: the gateway, redis ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vsqs_command() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "vsqs")
    found = beside if os.path.exists(beside) else shutil.which("vsqs")
    if found is None:
        raise RuntimeError("no vsqs command beside the interpreter or on PATH")
    return found


@dataclass
class Gateway:
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: str


def _http(port: int, method: str, path: str, headers: dict[str, str] | None = None,
          timeout: float = 5) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request(method, path, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@contextlib.contextmanager
def running_gateway(spool: str, workers: int, log_dir: str) -> Iterator[Gateway]:
    """``vsqs serve SPOOL --workers N`` on a free loopback port, with an API key and a
    SigV4 key pair; stopped on exit."""
    port = free_port()
    log_path = os.path.join(log_dir, f"gateway-{port}.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VSQS_", "AWS_"))}
    env.update(VSQS_API_KEY=API_KEY, VSQS_AWS_ACCESS_KEY_ID=AWS_KEY_ID, VSQS_AWS_SECRET_ACCESS_KEY=AWS_SECRET)
    command = [vsqs_command(), "serve", spool, "--host", "127.0.0.1", "--port", str(port),
               "--workers", str(workers), "--log-level", "warning"]
    process = PROCS.popen(command, log_path, env)
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"vsqs serve exited with {process.returncode}: {_tail(log_path)}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                if _http(port, "GET", "/healthz", timeout=1)[0] == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vsqs serve did not answer in 60 s: {_tail(log_path)}")
            time.sleep(0.1)
        if workers > 1:  # every worker up (each answers /healthz once it has imported the app)
            deadline = time.monotonic() + 60
            while len(_children(process.pid)) < workers and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)
        yield Gateway(f"http://127.0.0.1:{port}", port, process, log_path)
    finally:
        PROCS.stop(process)


def long_polls_waiting(gateway: Gateway) -> float:
    status, text = _http(gateway.port, "GET", "/metrics", {"Authorization": f"Bearer {API_KEY}"}, timeout=10)
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    for line in text.decode().splitlines():
        if line.startswith("vsqs_gateway_long_polls_waiting"):
            return float(line.split()[-1])
    return 0.0


def resp(*args: str | bytes) -> bytes:
    """A RESP command."""
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg if isinstance(arg, bytes) else arg.encode()
        out += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
    return b"".join(out)


class Redis:
    """A minimal RESP client on one socket (no redis-py)."""

    def __init__(self, port: int, timeout: float = 30) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def call(self, *args: str | bytes) -> Any:
        self.sock.sendall(resp(*args))
        return self.read()

    def read(self) -> Any:
        line = self.file.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(f"redis: {rest.decode()}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.file.read(size + 2)[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [self.read() for _ in range(count)]
        raise RuntimeError(f"redis: unexpected reply {line!r}")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def redis_server(install: bool) -> tuple[str | None, str]:
    """The redis-server executable and its version, or None and why not."""
    found = shutil.which("redis-server")
    if found is None and install:
        print("  redis-server missing: apt-get install -y redis-server", flush=True)
        for attempt in (["apt-get", "install", "-y", "redis-server"], ["apt-get", "update"],
                        ["apt-get", "install", "-y", "redis-server"]):
            done = subprocess.run(attempt, capture_output=True, text=True, env={**os.environ,
                                  "DEBIAN_FRONTEND": "noninteractive"}, check=False)
            if attempt[1] == "install" and done.returncode == 0:
                break
        found = shutil.which("redis-server")
    if found is None:
        return None, "redis-server is not installed (--install-redis: apt-get install -y redis-server)"
    try:
        version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"redis-server --version failed: {exc}"
    return found, version.split(" sha=")[0]


@contextlib.contextmanager
def running_redis(executable: str, root: str) -> Iterator[int]:
    port = free_port()
    directory = os.path.join(root, "redis")
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(root, "redis.log")
    process = PROCS.popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--dir", directory, "--daemonize", "no"], log_path)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}: {_tail(log_path)}")
            try:
                client = Redis(port, timeout=1)
                try:
                    if client.call("PING") == "PONG":
                        break
                finally:
                    client.close()
            except (OSError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not answer in 30 s: {_tail(log_path)}")
            time.sleep(0.05)
        yield port
    finally:
        PROCS.stop(process)


# -- the waiting consumer (a child process) ----------------------------------------------------


def _make_receive(kind: str, spec: dict[str, Any]) -> Callable[[], tuple[float, bytes | None]]:
    """The consumer's blocking receive: returns when it got a message (or the wait ran
    out: None), with time.monotonic() read as it returned; the message is then deleted."""
    if kind == "library":
        queue = vsqs.Queue(spec["path"])

        def receive() -> tuple[float, bytes | None]:
            message = queue.receive(wait=WAIT)
            now = time.monotonic()
            if message is None:
                return now, None
            body = message.body
            message.delete()
            return now, body
        return receive
    if kind == "sqs":
        import boto3

        client = boto3.client("sqs", endpoint_url=spec["url"], region_name=REGION,
                              aws_access_key_id=AWS_KEY_ID, aws_secret_access_key=AWS_SECRET)
        url = client.get_queue_url(QueueName=spec["queue"])["QueueUrl"]

        def receive() -> tuple[float, bytes | None]:
            got = client.receive_message(QueueUrl=url, WaitTimeSeconds=WAIT, MaxNumberOfMessages=1)
            now = time.monotonic()
            messages = got.get("Messages", [])
            if not messages:
                return now, None
            client.delete_message(QueueUrl=url, ReceiptHandle=messages[0]["ReceiptHandle"])
            return now, messages[0]["Body"].encode()
        return receive
    if kind == "redis":
        client = Redis(spec["port"], timeout=WAIT + 10)

        def receive() -> tuple[float, bytes | None]:
            got = client.call("BLPOP", spec["key"], str(WAIT))
            now = time.monotonic()
            return now, None if got is None else got[1]
        return receive
    raise ValueError(f"no consumer of kind {kind!r}")


def consumer_child(conn: Any, kind: str, spec: dict[str, Any], log_path: str) -> None:
    """Loop: on "go", say "ready" and block in a receive; send back when it returned."""
    _child_init(log_path)
    try:
        receive = _make_receive(kind, spec)
    except Exception:
        conn.send(("error", traceback.format_exc(limit=4)))
        return
    conn.send(("up", os.getpid()))
    while True:
        try:
            command = conn.recv()
        except EOFError:
            return
        if command != "go":
            return
        try:
            conn.send(("ready",))
            now, body = receive()
            conn.send(("got", now, body))
        except Exception:
            conn.send(("error", traceback.format_exc(limit=4)))


class Consumer:
    """The parent's side of a consumer_child."""

    def __init__(self, kind: str, spec: dict[str, Any], log_path: str) -> None:
        self.conn, child_conn = CTX.Pipe()
        self.log_path = log_path
        CHILD_LOGS.append(log_path)
        self.process = PROCS.child(CTX.Process(target=consumer_child, args=(child_conn, kind, spec, log_path)))
        child_conn.close()
        self.pid = self.expect("up", 120)[1]

    def expect(self, tag: str, timeout: float) -> tuple[Any, ...]:
        if not self.conn.poll(timeout):
            alive = "alive" if self.process.is_alive() else f"exited {self.process.exitcode}"
            raise RuntimeError(f"consumer ({alive}) sent nothing in {timeout:g} s waiting for {tag!r}; "
                               f"its log: {_tail(self.log_path)}")
        try:
            message = self.conn.recv()
        except EOFError:
            raise RuntimeError(f"consumer died (exit {self.process.exitcode}): {_tail(self.log_path)}") from None
        if message[0] == "error":
            raise RuntimeError(f"consumer failed: {message[1].strip()}")
        if message[0] != tag:
            raise RuntimeError(f"consumer sent {message!r}, expected {tag!r}")
        return tuple(message)

    def go(self) -> None:
        """Ask for one receive; return once the consumer is about to call it."""
        self.conn.send("go")
        self.expect("ready", 30)

    def result(self, timeout: float = WAIT + 15) -> tuple[float, bytes | None]:
        _, now, body = self.expect("got", timeout)
        return now, body

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send("stop")
        self.process.join(2)
        PROCS.stop(self.process)
        self.conn.close()


def pause() -> None:
    time.sleep(random.uniform(*PAUSE))


def sample_loop(
    row: Row,
    n: int,
    consumer: Consumer,
    act: Callable[[int], float],
    prepare: Callable[[int], None] | None = None,
    after: Callable[[int, float], None] | None = None,
    shift: float = 0.0,
) -> None:
    """``n`` samples into ``row``: prepare(i) (the consumer not waiting yet), the
    consumer starts its receive, a random pause, act(i) returns the reference time;
    the consumer's receive returning minus that (and minus the time act(i) was
    called, plus ``shift``, into ``row.from_start``). The consumer must get ``s{i}``."""
    for i in range(n):
        if prepare is not None:
            prepare(i)
        consumer.go()
        pause()
        began = time.monotonic()
        reference = act(i)
        now, body = consumer.result()
        if body is None:
            raise RuntimeError(f"sample {i}: the consumer's receive returned nothing in {WAIT} s")
        if body != f"s{i}".encode():
            raise RuntimeError(f"sample {i}: the consumer got {body[:40]!r}, not s{i}")
        row.samples.append(now - reference)
        row.from_start.append(now - began - shift)
        if after is not None:
            after(i, now - reference)


# -- the cases -----------------------------------------------------------------------------------


@dataclass
class Row:
    key: str
    samples: list[float] = field(default_factory=list)
    from_start: list[float] = field(default_factory=list)  # from the producer's call starting
    error: str | None = None
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def label(self) -> str:
        return LABELS[self.key]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


@dataclass
class Run:
    root: str
    spool: vsqs.Spool
    samples: int
    redis: str | None
    redis_why: str
    quick: bool
    dir: str = ""  # --dir
    other: str | None = None  # --other: the same directory as --dir, through another mount


def _queue(run: Run, name: str) -> vsqs.Queue:
    return run.spool.create_queue(name)


def _log(run: Run, name: str) -> str:
    return os.path.join(run.root, f"{name}.log")


@contextlib.contextmanager
def consumer(kind: str, spec: dict[str, Any], log_path: str) -> Iterator[Consumer]:
    c = Consumer(kind, spec, log_path)
    try:
        yield c
    finally:
        c.stop()


def case_library(run: Run, row: Row) -> None:
    queue = _queue(run, "library")
    with consumer("library", {"path": queue.path}, _log(run, "library")) as c:
        def act(i: int) -> float:
            queue.publish(f"s{i}", durable=False)
            return time.monotonic()
        sample_loop(row, run.samples, c, act)


def case_cli(run: Run, row: Row) -> None:
    queue = _queue(run, "cli")
    command = vsqs_command()
    spawned: list[float] = []
    with consumer("library", {"path": queue.path}, _log(run, "cli")) as c:
        def act(i: int) -> float:
            started = time.monotonic()
            done = subprocess.run([command, "publish", "--no-durable", queue.path, f"s{i}"],
                                  capture_output=True, timeout=60, check=False)
            exited = time.monotonic()
            if done.returncode != 0:
                raise RuntimeError(f"vsqs publish exited {done.returncode}: {done.stderr.decode()[-300:]}")
            spawned.append(exited - started)
            return exited
        sample_loop(row, run.samples, c, act)
    negative = sum(1 for s in row.samples if s < 0)
    row.notes.append(f"{negative} of {len(row.samples)} samples negative: the consumer's receive returned before "
                     f"the CLI process had finished exiting (reported as measured). The CLI process ran "
                     f"{ms(percentile(spawned, 50))} ms (p50) from spawn to exit.")


def case_sqs(run: Run, row: Row) -> None:
    queue = _queue(run, "sqs")
    with running_gateway(run.spool.root, 1, run.root) as gateway, \
            consumer("sqs", {"url": gateway.url, "queue": "sqs"}, _log(run, "sqs")) as c:
        def act(i: int) -> float:
            queue.publish(f"s{i}", durable=False)
            return time.monotonic()
        sample_loop(row, run.samples, c, act)


def case_sqs_workers(run: Run, row: Row) -> None:
    import boto3

    _queue(run, "sqsworkers")
    _queue(run, "sqswarm")
    session = boto3.session.Session()
    sender: list[Any] = [None]
    same: list[float] = []
    other: list[float] = []
    unknown: list[float] = []
    sends: list[float] = []
    with running_gateway(run.spool.root, 2, run.root) as gateway, \
            consumer("sqs", {"url": gateway.url, "queue": "sqsworkers"}, _log(run, "sqsworkers")) as c:
        def new_client() -> Any:
            return session.client("sqs", endpoint_url=gateway.url, region_name=REGION,
                                  aws_access_key_id=AWS_KEY_ID, aws_secret_access_key=AWS_SECRET)

        url = new_client().get_queue_url(QueueName="sqsworkers")["QueueUrl"]

        warm_url = new_client().get_queue_url(QueueName="sqswarm")["QueueUrl"]

        def prepare(i: int) -> None:
            """A fresh client each sample, so a fresh connection: the kernel picks its worker. Its
            first SendMessage (to a queue nobody reads) opens the connection and does botocore's
            first-call work, which would otherwise fall after the timed send's answer came in."""
            if sender[0] is not None:
                sender[0].close()
            sender[0] = new_client()
            sender[0].send_message(QueueUrl=warm_url, MessageBody="warm-up")

        def act(i: int) -> float:
            began = time.monotonic()
            sender[0].send_message(QueueUrl=url, MessageBody=f"s{i}")
            done = time.monotonic()
            sends.append(done - began)
            return done

        def after(i: int, latency: float) -> None:
            mine = serving_processes(os.getpid(), gateway.port, gateway.process.pid)
            theirs = serving_processes(c.pid, gateway.port, gateway.process.pid)
            if len(mine) == 1 and len(theirs) == 1:
                (same if mine == theirs else other).append(latency)
            else:
                unknown.append(latency)

        try:
            sample_loop(row, run.samples, c, act, prepare, after)
        finally:
            if sender[0] is not None:
                sender[0].close()
    parts = []
    for name, values in (("the same worker", same), ("different workers", other)):
        if values:
            parts.append(f"{len(values)} samples on {name} (p50 {ms(percentile(values, 50))} ms, "
                         f"max {ms(max(values))} ms)")
        else:
            parts.append(f"none on {name}")
    if unknown:
        parts.append(f"{len(unknown)} where /proc did not tell")
    row.notes.append("sender and long poll: " + "; ".join(parts) + f". SendMessage took {ms(percentile(sends, 50))} "
                     "ms (p50, round trip): the gateway publishes durably, and the message is claimable from "
                     "its rename, before the fsyncs that the answer waits for, so the long poll may return first "
                     "(negative values, as measured).")


def case_release(run: Run, row: Row) -> None:
    queue = _queue(run, "release")
    held: list[Any] = [None]
    with consumer("library", {"path": queue.path}, _log(run, "release")) as c:
        def prepare(i: int) -> None:  # A (this process) holds s{i}
            queue.publish(f"s{i}", durable=False)
            held[0] = queue.receive(visibility_timeout=600)
            if held[0] is None or held[0].body != f"s{i}".encode():
                raise RuntimeError(f"sample {i}: A did not get s{i} to hold")

        def act(i: int) -> float:
            held[0].release()
            return time.monotonic()
        sample_loop(row, run.samples, c, act, prepare)


def case_delay(run: Run, row: Row) -> None:
    queue = _queue(run, "delay")
    with consumer("library", {"path": queue.path}, _log(run, "delay")) as c:
        def act(i: int) -> float:
            queue.publish(f"s{i}", durable=False, delay=DELAY)
            return time.monotonic() + DELAY
        sample_loop(row, run.samples, c, act, shift=DELAY)
    early = sum(1 for s in row.samples if s < 0)
    row.notes.append(f"lateness = the receive returning - (publish returning + {DELAY} s)"
                     + (f"; {early} samples early (the delay runs from a time read inside the publish call, "
                        "before it returned)"
                        if early else "") + ".")


def case_group(run: Run, row: Row) -> None:
    queue = _queue(run, "group")
    held: list[Any] = [None]
    with consumer("library", {"path": queue.path}, _log(run, "group")) as c:
        def prepare(i: int) -> None:  # the group's head s{i}-head, held by A; then s{i}
            queue.publish(f"s{i}-head", group="g", durable=False)
            queue.publish(f"s{i}", group="g", durable=False)
            held[0] = queue.receive(visibility_timeout=600)
            if held[0] is None or held[0].body != f"s{i}-head".encode():
                raise RuntimeError(f"sample {i}: A did not get the group's head")

        def act(i: int) -> float:
            held[0].delete()
            return time.monotonic()
        sample_loop(row, run.samples, c, act, prepare)


def load_publisher(path: str, stop: Any, report: Any, log_path: str) -> None:
    """publish_batch of LOAD_BATCH every LOAD_EVERY s until ``stop``; report what it did."""
    _child_init(log_path)
    queue = vsqs.Queue(path)
    bodies = [b"load"] * LOAD_BATCH
    published, late = 0, 0.0
    started = time.monotonic()
    due = started
    try:
        while not stop.is_set():
            queue.publish_batch(bodies, durable=False)
            published += LOAD_BATCH
            due += LOAD_EVERY
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            else:
                late = max(late, now - due)
                if now - due > 1.0:  # far behind: do not burst to catch up
                    due = now
    finally:
        report.put(("load", published, time.monotonic() - started, late))


def load_consumer(path: str, results: Any, log_path: str) -> None:
    """receive_batch(10, wait=20) + delete_batch, forever; report each probe it got."""
    _child_init(log_path)
    queue = vsqs.Queue(path)
    results.put(("up", os.getpid()))
    got = 0
    while True:
        messages = queue.receive_batch(10, wait=WAIT)
        now = time.monotonic()
        for message in messages:
            if message.body.startswith(b"probe:"):
                results.put(("probe", int(message.body.split(b":")[1]), now, os.getpid()))
        if messages:
            queue.delete_batch([m.receipt for m in messages])
            got += len(messages)


def case_load(run: Run, row: Row) -> None:
    queue = _queue(run, "load")
    results, stop = CTX.Queue(), CTX.Event()
    started: list[Any] = []
    try:
        CHILD_LOGS.extend([_log(run, f"load-consumer-{k}") for k in range(LOAD_CONSUMERS)])
        CHILD_LOGS.append(_log(run, "load-publisher"))
        for k in range(LOAD_CONSUMERS):
            started.append(PROCS.child(CTX.Process(target=load_consumer, args=(
                queue.path, results, _log(run, f"load-consumer-{k}")))))
        deadline = time.monotonic() + 120
        up = 0
        while up < LOAD_CONSUMERS:
            message = results.get(timeout=max(0.1, deadline - time.monotonic()))
            up += message[0] == "up"
        load = PROCS.child(CTX.Process(target=load_publisher, args=(queue.path, stop, results,
                                                                      _log(run, "load-publisher"))))
        started.append(load)
        time.sleep(2.0)  # the load settles
        pids = [p.pid for p in started]
        cpu_before, probes_began = [own_cpu(pid) for pid in pids], time.monotonic()
        published: dict[int, float] = {}
        began: dict[int, float] = {}
        got: dict[int, tuple[float, int]] = {}
        load_report: tuple[Any, ...] | None = None

        def drain(block: float) -> None:
            nonlocal load_report
            with contextlib.suppress(Exception):
                while True:
                    message = results.get(timeout=block) if block else results.get_nowait()
                    if message[0] == "probe":
                        got[message[1]] = (message[2], message[3])
                    elif message[0] == "load":
                        load_report = message
                    block = 0

        for i in range(run.samples):
            pause()
            began[i] = time.monotonic()
            queue.publish(f"probe:{i}:{began[i]:.6f}", durable=False)
            published[i] = time.monotonic()
            drain(0)
            if not load.is_alive():
                raise RuntimeError(f"the load publisher died: {_tail(_log(run, 'load-publisher'))}")
            dead = [p for p in started if not p.is_alive()]
            if dead:
                raise RuntimeError(f"a consumer died (exit {dead[0].exitcode})")
        deadline = time.monotonic() + WAIT + 10
        while len(got) < len(published) and time.monotonic() < deadline:
            drain(0.5)
        backlog = queue.stats()
        span = time.monotonic() - probes_began
        cpu = [100 * (own_cpu(pid) - before) / span for pid, before in zip(pids, cpu_before, strict=True)]
        stop.set()
        load.join(10)
        deadline = time.monotonic() + 5
        while load_report is None and time.monotonic() < deadline:
            drain(0.5)
        missing = sorted(set(published) - set(got))
        if missing:
            raise RuntimeError(f"{len(missing)} probes never reported (first: {missing[0]})")
        row.samples = [got[i][0] - published[i] for i in sorted(published)]
        row.from_start = [got[i][0] - began[i] for i in sorted(published)]
        consumers = len({pid for _, pid in got.values()})
        rate = f"{load_report[1] / load_report[2]:,.0f} msg/s achieved (worst lag behind its schedule " \
               f"{load_report[3] * 1000:.0f} ms)" if load_report else "achieved rate not reported"
        row.notes.append(f"{LOAD_BATCH * round(1 / LOAD_EVERY):,} msg/s offered, {rate}; "
                         f"{backlog.ready} ready and {backlog.in_flight} in flight when the probes were in; "
                         f"the probes were got by {consumers} of the {LOAD_CONSUMERS} consumers. CPU meanwhile, "
                         f"% of one core: publisher {cpu[-1]:.0f}, consumers "
                         f"{', '.join(f'{c:.0f}' for c in cpu[:-1])}.")
    finally:
        stop.set()
        for process in started:
            PROCS.stop(process)
        results.close()
        results.cancel_join_thread()


def case_redis(run: Run, row: Row) -> None:
    if run.redis is None:
        row.skipped = run.redis_why
        return
    with running_redis(run.redis, run.root) as port, \
            consumer("redis", {"port": port, "key": "bench"}, _log(run, "redis-consumer")) as c:
        producer = Redis(port)
        try:
            def act(i: int) -> float:
                producer.call("LPUSH", "bench", f"s{i}")
                return time.monotonic()
            sample_loop(row, run.samples, c, act)
        finally:
            producer.close()
    negative = sum(1 for s in row.samples if s < 0)
    row.notes.append(f"Redis serves the blocked BLPOP in the same turn of its event loop as the LPUSH, before "
                     f"answering it, so from LPUSH returning its latency is about zero and {negative} of "
                     f"{len(row.samples)} samples are negative: a ratio to it mostly says how far the others are "
                     f"from zero; see the p50s from the call's start above.")


def case_netfs(run: Run, row: Row) -> None:
    """Publish through --dir, wait through --other (the same directory, another mount, as
    another host sees it): no notification crosses, the waiter polls (poll_interval 0.1 s)."""
    if run.other is None:
        row.skipped = "needs --other: --dir as another mount (another host) sees it"
        return
    queue = _queue(run, "netfs")
    other = os.path.join(run.other, os.path.relpath(queue.path, run.dir))
    with consumer("library", {"path": other}, _log(run, "netfs")) as c:
        def act(i: int) -> float:
            queue.publish(f"s{i}", durable=False)
            return time.monotonic()
        sample_loop(row, run.samples, c, act)


RUNNERS: dict[str, Callable[[Run, Row], None]] = {
    "library": case_library, "cli": case_cli, "sqs": case_sqs, "sqs-workers": case_sqs_workers,
    "release": case_release, "delay": case_delay, "group": case_group, "load": case_load, "redis": case_redis,
    "netfs": case_netfs,
}


# -- CPU of idle waiters -------------------------------------------------------------------------


def idle_child(path: str, ready: Any, log_path: str) -> None:
    _child_init(log_path)
    queue = vsqs.Queue(path)
    ready.put(os.getpid())
    parent = os.getppid()
    while os.getppid() == parent:
        queue.receive(wait=WAIT)


def idle_processes_cpu(run: Run, count: int, window: float) -> str:
    queue = _queue(run, "idle")
    ready = CTX.Queue()
    started: list[Any] = []
    logs = [_log(run, f"idle-{k}") for k in range(count)]
    try:
        for k in range(count):
            started.append(PROCS.child(CTX.Process(target=idle_child, args=(queue.path, ready, logs[k]))))
        pids = []
        deadline = time.monotonic() + 300
        while len(pids) < count:
            pids.append(ready.get(timeout=max(0.1, deadline - time.monotonic())))
        time.sleep(3.0)  # every one asleep in its receive
        dead = [p for p in started if not p.is_alive()]
        if dead:
            raise RuntimeError(f"{len(dead)} waiting processes died: {_tail(logs[started.index(dead[0])])}")
        before, exact_before = sum(own_cpu(pid) for pid in pids), exact_cpu(pids)
        time.sleep(window)
        used, exact = sum(own_cpu(pid) for pid in pids) - before, exact_cpu(pids) - exact_before
    finally:
        for process in started:
            PROCS.stop(process)
        ready.close()
        ready.cancel_join_thread()
    warned = [_tail(path, 1) for path in logs if _tail(path, 1)]
    polled = sum(1 for text in warned if "poll instead" in text)
    line = (f"{count} idle processes in receive(wait={WAIT}) on an empty queue, over {window:g} s: "
            f"{100 * used / window:.2f}% of one core in total, {100 * used / window / count:.3f}% per process "
            f"(from schedstat, ns: {100 * exact / window:.3f}% in total, {100 * exact / window / count:.4f}% "
            f"per process)")
    if warned:
        line += (f"\n    ({len(warned)} of them wrote to stderr, {polled} that they poll instead of inotify; "
                 f"e.g.: {warned[0]})")
    return line


POLLS_PER_CLIENT = 50  # long polls per httpx client: its pool's cost per request grows with its connections


async def _poll_forever(url: str, queue: str, count: int, counters: Any, log_path: str) -> None:
    """``count`` long polls, each re-issued when it returns. Their first waits are spread
    over 1-20 s, so that from then on about count / 20 return each second (a steady state,
    not a wave of ``count`` every 20 s)."""
    import httpx

    clients = []
    for _ in range(0, count, POLLS_PER_CLIENT):
        limits = httpx.Limits(max_connections=POLLS_PER_CLIENT, max_keepalive_connections=POLLS_PER_CLIENT)
        clients.append(httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"},
                                         limits=limits, timeout=httpx.Timeout(WAIT + 20)))

    async def one(k: int) -> None:
        client = clients[k // POLLS_PER_CLIENT]
        wait = 1 + k % WAIT
        while True:
            try:
                answer = await client.get(f"/queues/{queue}/messages", params={"wait": wait})
                counters[0 if answer.status_code in (200, 204) else 1] += 1
                if answer.status_code not in (200, 204):
                    print(f"poll answered {answer.status_code}: {answer.text[:200]}", flush=True)
                    await asyncio.sleep(1)
            except Exception as exc:
                counters[2] += 1
                print(f"poll failed: {type(exc).__name__}: {exc}", flush=True)
                await asyncio.sleep(1)
            wait = WAIT

    try:
        await asyncio.gather(*(one(k) for k in range(count)))
    finally:
        for client in clients:
            await client.aclose()


def poller_child(url: str, queue: str, count: int, counters: Any, log_path: str) -> None:
    _child_init(log_path)
    asyncio.run(_poll_forever(url, queue, count, counters, log_path))


def gateway_cpu(run: Run, polls: int, window: float) -> str:
    _queue(run, "idlegw")
    with running_gateway(run.spool.root, 1, run.root) as gateway:
        time.sleep(2.0)
        before, exact_before = tree_cpu(gateway.process.pid), exact_cpu(_descendants(gateway.process.pid))
        time.sleep(window)
        idle = tree_cpu(gateway.process.pid) - before
        idle_exact = exact_cpu(_descendants(gateway.process.pid)) - exact_before
        counters = CTX.Array("q", 3)
        log_path = _log(run, "poller")
        poller = PROCS.child(CTX.Process(target=poller_child, args=(gateway.url, "idlegw", polls, counters,
                                                                     log_path)))
        try:
            deadline = time.monotonic() + 120
            waiting = 0.0
            while waiting < polls:
                if not poller.is_alive():
                    raise RuntimeError(f"the polling client died: {_tail(log_path)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {waiting:.0f} of {polls} long polls waiting after 120 s: "
                                       f"{_tail(log_path)}")
                time.sleep(0.5)
                waiting = long_polls_waiting(gateway)
            time.sleep(1.0)
            before, client_before, answered = tree_cpu(gateway.process.pid), own_cpu(poller.pid), counters[0]
            exact_before = exact_cpu(_descendants(gateway.process.pid))
            time.sleep(window)
            used = tree_cpu(gateway.process.pid) - before
            exact = exact_cpu(_descendants(gateway.process.pid)) - exact_before
            client = own_cpu(poller.pid) - client_before
            answered = counters[0] - answered
            still = long_polls_waiting(gateway)
            failures = counters[1] + counters[2]
        finally:
            PROCS.stop(poller)
    line = (f"vsqs serve --workers 1 holding {polls:,} idle long polls (raw GET ?wait={WAIT}, re-issued on "
            f"return, the first waits spread over 1-{WAIT} s) over {window:g} s: {100 * used / window:.2f}% "
            f"of one core (from schedstat: "
            f"{100 * exact / window:.3f}%); the same gateway without polls: {100 * idle / window:.2f}% "
            f"({100 * idle_exact / window:.3f}%); the polling client: {100 * client / window:.2f}%; "
            f"{answered:,} polls returned empty in the window ({answered / window:.0f} a second), {still:.0f} waiting "
            f"at its end")
    if failures:
        line += f"; {failures} polls failed ({_tail(log_path, 1)})"
    return line


# -- the run ------------------------------------------------------------------------------------


def inotify_in_use() -> int:
    """inotify instances open by this user's processes now (the limit is per user)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                count += os.readlink(f"/proc/{entry}/fd/{fd}") == "anon_inode:inotify"
    return count


def child_notes(paths: list[str]) -> list[str]:
    """What the children whose logs are ``paths`` wrote (the library's warnings), counted."""
    seen: dict[str, int] = {}
    for path in paths:
        text = _tail(path, 1)
        if text:
            seen[text] = seen.get(text, 0) + 1
    return [f"{n} of its child processes wrote: {text}" for text, n in seen.items()]


def print_environment(root: str, redis: str | None, redis_version: str) -> None:
    try:
        from vsqs._core import inotify as _inotify
        fstype = _inotify.filesystem_type(root)
        wakeups = "inotify" if _inotify.is_local(fstype) else "polling (not a local filesystem)"
    except Exception as exc:  # a private module: only informative
        wakeups = f"unknown ({exc})"
    limit = _report.read_first("/proc/sys/fs/inotify/max_user_instances") or "?"
    print(f"vsqs {vsqs.__version__}, Python {platform.python_version()}, {platform.system()} {platform.release()}; "
          f"{_report.machine(root)}")
    print(f"spool on {os.path.abspath(root)}; waiting receives woken by {wakeups}; "
          f"inotify instances of this user: {inotify_in_use()} open of {limit}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"redis: {f'{redis_version} ({redis})' if redis else redis_version}")
    print(f"each sample: the consumer waits (wait={WAIT} s), the producer pauses {PAUSE[0] * 1000:.0f}-"
          f"{PAUSE[1] * 1000:.0f} ms, then acts; durable=False publishes; all on 127.0.0.1\n", flush=True)


def table_rows(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """p50/p99/max from the call returning; p50 from the call starting, and that over
    Redis's (Redis answers BLPOP before LPUSH, so from LPUSH returning its latency is
    about 0 or below: only the figures from the call's start compare)."""
    anchor = next((r for r in rows if r.key == "redis" and r.from_start and not r.error), None)
    reference = percentile(anchor.from_start, 50) if anchor else None
    headers = ["case", "samples", "p50 (ms)", "p99 (ms)", "max (ms)", "p50 from start (ms)", "x Redis"]
    out = []
    for row in rows:
        if row.samples and row.error is None:
            p50 = percentile(row.samples, 50)
            start = percentile(row.from_start, 50) if row.from_start else None
            ratio = ("n/a" if reference is None or start is None or reference <= 0 or start <= 0
                     else f"{start / reference:.1f}")
            out.append([row.label, str(len(row.samples)), ms(p50), ms(percentile(row.samples, 99)),
                        ms(max(row.samples)), "" if start is None else ms(start), ratio])
        elif row.skipped:
            out.append([row.label, "0", "skipped", "", "", "", row.skipped])
        else:
            first = (row.error or "no samples").strip().splitlines()[-1]
            out.append([row.label, str(len(row.samples)), "failed", "", "", "", first[:100]])
    return headers, out


def print_table(headers: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(headers)]
    widths[-1] = len(headers[-1])
    print("  ".join(h.ljust(widths[i]) if i == 0 else h.rjust(widths[i]) for i, h in enumerate(headers)))
    for line in lines:
        print("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(line)))


def _from_top(count: int) -> str:
    """Which sample p99 is, counted from the highest."""
    rank = count - min(count - 1, int(0.99 * count))
    return "highest" if rank == 1 else f"{rank}{ {2: 'nd', 3: 'rd'}.get(rank, 'th')} highest"


def notes(rows: list[Row], count: int) -> list[str]:
    out = [f"Latency: from the call that makes the message claimable returning to the waiting consumer's receive "
           f"returning (time.monotonic() in both processes). p99 is the sample at 0-based rank int(0.99 n) of "
           f"the n sorted: with n = {count}, the {_from_top(count)}."]
    anchor = next((r for r in rows if r.key == "redis" and r.from_start and not r.error), None)
    reference = percentile(anchor.from_start, 50) if anchor else None
    parts = []
    for row in rows:
        if row.from_start and not row.error:
            p50 = percentile(row.from_start, 50)
            ratio = f", {p50 / reference:.1f}x Redis" if reference and reference > 0 and p50 > 0 else ""
            parts.append(f"{row.key} {ms(p50)}{ratio}")
    if parts:
        out.append("From the producer's call starting instead of returning (for the CLI: from its spawn), p50 in ms: "
                   + "; ".join(parts) + ".")
    for row in rows:
        for note in row.notes:
            out.append(f"{row.key}: {note}")
        if row.error:
            out.append(f"{row.key} failed: {row.error.strip()}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 30 samples a case, 20 idle processes and 100 long polls over 5 s")
    parser.add_argument("--samples", type=int, default=None, help="samples per case (default 200; --quick 30)")
    parser.add_argument("--cases", default=None,
                        help=f"cases to run, comma-separated (default: all): {', '.join(k for k, _ in CASES)}; "
                             "'cpu' the two CPU figures")
    parser.add_argument("--idle-procs", type=int, default=None, help="idle waiting processes (100; --quick 20)")
    parser.add_argument("--polls", type=int, default=None, help="idle long polls on the gateway (1000; --quick 100)")
    parser.add_argument("--window", type=float, default=None, help="seconds of each CPU window (30; --quick 5)")
    parser.add_argument("--dir", default=".bench",
                        help="where the spool goes, in a fresh directory (removed at the end)")
    parser.add_argument("--install-redis", action="store_true", help="apt-get install redis-server if it is missing")
    parser.add_argument("--pause", default=None, metavar="LOW,HIGH",
                        help="the producer's random pause before each sample, in seconds (default 0.02,0.08); "
                             "a longer one lets a polling consumer back off further")
    parser.add_argument("--other", default=None,
                        help="--dir as another mount sees it (two mounts of one network filesystem): the netfs case")
    _report.add_markdown_option(parser)
    args = parser.parse_args()
    if args.pause:
        global PAUSE
        low, high = (float(x) for x in args.pause.split(","))
        PAUSE = (low, high)
    samples = args.samples or (30 if args.quick else 200)
    idle_procs = args.idle_procs or (20 if args.quick else 100)
    polls = args.polls or (100 if args.quick else 1000)
    window = args.window or (5.0 if args.quick else 30.0)
    known = [k for k, _ in CASES] + ["cpu"]
    wanted = args.cases.split(",") if args.cases else [k for k in known if k != "netfs" or args.other]
    unknown = [w for w in wanted if w not in known]
    if unknown:
        parser.error(f"unknown cases: {', '.join(unknown)} (known: {', '.join(known)})")

    def terminated(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    CTX.set_forkserver_preload(["__main__"])  # children fork from a process that has imported vsqs
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="latency-", dir=args.dir)
    started = time.monotonic()
    rows: list[Row] = []
    cpu_lines: list[str] = []
    try:
        spool = vsqs.Spool(os.path.join(root, "spool"), create=True)
        redis, redis_version = redis_server(args.install_redis) if "redis" in wanted else (None, "not asked for")
        print_environment(spool.root, redis, redis_version)
        provenance = _report.provenance(REPO, root, f"{samples} samples a case, consumers waiting {WAIT} s, "
                                                    f"pauses {PAUSE[0] * 1000:.0f}-{PAUSE[1] * 1000:.0f} ms")
        run = Run(root, spool, samples, redis, redis_version, args.quick, args.dir, args.other)
        order = [k for k, _ in CASES if k in wanted]
        for n, key in enumerate(order, 1):
            row = Row(key)
            rows.append(row)
            case_started = time.monotonic()
            print(f"[{n}/{len(order)}] {key}: {row.label} ...", end=" ", flush=True)
            logs_before = len(CHILD_LOGS)
            try:
                RUNNERS[key](run, row)
            except Exception:
                row.error = traceback.format_exc(limit=3)
            row.notes += child_notes(CHILD_LOGS[logs_before:])
            row.seconds = time.monotonic() - case_started
            state = ("skipped" if row.skipped else "failed" if row.error else
                     f"p50 {ms(percentile(row.samples, 50))} ms") if row.skipped or row.error or row.samples else "-"
            print(f"{state} ({row.seconds:.0f} s)", flush=True)
        if "cpu" in wanted:
            for what, measure in (("idle processes", lambda: idle_processes_cpu(run, idle_procs, window)),
                                  ("idle long polls", lambda: gateway_cpu(run, polls, window))):
                print(f"[cpu] {what} ...", flush=True)
                try:
                    cpu_lines.append(measure())
                except Exception:
                    cpu_lines.append(f"{what}: failed: {traceback.format_exc(limit=3).strip()}")
    finally:
        PROCS.stop_all()
        shutil.rmtree(root, ignore_errors=True)
    print()
    headers, lines = table_rows(rows)
    if rows:
        print_table(headers, lines)
        print()
        for note in notes(rows, samples):
            print(f"* {note}")
    if cpu_lines:
        print("\nCPU (utime + stime from /proc/PID/stat, in % of one core):")
        for line in cpu_lines:
            print(f"  {line}")
    print(f"\nrun time: {time.monotonic() - started:.0f} s; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.markdown:
        blocks = [provenance, _report.table(headers, lines, right=(1, 2, 3, 4, 5)) if rows else "",
                  "\n".join(f"* {note}" for note in notes(rows, samples)) if rows else "",
                  "\n".join(f"* CPU: {line}" for line in cpu_lines)]
        _report.emit(blocks, args.markdown)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        PROCS.stop_all()
        sys.exit(130)
