#!/usr/bin/env python3
"""Benchmark vsqs against the queues a user would otherwise pick, on the same disk.

Run from the repository root (``scripts/bench.py --peers`` runs this)::

    .venv/bin/python scripts/bench.py --peers           # about 2-3 minutes on 2 cores
    .venv/bin/python scripts/bench.py --peers --quick   # smoke run
    .venv/bin/python scripts/bench_peers.py --help      # all options

The peers:

* ``dirq`` (python-dirq) ``QueueSimple``;
* ``persist-queue``: its file ``Queue`` and ``SQLiteAckQueue``;
* the standard library's ``mailbox.Maildir`` used as a queue;
* the original ``vsqs`` 0.3 from PyPI (imported as ``vsqs`` too);
* this checkout's vsqs.

The PyPI peers are installed into ``.bench-peers-venv/`` under the repository
root (made with ``python -m venv`` on first use; the project's own .venv is
not touched). A peer that cannot be installed or fails is reported as
"unavailable: <reason>" or "failed: <reason>" and the run goes on.

Every workload runs in a fresh worker process (this file with ``--worker``):
this checkout's vsqs and Maildir under the Python running this script, the
PyPI peers under the peers venv's Python. A worker times only its loop
(``time.perf_counter`` for wall, ``time.process_time`` for CPU: user + system
of the whole worker process, so threads such as vsqs 0.3's watchdog observer
count too); setup (imports, prefill) is not timed. Figures are medians over
``--repeat`` repetitions.

Workloads (bodies of ``--body-size`` bytes, each starting with a unique id):

* publish: non-durable where the peer has such a mode;
* durable publish: where the peer has it (vsqs: fsync of file and directory;
  vsqs 0.3 and Maildir: fsync of the file only, they have no other mode;
  SQLiteAckQueue: a commit in WAL mode with SQLite's default synchronous=FULL);
  persist-queue's file Queue fsyncs only at chunk boundaries, so it counts
  as non-durable (it does replace its info file on every put and get);
* receive+delete: the queue is filled (untimed), then a fresh handle takes
  and deletes every message;
* multi-process: 2 producer and 2 consumer processes started together over
  ``--mp-count`` messages in total. Consumers poll (sleep 1 ms when empty)
  and stop once the producers have exited and the queue looks empty. Every
  body carries a unique id; consumers record what they got: lost = published
  but never received, duplicates = received more than once. Throughput is
  messages / (last message received - start); CPU is the four processes'
  CPU time added up. The queue is made beforehand by one process.

How each peer is used as a queue (its documented or obvious idiom):

* dirq QueueSimple: ``add``; consume by ``first``/``next``, ``lock``, ``get``, ``remove``.
* persist-queue Queue: ``put``; ``get_nowait`` + ``task_done`` (autosave=True). It
  is documented as thread-safe, not process-safe; in the multi-process run a
  consumer that finds it empty reopens it to see other processes' puts.
* persist-queue SQLiteAckQueue: ``put``; ``get(block=False)`` + ``ack``.
* mailbox.Maildir: ``add``; consume by ``keys``, ``get_bytes``, ``remove``; a
  consumer whose ``remove`` fails (another one removed it first) drops the
  message: a message is counted as received only by the consumer that removed it.
* vsqs 0.3: ``QueueManager(dir).get_queue(name)``; ``publish``; ``receive`` +
  ``delete``. Its publish and receive list the whole directory each time.
* vsqs: ``publish``; ``receive`` + ``delete``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VENV = os.path.join(REPO, ".bench-peers-venv")
PEER_PACKAGES = {"dirq": "dirq", "persist-queue": "persist-queue", "vsqs 0.3": "vsqs<0.4"}

PEERS = ["vsqs", "dirq", "pq-file", "pq-sqlite-ack", "maildir", "vsqs-0.3"]
LABELS = {
    "vsqs": "vsqs (this checkout)",
    "dirq": "dirq QueueSimple",
    "pq-file": "persist-queue Queue (file)",
    "pq-sqlite-ack": "persist-queue SQLiteAckQueue",
    "maildir": "mailbox.Maildir",
    "vsqs-0.3": "vsqs 0.3 (PyPI)",
}
NEEDS = {"dirq": "dirq", "pq-file": "persist-queue", "pq-sqlite-ack": "persist-queue", "vsqs-0.3": "vsqs 0.3"}
WORKLOADS = ["publish", "publish_durable", "receive_delete", "multiprocess"]
CREATE_ONLY = ("publish", "publish_durable")  # workloads that delete nothing: they run first
WL_LABELS = {
    "publish": "publish",
    "publish_durable": "durable publish",
    "receive_delete": "receive+delete",
    "multiprocess": "2 producers + 2 consumers",
}
# (peer, workload) pairs that do not exist, and why
NOT_APPLICABLE = {
    ("vsqs-0.3", "publish"): "no non-durable mode (always fsyncs)",
    ("pq-sqlite-ack", "publish"): "no non-durable mode (commits every put)",
    ("dirq", "publish_durable"): "no fsync",
    ("pq-file", "publish_durable"): "no per-put fsync",
    ("maildir", "publish"): "no non-durable mode (add fsyncs the file)",
}

DEFAULTS = {"count": 2_000, "durable_count": 300, "mp_count": 2_000, "repeat": 3,
            "depths": "1000,100000", "depth_count": 10_000}
QUICK = {"count": 300, "durable_count": 50, "mp_count": 600, "repeat": 1,
         "depths": "1000,10000", "depth_count": 1_000}
DEPTH_PEERS = ["vsqs", "dirq"]  # the peers a depth run compares
DEPTH_WARMUP = 100
WORKER_TIMEOUT = 120.0


# -- the worker: runs inside the peer's Python ----------------------------------------


class Adapter:
    """One queue, opened in one process."""

    def __init__(self, peer: str, path: str) -> None:
        self.peer = peer
        self.path = path
        self._open()

    def _open(self) -> None:
        peer, path = self.peer, self.path
        if peer == "vsqs":
            if REPO not in sys.path:  # this checkout's vsqs, not one the interpreter has installed
                sys.path.insert(0, REPO)
            import vsqs

            self.q = vsqs.Queue(path, create=True)
        elif peer == "vsqs-0.3":
            # the PyPI 0.3 in the peers venv (sys.path[0] is scripts/, not the checkout)
            from vsqs.queue import QueueManager

            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.manager = QueueManager(os.path.dirname(path))
            self.q = self.manager.get_queue(os.path.basename(path))
        elif peer == "dirq":
            from dirq.QueueSimple import QueueSimple

            self.q = QueueSimple(path)
        elif peer == "pq-file":
            import persistqueue

            self.q = persistqueue.Queue(path, autosave=True)
        elif peer == "pq-sqlite-ack":
            import persistqueue

            self.q = persistqueue.SQLiteAckQueue(path, auto_commit=True)
        elif peer == "maildir":
            import mailbox

            self.q = mailbox.Maildir(path, factory=None, create=True)
        else:
            raise ValueError(peer)

    def fill(self, count: int, size: int) -> None:
        """Put ``count`` messages in, fast (untimed set-up of a depth run)."""
        if self.peer == "vsqs":
            for start in range(0, count, 10_000):
                n = min(10_000, count - start)
                self.q.publish_batch([body_for(f"d{start + i}", size) for i in range(n)], durable=False)
        else:
            for i in range(count):
                self.publish(body_for(f"d{i}", size), False)

    def take_n(self, n: int) -> int:
        """Receive and delete up to ``n`` messages one by one; how many."""
        peer, q, done = self.peer, self.q, 0
        if peer == "vsqs":
            receive, delete = q.receive, q.delete
            while done < n:
                m = receive()
                if m is None:
                    break
                m.body  # noqa: B018 - read, as the other workloads do
                delete(m.receipt)
                done += 1
            return done
        if peer == "dirq":
            while done < n:
                name = q.next() if getattr(self, "_iterating", False) else q.first()
                self._iterating = True
                if not name:
                    break
                if q.lock(name):
                    q.get(name)
                    q.remove(name)
                    done += 1
            return done
        raise ValueError(peer)

    def reopen(self) -> None:
        self.close()
        self._open()

    def close(self) -> None:
        if self.peer == "vsqs-0.3":
            self.q.close()
            self.manager.close()

    def publish(self, body: bytes, durable: bool) -> None:
        peer, q = self.peer, self.q
        if peer == "vsqs":
            q.publish(body, durable=durable)
        elif peer == "vsqs-0.3":
            q.publish(body)
        elif peer == "dirq":
            q.add(body)
        elif peer in ("pq-file", "pq-sqlite-ack"):
            q.put(body)
        elif peer == "maildir":
            q.add(body)

    def take(self) -> list[bytes]:
        """Receive and delete what is visible now (one or more messages); [] if none."""
        peer, q = self.peer, self.q
        if peer == "vsqs":
            m = q.receive()
            if m is None:
                return []
            q.delete(m.receipt)
            return [m.body]
        if peer == "vsqs-0.3":
            mid, data = q.receive(visibility_timeout=300, timeout=0.001)
            if mid is None:
                return []
            q.delete(mid)
            return [data]
        if peer == "dirq":
            got = []
            name = q.first()
            while name:
                if q.lock(name):
                    got.append(q.get(name))
                    q.remove(name)
                name = q.next()
            return got
        if peer == "pq-file":
            import persistqueue

            try:
                item = q.get_nowait()
            except persistqueue.Empty:
                return []
            q.task_done()
            return [item]
        if peer == "pq-sqlite-ack":
            import persistqueue

            try:
                item = q.get(block=False)
            except persistqueue.Empty:
                return []
            q.ack(item)
            return [item]
        if peer == "maildir":
            got = []
            for key in q.keys():  # noqa: SIM118 (iterating a Mailbox yields messages)
                try:
                    data = q.get_bytes(key)
                    q.remove(key)
                except (KeyError, FileNotFoundError):
                    continue  # another consumer took it
                got.append(data)
            return got
        raise ValueError(peer)


def count_races() -> dict[str, int]:
    """Count, in this vsqs worker, the claims lost to another consumer (a rename
    whose source was gone) and the directory listings. Costs a Python call per
    rename and listing, so it is opt-in (--count-races)."""
    from vsqs._core import fs as _fs

    counts = {"lost": 0, "listings": 0}
    rename, list_names = _fs.rename, _fs.list_names

    def counted_rename(src: str, dst: str) -> bool:
        won = rename(src, dst)
        if not won:
            counts["lost"] += 1
        return won

    def counted_list_names(directory: str) -> list[str]:
        counts["listings"] += 1
        return list_names(directory)

    _fs.rename, _fs.list_names = counted_rename, counted_list_names
    return counts


def body_for(ident: str, size: int) -> bytes:
    head = (ident + ":").encode()
    return head + b"x" * max(0, size - len(head))


def ident_of(body: Any) -> str:
    if isinstance(body, str):
        body = body.encode()
    return bytes(body).split(b":", 1)[0].decode()


def rss_mb() -> float:
    """Resident memory of this process now, in MiB (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def wait_until(t0: float) -> None:
    while True:
        left = t0 - time.time()
        if left <= 0:
            return
        time.sleep(min(left, 0.001))


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("peer")
    p.add_argument("role", choices=["init", "publish", "publish_durable", "receive_delete", "receive_depth",
                                    "producer", "consumer"])
    p.add_argument("path")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--tag", default="p")
    p.add_argument("--ctl", help="control directory of a multi-process run")
    p.add_argument("--out", help="where a multi-process worker writes its ids")
    p.add_argument("--timed", type=int, default=0, help="depth run: messages timed")
    p.add_argument("--warmup", type=int, default=100, help="depth run: untimed receives first")
    p.add_argument("--count-races", action="store_true", help="vsqs consumer: count lost claims and listings")
    a = p.parse_args(argv)
    result: dict[str, Any] = {}
    q = Adapter(a.peer, a.path)
    races = count_races() if a.count_races and a.peer == "vsqs" and a.role == "consumer" else None
    if a.role == "init":  # make the queue, so that four processes do not race to create it
        result = {}
    elif a.role in ("publish", "publish_durable"):
        durable = a.role == "publish_durable"
        bodies = [body_for(f"{a.tag}{i}", a.body_size) for i in range(a.count)]
        publish = q.publish
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for b in bodies:
            publish(b, durable)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result = {"count": a.count, "wall": wall, "cpu": cpu}
    elif a.role == "receive_delete":
        for i in range(a.count):  # prefill, untimed
            q.publish(body_for(f"{a.tag}{i}", a.body_size), False)
        q.close()
        q = Adapter(a.peer, a.path)  # a fresh handle
        take, seen = q.take, 0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        while seen < a.count:
            got = take()
            if not got:
                raise RuntimeError(f"queue ran dry after {seen} of {a.count}")
            seen += len(got)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result = {"count": seen, "wall": wall, "cpu": cpu}
    elif a.role == "receive_depth":
        q.fill(a.count, a.body_size)  # untimed
        q.close()
        rss0 = rss_mb()
        q = Adapter(a.peer, a.path)  # a fresh handle
        wall0 = time.perf_counter()
        warm = q.take_n(a.warmup)  # includes the first listing
        warmup_wall = time.perf_counter() - wall0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        seen = 0
        while seen < a.timed:
            got = q.take_n(min(500, a.timed - seen))
            if not got:
                raise RuntimeError(f"queue ran dry after {warm + seen} of {a.count}")
            seen += got
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result = {"count": seen, "wall": wall, "cpu": cpu, "warmup_wall": warmup_wall,
                  "rss_mb": rss_mb() - rss0}
    else:
        ctl = a.ctl
        with open(os.path.join(ctl, f"ready-{a.tag}"), "w"):
            pass
        go = os.path.join(ctl, "go")
        while not os.path.exists(go):
            time.sleep(0.001)
        with open(go) as f:
            t0 = float(f.read())
        wait_until(t0)
        cpu0 = time.process_time()
        ids: list[str] = []
        last = t0
        if a.role == "producer":
            for i in range(a.count):
                ident = f"{a.tag}-{i}"
                q.publish(body_for(ident, a.body_size), False)
                ids.append(ident)  # its publish returned
            last = time.time()
        else:
            done = os.path.join(ctl, "producers-done")
            while True:
                finished = os.path.exists(done)
                got = q.take()
                if got:
                    ids.extend(ident_of(b) for b in got)
                    last = time.time()
                    continue
                if finished:
                    if a.peer == "pq-file":  # see other processes' puts
                        q.reopen()
                        more = q.take()
                        if more:
                            ids.extend(ident_of(b) for b in more)
                            last = time.time()
                            continue
                    break
                time.sleep(0.001)
                if a.peer == "pq-file":
                    q.reopen()
        cpu = time.process_time() - cpu0
        with open(a.out, "w") as f:
            f.write("\n".join(ids))
        result = {"count": len(ids), "cpu": cpu, "t0": t0, "last": last}
        if races is not None:
            result["races"] = races
    q.close()
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    os._exit(0)  # vsqs 0.3's observer thread must not hold the exit


# -- the orchestrator -------------------------------------------------------------------


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def venv_python() -> str:
    return os.path.join(VENV, "bin", "python")


def ensure_venv() -> tuple[dict[str, str], dict[str, str]]:
    """(installed package -> version, package -> why unavailable)."""
    ok: dict[str, str] = {}
    bad: dict[str, str] = {}
    py = venv_python()
    if not os.path.exists(py):
        progress(f"creating {VENV}")
        r = subprocess.run([sys.executable, "-m", "venv", VENV], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            why = "cannot create venv: " + (r.stderr.strip().splitlines() or ["?"])[-1]
            return ok, {k: why for k in PEER_PACKAGES}
    for name, spec in PEER_PACKAGES.items():
        dist = spec.split("<")[0]
        check = subprocess.run([py, "-m", "pip", "show", dist], capture_output=True, text=True, check=False)
        if check.returncode != 0 or (name == "vsqs 0.3" and "Version: 0.3" not in check.stdout):
            progress(f"pip install '{spec}' into {os.path.basename(VENV)}")
            r = subprocess.run([py, "-m", "pip", "install", "-q", spec], capture_output=True, text=True, check=False)
            if r.returncode != 0:
                lines = [x for x in r.stderr.splitlines() if x.strip() and "WARNING" not in x]
                bad[name] = "pip install failed: " + (lines[-1] if lines else f"exit {r.returncode}")
                continue
            check = subprocess.run([py, "-m", "pip", "show", dist], capture_output=True, text=True, check=False)
        version = next((x.split(":", 1)[1].strip() for x in check.stdout.splitlines()
                        if x.startswith("Version:")), "?")
        ok[name] = version
    return ok, bad


class Failed(Exception):
    pass


def python_for(peer: str) -> str:
    return sys.executable if peer in ("vsqs", "maildir") else venv_python()


def run_worker(peer: str, role: str, path: str, args: argparse.Namespace, timeout: float = WORKER_TIMEOUT,
               **extra: Any) -> dict[str, Any]:
    cmd = [python_for(peer), os.path.abspath(__file__), "--worker", peer, role, path,
           "--body-size", str(args.body_size)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                           check=False)
    except subprocess.TimeoutExpired:
        raise Failed(f"timed out after {timeout:.0f} s") from None
    if r.returncode != 0 or not r.stdout.strip():
        lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
        raise Failed(lines[-1][:160] if lines else f"exit {r.returncode}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_multiprocess(peer: str, path: str, args: argparse.Namespace, scratch: str) -> dict[str, Any]:
    ctl = tempfile.mkdtemp(prefix="ctl-", dir=scratch)
    per = args.mp_count // 2
    run_worker(peer, "init", path, args)
    procs: list[tuple[str, subprocess.Popen[str], str]] = []
    for role, tag in (("producer", "p0"), ("producer", "p1"), ("consumer", "c0"), ("consumer", "c1")):
        out = os.path.join(ctl, f"{tag}.ids")
        cmd = [python_for(peer), os.path.abspath(__file__), "--worker", peer, role, path,
               "--body-size", str(args.body_size), "--count", str(per), "--tag", tag,
               "--ctl", ctl, "--out", out] + (["--count-races"] if getattr(args, "count_races", False) else [])
        procs.append((role, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             text=True, cwd=REPO), out))
    deadline = time.monotonic() + WORKER_TIMEOUT
    errors: list[str] = []

    def finish(p: subprocess.Popen[str]) -> dict[str, Any] | None:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            errors.append("a worker timed out")
            return None
        if p.returncode != 0 or not out.strip():
            lines = [x for x in err.strip().splitlines() if x.strip()]
            errors.append(lines[-1][:160] if lines else f"exit {p.returncode}")
            return None
        return json.loads(out.strip().splitlines()[-1])

    while sum(1 for n in os.listdir(ctl) if n.startswith("ready-")) < 4:
        if time.monotonic() > deadline or any(p.poll() is not None for _, p, _ in procs):
            break
        time.sleep(0.01)
    with open(os.path.join(ctl, "go.tmp"), "w") as f:
        f.write(repr(time.time() + 0.1))
    os.rename(os.path.join(ctl, "go.tmp"), os.path.join(ctl, "go"))
    results = [finish(p) for role, p, _ in procs[:2]]
    with open(os.path.join(ctl, "producers-done"), "w"):
        pass
    results += [finish(p) for role, p, _ in procs[2:]]

    def ids(out: str) -> list[str]:
        try:
            with open(out) as f:
                text = f.read()
        except OSError:
            return []
        return text.split("\n") if text else []

    published = [i for _, _, out in procs[:2] for i in ids(out)]
    received = [i for _, _, out in procs[2:] for i in ids(out)]
    pub_set, rec_set = set(published), set(received)
    res: dict[str, Any] = {
        "published": len(published), "received": len(received),
        "lost": len(pub_set - rec_set), "duplicates": len(received) - len(rec_set),
        "errors": errors,
    }
    good = [r for r in results if r]
    if len(good) == 4 and received:
        t0 = good[0]["t0"]
        span = max(r["last"] for r in good[2:]) - t0
        res.update(count=len(rec_set), wall=span, cpu=sum(r["cpu"] for r in good))
        if all("races" in r for r in good[2:]):
            res["races"] = {k: sum(r["races"][k] for r in good[2:]) for k in ("lost", "listings")}
    shutil.rmtree(ctl, ignore_errors=True)
    return res


def cell(rec: dict[str, Any]) -> str:
    if "skip" in rec:
        return rec["skip"]
    return f"{rec['rate']:>9,.0f} {rec['cpu_us']:>7.1f}"


def run(args: argparse.Namespace) -> dict[str, Any]:
    parent = os.path.abspath(args.dir)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="peers-", dir=parent)
    installed, unavailable = ensure_venv()
    table: dict[str, dict[str, dict[str, Any]]] = {p: {} for p in args.peers}
    started = time.perf_counter()
    serial = 0
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    mps: dict[str, list[dict[str, Any]]] = {}
    try:
        for peer in args.peers:
            pkg = NEEDS.get(peer)
            for wl in WORKLOADS:
                rec = table[peer][wl] = {}
                if pkg in unavailable:
                    rec["skip"] = f"unavailable: {unavailable[pkg]}"
                elif (peer, wl) in NOT_APPLICABLE:
                    rec["skip"] = f"n/a: {NOT_APPLICABLE[(peer, wl)]}"
        # Creates first: every repetition of the workloads that only create files
        # runs before any file of this run is deleted (their directories are kept
        # until then). On ext4 without a journal, deletes leave block groups where
        # the next creates cost ten times as much for minutes (see
        # docs/benchmarks.md), which would swamp the libraries' own costs.
        # Within each phase, repetitions are outermost and the peers rotate, so a
        # slow spell of the machine or the kernel does not fall on one peer only.
        phases = [[wl for wl in WORKLOADS if wl in CREATE_ONLY], [wl for wl in WORKLOADS if wl not in CREATE_ONLY]]
        for phase in phases:
            kept: list[str] = []
            for rep in range(0 if args.depths_only else args.repeat):
                for wl in phase:
                    order = args.peers[rep % len(args.peers):] + args.peers[: rep % len(args.peers)]
                    for peer in order:
                        rec = table[peer][wl]
                        if "skip" in rec:
                            continue
                        progress(f"rep {rep + 1}/{args.repeat}: {LABELS[peer]}: {WL_LABELS[wl]}")
                        serial += 1
                        path = os.path.join(scratch, f"{serial:04d}-{peer}-{wl}", "q")
                        os.makedirs(os.path.dirname(path))
                        try:
                            if wl == "multiprocess":
                                r = run_multiprocess(peer, path, args, scratch)
                                mps.setdefault(peer, []).append(r)
                                if "wall" not in r:
                                    raise Failed("; ".join(r["errors"]) or "no message received")
                            else:
                                count = args.durable_count if wl == "publish_durable" else args.count
                                r = run_worker(peer, wl, path, args, count=count, tag="m")
                            walls.setdefault((peer, wl), []).append(r["wall"] / r["count"])
                            cpus.setdefault((peer, wl), []).append(r["cpu"] / r["count"])
                        except Failed as exc:
                            rec["skip"] = f"failed: {exc}"
                        except Exception as exc:  # noqa: BLE001 -- a peer's surprise must not end the run
                            rec["skip"] = f"failed: {type(exc).__name__}: {exc}"
                        if wl in CREATE_ONLY:
                            kept.append(os.path.dirname(path))
                        else:
                            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            for directory in kept:
                shutil.rmtree(directory, ignore_errors=True)
        depth_rows = run_depths(args, scratch, unavailable)
        for peer in args.peers:
            for wl in WORKLOADS:
                rec = table[peer][wl]
                if (peer, wl) in walls and "skip" not in rec:
                    rec["wall_us"] = statistics.median(walls[peer, wl]) * 1e6
                    rec["cpu_us"] = statistics.median(cpus[peer, wl]) * 1e6
                    rec["rate"] = 1e6 / rec["wall_us"]
                    rec["reps"] = len(walls[peer, wl])
                    rec["wall_us_reps"] = [round(x * 1e6, 1) for x in walls[peer, wl]]
                    rec["cpu_us_reps"] = [round(x * 1e6, 1) for x in cpus[peer, wl]]
                if wl == "multiprocess" and peer in mps:
                    mp = mps[peer]
                    rec["mp_runs"] = mp
                    rec["lost"] = [r["lost"] for r in mp]
                    rec["duplicates"] = [r["duplicates"] for r in mp]
                    rec["errors"] = sorted({e for r in mp for e in r["errors"]})
                    if all("races" in r and r.get("count") for r in mp):
                        rec["races"] = [{k: round(v / r["count"], 3) for k, v in r["races"].items()} for r in mp]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(parent)
    return {"installed": installed, "unavailable": unavailable, "table": table, "depths": depth_rows,
            "seconds": time.perf_counter() - started}


def listing_window() -> int:
    """How many names a vsqs handle keeps of one listing (0 if this vsqs has no window)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from vsqs._core import listing as _listing

    return int(getattr(_listing, "WINDOW", 0))


def run_depths(args: argparse.Namespace, scratch: str, unavailable: dict[str, str]) -> dict[str, Any]:
    """receive+delete on a fresh handle over a queue filled to each depth, for
    the peers that take part (vsqs and dirq). The first listing and warm-up
    receives are timed apart; the timed loop covers at least 2.5 vsqs listing
    windows where the depth exceeds one, so vsqs's re-listings are counted."""
    peers = [p for p in DEPTH_PEERS if p in args.peers and NEEDS.get(p) not in unavailable]
    window = listing_window()
    rows: dict[str, Any] = {}
    for depth in args.depths:
        timed = min(depth, args.depth_count)
        if window and depth > window:
            timed = min(depth, max(timed, window * 5 // 2))
        reps = args.repeat if depth <= 100_000 else 1
        timeout = WORKER_TIMEOUT + depth * 0.0006 + timed * 0.0006
        row: dict[str, Any] = {"timed": timed, "warmup": DEPTH_WARMUP}
        rows[str(depth)] = row
        for rep in range(reps):
            order = peers[rep % len(peers):] + peers[: rep % len(peers)] if peers else []
            for peer in order:
                rec = row.setdefault(peer, {"runs": []})
                if "skip" in rec:
                    continue
                progress(f"depth {depth:,}, rep {rep + 1}/{reps}: {LABELS[peer]}: fill {depth + DEPTH_WARMUP:,}, "
                         f"time {timed:,}")
                path = os.path.join(scratch, f"depth-{depth}-{peer}-{rep}", "q")
                os.makedirs(os.path.dirname(path))
                try:
                    rec["runs"].append(run_worker(peer, "receive_depth", path, args, timeout=timeout,
                                                  count=depth + DEPTH_WARMUP, timed=timed, warmup=DEPTH_WARMUP))
                except Failed as exc:
                    rec["skip"] = f"failed: {exc}"
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
        for peer in peers:
            rec = row.get(peer, {})
            runs = rec.get("runs", [])
            if runs and "skip" not in rec:
                rec["cpu_us"] = statistics.median(r["cpu"] / r["count"] for r in runs) * 1e6
                rec["wall_us"] = statistics.median(r["wall"] / r["count"] for r in runs) * 1e6
                rec["rate"] = 1e6 / rec["wall_us"]
                rec["warmup_ms"] = statistics.median(r["warmup_wall"] for r in runs) * 1e3
                rec["rss_mb"] = statistics.median(r["rss_mb"] for r in runs)
    return rows


def print_report(doc: dict[str, Any], args: argparse.Namespace) -> None:
    table = doc["table"]
    sys.path.insert(0, HERE)
    import _report  # the environment helpers

    print("vsqs against its peers")
    print(f"  python      {platform.python_version()} ({sys.executable}); peers in {VENV}")
    print("  peers       " + ", ".join(f"{k} {v}" for k, v in doc["installed"].items()))
    for k, v in doc["unavailable"].items():
        print(f"  unavailable {k}: {v}")
    fs = _report.mount_of(args.dir)
    if fs:
        print(f"  filesystem  {fs['type']} on {fs['device']} at {fs['mount_point']}"
              + {"no": ", no journal", "yes": ", journal"}.get(fs.get("journal", ""), ""))
    print(f"  cpus        {os.cpu_count()}, {_report.cpu_model()}")
    print(f"  counts      publish and receive+delete {args.count}, durable publish {args.durable_count}, "
          f"multi-process {args.mp_count} ({args.mp_count // 2} per producer); "
          f"{args.repeat} repetition(s), medians; {args.body_size} byte bodies")
    print()
    w = max(len(LABELS[p]) for p in table)
    print(f"{'peer':<{w}}  {'workload':<26} {'msgs/s':>9} {'CPU us/msg':>10}  notes")
    print("-" * (w + 62))
    for peer, rows in table.items():
        if args.depths_only:
            break
        for wl in WORKLOADS:
            rec = rows[wl]
            if "skip" in rec:
                print(f"{LABELS[peer]:<{w}}  {WL_LABELS[wl]:<26} {rec['skip']}")
                continue
            if "rate" not in rec:
                continue  # not run (--depths-only)
            note = mp_note(rec) if wl == "multiprocess" else ""
            print(f"{LABELS[peer]:<{w}}  {WL_LABELS[wl]:<26} {rec['rate']:>9,.0f} {rec['cpu_us']:>10.1f}  {note}")
        print()
    for peer, rows in table.items():  # failed multi-process runs still have counts
        rec = rows.get("multiprocess", {})
        if "skip" in rec and rec.get("mp_runs"):
            r = rec["mp_runs"]
            print(f"{LABELS[peer]} multi-process: lost {[x['lost'] for x in r]}, duplicated "
                  f"{[x['duplicates'] for x in r]}, published {[x['published'] for x in r]}")
    depths = doc.get("depths", {})
    if depths:
        print("receive+delete on a deep queue (fresh handle; the first listing and "
              f"{DEPTH_WARMUP} receives are timed apart, as 'first')")
        print(f"{'peer':<{w}}  {'depth':>9} {'timed':>8} {'msgs/s':>9} {'CPU us/msg':>10} {'first':>9} "
              f"{'RSS':>8}")
        print("-" * (w + 62))
        for depth, row in depths.items():
            for peer in DEPTH_PEERS:
                rec = row.get(peer)
                if rec is None:
                    continue
                if "skip" in rec:
                    print(f"{LABELS[peer]:<{w}}  {int(depth):>9,} {rec['skip']}")
                    continue
                print(f"{LABELS[peer]:<{w}}  {int(depth):>9,} {row['timed']:>8,} {rec['rate']:>9,.0f} "
                      f"{rec['cpu_us']:>10.1f} {rec['warmup_ms']:>6.0f} ms {rec['rss_mb']:>+5.1f} MB")
        print("RSS: the worker's resident memory after the timed loop, less before the handle was opened.")
        print()
    print("vsqs / dirq QueueSimple (throughput ratio; > 1 means vsqs is faster)")
    for label, wall, cpu in ratio_rows(doc, args):
        print(f"  {label:<26} -" if wall == "-" else f"  {label:<26} wall {wall:>6}   CPU {cpu:>6}")
    print()
    print(f"total time {doc['seconds']:.0f} s")


def mp_note(rec: dict[str, Any]) -> str:
    note = (f"lost {'/'.join(map(str, rec['lost']))}, "
            f"duplicated {'/'.join(map(str, rec['duplicates']))} (per repetition)")
    if rec["errors"]:
        note += "; errors: " + "; ".join(rec["errors"])
    if rec.get("races"):
        note += ("; per message: lost claims " + "/".join(str(x["lost"]) for x in rec["races"])
                 + ", listings " + "/".join(str(x["listings"]) for x in rec["races"]))
    return note


def ratio_rows(doc: dict[str, Any], args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(workload, wall ratio, CPU ratio) of vsqs against dirq; > 1 means vsqs is faster."""
    table, out = doc["table"], []
    mine, theirs = table.get("vsqs", {}), table.get("dirq", {})
    for wl in WORKLOADS:
        a, b = mine.get(wl, {}), theirs.get(wl, {})
        if "rate" in a and "rate" in b:
            out.append((WL_LABELS[wl], f"{a['rate'] / b['rate']:.2f}x", f"{b['cpu_us'] / a['cpu_us']:.2f}x"))
        elif not args.depths_only:
            out.append((WL_LABELS[wl], "-", "-"))
    for depth, row in doc.get("depths", {}).items():
        a, b = row.get("vsqs", {}), row.get("dirq", {})
        if "rate" in a and "rate" in b:
            out.append((f"receive+delete at {int(depth):,}", f"{a['rate'] / b['rate']:.2f}x",
                        f"{b['cpu_us'] / a['cpu_us']:.2f}x"))
    return out


def markdown(doc: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """The report's tables as markdown, after a line saying where they come from."""
    import _report

    blocks = []
    extra = (f"publish and receive+delete {args.count:,} messages, durable publish {args.durable_count:,}, "
             f"multi-process {args.mp_count:,}; {args.repeat} repetition(s), medians; "
             + ", ".join(f"{k} {v}" for k, v in doc["installed"].items()))
    blocks.append(_report.provenance(REPO, args.dir, extra))
    rows = []
    for peer, recs in ([] if args.depths_only else doc["table"].items()):
        for wl in WORKLOADS:
            rec = recs[wl]
            if "skip" in rec:
                rows.append([LABELS[peer], WL_LABELS[wl], "", "", rec["skip"]])
            elif "rate" in rec:
                note = mp_note(rec) if wl == "multiprocess" else ""
                rows.append([LABELS[peer], WL_LABELS[wl], f"{rec['rate']:,.0f}", f"{rec['cpu_us']:.1f}", note])
    if rows:
        blocks.append(_report.table(["peer", "workload", "msgs/s", "CPU µs/msg", "notes"], rows, right=(2, 3)))
    rows = []
    for depth, row in doc.get("depths", {}).items():
        for peer in DEPTH_PEERS:
            rec = row.get(peer)
            if rec is None:
                continue
            if "skip" in rec:
                rows.append([LABELS[peer], f"{int(depth):,}", "", "", "", "", rec["skip"]])
            elif "rate" in rec:
                rows.append([LABELS[peer], f"{int(depth):,}", f"{row['timed']:,}", f"{rec['rate']:,.0f}",
                             f"{rec['cpu_us']:.1f}", f"{rec['warmup_ms']:.0f}", f"{rec['rss_mb']:+.1f}"])
    if rows:
        blocks.append(_report.table(["peer (receive+delete, fresh handle)", "depth", "timed", "msgs/s",
                                     "CPU µs/msg", "first ms", "RSS MB"], rows, right=(1, 2, 3, 4, 5, 6)))
    ratios = ratio_rows(doc, args)
    if ratios:
        blocks.append(_report.table(["vsqs / dirq QueueSimple (> 1: vsqs faster)", "wall", "CPU"], ratios,
                                    right=(1, 2)))
    return blocks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Benchmark vsqs against its peers on the same disk.")
    p.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench"),
                   help="make the scratch directory under this one (default: ./.bench)")
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    p.add_argument("--markdown", nargs="?", const="-", metavar="PATH",
                   help="also print the results as markdown tables, with a line naming the command, commit, "
                        "date and machine (to PATH, or to stdout after the usual output)")
    p.add_argument("--body-size", type=int, default=100, metavar="BYTES")
    p.add_argument("--count", type=int, metavar="N", help="messages for publish and receive+delete (2000)")
    p.add_argument("--durable-count", type=int, metavar="N", help="messages for durable publish (300)")
    p.add_argument("--mp-count", type=int, metavar="N", help="messages in the multi-process run (2000)")
    p.add_argument("--repeat", type=int, metavar="N", help="repetitions (3)")
    p.add_argument("--only", metavar="PEER,...", help="run only these peers: " + ", ".join(PEERS))
    p.add_argument("--depths", metavar="D,...",
                   help="queue depths for receive+delete on a deep queue, vsqs and dirq "
                        "(1000,100000; '' for none; add 1000000 for the long run)")
    p.add_argument("--depth-count", type=int, metavar="N",
                   help="receive+deletes timed per depth: min(depth, N) (10000), at least 2.5 "
                        "vsqs listing windows where the depth exceeds one")
    p.add_argument("--depths-only", action="store_true", help="run the depth runs only")
    p.add_argument("--count-races", action="store_true",
                   help="multi-process run: vsqs's consumers count the claims they lose to each other "
                        "and their listings, shown per message received (adds a Python call to each)")
    args = p.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.peers = args.only.split(",") if args.only else list(PEERS)
    args.depths = [int(d) for d in args.depths.replace("_", "").split(",") if d.strip()]
    for peer in args.peers:
        if peer not in PEERS:
            p.error(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = run(args)
    print_report(doc, args)
    if args.markdown:
        import _report

        _report.emit(markdown(doc, args), args.markdown)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"config": {k: v for k, v in vars(args).items() if k != "json"}, **doc}, f, indent=2)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2:]))
    sys.exit(main())
