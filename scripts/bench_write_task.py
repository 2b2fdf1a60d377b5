#!/usr/bin/env python3
"""A Spark write task's staging alone, without Spark: ``_stage_rows`` of
vsqs._spark.writer (chunks of 1,000 messages into one stage, then the
stage is dropped), with one chunk in flight (as before issue 15's second
part) and with STAGE_IN_FLIGHT chunks, alternating in one process, so each
round's ratio compares the two on the same disk at the same moment. Run
from the repository root::

    .venv/bin/python scripts/bench_write_task.py --count 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import vsqs
from vsqs._spark import writer


def stage_rate(directory: str, chunks: list[list[bytes]], in_flight: int) -> float:
    """Messages a second of one task's staging with ``in_flight`` chunks at once."""
    writer.STAGE_IN_FLIGHT = in_flight
    vsqs.Queue(directory, create=True)
    start = time.perf_counter()
    staged = writer._stage_rows(functools.partial(vsqs.Queue, directory), "spark-bench", chunks)
    seconds = time.perf_counter() - start
    assert staged.rows == sum(len(chunk) for chunk in chunks)
    return staged.rows / seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=5000, help="messages a round (a multiple of 1,000)")
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=os.path.join(REPO, ".bench"))
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    chunks = [[b"m" * args.body_size] * 1000 for _ in range(args.count // 1000)]
    ways = writer.STAGE_IN_FLIGHT
    scratch = tempfile.mkdtemp(prefix="bench-task-", dir=args.dir)
    print(f"{args.count:,} messages of {args.body_size} bytes a round; round, one chunk, {ways} chunks, ratio")
    try:
        for round_ in range(1, args.rounds + 1):
            one = stage_rate(os.path.join(scratch, f"one-{round_}"), chunks, 1)
            many = stage_rate(os.path.join(scratch, f"many-{round_}"), chunks, ways)
            print(f"{round_}  {one:,.0f} msg/s  {many:,.0f} msg/s  {many / one:.2f}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
