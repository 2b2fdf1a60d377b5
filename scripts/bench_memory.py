#!/usr/bin/env python3
"""Memory of one queue handle on a deep queue, and what its receives cost.

Fills a fresh queue to ``--depth`` messages (non-durable ``publish_batch``,
untimed), then in a fresh process state opens one handle and:

* times its first receive+delete (it lists the whole directory);
* reports the handle's resident memory (RSS, from /proc/self/statm) and,
  with ``--tracemalloc``, the Python memory traced since just before the
  handle was opened (current and peak: the peak is the listing itself);
* times ``--count`` more receive+deletes and counts the listings among them.

The queue directory is removed at the end with one ``shutil.rmtree``.

    .venv/bin/python scripts/bench_memory.py --depth 1000000 --count 250000
    .venv/bin/python scripts/bench_memory.py --depth 1000000 --count 1000 --tracemalloc
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's vsqs

import vsqs
from vsqs._core import queue as _queue


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench"), help="parent of the scratch queue")
    p.add_argument("--depth", type=int, default=1_000_000)
    p.add_argument("--count", type=int, default=10_000, help="receive+deletes timed after the first")
    p.add_argument("--window", type=int, help=f"listing window of the handle ({_queue._LISTING_WINDOW})")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (slower)")
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="memory-", dir=args.dir)
    try:
        path = os.path.join(root, "q")
        filler = vsqs.Queue(path, create=True)
        started = time.perf_counter()
        for start in range(0, args.depth, 10_000):
            filler.publish_batch([b"x" * 100] * min(10_000, args.depth - start), durable=False)
        print(f"filled {args.depth:,} messages in {time.perf_counter() - started:.0f} s")
        del filler
        base = rss_mb()
        if args.tracemalloc:
            tracemalloc.start()
        q = vsqs.Queue(path)
        if args.window:
            q._window = args.window
        cpu0, wall0 = time.process_time(), time.perf_counter()
        q.receive().delete()
        print(f"first receive+delete: {time.perf_counter() - wall0:.3f} s wall, "
              f"{time.process_time() - cpu0:.3f} s CPU; the listing took {q._listing.cost:.3f} s, "
              f"kept {len(q._listing.visible):,} names (window {q._window:,})")
        print(f"RSS after it: {rss_mb():.1f} MB ({rss_mb() - base:+.1f} MB since before the handle); "
              f"peak RSS of the process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
        if args.tracemalloc:
            current, peak = tracemalloc.get_traced_memory()
            print(f"tracemalloc: {current / 2**20:.1f} MB held by the handle, peak {peak / 2**20:.1f} MB "
                  "(the listing)")
        listings = [0]
        relist = q._relist

        def counted(now: int) -> None:
            listings[0] += 1
            relist(now)

        q._relist = counted  # type: ignore[method-assign]
        receive, delete = q.receive, q.delete
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.count):
            delete(receive().receipt)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        print(f"{args.count:,} receive+deletes: {cpu / args.count * 1e6:.1f} us CPU, "
              f"{wall / args.count * 1e6:.1f} us wall per message; {listings[0]} listings among them")
        print(f"RSS after them: {rss_mb():.1f} MB ({rss_mb() - base:+.1f} MB since before the handle)")
        if args.tracemalloc:
            current, peak = tracemalloc.get_traced_memory()
            print(f"tracemalloc: {current / 2**20:.1f} MB held, peak {peak / 2**20:.1f} MB")
    finally:
        started = time.perf_counter()
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed the queue in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
