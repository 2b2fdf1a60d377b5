#!/usr/bin/env python3
"""Spark on the NFS cluster: msg/s with one worker and with two, in the same run.

    .venv/bin/python scripts/bench_spark_cluster.py                  # 4,000 messages, 2 rounds
    .venv/bin/python scripts/bench_spark_cluster.py --messages 20000 --markdown

Starts the cluster of tests/spark/cluster.py: nfs-ganesha serving one export,
the driver (this process) with its own NFS client, and two standalone
workers, each in its own mount namespace with its own NFS client mounted at
the same path: three hosts of one export. Needs root, /dev/fuse, java and the
team's netfs kit (``../shared/netfs`` or ``$NETFS_KIT``).

Each round measures, on an application with one executor (one worker's
``--cores``) and then on one with an executor on each worker:

* ``stream``: ``readStream.format("vsqs")`` with ``Trigger.AvailableNow``
  into the ``noop`` sink, ``--per-trigger`` messages a micro-batch (default:
  the source's default), from
  ``start()`` until the query ends (the queue is then empty);
* ``process_queue``: a function that returns nothing, one task per executor
  core, until the tasks stop (they wait ``--wait`` s on an empty queue).

The queue (``--messages`` bodies of ``--body-size`` bytes) is published
beforehand from the driver, untimed; each application runs a warm-up job
first (a small stream and process_queue, untimed), so Python workers are up
and the stream's planning is warm. The ratio two/one is from the same round:
the machine may be shared, so compare ratios, not absolute figures. The
target (issue 15) is two workers at least 1.6x one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import vsqs
import vsqs.spark
from tests.spark.cluster import ClusterUnavailable, NfsCluster, driver_session


def _fill(path: str, count: int, size: int) -> vsqs.Queue:
    queue = vsqs.Queue(path, create=True)
    pad = b"x" * max(0, size - 8)
    for start in range(0, count, 500):
        queue.publish_batch([b"%08d" % i + pad for i in range(start, min(count, start + 500))])
    return queue


def _stream(spark, queue: vsqs.Queue, checkpoint: str, per_trigger: int | None) -> tuple[float, int]:
    """Seconds to drain ``queue`` with the streaming source, and the rows it read."""
    started = time.perf_counter()
    reader = spark.readStream.format("vsqs").option("visibilityTimeout", "600")
    if per_trigger is not None:
        reader = reader.option("maxMessagesPerTrigger", str(per_trigger))
    query = (
        reader.load(queue.path)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return seconds, rows


def _nothing(_body: bytes) -> None:
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=None,
                        help="maxMessagesPerTrigger (default: the source's own default)")
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker (and its executor)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--wait", type=float, default=0.2, help="process_queue: idle seconds before a task stops")
    parser.add_argument("--only", choices=["stream", "process_queue"], default=None)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _report

    _report.add_markdown_option(parser)
    args = parser.parse_args()
    workloads = [args.only] if args.only else ["stream", "process_queue"]

    results: dict[tuple[str, int], list[float]] = {}
    ratios: dict[str, list[float]] = {w: [] for w in workloads}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="vsqs-spark-cluster-") as scratch:
        try:
            cluster = NfsCluster(os.path.join(scratch, "cluster"), workers=2, cores=args.cores)
        except ClusterUnavailable as why:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
        with cluster:
            print(f"cluster up: {cluster.master_url}, spool {cluster.spool} (NFS, one client per host)",
                  flush=True)
            for round_ in range(1, args.rounds + 1):
                rates: dict[tuple[str, int], float] = {}
                for executors in (1, 2):
                    with driver_session(cluster, f"bench-{round_}-{executors}", executors) as spark:
                        tasks = executors * args.cores
                        spark.sparkContext.parallelize(range(tasks), tasks).map(lambda x: x).collect()
                        warm = os.path.join(cluster.spool, f"r{round_}-{executors}-warm-up")
                        _stream(spark, _fill(warm + "-s", 20, 8), os.path.join(scratch, f"ck-w{round_}-{executors}"), 10)
                        vsqs.spark.process_queue(spark, _fill(warm + "-p", 20, 8), _nothing, parallelism=tasks,
                                                 wait=args.wait)
                        for workload in workloads:
                            base = os.path.join(cluster.spool, f"r{round_}-{executors}-{workload}")
                            queue = _fill(base, args.messages, args.body_size)
                            if workload == "stream":
                                seconds, rows = _stream(spark, queue, os.path.join(scratch, f"ck-{round_}-{executors}"),
                                                        args.per_trigger)
                            else:
                                started = time.perf_counter()
                                result = vsqs.spark.process_queue(
                                    spark, queue, _nothing, parallelism=tasks, wait=args.wait,
                                    visibility_timeout=600,
                                )
                                seconds, rows = time.perf_counter() - started, result.processed
                            left = queue.stats().total
                            if rows != args.messages or left:
                                print(f"  {workload}: read {rows} of {args.messages}, {left} left in the queue",
                                      file=sys.stderr)
                            rate = args.messages / seconds
                            rates[(workload, executors)] = rate
                            results.setdefault((workload, executors), []).append(rate)
                            print(f"round {round_}: {workload:13} {executors} worker(s): "
                                  f"{rate:7.0f} msg/s ({seconds:.1f} s)", flush=True)
                for workload in workloads:
                    ratio = rates[(workload, 2)] / rates[(workload, 1)]
                    ratios[workload].append(ratio)
                    print(f"round {round_}: {workload:13} two/one = {ratio:.2f}", flush=True)

    rows = []
    for workload in workloads:
        one, two = results[(workload, 1)], results[(workload, 2)]
        rows.append([workload, " / ".join(f"{r:,.0f}" for r in one), " / ".join(f"{r:,.0f}" for r in two),
                     " / ".join(f"{r:.2f}" for r in ratios[workload]),
                     "yes" if statistics.median(ratios[workload]) >= 1.6 else "no"])
    print()
    for row in rows:
        print(f"{row[0]:13} one worker {row[1]} msg/s, two workers {row[2]} msg/s, two/one {row[3]}")
    if args.markdown:
        _report.emit([
            _report.provenance(REPO, args.dir or tempfile.gettempdir(),
                               f"the spool on nfs-ganesha (NFSv3) through one userspace client per host; "
                               f"{args.messages:,} messages of {args.body_size} B, {args.cores} core(s) a "
                               f"worker, {'the default' if args.per_trigger is None else f'{args.per_trigger:,}'} a trigger; "
                               f"one figure per round; load average "
                               f"{os.getloadavg()[0]:.0f} at the end"),
            _report.table(["workload", "one worker, msg/s", "two workers, msg/s", "two/one (same round)",
                           "≥ 1.6x"], rows, right=[1, 2, 3]),
        ], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
