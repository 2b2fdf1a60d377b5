#!/usr/bin/env python3
"""Load the HTTP gateway with N concurrent clients on loopback, beside its
floor and the library called directly on the same spool, and print
throughput, latency percentiles and the gateway's cost against its floor.

    .venv/bin/python scripts/bench_gateway.py --clients 1,8 --messages 1200   # the runs in docs/benchmarks.md
    .venv/bin/python scripts/bench_gateway.py --quick          # a smoke run, a few seconds
    .venv/bin/python scripts/bench_gateway.py --clients 1,8 --workers 2

The floor (``scripts/_gateway_floor.py``) is a bare ASGI app under the same
server (uvicorn with the gateway's protocol, event loop and options) that
answers the same requests with the same library call in one hop to the
thread pool, and does nothing else. It runs in the same run, on the same
spool, each of its rows right after the gateway's: ``gateway / floor`` is the
gateway's time per message over the floor's, the figure the gateway is held
to (at most 1.3); on a loaded machine it is the figure to trust, not the
rates.

Each row is one workload at one concurrency: ``--messages`` messages split
between the clients. The clients are asyncio tasks, each on its own keep-alive
connection, speaking HTTP/1.1 through a minimal client in this script (httpx
costs about 1 ms of CPU per request, which would measure the client); on a
small machine the client still shares the cores with the gateway. The
library rows run the same workload with the same number of threads calling
``vsqs.Queue`` directly: the gap between the two is what HTTP costs.

Workloads:

* ``publish``: one message per request (raw ``POST /queues/q/messages``);
  library: ``publish(body)``.
* ``publish x10``: ``POST /queues/q/messages/batch`` with 10 messages;
  library: ``publish_batch(10 bodies)``.
* ``consume``: raw ``GET /queues/q/messages`` then ``DELETE`` by receipt;
  library: ``receive()`` then ``delete()``.
* ``consume x10``: ``POST .../receive`` for 10 then ``POST .../delete`` for
  10; library: ``receive_batch(10)`` then ``delete_batch``.
* ``sqs send``, ``sqs send x10``, ``sqs receive+delete``, ``sqs
  receive+delete x10``: the same through the SQS face (``SendMessage``;
  ``SendMessageBatch`` of 10; ``ReceiveMessage`` then ``DeleteMessage``;
  ``ReceiveMessage`` for 10 then ``DeleteMessageBatch``), with raw HTTP
  rather than boto3 so the client's cost stays small (the gateway runs
  without credentials here).

Latency is per request (for the library: per call), in milliseconds.
All publishes are durable (fsync), as the gateway's are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import _report

import vsqs
from tests.gateway.server import free_port, running_gateway

BODY = b"x" * 100


@dataclass
class Row:
    workload: str
    via: str
    clients: int
    messages: int
    seconds: float
    latencies: list[float]
    cpu: float = 0.0  # the server's CPU seconds (all its threads and worker processes) for the row

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    @property
    def cpu_per_message(self) -> float:
        return self.cpu / self.messages

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- through the gateway ----------------------------------------------------------


class Connection:
    """A minimal keep-alive HTTP/1.1 client on one connection. httpx costs about
    1 ms of CPU per request, which on a small machine would measure the client
    rather than the gateway; this costs a few tens of microseconds."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self._reader, self._writer, self._host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, port = url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, f"{host}:{port}")

    async def request(self, method: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self._host}", f"Content-Length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        head = await self._reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        found = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                found[name.strip().lower()] = value.strip()
        content = await self._reader.readexactly(int(found.get("content-length", "0")))
        return int(status_line.split()[1]), found, content

    def close(self) -> None:
        self._writer.close()


async def _drive(clients: int, requests: int, one: Callable[[Connection], Awaitable[None]],
                 url: str) -> tuple[float, list[float]]:
    """Run ``requests`` calls of ``one`` spread over ``clients`` concurrent connections."""
    latencies: list[float] = []
    left = requests
    connections = [await Connection.open(url) for _ in range(clients)]

    async def client(connection: Connection) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            await one(connection)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in connections))
    elapsed = time.perf_counter() - started
    for connection in connections:
        connection.close()
    return elapsed, latencies


