#!/usr/bin/env python3
"""Benchmark the streaming read of the ``vsqs`` Spark source (issue 15).

Run from the repository root, with the project installed in .venv::

    .venv/bin/python scripts/bench_spark.py              # about 3 minutes on a quiet 2-core machine
    .venv/bin/python scripts/bench_spark.py --quick      # a smoke run
    .venv/bin/python scripts/bench_spark.py --help

Each figure is measured ``--repeat`` times (default 2), in the same run as
its references, and reported as a ratio to them, since the machine may be
shared:

* **library reference**: two processes, each receiving and deleting
  messages one at a time (``Queue.receive`` + ``delete``) until the queue is
  empty; also with ``receive_batch(100)``;
* **vsqs stream**: ``readStream.format("vsqs")`` with the default options
  on ``local[2]``, all columns (bodies read), ``Trigger.AvailableNow``, the
  ``noop`` sink; timed from ``start()`` to the end of the query, in a
  session whose Python workers are already warm;
* **Spark's floor for a Python stream source**: ``scripts/_spark_floor.py``,
  a Python streaming source that plans and delivers the same rows as the
  vsqs source (same schema, batches, partitions and Arrow record batches)
  and does no queue work, same trigger and sink: what Spark alone costs;
* **process_queue**: ``vsqs.spark.process_queue`` with a function that does
  nothing, default options (``wait`` 1 s: each task ends after 1 s of an
  empty queue, which the figure includes);
* **snapshot read**: ``spark.read.format("vsqs")`` of the queue (every
  column, bodies read) into the ``noop`` sink, against ``spark.read.text``
  of one file per message (``--file-messages``);
* **Spark file stream**: ``readStream.format("text")`` of one file per
  message (as a Spark user would otherwise do it), same trigger and sink;
  fewer messages (``--file-messages``), as it is slow;
* **CPU** of Spark's JVM, of the executors' Python workers, and of the
  driver's Python side (the data-source planners and lookups, the streaming
  source's runner) during each stream and its floor: this run's JVM and the
  processes below it, sampled from ``/proc`` every 0.1 s (see ``SparkCpu``);
* **driver time per batch** at 5,000 and 50,000 messages a trigger, from
  Spark's progress reports: ``latestOffset`` (the source's planning) and
  everything but the batch's execution (``triggerExecution - addBatch``),
  with the size of each offset-log file and of each progress report.
"""

from __future__ import annotations

import argparse
import compileall
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import vsqs

# What each Python process Spark starts runs: the module after ``-m`` (``python -m
# pyspark.daemon MODULE`` for a daemon and the workers it forks, ``python -m MODULE``
# for one the JVM runs itself). The executors' Python workers run this one; every
# other is the driver's side: data-source lookups and planners
# (``pyspark.sql.worker.*``), the streaming source's runner (latestOffset, partitions).
EXECUTOR_MODULE = "pyspark.worker"
SAMPLE_EVERY = 0.1  # seconds between looks at the JVM's child processes
CPU_KINDS = ("jvm", "executors", "driver side", "unattributed")


def _stat(pid: int) -> tuple[int, int, int, int] | None:
    """(parent pid, start time, own CPU ticks, ticks of its reaped children) of ``pid``; None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def _kind(pid: int) -> str:
    """``executors`` for a process of the executors' Python workers, else ``driver side``."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")
    except OSError:
        return "driver side"
    modules = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-m"]
    module = modules[0] if modules else ""
    if module == "pyspark.daemon":
        at = args.index("-m") + 2
        module = args[at] if at < len(args) else ""
    return "executors" if module == EXECUTOR_MODULE else "driver side"


