#!/usr/bin/env python3
"""Spark on the NFS cluster: msg/s with one worker and with more, in the same run, and where the CPU went.

    .venv/bin/python scripts/bench_spark_cluster.py                  # 40,000 messages, 1 and 2 workers
    .venv/bin/python scripts/bench_spark_cluster.py --workers 1,2,4 --cpu-per-worker 0.25 --markdown

Starts the cluster of tests/spark/cluster.py: nfs-ganesha serving one export,
the driver (this process) with its own NFS client, and standalone workers
(as many as the largest of ``--workers``), each in its own mount namespace
with its own NFS client mounted at the same path: hosts of one export. Needs
root, /dev/fuse, java and the team's netfs kit (``../shared/netfs`` or
``$NETFS_KIT``). ``--cpu-per-worker`` puts each worker host (its NFS client,
its JVMs, its Python workers) in a CPU cgroup of that many cores, so that the
machine, not shared between the workers, has room for all of them: what
hosts of their own would be.

Each round measures, on an application with an executor on each of N workers
for each N of ``--workers`` (largest first), and on one with one executor
(one worker's ``--cores``):

* ``stream``: ``readStream.format("vsqs")`` with ``Trigger.AvailableNow``
  into the ``noop`` sink, ``--per-trigger`` messages a micro-batch in
  ``numPartitions`` = the application's executor cores (as docs/spark.md
  advises on a cluster), from ``start()`` until the query ends (the queue is
  then empty);
* ``process_queue``: a function that returns nothing, one task per executor
  core, until the tasks stop (they wait ``--wait`` s on an empty queue).

The queues (``--messages`` bodies of ``--body-size`` bytes each) are
published beforehand, untimed, by the largest application's executors
(an NFS client each, at once: publishing them through the driver's one
client took longer than the runs). Each application runs a warm-up job first
(untimed). Each ratio N/one is from the same round: the machine may be
shared, so compare ratios, not absolute figures. The targets, on capped
workers: two at least 1.7x one, four at least 3x.

To say why a ratio is what it is, every timed run also reports the CPU the
cluster's processes used (cores busy on average: the NFS server, the NFS
clients of the workers and of the driver, the executors' JVMs and Python
workers, the driver, Spark's daemons) against the whole machine's busy
cores (the rest is other processes); with ``--cpu-per-worker``, the CPU the
capped worker hosts used (their cgroups' own count, exact) and the share of
the scheduling periods they ran in that their caps held them back in (near
0: the caps did not bind, the bound was elsewhere); and, for the stream,
how much of the
run the driver spent planning and logging batches (``latestOffset``,
``walCommit``, ``commitOffsets``, ``queryPlanning`` of Spark's progress
reports) against running them (``addBatch``).
"""

from __future__ import annotations

import argparse
import os
import signal
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
    line = f"cores busy: {parts}; cluster {ours:.2f} of the machine's {used['machine']:.2f}"
    if used.get("worker hosts"):
        line += (f"; the capped worker hosts {used['worker hosts']:.2f}, held back by their caps "
                 f"in {used['throttled']:.0%} of the periods they ran in")
    return line


def _cores(text: str) -> float:
    cores = float(text)
    if not cores > 0:
        raise argparse.ArgumentTypeError("cores of CPU a worker: a number above 0, such as 0.25")
    return cores


def _counts(text: str) -> list[int]:
    counts = sorted({int(part) for part in text.split(",")})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("worker counts are numbers from 1, such as 1,2,4")
    return counts