def _check(answer: tuple[int, dict[str, str], bytes], *statuses: int) -> tuple[int, dict[str, str], bytes]:
    if answer[0] not in statuses:
        raise RuntimeError(f"answered {answer[0]}: {answer[2][:300]!r}")
    return answer


JSON = {"Content-Type": "application/json"}


async def publish_one(http: Connection) -> None:
    _check(await http.request("POST", "/queues/q/messages", BODY), 201)


async def publish_ten(http: Connection) -> None:
    doc = json.dumps({"messages": [{"body": BODY.decode()}] * 10}).encode()
    _check(await http.request("POST", "/queues/q/messages/batch", doc, JSON), 201)


async def consume_one(http: Connection) -> None:
    _, headers, _ = _check(await http.request("GET", "/queues/q/messages"), 200)
    _check(await http.request("DELETE", f"/queues/q/messages/{headers['message-receipt']}"), 204)


async def consume_ten(http: Connection) -> None:
    got = _check(await http.request("POST", "/queues/q/messages/receive", b'{"max_messages": 10}', JSON), 200)
    receipts = [m["receipt"] for m in json.loads(got[2])["messages"]]
    if receipts:
        doc = json.dumps({"receipts": receipts}).encode()
        _check(await http.request("POST", "/queues/q/messages/delete", doc, JSON), 200)


QUEUE_URL = ["http://127.0.0.1/000000000000/q"]  # set to the gateway's own once it runs


async def _sqs(http: Connection, action: str, doc: dict[str, object]) -> dict[str, object]:
    body = json.dumps({"QueueUrl": QUEUE_URL[0], **doc}).encode()
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}
    answer: dict[str, object] = json.loads(_check(await http.request("POST", "/", body, headers), 200)[2])
    return answer


async def sqs_send(http: Connection) -> None:
    await _sqs(http, "SendMessage", {"MessageBody": BODY.decode()})


async def sqs_send_ten(http: Connection) -> None:
    await _sqs(http, "SendMessageBatch", {"Entries": [{"Id": str(i), "MessageBody": BODY.decode()}
                                                      for i in range(10)]})


async def sqs_receive_one(http: Connection) -> None:
    got = await _sqs(http, "ReceiveMessage", {})
    messages = got.get("Messages", [])
    assert isinstance(messages, list) and messages, "the queue ran dry"
    await _sqs(http, "DeleteMessage", {"ReceiptHandle": messages[0]["ReceiptHandle"]})


async def sqs_receive_ten(http: Connection) -> None:
    got = await _sqs(http, "ReceiveMessage", {"MaxNumberOfMessages": 10})
    messages = got.get("Messages", [])
    assert isinstance(messages, list)
    entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
    if entries:
        await _sqs(http, "DeleteMessageBatch", {"Entries": entries})


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid``, its threads and its child
    processes (``--workers``), from /proc: what a request costs the server,
    whatever else the machine is doing."""
    total = 0.0
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return total
    return total + sum(cpu_seconds(child) for child in children)


# -- the floor ---------------------------------------------------------------------------


@contextmanager
def running_floor(spool: str, log_dir: str) -> Iterator[tuple[str, int]]:
    """``scripts/_gateway_floor.py`` on a free loopback port: its URL and process id."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(os.path.join(log_dir, f"floor-{port}.log"), "wb") as log:
        process = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "_gateway_floor.py"), spool,
                                    str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the floor did not start (see {log.name})")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the library, directly ---------------------------------------------------------------


def _threads(clients: int, requests: int, one: Callable[[], None]) -> tuple[float, list[float]]:
    latencies: list[float] = []
    left = [requests]
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if left[0] <= 0:
                    return
                left[0] -= 1
            started = time.perf_counter()
            one()
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started, latencies


def library_workloads(queue: vsqs.Queue) -> dict[str, Callable[[], None]]:
    def consume_one() -> None:
        m = queue.receive()
        assert m is not None, "the queue ran dry"
        queue.delete(m.receipt)

    def consume_ten() -> None:
        got = queue.receive_batch(10)
        queue.delete_batch([m.receipt for m in got])

    return {
        "publish": lambda: queue.publish(BODY) and None,
        "publish x10": lambda: queue.publish_batch([BODY] * 10) and None,
        "consume": consume_one,
        "consume x10": consume_ten,
    }


