#!/usr/bin/env python3
"""Spark on the NFS cluster: msg/s with one worker and with two, in the same run, and where the CPU went.

    .venv/bin/python scripts/bench_spark_cluster.py                  # 40,000 messages, 1 round
    .venv/bin/python scripts/bench_spark_cluster.py --messages 60000 --rounds 2 --markdown

Starts the cluster of tests/spark/cluster.py: nfs-ganesha serving one export,
the driver (this process) with its own NFS client, and two standalone
workers, each in its own mount namespace with its own NFS client mounted at
the same path: three hosts of one export. Needs root, /dev/fuse, java and the
team's netfs kit (``../shared/netfs`` or ``$NETFS_KIT``).

Each round measures, on an application with an executor on each worker and
then on one with one executor (one worker's ``--cores``):

* ``stream``: ``readStream.format("vsqs")`` with ``Trigger.AvailableNow``
  into the ``noop`` sink, ``--per-trigger`` messages a micro-batch in
  ``numPartitions`` = the application's executor cores (as docs/spark.md
  advises on a cluster), from ``start()`` until the query ends (the queue is
  then empty);
* ``process_queue``: a function that returns nothing, one task per executor
  core, until the tasks stop (they wait ``--wait`` s on an empty queue).

The queues (``--messages`` bodies of ``--body-size`` bytes each) are
published beforehand, untimed, by the two-executor application's executors
(two NFS clients at once: publishing them through the driver's one client
took longer than the runs). Each application runs a warm-up job first
(untimed). The ratio two/one is from the same round: the machine may be
shared, so compare ratios, not absolute figures. The target (issue 15) is
two workers at least 1.6x one.

To say why a ratio is what it is, every timed run also reports the CPU the
cluster's processes used (cores busy on average: the NFS server, the NFS
clients of the workers and of the driver, the executors' JVMs and Python
workers, the driver, Spark's daemons) against the whole machine's busy
cores (the rest is other processes), and, for the stream, how much of the
run the driver spent planning and logging batches (``latestOffset``,
``walCommit``, ``commitOffsets``, ``queryPlanning`` of Spark's progress
reports) against running them (``addBatch``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import vsqs
import vsqs.spark
from tests.spark.cluster import ClusterUnavailable, NfsCluster, driver_session

CPU_CLASSES = ("nfs server", "nfs clients, workers", "nfs client, driver", "executors", "driver",
               "spark daemons")
DRIVER_PHASES = ("latestOffset", "walCommit", "commitOffsets", "queryPlanning")
TICK = os.sysconf("SC_CLK_TCK")


def _fill(spark, path: str, count: int, size: int, tasks: int) -> None:
    """Publish ``count`` bodies to a new queue at ``path`` from the executors (untimed)."""
    vsqs.Queue(path, create=True)
    pad = b"x" * max(0, size - 8)
    slices = [(start, min(count, start + 500)) for start in range(0, count, 500)]

    def publish(part):
        queue = vsqs.Queue(path)
        for start, stop in part:
            queue.publish_batch([b"%08d" % i + pad for i in range(start, stop)])

    spark.sparkContext.parallelize(slices, tasks).foreachPartition(publish)


def _cpu_ticks(nfs_base: str) -> tuple[dict[str, int], int]:
    """CPU ticks used so far by the cluster's processes, by class; and the machine's busy ticks.

    A process's class comes from its command line, its mount namespace (the
    workers' are not ours) and whether it descends from this process. Ticks
    of processes that ended between two samples are missed (Spark reuses its
    Python workers, so few do).
    """
    ours = os.readlink("/proc/self/ns/mnt")
    procs: dict[int, tuple[int, int, bytes, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
            namespace = os.readlink(f"/proc/{entry}/ns/mnt")
        except OSError:
            continue
        procs[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]), command, namespace)
    me = os.getpid()

    def descends(pid: int) -> bool:
        for _ in range(64):
            if pid == me:
                return True
            if pid not in procs:
                return False
            pid = procs[pid][0]
        return False

    by_class: dict[str, int] = defaultdict(int)
    base = nfs_base.encode()
    for pid, (_, ticks, command, namespace) in procs.items():
        if b"ganesha" in command and base in command:
            by_class["nfs server"] += ticks
        elif b"nfsfuse" in command and base in command:
            by_class["nfs client, driver" if namespace == ours else "nfs clients, workers"] += ticks
        elif b"deploy.master.Master" in command or b"deploy.worker.Worker" in command:
            by_class["spark daemons"] += ticks
        elif descends(pid):
            by_class["driver" if namespace == ours else "executors"] += ticks
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
    return dict(by_class), busy


def _cores_used(before: tuple[dict[str, int], int], after: tuple[dict[str, int], int], seconds: float
                ) -> dict[str, float]:
    """Average cores busy during the run, by class, with the machine's total ("machine")."""
    used = {name: (after[0].get(name, 0) - before[0].get(name, 0)) / TICK / seconds for name in CPU_CLASSES}
    used["machine"] = (after[1] - before[1]) / TICK / seconds
    return used


