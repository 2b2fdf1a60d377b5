"""What the web console's pages cost, against their floor measured in the same run.

    .venv/bin/python scripts/bench_console.py --queues 100 --depth 10000 --deep 1000000

* the overview of QUEUES queues of DEPTH messages each, rendered with fresh
  stats of every queue (the console's 2 s cache off) and from the period's
  sample (as when the console samples, the default), against ``stats()`` of every queue (what ``vsqs stats``
  does for each: the floor the console promises not to exceed);
* a page of 50 messages (with body previews) of one queue of DEEP messages,
  the first page and one deep in the queue (its counts cached: the paging
  alone), against one bare ``os.scandir``
  of its directory (the floor of anything that looks at the queue's names).

The spool is made in a temporary directory (``--spool`` to reuse one: it is
filled only where queues are missing). Pages are fetched in-process through
httpx's ASGI transport, so no network or server process is timed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

import httpx

import vsqs
from vsqs._gateway.app import create_app
from vsqs._gateway.config import GatewayConfig
from vsqs._gateway.console import views


def fill(queue: vsqs.Queue, depth: int) -> None:
    have = queue.stats().total
    while have < depth:
        n = min(10_000, depth - have)
        queue.publish_batch([b"x" * 100] * n, durable=False)
        have += n


def _fastapi(app):
    """The FastAPI app inside the gateway's middleware."""
    while not hasattr(app, "state"):
        app = app.app
    return app


def timed(fn, repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--depth", type=int, default=10_000)
    parser.add_argument("--deep", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spool", default=None)
    args = parser.parse_args()
    root = args.spool or tempfile.mkdtemp(prefix="vsqs-bench-console-")
    spool = vsqs.Spool(root, create=True)
    started = time.perf_counter()
    for i in range(args.queues):
        fill(spool.create_queue(f"q{i:03d}"), args.depth)
    deep = spool.create_queue("deep") if args.deep else None
    if deep is not None:
        fill(deep, args.deep)
    print(f"spool {root}: {args.queues} x {args.depth} + {args.deep} messages, made in "
          f"{time.perf_counter() - started:.0f} s")

    names = spool.queues()  # every queue the overview shows (the deep one too)

    async def pages() -> tuple[float, float, float]:
        views.StatsCache.__init__.__defaults__ = (0.0,)  # every render takes fresh stats: the cold cost
        app = create_app(GatewayConfig(spool=root, gc_interval=0))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://127.0.0.1") as client:
            await client.get("/ui")  # the templates compile once per process
            overview, floors = [], []
            for _ in range(args.repeat):  # the floor and the page in turns: the machine's load hits both alike
                floors.append(timed(lambda: [spool.queue(name).stats() for name in names], 1))
                start = time.perf_counter()
                answer = await client.get("/ui")
                overview.append(time.perf_counter() - start)
                assert answer.status_code == 200 and answer.text.count("<tr data-queue=") >= args.queues
            console = _fastapi(app).state.console
            console.history.started = 0  # (this bench's sample is taken after its start)
            assert console.sample(), "another process sampled this period"  # what the sampler does once a period
            sampled = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                answer = await client.get("/ui")
                sampled.append(time.perf_counter() - start)
                assert answer.status_code == 200 and answer.text.count("<tr data-queue=") >= args.queues
            first = deepest = 0.0
            if deep is not None:
                console.cache._ttl = 3600.0  # the deep queue's counts once: the pages below time the paging
                await client.get("/ui/queues/deep")
                runs = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    answer = await client.get("/ui/queues/deep")
                    runs.append(time.perf_counter() - start)
                    assert answer.text.count("<tr data-message=") == 50
                first = statistics.median(runs)
                middle = list(deep.messages(limit=10_000))[-1].id  # 10,000 in
                runs = []
                for _ in range(args.repeat):
                    start = time.perf_counter()
                    answer = await client.get("/ui/queues/deep", params={"after": middle})
                    runs.append(time.perf_counter() - start)
                    assert answer.text.count("<tr data-message=") == 50
                deepest = statistics.median(runs)
            return statistics.median(floors), statistics.median(overview), statistics.median(sampled), first, deepest

    floor, overview, sampled, first, deepest = asyncio.run(pages())
    print(f"overview of {args.queues} queues x {args.depth}: {overview * 1000:.0f} ms taking stats() of each, "
          f"{sampled * 1000:.0f} ms from the period's sample; stats() of each (the floor): {floor * 1000:.0f} ms; "
          f"ratios {overview / floor:.2f}, {sampled / floor:.3f}")
    if deep is not None:
        scan = timed(lambda: sum(1 for _ in os.scandir(deep.path)), args.repeat)
        print(f"queue page of {args.deep} messages: first page {first * 1000:.0f} ms, a page 10,000 in "
              f"{deepest * 1000:.0f} ms; one bare scandir (the floor): {scan * 1000:.0f} ms; "
              f"ratios {first / scan:.2f}, {deepest / scan:.2f}")


if __name__ == "__main__":
    main()