class SparkCpu:
    """CPU seconds of Spark's processes between ``start`` and ``stop``: its JVM
    (``jvm``), the executors' Python workers (``executors``), the other Python
    processes it starts (``driver side``: planners, lookups, the streaming
    source's runner), and ``unattributed``.

    A process that exits is reaped by its parent, whose counter of reaped CPU
    does not say whose it was (and the JVM itself starts some: the streaming
    source's runner), so a thread looks every SAMPLE_EVERY s at the JVM's
    children: each child's CPU with its descendants' (its own, what it reaped,
    its live children's), as last seen. A child that exited counts what it had
    when last seen; what the JVM reaped beyond that (a child that started and
    exited between two looks, or worked on after the last) is ``unattributed``.
    Only the processes below this run's JVM count, whatever else the machine runs.
    """

    def __init__(self, jvm: int) -> None:
        self._jvm = jvm
        self._tick = os.sysconf("SC_CLK_TCK")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="cpu-sampler", daemon=True)
        self._seen: dict[tuple[int, int], tuple[str, int]] = {}  # (pid, start) of a JVM child -> (kind, ticks)
        self._kinds: dict[tuple[int, int], str] = {}
        self._first: dict[tuple[int, int], int] = {}  # ticks of the children already there at the start
        self._alive: set[tuple[int, int]] = set()  # the JVM's children at the last look
        self._tree = {jvm}  # the JVM and the processes below it, as seen
        self._foreign: set[int] = set()  # processes seen outside that tree (not read again)
        self._jvm_first = self._jvm_last = (0, 0)  # (own, reaped) ticks of the JVM

    def start(self) -> SparkCpu:
        self._jvm_first = self._look()
        self._first = {key: ticks for key, (_, ticks) in self._seen.items()}
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        self._jvm_last = self._look()
        used = dict.fromkeys(CPU_KINDS, 0.0)
        used["jvm"] = (self._jvm_last[0] - self._jvm_first[0]) / self._tick
        reaped = self._jvm_last[1] - self._jvm_first[1]
        for key, (kind, ticks) in self._seen.items():
            used[kind] += (ticks - self._first.get(key, 0)) / self._tick
            if key not in self._alive:
                reaped -= ticks - self._first.get(key, 0)  # (its CPU is in the JVM's reaped counter now)
        used["unattributed"] = max(0, reaped) / self._tick
        return used

    def _watch(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self._look()

    def _look(self) -> tuple[int, int]:
        """Update each JVM child's ticks; the JVM's own and reaped ticks."""
        stats = {}
        # (ascending: a parent is met before its children, so a process new since the
        # last look is placed by its parent; a process outside the JVM's tree stays out)
        for pid in sorted(int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
            if pid in self._foreign or (found := _stat(pid)) is None:
                continue
            if pid in self._tree or found[0] in self._tree:
                self._tree.add(pid)
                stats[pid] = found
            else:
                self._foreign.add(pid)
        children: dict[int, list[int]] = {}
        for pid, (parent, *_) in stats.items():
            children.setdefault(parent, []).append(pid)

        def ticks(pid: int) -> int:  # own, reaped, and the live descendants'
            _, _, own, reaped = stats[pid]
            return own + reaped + sum(ticks(child) for child in children.get(pid, ()))

        self._alive = set()
        for pid in children.get(self._jvm, ()):
            key = (pid, stats[pid][1])
            kind = self._kinds.get(key) or self._kinds.setdefault(key, _kind(pid))
            self._seen[key] = (kind, ticks(pid))
            self._alive.add(key)
        jvm = stats.get(self._jvm)
        return (jvm[2], jvm[3]) if jvm is not None else self._jvm_last


def spark_jvm() -> int:
    """The pid of this process's Spark JVM (its child running java)."""
    for entry in os.listdir("/proc"):
        found = _stat(int(entry)) if entry.isdigit() else None
        if found is not None and found[0] == os.getpid():
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if b"java" in f.read().split(b"\0")[0]:
                    return int(entry)
    raise RuntimeError("no Spark JVM among this process's children")


def fill(path: str, count: int, body: bytes) -> vsqs.Queue:
    queue = vsqs.Queue(path, create=True)
    for start in range(0, count, 10_000):
        queue.publish_batch([body] * min(10_000, count - start), durable=False)
    return queue


def _consume(path: str, batch: int, out: Any) -> None:
    queue = vsqs.Queue(path)
    done = 0
    while True:
        if batch == 1:
            message = queue.receive(visibility_timeout=300)
            got = [message] if message is not None else []
        else:
            got = queue.receive_batch(batch, visibility_timeout=300)
        if not got:
            break
        for message in got:
            queue.delete(message.receipt)
        done += len(got)
    out.put(done)


def library_rate(directory: str, count: int, body: bytes, batch: int) -> float:
    """Messages a second of two processes receiving and deleting until empty."""
    path = os.path.join(directory, f"lib-{batch}-{time.monotonic_ns()}")
    fill(path, count, body)
    context = multiprocessing.get_context("spawn")  # this process runs a JVM gateway: no fork
    results = context.Queue()
    workers = [context.Process(target=_consume, args=(path, batch, results)) for _ in range(2)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    done = sum(results.get() for _ in workers)
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - began
    assert done == count and vsqs.Queue(path).stats().total == 0, (done, count)
    shutil.rmtree(path)
    return count / elapsed


def spark_session(master: str):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.chdir(ROOT)  # the Python workers find pyspark_vsqs here
    # vsqs's bytecode, as an installed wheel has it: where PYTHONDONTWRITEBYTECODE is
    # set, every Python process Spark starts would compile vsqs again (0.15 s of CPU each)
    compileall.compile_dir(str(ROOT / "vsqs"), quiet=1)
    compileall.compile_file(str(ROOT / "pyspark_vsqs.py"), quiet=1)
    spark = (
        SparkSession.builder.master(master)
        .appName("vsqs-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    import _spark_floor
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(_spark_floor)  # the Python workers cannot import scripts/
    spark.dataSource.register(_spark_floor.FloorDataSource)
    return spark


def stream_run(spark, directory: str, count: int, body: bytes, options: dict[str, str]) -> dict:
    """Drain a queue of ``count`` messages with the vsqs source; rate and per-batch figures."""
    tag = time.monotonic_ns()
    path = os.path.join(directory, f"stream-{tag}")
    checkpoint = os.path.join(directory, f"ck-{tag}")
    fill(path, count, body)
    reader = spark.readStream.format("vsqs")
    for key, value in options.items():
        reader = reader.option(key, value)
    cpu = SparkCpu(spark_jvm()).start()
    began = time.perf_counter()
    query = (
        reader.load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    cpu = cpu.stop()
    left = vsqs.Queue(path).stats().total
    progress = [p for p in query.recentProgress]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == count and left == 0, (rows, count, left)
    batches = [p for p in progress if p["numInputRows"]]
    offsets = [f for f in Path(checkpoint, "offsets").iterdir() if f.name.isdigit()]
    result = {
        "rate": count / elapsed,
        "count": count,
        "cpu": cpu,
        "elapsed": elapsed,
        "batches": len(batches),
        "latest_offset_ms": [p["durationMs"].get("latestOffset", 0) for p in batches],
        "driver_ms": [p["durationMs"]["triggerExecution"] - p["durationMs"].get("addBatch", 0) for p in batches],
        "offset_bytes": max(f.stat().st_size for f in offsets),
        "progress_bytes": max(len(p.json if hasattr(p, "json") else json.dumps(p, default=str)) for p in progress),
    }
    shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return result


def floor_run(spark, directory: str, count: int, body: bytes) -> dict:
    """Rate and CPU of the floor source: Spark's own cost of the same stream."""
    checkpoint = os.path.join(directory, f"flck-{time.monotonic_ns()}")
    cpu = SparkCpu(spark_jvm()).start()
    began = time.perf_counter()
    query = (
        spark.readStream.format("vsqs_floor")
        .option("count", str(count))
        .option("bodySize", str(len(body)))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    cpu = cpu.stop()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == count, (rows, count)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"rate": count / elapsed, "count": count, "cpu": cpu, "elapsed": elapsed}


def process_queue_rate(spark, directory: str, count: int, body: bytes) -> float:
    """Messages a second of ``process_queue`` with a function that does nothing."""
    import vsqs.spark

    path = os.path.join(directory, f"pq-{time.monotonic_ns()}")
    fill(path, count, body)
    began = time.perf_counter()
    result = vsqs.spark.process_queue(spark, vsqs.Queue(path), lambda message: None)
    elapsed = time.perf_counter() - began
    assert result.processed == count and vsqs.Queue(path).stats().total == 0, (result, count)
    shutil.rmtree(path)
    return count / elapsed


def snapshot_rates(spark, directory: str, count: int, file_count: int, body: bytes) -> tuple[float, float]:
    """Messages a second of a snapshot read of the queue (every column), and
    rows a second of ``spark.read.text`` of one file per message."""
    tag = time.monotonic_ns()
    path = os.path.join(directory, f"snap-{tag}")
    fill(path, count, body)
    began = time.perf_counter()
    spark.read.format("vsqs").load(path).write.format("noop").mode("overwrite").save()
    snapshot = count / (time.perf_counter() - began)
    assert vsqs.Queue(path).stats().ready == count  # a snapshot changes nothing
    shutil.rmtree(path)
    files = os.path.join(directory, f"snapfiles-{tag}")
    os.makedirs(files)
    for n in range(file_count):
        with open(os.path.join(files, f"m{n:08d}.txt"), "wb") as stream:
            stream.write(body)
    began = time.perf_counter()
    spark.read.text(files).write.format("noop").mode("overwrite").save()
    text = file_count / (time.perf_counter() - began)
    shutil.rmtree(files)
    return snapshot, text


def file_stream_rate(spark, directory: str, count: int, body: bytes) -> float:
    """Messages a second of Spark's own file stream source, one file per message."""
    tag = time.monotonic_ns()
    source = os.path.join(directory, f"files-{tag}")
    os.makedirs(source)
    for n in range(count):
        with open(os.path.join(source, f"m{n:08d}.txt"), "wb") as stream:
            stream.write(body)
    checkpoint = os.path.join(directory, f"fck-{tag}")
    began = time.perf_counter()
    query = (
        spark.readStream.format("text")
        .load(source)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - began
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == count, (rows, count)
    shutil.rmtree(source, ignore_errors=True)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return count / elapsed


def _cpu_line(run: dict) -> str:
    cpu, count = run["cpu"], run["count"]
    python = cpu["executors"] + cpu["driver side"] + cpu["unattributed"]
    return (
        f"JVM {cpu['jvm']:.2f}; executors' Python workers {cpu['executors']:.2f} "
        f"({1e6 * cpu['executors'] / count:.0f} us a message); driver-side Python (planners, the "
        f"streaming source's runner) {cpu['driver side']:.2f}; exited between samples {cpu['unattributed']:.2f}; "
        f"all Python {python:.2f} ({1e6 * python / count:.0f} us a message) "
        f"(of {(os.cpu_count() or 1) * run['elapsed']:.2f})"
    )


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    median, low, high = statistics.median(values), min(values), max(values)
    return f"median {median:.0f} ms (min {low:.0f}, max {high:.0f}, {len(values)} batches)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=50_000, help="messages per streaming run (50,000)")
    parser.add_argument("--file-messages", type=int, default=3_000, help="messages (files) of the file-stream run")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--dir", default=None, help="where to make the queues (default: a temporary directory)")
    parser.add_argument("--quick", action="store_true", help="10,000 messages, one repetition")
    parser.add_argument("--skip-driver", action="store_true", help="skip the 5,000/50,000 per trigger runs")
    args = parser.parse_args()
    if args.quick:
        args.messages, args.file_messages, args.repeat = 10_000, 500, 1
    body = b"x" * args.body_size
    directory = tempfile.mkdtemp(prefix="vsqs-bench-spark-", dir=args.dir)
    try:
        spark = spark_session(args.master)
        stream_run(spark, directory, 2_000, body, {})  # warm the Python workers up
        floor_run(spark, directory, 2_000, body)  # (and the floor's first use of its class)
        process_queue_rate(spark, directory, 500, body)  # (and the batch paths')
        snapshot_rates(spark, directory, 500, 50, body)
        rows = []
        for repetition in range(args.repeat):
            lib = library_rate(directory, args.messages, body, 1)
            lib_batch = library_rate(directory, args.messages, body, 100)
            stream = stream_run(spark, directory, args.messages, body, {})
            floor_figures = floor_run(spark, directory, args.messages, body)
            floor = floor_figures["rate"]
            files = file_stream_rate(spark, directory, args.file_messages, body)
            processed = process_queue_rate(spark, directory, args.messages, body)
            snapshot, text = snapshot_rates(spark, directory, args.messages, args.file_messages, body)
            rows.append((lib, lib_batch, stream, floor, files))
            print(
                f"run {repetition + 1}: library receive+delete {lib:,.0f} msg/s, "
                f"library receive_batch(100)+delete {lib_batch:,.0f} msg/s, "
                f"vsqs stream (defaults) {stream['rate']:,.0f} msg/s in {stream['batches']} batches, "
                f"Spark's floor (a Python source without queue work) {floor:,.0f} msg/s, "
                f"file stream {files:,.0f} msg/s",
                flush=True,
            )
            print(
                f"       ratios: vsqs stream / library = {stream['rate'] / lib:.2f}, "
                f"/ library batch = {stream['rate'] / lib_batch:.2f}, "
                f"/ Spark's floor = {stream['rate'] / floor:.2f}, "
                f"floor / library = {floor / lib:.2f}, "
                f"/ file stream = {stream['rate'] / files:.1f}x",
                flush=True,
            )
            print(
                f"       process_queue (a function that does nothing) {processed:,.0f} msg/s "
                f"= {processed / lib:.2f}x the library; snapshot read {snapshot:,.0f} msg/s "
                f"= {snapshot / lib:.2f}x the library, {snapshot / text:.1f}x read.text of one file "
                f"per message ({text:,.0f} rows/s)",
                flush=True,
            )
            print(
                f"       CPU seconds (of {os.cpu_count()} cores x the run's time): vsqs stream: "
                f"{_cpu_line(stream)}; Spark's floor: {_cpu_line(floor_figures)}",
                flush=True,
            )
        if not args.skip_driver:
            for per_trigger in (5_000, 50_000):
                count = max(args.messages, 2 * per_trigger)
                for repetition in range(args.repeat):
                    run = stream_run(spark, directory, count, body, {"maxMessagesPerTrigger": str(per_trigger)})
                    print(
                        f"{per_trigger:,} a trigger, run {repetition + 1}: {run['rate']:,.0f} msg/s; "
                        f"latestOffset {_ms(run['latest_offset_ms'])}; "
                        f"driver (trigger - addBatch) {_ms(run['driver_ms'])}; "
                        f"largest offset file {run['offset_bytes']:,} B, largest progress report "
                        f"{run['progress_bytes']:,} B",
                        flush=True,
                    )
        spark.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
