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

import _probe
import _report

import vsqs


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench"), help="parent of the scratch queue")
    p.add_argument("--depth", type=int, default=1_000_000)
    p.add_argument("--count", type=int, default=10_000, help="receive+deletes timed after the first")
    p.add_argument("--window", type=int, help=f"listing window of the handle ({_probe.window()})")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python allocations (slower)")
    _report.add_markdown_option(p)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="memory-", dir=args.dir)
    rows: list[tuple[str, str]] = []  # (what was measured, its figure): the markdown table

    def say(text: str, measured: str, figure: str) -> None:
        print(text, flush=True)
        rows.append((measured, figure))

    try:
        path = os.path.join(root, "q")
        filler = vsqs.Queue(path, create=True)
        started = time.perf_counter()
        for start in range(0, args.depth, 10_000):
            filler.publish_batch([b"x" * 100] * min(10_000, args.depth - start), durable=False)
        fill_s = time.perf_counter() - started
        say(f"filled {args.depth:,} messages in {fill_s:.0f} s", "fill (non-durable publish_batch)",
            f"{args.depth:,} messages in {fill_s:.0f} s")
        del filler
        base = rss_mb()
        if args.tracemalloc:
            tracemalloc.start()
        if args.window:
            _probe.set_window(args.window)
        probe = _probe.Probe()
        q = vsqs.Queue(path)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        q.receive().delete()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        listing, kept = probe.cache.cost, len(probe.cache.visible)
        say(f"first receive+delete: {wall:.3f} s wall, {cpu:.3f} s CPU; the listing took {listing:.3f} s, "
            f"kept {kept:,} names (window {probe.cache.window:,})",
            "the first receive+delete (one listing of the whole queue)",
            f"{wall:.3f} s wall, {cpu:.3f} s CPU; the listing {listing:.3f} s; {kept:,} names kept "
            f"(window {probe.cache.window:,})")
        held, peak_rss = rss_mb() - base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        say(f"RSS after it: {rss_mb():.1f} MB ({held:+.1f} MB since before the handle); "
            f"peak RSS of the process {peak_rss:.0f} MB",
            "RSS after it, less before the handle was opened (peak RSS of the process, fill included)",
            f"{held:+.1f} MB ({peak_rss:.0f} MB)")
        if args.tracemalloc:
            current, peak = tracemalloc.get_traced_memory()
            say(f"tracemalloc: {current / 2**20:.1f} MB held by the handle, peak {peak / 2**20:.1f} MB "
                "(the listing)", "Python memory the handle holds after it, and at the listing's peak "
                "(tracemalloc)", f"{current / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB")
        probe.listings = 0
        receive, delete = q.receive, q.delete
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.count):
            delete(receive().receipt)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        say(f"{args.count:,} receive+deletes: {cpu / args.count * 1e6:.1f} us CPU, "
            f"{wall / args.count * 1e6:.1f} us wall per message; {probe.listings} listings among them",
            f"{args.count:,} more receive+deletes, per message",
            f"{cpu / args.count * 1e6:.1f} µs CPU, {wall / args.count * 1e6:.1f} µs wall; "
            f"{probe.listings} listings among them")
        say(f"RSS after them: {rss_mb():.1f} MB ({rss_mb() - base:+.1f} MB since before the handle)",
            "RSS after them, less before the handle was opened", f"{rss_mb() - base:+.1f} MB")
        if args.tracemalloc:
            current, peak = tracemalloc.get_traced_memory()
            say(f"tracemalloc: {current / 2**20:.1f} MB held, peak {peak / 2**20:.1f} MB",
                "Python memory held after them (tracemalloc)", f"{current / 2**20:.1f} MB, peak {peak / 2**20:.1f} MB")
    finally:
        started = time.perf_counter()
        shutil.rmtree(root, ignore_errors=True)
        print(f"removed the queue in {time.perf_counter() - started:.0f} s")
    if args.markdown:
        repo = os.path.dirname(HERE)
        extra = f"one handle, depth {args.depth:,}" + (", with tracemalloc" if args.tracemalloc else "")
        _report.emit([_report.provenance(repo, args.dir, extra),
                      _report.table(["measured", "figure"], rows)], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