TARGETS = {2: 1.7, 4: 3.0}  # (issue 21) N workers against one, on workers with CPU of their own


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--messages", type=int, default=40000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--per-trigger", type=int, default=10000, help="maxMessagesPerTrigger")
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker (and its executor)")
    parser.add_argument("--workers", type=_counts, default=[1, 2],
                        help="worker counts to run, each against one (default 1,2)")
    parser.add_argument("--cpu-per-worker", type=_cores, default=None,
                        help="cores of CPU each worker host may use, all its processes together "
                             "(a cgroup each; default: no cap)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--wait", type=float, default=0.5, help="process_queue: idle seconds before a task stops")
    parser.add_argument("--only", choices=["stream", "process_queue"], default=None)
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temporary one)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import _report

    _report.add_markdown_option(parser)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # (so that the cluster is stopped on the way out)
    workloads = [args.only] if args.only else ["stream", "process_queue"]
    counts = sorted(set(args.workers) | {1}, reverse=True)  # the largest first: it publishes every queue
    most = counts[0]

    results: dict[tuple[str, int], list[float]] = {}
    ratios: dict[tuple[str, int], list[float]] = defaultdict(list)
    cpu: dict[tuple[str, int], list[dict[str, float]]] = defaultdict(list)
    driver_share: dict[int, list[float]] = defaultdict(list)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="vsqs-spark-cluster-") as scratch:
        try:
            cluster = NfsCluster(os.path.join(scratch, "cluster"), workers=most, cores=args.cores,
                                 cpu_per_worker=args.cpu_per_worker)
        except ClusterUnavailable as why:
            print(f"cannot run: {why}", file=sys.stderr)
            return 2
        with cluster:
            nfs_base = str(cluster.nfs_base)
            cap = f", {args.cpu_per_worker:g} core(s) of CPU a worker host" if args.cpu_per_worker else ""
            print(f"cluster up: {cluster.master_url}, {most} workers{cap}, spool {cluster.spool} "
                  f"(NFS, one client per host)", flush=True)
            for round_ in range(1, args.rounds + 1):
                rates: dict[tuple[str, int], float] = {}
                for executors in counts:
                    with driver_session(cluster, f"bench-{round_}-{executors}", executors) as spark:
                        tasks = executors * args.cores
                        spark.sparkContext.parallelize(range(tasks), tasks).map(lambda x: x).collect()
                        if executors == most:  # publish every queue of the round, every client at once
                            started = time.perf_counter()
                            for each in counts:
                                for workload in workloads:
                                    _fill(spark, os.path.join(cluster.spool, f"r{round_}-{each}-{workload}"),
                                          args.messages, args.body_size, most * args.cores)
                            print(f"round {round_}: published {len(workloads) * len(counts)} queues of "
                                  f"{args.messages:,} in {time.perf_counter() - started:.0f} s (untimed)",
                                  flush=True)
                        warm = os.path.join(cluster.spool, f"r{round_}-{executors}-warm-up")
                        _fill(spark, warm + "-s", 40, 8, tasks)
                        _fill(spark, warm + "-p", 40, 8, tasks)
                        _stream(spark, warm + "-s", os.path.join(scratch, f"ck-w{round_}-{executors}"), 20, tasks)
                        vsqs.spark.process_queue(spark, vsqs.Queue(warm + "-p"), _nothing, parallelism=tasks,
                                                 wait=args.wait)
                        for workload in workloads:
                            path = os.path.join(cluster.spool, f"r{round_}-{executors}-{workload}")
                            before = _cpu_ticks(nfs_base)
                            hosts_before = cluster.cpu_used()
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
                            hosts_after = cluster.cpu_used()
                            used["worker hosts"] = (hosts_after[0] - hosts_before[0]) / seconds
                            periods = hosts_after[1] - hosts_before[1]
                            used["throttled"] = (hosts_after[2] - hosts_before[2]) / periods if periods else 0.0
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
                    for executors in counts[:-1]:
                        ratio = rates[(workload, executors)] / rates[(workload, 1)]
                        ratios[(workload, executors)].append(ratio)
                        print(f"round {round_}: {workload:13} {executors}/1 = {ratio:.2f}", flush=True)

    rows = []
    for workload in workloads:
        for executors in sorted(counts):
            rates_n = results[(workload, executors)]
            ratio = ratios.get((workload, executors))
            target = TARGETS.get(executors)
            rows.append([workload, executors, " / ".join(f"{r:,.0f}" for r in rates_n),
                         " / ".join(f"{r:.2f}" for r in ratio) if ratio else "1",
                         "–" if not ratio or target is None
                         else f"{target:g}x: {'yes' if statistics.median(ratio) >= target else 'no'}"])
    cpu_rows = []
    for (workload, executors), samples in sorted(cpu.items()):
        mean = {name: statistics.mean(s[name] for s in samples)
                for name in (*CPU_CLASSES, "machine", "worker hosts", "throttled")}
        ours = sum(mean[name] for name in CPU_CLASSES)
        share = driver_share.get(executors) if workload == "stream" else None
        capped = [f"{mean['worker hosts']:.2f}", f"{mean['throttled']:.0%}"] if args.cpu_per_worker else []
        cpu_rows.append([workload, executors, *(f"{mean[name]:.2f}" for name in CPU_CLASSES), f"{ours:.2f}",
                         f"{mean['machine']:.2f}", *capped, f"{statistics.mean(share):.0%}" if share else "–"])
    print()
    for row in rows:
        print(f"{row[0]:13} {row[1]} worker(s): {row[2]} msg/s, against one {row[3]}, target {row[4]}")
    print(f"load average (1 min) during the run: {min(loads):.0f}-{max(loads):.0f}")
    if args.markdown:
        _report.emit([
            _report.provenance(REPO, args.dir or tempfile.gettempdir(),
                               f"the spool on nfs-ganesha (NFSv3) through one userspace client per host; "
                               f"{args.messages:,} messages of {args.body_size} B, {args.cores} core(s) a "
                               f"worker{cap}, {args.per_trigger:,} a trigger in as many partitions as "
                               f"executor cores; one figure per round; load average "
                               f"{min(loads):.0f}-{max(loads):.0f} during the run"),
            _report.table(["workload", "workers", "msg/s", "against one (same round)", "target"], rows,
                          right=[1, 2, 3]),
            _report.table(["workload", "workers", *CPU_CLASSES, "cluster", "machine",
                           *(["capped worker hosts (cgroups)", "held back by the cap"] if args.cpu_per_worker
                             else []),
                           "driver's share of trigger time"], cpu_rows, right=list(range(1, 13))),
        ], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
