#!/usr/bin/env python3
"""Load the HTTP gateway with N concurrent clients on loopback, beside the
library called directly on the same spool, and print throughput and latency
percentiles.

    .venv/bin/python scripts/bench_gateway.py                  # the run in docs/benchmarks.md (~2 min)
    .venv/bin/python scripts/bench_gateway.py --quick          # a smoke run, a few seconds
    .venv/bin/python scripts/bench_gateway.py --clients 1,8 --workers 2

Each row is one workload at one concurrency: ``--messages`` messages split
between the clients. The clients are asyncio tasks on one httpx connection
pool each (keep-alive), so the client process costs little; but on a small
machine it shares the cores with the gateway, and the figures say so. The
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
* ``sqs send``/``sqs receive+delete x10``: the same through the SQS face
  (``AmazonSQS.SendMessage``; ``ReceiveMessage`` for 10 then
  ``DeleteMessageBatch``), with raw HTTP rather than boto3 so the client's
  cost stays small (the gateway runs without credentials here).

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
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import vsqs
from tests.gateway_server import running_gateway

BODY = b"x" * 100


@dataclass
class Row:
    workload: str
    via: str
    clients: int
    messages: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.messages / self.seconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


# -- through the gateway ----------------------------------------------------------


async def _drive(clients: int, requests: int, one: Callable[[httpx.AsyncClient], Awaitable[None]],
                 url: str) -> tuple[float, list[float]]:
    """Run ``requests`` calls of ``one`` spread over ``clients`` concurrent tasks."""
    latencies: list[float] = []
    left = requests
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                started = time.perf_counter()
                await one(http)
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return time.perf_counter() - started, latencies


def _check(answer: httpx.Response, *statuses: int) -> httpx.Response:
    if answer.status_code not in statuses:
        raise RuntimeError(f"{answer.request.method} {answer.request.url}: {answer.status_code} {answer.text[:300]}")
    return answer


async def publish_one(http: httpx.AsyncClient) -> None:
    _check(await http.post("/queues/q/messages", content=BODY), 201)


async def publish_ten(http: httpx.AsyncClient) -> None:
    doc = {"messages": [{"body": BODY.decode()}] * 10}
    _check(await http.post("/queues/q/messages/batch", json=doc), 201)


async def consume_one(http: httpx.AsyncClient) -> None:
    got = _check(await http.get("/queues/q/messages"), 200)
    _check(await http.delete(f"/queues/q/messages/{got.headers['Message-Receipt']}"), 204)


async def consume_ten(http: httpx.AsyncClient) -> None:
    got = _check(await http.post("/queues/q/messages/receive", json={"max_messages": 10}), 200)
    receipts = [m["receipt"] for m in got.json()["messages"]]
    if receipts:
        _check(await http.post("/queues/q/messages/delete", json={"receipts": receipts}), 200)


QUEUE_URL = ["http://127.0.0.1/000000000000/q"]  # set to the gateway's own once it runs


def _sqs(action: str, doc: dict[str, object]) -> dict[str, object]:
    doc = {"QueueUrl": QUEUE_URL[0], **doc}
    return {"headers": {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
            "content": json.dumps(doc).encode()}


async def sqs_send(http: httpx.AsyncClient) -> None:
    _check(await http.post("/", **_sqs("SendMessage", {"MessageBody": BODY.decode()})), 200)


async def sqs_receive_ten(http: httpx.AsyncClient) -> None:
    got = _check(await http.post("/", **_sqs("ReceiveMessage", {"MaxNumberOfMessages": 10})),
                 200).json()
    entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got.get("Messages", []))]
    if entries:
        _check(await http.post("/", **_sqs("DeleteMessageBatch", {"Entries": entries})), 200)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16,64", help="concurrencies to try, comma-separated")
    parser.add_argument("--messages", type=int, default=4000, help="messages per row")
    parser.add_argument("--workers", type=int, default=1, help="gateway worker processes")
    parser.add_argument("--dir", default=".bench", help="where the spool goes (removed at the end)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1,4 clients, 400 messages")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.messages = "1,4", 400
    concurrencies = [int(c) for c in args.clients.split(",")]
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="gateway-", dir=args.dir)
    spool = vsqs.Spool(root)
    queue = spool.create_queue("q")
    rows: list[Row] = []
    print(f"vsqs {vsqs.__version__}, Python {platform.python_version()}, {platform.system()} "
          f"{platform.release()}, {os.cpu_count()} cores; spool on {os.path.abspath(root)}")
    print(f"gateway: vsqs serve --workers {args.workers}, loopback; {args.messages} messages of "
          f"{len(BODY)} bytes per row; durable publishes\n")
    try:
        with running_gateway(root, "--workers", str(args.workers), log_dir=args.dir) as server:
            QUEUE_URL[0] = f"{server.url}/000000000000/q"
            http_workloads: list[tuple[str, Callable[[httpx.AsyncClient], Awaitable[None]], int]] = [
                ("publish", publish_one, 1), ("publish x10", publish_ten, 10),
                ("consume", consume_one, 1), ("consume x10", consume_ten, 10),
                ("sqs send", sqs_send, 1), ("sqs receive+delete x10", sqs_receive_ten, 10),
            ]
            direct = library_workloads(queue)
            for clients in concurrencies:
                for name, one, per_request in http_workloads:
                    requests = args.messages // per_request
                    seconds, latencies = asyncio.run(_drive(clients, requests, one, server.url))
                    rows.append(Row(name, "gateway", clients, requests * per_request, seconds, latencies))
                    _print(rows[-1])
                    if name in direct:
                        seconds, latencies = _threads(clients, requests, direct[name])
                        rows.append(Row(name, "library", clients, requests * per_request, seconds, latencies))
                        _print(rows[-1])
                if queue.stats().total:
                    queue.purge()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print("\nratios, gateway / library (msg/s), same run:")
    for clients in concurrencies:
        parts = []
        for name in ("publish", "publish x10", "consume", "consume x10"):
            g = next(r for r in rows if r.workload == name and r.via == "gateway" and r.clients == clients)
            lib = next(r for r in rows if r.workload == name and r.via == "library" and r.clients == clients)
            parts.append(f"{name} {g.rate / lib.rate:.2f}")
        print(f"  {clients:>3} clients: " + ", ".join(parts))
    if args.json:
        print(json.dumps([{**r.__dict__, "latencies": None, "rate": r.rate, "p50_ms": r.percentile(50),
                           "p95_ms": r.percentile(95), "p99_ms": r.percentile(99)} for r in rows]))


def _print(row: Row) -> None:
    print(f"{row.workload:<24} {row.via:<8} {row.clients:>3} clients {row.rate:>8.0f} msg/s   "
          f"p50 {row.percentile(50):6.2f} ms  p95 {row.percentile(95):6.2f} ms  p99 {row.percentile(99):6.2f} ms  "
          f"({statistics.fmean(row.latencies) * 1000:.2f} ms mean)", flush=True)


if __name__ == "__main__":
    main()
