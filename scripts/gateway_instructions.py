#!/usr/bin/env python3
"""User-space instructions per request of the gateway's ASGI app, called in
process (no HTTP server, no client): a figure that does not move with the
machine's load, for changes too small for ``bench_gateway.py`` to see.

    .venv/bin/python scripts/gateway_instructions.py consume               # raw receive + delete
    .venv/bin/python scripts/gateway_instructions.py consume --no-fast-path
    .venv/bin/python scripts/gateway_instructions.py publish|sqs-send|sqs-consume

Each figure is (a run of ``--many`` iterations) minus (a run of ``--few``),
both under ``valgrind --tool=callgrind``, divided by the difference: start-up,
imports and the queue's fill cancel out. An iteration is one message: one
request for the publishes, two (receive, then delete) for the consumes.
``--no-fast-path`` sends the native routes through FastAPI's routes (no hot
routes), to weigh :mod:`vsqs._gateway.rest.hot`.
``--profile`` runs the iterations once under cProfile instead (the event
loop's thread only) and prints the top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import vsqs

BODY = b"x" * 100
SQS = {"content-type": "application/x-amz-json-1.0"}


async def request(app: Any, method: str, path: str, headers: dict[str, str] | None = None,
                  body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request through the ASGI app; (status, headers, body)."""
    head = {"host": "127.0.0.1", "content-length": str(len(body)), **(headers or {})}
    sent: list[dict[str, Any]] = []
    given = False

    async def receive() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.encode(), v.encode()) for k, v in head.items()],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80)}
    await app(scope, receive, send)
    start = sent[0]
    return (start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
            b"".join(m.get("body", b"") for m in sent[1:]))


def workloads(app: Any) -> dict[str, Callable[[], Awaitable[None]]]:
    url = "http://127.0.0.1/000000000000/q"

    async def sqs(action: str, doc: dict[str, Any]) -> dict[str, Any]:
        status, _, body = await request(app, "POST", "/", {**SQS, "x-amz-target": "AmazonSQS." + action},
                                        json.dumps(doc).encode())
        assert status == 200, (status, body)
        answer: dict[str, Any] = json.loads(body)
        return answer

    async def publish() -> None:
        status, _, _ = await request(app, "POST", "/queues/q/messages", {"content-type": "text/plain"}, BODY)
        assert status == 201, status

    async def consume() -> None:
        status, headers, _ = await request(app, "GET", "/queues/q/messages")
        assert status == 200, status
        status, _, _ = await request(app, "DELETE", "/queues/q/messages/" + headers["message-receipt"])
        assert status == 204, status

    async def sqs_send() -> None:
        await sqs("SendMessage", {"QueueUrl": url, "MessageBody": BODY.decode()})

    async def sqs_consume() -> None:
        received = await sqs("ReceiveMessage", {"QueueUrl": url})
        await sqs("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": received["Messages"][0]["ReceiptHandle"]})

    return {"publish": publish, "consume": consume, "sqs-send": sqs_send, "sqs-consume": sqs_consume}


async def run(workload: str, iterations: int, fast_path: bool, profile: bool) -> None:
    """Build the app over a fresh spool and run ``iterations`` of ``workload`` (after a warm-up)."""
    from vsqs._gateway.app import create_app
    from vsqs._gateway.config import GatewayConfig
    from vsqs._gateway.rest import hot

    if not fast_path:
        hot.HOT_ROUTES = frozenset()
    with tempfile.TemporaryDirectory(prefix="vsqs-instructions-") as spool:
        app = create_app(GatewayConfig(spool=spool, gc_interval=0, console_interval=0))
        queue = vsqs.Spool(spool).create_queue("q")
        warm_up = 20
        if workload.endswith("consume"):
            for start in range(0, iterations + warm_up, 100):
                queue.publish_batch([BODY] * min(100, iterations + warm_up - start))
        one = workloads(app)[workload]
        for _ in range(warm_up):
            await one()
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        for _ in range(iterations):
            await one()
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(30)


def instructions(args: argparse.Namespace, iterations: int) -> int:
    """The total Ir of one run of ``iterations`` under callgrind."""
    with tempfile.TemporaryDirectory(prefix="vsqs-callgrind-") as out:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.out", sys.executable,
                   os.path.abspath(__file__), args.workload, "--run", str(iterations)]
        if not args.fast_path:
            command.append("--no-fast-path")
        done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=["publish", "consume", "sqs-send", "sqs-consume"])
    parser.add_argument("--few", type=int, default=50, help="iterations of the shorter run")
    parser.add_argument("--many", type=int, default=250, help="iterations of the longer run")
    parser.add_argument("--no-fast-path", dest="fast_path", action="store_false",
                        help="native routes through FastAPI's full path")
    parser.add_argument("--profile", action="store_true", help="cProfile one run of --many instead")
    parser.add_argument("--run", type=int, default=None, help=argparse.SUPPRESS)  # one run, under callgrind
    args = parser.parse_args()
    if args.run is not None or args.profile:
        asyncio.run(run(args.workload, args.run if args.run is not None else args.many, args.fast_path,
                        args.profile))
        return
    few, many = instructions(args, args.few), instructions(args, args.many)
    label = "" if args.fast_path else " (no fast path)"
    print(f"{args.workload}{label}: {(many - few) / (args.many - args.few):,.0f} instructions per message")


if __name__ == "__main__":
    main()
