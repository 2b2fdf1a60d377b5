#!/usr/bin/env python3
"""The streaming read's executor side, outside Spark, against the bare system calls.

Run from the repository root, with the project installed in .venv::

    .venv/bin/python scripts/bench_stream_executor.py                  # 50,000 messages, 3 rounds
    .venv/bin/python scripts/bench_stream_executor.py --dir /dev/shm   # without the disk's costs
    .venv/bin/python scripts/bench_stream_executor.py --markdown       # also as a table

What a Spark executor does for the ``vsqs`` stream, driven directly (no JVM,
no Python worker, one process): micro-batches of ``--per-trigger`` messages,
each split into partitions of ``--per-partition`` (the source's defaults),
each partition a fresh queue handle that claims its share in chunks (its
share of the queue first, as in Spark), records them in its manifest and
builds Arrow record batches (``vsqs._spark.claims.read_partition``), after
deleting the previous batch's partition (its settle list). Measured: CPU
seconds of the process (user and system) a message. ``--depth`` takes the
messages from a deeper queue (each partition lists all of it), ``--shards``
from a queue with shards.

Beside it, in the same run and directory, **the bare limit**: the same files
handled by a loop of the system calls the design needs a message (a listing
a partition, ``rename`` to claim, ``open``/``read``/``read``/``close``,
``unlink``), with nothing else. The ratio is what vsqs and Spark's data-source
shapes cost on top of the filesystem.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import _report

import vsqs
from vsqs._spark import manifest as manifests
from vsqs._spark.claims import StreamPartition, read_partition
from vsqs._spark.options import Options
from vsqs._spark.source import VsqsDataSource
from vsqs._spark.stream import MIN_CLAIM_PARTITIONS


def cpu() -> tuple[float, float]:
    times = os.times()
    return times.user, times.system


def executor_side(directory: str, count: int, per_trigger: int, per_partition: int, body: bytes,
                  depth: int = 0, shards: int = 1) -> tuple[float, float]:
    """User and system CPU seconds a message of the stream's executor work:
    ``count`` messages taken from a queue ``max(depth, count)`` deep."""
    path = os.path.join(directory, f"stream-{time.monotonic_ns()}")
    queue = vsqs.Queue(path, create=True, shards=shards if shards > 1 else None)
    depth = max(depth, count)
    for start in range(0, depth, 10_000):
        queue.publish_batch([body] * min(10_000, depth - start), durable=False)
    options = Options.parse({"path": path})
    schema = VsqsDataSource({"path": path}).schema()
    query = manifests.new_query_id()
    rows = 0
    previous_parts = 0
    seq = 0
    user, system = cpu()
    while rows < count or previous_parts:
        seq += 1
        take = min(per_trigger, count - rows)
        parts = min(take, max(MIN_CLAIM_PARTITIONS, -(-take // per_partition))) if take else previous_parts
        share, extra = divmod(take, parts)
        for index in range(parts):
            settle = [(seq - 1, i) for i in range(index, previous_parts, parts)]
            partition = StreamPartition(query, seq, index, share + (index < extra), settle, False, parts)
            rows += sum(batch.num_rows for batch in read_partition(options, schema, partition))
        previous_parts = parts if take else 0
    used_user, used_system = cpu()
    left = queue.stats().total
    assert rows == count and left == depth - count, (rows, count, left)
    shutil.rmtree(path)
    return (used_user - user) / count, (used_system - system) / count


def bare_limit(directory: str, count: int, per_partition: int, body: bytes, depth: int = 0) -> tuple[float, float]:
    """User and system CPU seconds a message of the bare system calls (``count``
    messages of a directory ``max(depth, count)`` deep; one directory: no shards)."""
    path = os.path.join(directory, f"bare-{time.monotonic_ns()}")
    os.mkdir(path)
    names = [f"{index:020d}" for index in range(max(depth, count))]
    for name in names:
        fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, body)
        os.close(fd)
    at = os.open(path, os.O_RDONLY)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    user, system = cpu()
    for start in range(0, count, per_partition):
        os.listdir(at)
        for name in names[start : min(count, start + per_partition)]:
            os.rename(name, name + ".h", src_dir_fd=at, dst_dir_fd=at)
            fd = os.open(name + ".h", flags, dir_fd=at)
            os.read(fd, 65536)
            os.read(fd, 65536)
            os.close(fd)
        for name in names[start : min(count, start + per_partition)]:
            os.unlink(name + ".h", dir_fd=at)
    used_user, used_system = cpu()
    os.close(at)
    shutil.rmtree(path)
    return (used_user - user) / count, (used_system - system) / count


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--per-trigger", type=int, default=20_000, help="messages a micro-batch (the source's default)")
    p.add_argument("--per-partition", type=int, default=5_000, help="messages a partition (the source's default)")
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--depth", type=int, default=0,
                   help="messages in the queue at the start (default: --messages): a stream taking "
                        "--messages from a deeper queue")
    p.add_argument("--shards", type=int, default=1, help="the queue's shards (the bare loop: one directory)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", help="where to make the queues (default: a temporary directory)")
    _report.add_markdown_option(p)
    a = p.parse_args()
    body = b"x" * a.body_size
    directory = tempfile.mkdtemp(prefix="vsqs-bench-executor-", dir=a.dir)
    rows = []
    try:
        for run in range(1, a.repeat + 1):
            stream = executor_side(directory, a.messages, a.per_trigger, a.per_partition, body, a.depth, a.shards)
            bare = bare_limit(directory, a.messages, a.per_partition, body, a.depth)
            rows.append((run, stream, bare))
            print(f"run {run}: executor side {sum(stream) * 1e6:.1f} µs/msg (user {stream[0] * 1e6:.1f}, "
                  f"system {stream[1] * 1e6:.1f}); bare system calls {sum(bare) * 1e6:.1f} µs/msg "
                  f"(user {bare[0] * 1e6:.1f}, system {bare[1] * 1e6:.1f}); "
                  f"{sum(stream) / sum(bare):.2f}x the bare limit", flush=True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    median = statistics.median(sum(stream) for _, stream, _ in rows)
    print(f"median: executor side {median * 1e6:.1f} µs/msg of CPU")
    if a.markdown is not None:
        table = _report.table(
            ["run", "executor side µs/msg (user + system)", "bare system calls µs/msg", "executor / bare"],
            [(run, f"{sum(s) * 1e6:.1f} ({s[0] * 1e6:.1f} + {s[1] * 1e6:.1f})",
              f"{sum(b) * 1e6:.1f} ({b[0] * 1e6:.1f} + {b[1] * 1e6:.1f})", f"{sum(s) / sum(b):.2f}")
             for run, s, b in rows],
            right=(1, 2, 3),
        )
        extra = (f"{a.messages:,} messages of {a.body_size} B from a queue {max(a.depth, a.messages):,} deep"
                 f"{f' ({a.shards} shards)' if a.shards > 1 else ''}, {a.per_trigger:,} a micro-batch, "
                 f"{a.per_partition:,} a partition; one process")
        _report.emit([_report.provenance(str(ROOT), directory, extra), table], a.markdown)


if __name__ == "__main__":
    main()