# -- the run ------------------------------------------------------------------------------------


WORKLOADS: list[tuple[str, Callable[[Connection], Awaitable[None]], int]] = [
    ("publish", publish_one, 1), ("publish x10", publish_ten, 10),
    ("consume", consume_one, 1), ("consume x10", consume_ten, 10),
    ("sqs send", sqs_send, 1), ("sqs send x10", sqs_send_ten, 10),
    ("sqs receive+delete", sqs_receive_one, 1), ("sqs receive+delete x10", sqs_receive_ten, 10),
]
CONSUMING = frozenset({"consume", "consume x10", "sqs receive+delete", "sqs receive+delete x10"})


def _top_up(queue: vsqs.Queue, count: int) -> None:
    """Make sure ``count`` messages are visible, for a consuming row."""
    missing = count - queue.stats().ready
    while missing > 0:
        queue.publish_batch([BODY] * min(100, missing))
        missing -= 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,8", help="concurrencies to try, comma-separated")
    parser.add_argument("--messages", type=int, default=2000, help="messages per row")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--rounds", type=int, default=3,
                        help="turns the gateway and the floor take at each row, one after the other")
    parser.add_argument("--only", default=None, help="workloads to run, comma-separated (default: all)")
    parser.add_argument("--dir", default=".bench", help="where the spool goes (removed at the end)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,4 clients, 400 messages")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    _report.add_markdown_option(parser)
    args = parser.parse_args()
    if args.quick:
        args.clients, args.messages = "1,4", 400
    concurrencies = [int(c) for c in args.clients.split(",")]
    wanted = set(args.only.split(",")) if args.only else {name for name, _, _ in WORKLOADS}
    workloads = [w for w in WORKLOADS if w[0] in wanted]
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="gateway-", dir=args.dir)
    spool = vsqs.Spool(root)
    queue = spool.create_queue("q")
    rows: list[Row] = []
    print(f"vsqs {vsqs.__version__}, Python {platform.python_version()}, {platform.system()} "
          f"{platform.release()}, {os.cpu_count()} cores; spool on {os.path.abspath(root)}")
    print(f"gateway: vsqs serve --workers {args.workers}, loopback; floor: scripts/_gateway_floor.py; "
          f"{args.messages} messages of {len(BODY)} bytes per row; durable publishes\n")
    try:
        with running_gateway(root, "--workers", str(args.workers), log_dir=args.dir) as server, \
                running_floor(root, args.dir) as (floor_url, floor_pid):
            direct = library_workloads(queue)
            for clients in concurrencies:
                for name, one, per_request in workloads:
                    requests = args.messages // per_request
                    if name in CONSUMING:  # what the gateway, the floor and the library will take
                        _top_up(queue, 3 * requests * per_request)
                    done: dict[str, Row] = {}
                    for _ in range(args.rounds):  # interleaved, so that the machine's load falls on both
                        for via, url, pid in (("gateway", server.url, server.process.pid),
                                              ("floor", floor_url, floor_pid)):
                            QUEUE_URL[0] = f"{url}/000000000000/q"
                            count = requests // args.rounds
                            cpu = cpu_seconds(pid)
                            seconds, latencies = asyncio.run(_drive(clients, count, one, url))
                            row = done.setdefault(via, Row(name, via, clients, 0, 0.0, []))
                            row.cpu += cpu_seconds(pid) - cpu
                            row.messages += count * per_request
                            row.seconds += seconds
                            row.latencies += latencies
                    for row in done.values():
                        rows.append(row)
                        _print(row)
                    if name in direct:
                        seconds, latencies = _threads(clients, requests, direct[name])
                        rows.append(Row(name, "library", clients, requests * per_request, seconds, latencies))
                        _print(rows[-1])
                if queue.stats().total:
                    queue.purge()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\ngateway / floor, same run (server CPU per message; in brackets, wall time per message); "
          "the target is 1.3 at most:")
    for clients in concurrencies:
        parts = [f"{name} {_cpu_ratio(rows, name, clients):.2f} ({_ratio(rows, name, clients, 'floor'):.2f})"
                 for name, _, _ in workloads]
        print(f"  {clients:>3} clients: " + ", ".join(parts))
    if args.markdown:
        extra = (f"vsqs serve --workers {args.workers}, loopback; {args.messages:,} durable messages of "
                 f"{len(BODY)} bytes per row")
        _report.emit([_report.provenance(REPO, args.dir, extra), markdown(rows, concurrencies)], args.markdown)
    if args.json:
        print(json.dumps([{**r.__dict__, "latencies": None, "rate": r.rate, "p50_ms": r.percentile(50),
                           "p95_ms": r.percentile(95), "p99_ms": r.percentile(99)} for r in rows]))