def _stream(spark, path: str, checkpoint: str, per_trigger: int, partitions: int
            ) -> tuple[float, int, dict[str, float]]:
    """Seconds to drain the queue at ``path`` with the streaming source, the rows
    it read, and the milliseconds of the driver's phases summed over its batches."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("vsqs")
        .option("visibilityTimeout", "600")
        .option("maxMessagesPerTrigger", str(per_trigger))
        .option("numPartitions", str(partitions))
        .load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    phases: dict[str, float] = defaultdict(float)
    for report in progress:
        for name, ms in (report.get("durationMs") or {}).items():
            phases[name] += ms
    return seconds, rows, dict(phases)


def _nothing(_body: bytes) -> None:
    return None


def _cpu_line(used: dict[str, float]) -> str:
    ours = sum(used[name] for name in CPU_CLASSES)
    parts = ", ".join(f"{name} {used[name]:.2f}" for name in CPU_CLASSES)
    return f"cores busy: {parts}; cluster {ours:.2f} of the machine's {used['machine']:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--messages", type=int, default=40000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=10000, help="maxMessagesPerTrigger")
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker (and its executor)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--wait", type=float, default=0.5, help="process_queue: idle seconds before a task stops")
    parser.add_argument("--only", choices=["stream", "process_queue"], default=None)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _report

    _report.add_markdown_option(parser)
    args = parser.parse_args()
    workloads = [args.only] if args.only else ["stream", "process_queue"]

    results: dict[tuple[str, int], list[float]] = {}
    ratios: dict[str, list[float]] = {w: [] for w in workloads}
    cpu: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    driver_share: dict[int, list[float]] = defaultdict(list)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="vsqs-spark-cluster-") as scratch:
        try:
            cluster = NfsCluster(os.path.join(scratch, "cluster"), workers=2, cores=args.cores)
        except ClusterUnavailable as why:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
        with cluster:
            nfs_base = str(cluster.nfs_base)
            print(f"cluster up: {cluster.master_url}, spool {cluster.spool} (NFS, one client per host)",
                  flush=True)
            for round_ in range(1, args.rounds + 1):
                rates: dict[tuple[str, int], float] = {}
                for executors in (2, 1):
                    with driver_session(cluster, f"bench-{round_}-{executors}", executors) as spark:
                        tasks = executors * args.cores
                        spark.sparkContext.parallelize(range(tasks), tasks).map(lambda x: x).collect()
                        if executors == 2:  # publish every queue of the round, two clients at once
                            started = time.perf_counter()
                            for each in (2, 1):
                                for workload in workloads:
                                    _fill(spark, os.path.join(cluster.spool, f"r{round_}-{each}-{workload}"),
                                          args.messages, args.body_size, 2 * args.cores)
                            print(f"round {round_}: published {len(workloads) * 2} queues of {args.messages:,} "
                                  f"in {time.perf_counter() - started:.0f} s (untimed)", flush=True)
                        warm = os.path.join(cluster.spool, f"r{round_}-{executors}-warm-up")
                        _fill(spark, warm + "-s", 40, 8, tasks)
                        _fill(spark, warm + "-p", 40, 8, tasks)
                        _stream(spark, warm + "-s", os.path.join(scratch, f"ck-w{round_}-{executors}"), 20, tasks)
                        vsqs.spark.process_queue(spark, vsqs.Queue(warm + "-p"), _nothing, parallelism=tasks,
                                                 wait=args.wait)
                        for workload in workloads:
                            path = os.path.join(cluster.spool, f"r{round_}-{executors}-{workload}")
                            before = _cpu_ticks(nfs_base)
                            if workload == "stream":
                                seconds, rows, phases = _stream(
                                    spark, path, os.path.join(scratch, f"ck-{round_}-{executors}"),
                                    args.per_trigger, tasks)
                            else:
                                started = time.perf_counter()
                                result = vsqs.spark.process_queue(
                                    spark, vsqs.Queue(path), _nothing, parallelism=tasks, wait=args.wait,
                                    visibility_timeout=600,
                                )
                                seconds, rows, phases = time.perf_counter() - started, result.processed, {}
                            used = _cores_used(before, _cpu_ticks(nfs_base), seconds)
                            loads.append(os.getloadavg()[0])
                            left = vsqs.Queue(path).stats().total
                            if rows != args.messages or left:
                                print(f"  {workload}: read {rows} of {args.messages}, {left} left in the queue",
                                      file=sys.stderr)
                            rate = args.messages / seconds
                            rates[(workload, executors)] = rate
                            results.setdefault((workload, executors), []).append(rate)
                            cpu[(workload, executors)].append(used)
                            print(f"round {round_}: {workload:13} {executors} worker(s): "
                                  f"{rate:7.0f} msg/s ({seconds:.1f} s); {_cpu_line(used)}", flush=True)
                            if phases:
                                driver_ms = sum(phases.get(name, 0) for name in DRIVER_PHASES)
                                share = driver_ms / max(1.0, phases.get("triggerExecution", 0))
                                driver_share[executors].append(share)
                                print("    stream phases (ms, all batches): "
                                      + ", ".join(f"{k} {v:.0f}" for k, v in sorted(phases.items()))
                                      + f"; the driver's share of trigger time {share:.0%}", flush=True)
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
    cpu_rows = []
    for (workload, executors), samples in sorted(cpu.items()):
        mean = {name: statistics.mean(s[name] for s in samples) for name in (*CPU_CLASSES, "machine")}
        ours = sum(mean[name] for name in CPU_CLASSES)
        share = driver_share.get(executors) if workload == "stream" else None
        cpu_rows.append([workload, executors, *(f"{mean[name]:.2f}" for name in CPU_CLASSES), f"{ours:.2f}",
                         f"{mean['machine']:.2f}", f"{statistics.mean(share):.0%}" if share else "–"])
    print()
    for row in rows:
        print(f"{row[0]:13} one worker {row[1]} msg/s, two workers {row[2]} msg/s, two/one {row[3]}")
    print(f"load average (1 min) during the run: {min(loads):.0f}-{max(loads):.0f}")
    if args.markdown:
        _report.emit([
            _report.provenance(REPO, args.dir or tempfile.gettempdir(),
                               f"the spool on nfs-ganesha (NFSv3) through one userspace client per host; "
                               f"{args.messages:,} messages of {args.body_size} B, {args.cores} core(s) a "
                               f"worker, {args.per_trigger:,} a trigger in as many partitions as executor cores; "
                               f"one figure per round; load average {min(loads):.0f}-{max(loads):.0f} "
                               f"during the run"),
            _report.table(["workload", "one worker, msg/s", "two workers, msg/s", "two/one (same round)",
                           "≥ 1.6x"], rows, right=[1, 2, 3]),
            _report.table(["workload", "workers", *CPU_CLASSES, "cluster", "machine",
                           "driver's share of trigger time"], cpu_rows, right=list(range(1, 11))),
        ], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