def _row(rows: list[Row], name: str, via: str, clients: int) -> Row | None:
    return next((r for r in rows if r.workload == name and r.via == via and r.clients == clients), None)


def _ratio(rows: list[Row], name: str, clients: int, peer: str) -> float:
    """The gateway's time per message over ``peer``'s (their rates, inverted)."""
    gateway, other = _row(rows, name, "gateway", clients), _row(rows, name, peer, clients)
    return float("nan") if gateway is None or other is None else other.rate / gateway.rate


def _cpu_ratio(rows: list[Row], name: str, clients: int) -> float:
    """The gateway's server CPU per message over the floor's."""
    gateway, floor = _row(rows, name, "gateway", clients), _row(rows, name, "floor", clients)
    if gateway is None or floor is None or not floor.cpu:
        return float("nan")
    return gateway.cpu_per_message / floor.cpu_per_message


MD_LABELS = {
    "publish": "publish, one per request",
    "publish x10": "publish, batches of 10",
    "consume": "receive + delete, one per request (2 requests a message)",
    "consume x10": "receive 10 + delete 10",
    "sqs send": "SQS: SendMessage",
    "sqs send x10": "SQS: SendMessageBatch of 10",
    "sqs receive+delete": "SQS: ReceiveMessage + DeleteMessage",
    "sqs receive+delete x10": "SQS: ReceiveMessage 10 + DeleteMessageBatch",
}


def markdown(rows: list[Row], concurrencies: list[int]) -> str:
    """One line per workload and concurrency: the gateway, its floor and the library, same run."""
    lines = []
    for name, label in MD_LABELS.items():
        for i, clients in enumerate(concurrencies):
            g, floor, lib = (_row(rows, name, via, clients) for via in ("gateway", "floor", "library"))
            if g is None or floor is None:
                continue
            line = [label if i == 0 else "", clients,
                    f"{g.cpu_per_message * 1e6:,.0f}", f"{floor.cpu_per_message * 1e6:,.0f}",
                    f"**{_cpu_ratio(rows, name, clients):.2f}**",
                    f"{g.rate:,.0f}", f"{g.percentile(50):.2f} / {g.percentile(99):.2f}", f"{floor.rate:,.0f}",
                    f"{_ratio(rows, name, clients, 'floor'):.2f}",
                    f"{lib.rate:,.0f}" if lib else ""]
            lines.append(line)
    return _report.table(["workload", "clients", "gateway CPU µs/msg", "floor CPU µs/msg", "gateway / floor (CPU)",
                          "gateway msg/s", "p50 / p99 ms", "floor msg/s", "gateway / floor (wall)", "library msg/s"],
                         lines, right=(1, 2, 3, 4, 5, 7, 8, 9))


def _print(row: Row) -> None:
    cpu = f"{row.cpu_per_message * 1e6:6.0f} µs CPU/msg" if row.via != "library" else " " * 17
    print(f"{row.workload:<24} {row.via:<8} {row.clients:>3} clients {cpu} {row.rate:>8.0f} msg/s   "
          f"p50 {row.percentile(50):6.2f} ms  p95 {row.percentile(95):6.2f} ms  p99 {row.percentile(99):6.2f} ms  "
          f"({statistics.fmean(row.latencies) * 1000:.2f} ms mean)", flush=True)


if __name__ == "__main__":
    main()
