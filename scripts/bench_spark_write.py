#!/usr/bin/env python3
"""Spark's ``df.write.format("vsqs")`` against the library's own staged
publish, in the same run, each figure twice. Run from the repository root::

    .venv/bin/python scripts/bench_spark_write.py                       # this checkout
    .venv/bin/python scripts/bench_spark_write.py --repo . --repo ../main   # two checkouts, alternating
    .venv/bin/python scripts/bench_spark_write.py --count 20000 --master 'local[2]' --markdown -

Each round runs in a fresh process (Spark started, and one small write
done, before the clock runs):

* ``spark write``: a cached DataFrame of ``--count`` bodies of ``--body-size``
  bytes in ``--partitions`` partitions (default: Spark's parallelism)
  written with ``df.write.format("vsqs").mode("append").save(queue)``: task
  stages, driver commit, everything durable when ``save`` returns;
* ``staged publish``: the library alone, one process: the same messages
  with ``Queue.publish_staged`` in chunks of 1,000 (what a Spark task does),
  then ``Queue.commit_stage``;
* ``fsync floor``: bare system calls, the durable publish of one message at a
  time: ``open(O_EXCL)``, ``write``, ``fsync``, ``close``, ``rename``, and one
  directory fsync at the end. It does not depend on the vsqs measured, so it
  is the peer the others are divided by (the disk's speed swings under load).

With several ``--repo`` the rounds alternate between the checkouts, and the
last column compares each with the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import _report

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def floor(directory: str, count: int, body: bytes) -> float:
    """Messages a second of the one-at-a-time durable publish, in bare system calls."""
    os.makedirs(directory)
    start = time.perf_counter()
    for i in range(count):
        temp, final = os.path.join(directory, f"{i:08d}.new"), os.path.join(directory, f"{i:08d}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        os.write(fd, body)
        os.fsync(fd)
        os.close(fd)
        os.rename(temp, final)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    return count / (time.perf_counter() - start)


def staged(path: str, count: int, body: bytes) -> float:
    """Messages a second of publish_staged in chunks of 1,000, then commit_stage."""
    import vsqs

    queue = vsqs.Queue(path, create=True)
    bodies = [body] * count
    start = time.perf_counter()
    for first in range(0, count, 1000):
        queue.publish_staged(bodies[first : first + 1000], stage="bench")
    published = queue.commit_stage("bench")
    seconds = time.perf_counter() - start
    assert published == count, (published, count)
    return count / seconds


def round_worker(args: argparse.Namespace) -> None:
    """One round in this process: prints one JSON line."""
    args.repo = args.repo[0]
    sys.path.insert(0, args.repo)
    os.environ["PYTHONPATH"] = args.repo + os.pathsep + os.environ.get("PYTHONPATH", "")  # the executors'
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import vsqs
    import vsqs.spark

    spark = (
        SparkSession.builder.master(args.master)
        .appName("vsqs-bench-write")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    vsqs.spark.register(spark)
    partitions = args.partitions or spark.sparkContext.defaultParallelism
    seen = spark.sparkContext.parallelize([0], 1).map(lambda _: __import__("vsqs").__file__).first()
    if os.path.dirname(os.path.dirname(seen)) != os.path.realpath(args.repo):
        raise SystemExit(f"the executors import vsqs from {seen}, not from {args.repo}")
    pad = "x" * max(0, args.body_size - 9)
    frame = (
        spark.range(args.count, numPartitions=partitions)
        .select(F.concat(F.format_string("m%08d", "id"), F.lit(pad)).cast("binary").alias("body"))
        .cache()
    )
    frame.count()  # generated and cached before the clock runs
    body = b"m" + b"x" * (args.body_size - 1)
    out: dict[str, object] = {"repo": args.repo, "vsqs": vsqs.__file__, "partitions": partitions}
    scratch = tempfile.mkdtemp(prefix="bench-write-", dir=args.dir)
    try:
        out["floor"] = floor(os.path.join(scratch, "floor"), args.count, body)
        # a first write pays for Spark's look-up of the data source and its Python
        # workers' start (half a minute on a loaded machine): not what is measured
        warm = os.path.join(scratch, "warm-up")
        vsqs.Queue(warm, create=True)
        frame.limit(2 * partitions).write.format("vsqs").mode("append").save(warm)
        path = os.path.join(scratch, "spark")
        vsqs.Queue(path, create=True)
        start = time.perf_counter()
        frame.write.format("vsqs").mode("append").save(path)
        out["spark"] = args.count / (time.perf_counter() - start)
        total = vsqs.Queue(path).stats().total
        assert total == args.count, (total, args.count)
        out["staged"] = staged(os.path.join(scratch, "staged"), args.count, body)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        spark.stop()
    print(json.dumps(out), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repo", action="append", help="a checkout whose vsqs is measured (repeatable; default: this one)")
    p.add_argument("--count", type=int, default=50_000)
    p.add_argument("--body-size", type=int, default=100)
    p.add_argument("--master", default="local[2]")
    p.add_argument(
        "--partitions", type=int, default=0, help="partitions of the DataFrame (default: Spark's parallelism)"
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dir", default=os.path.join(REPO, ".bench"))
    _report.add_markdown_option(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        round_worker(args)
        return 0
    repos = [os.path.realpath(r) for r in (args.repo or [REPO])]
    args.dir = os.path.abspath(args.dir)
    os.makedirs(args.dir, exist_ok=True)
    print(f"{args.count:,} messages of {args.body_size} bytes, {args.master}; disk: {_report.machine(args.dir)}")
    rows: list[list[str]] = []
    first: list[float] = []
    for round_ in range(1, args.rounds + 1):
        for repo in repos:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--repo", repo, "--count", str(args.count),
                   "--body-size", str(args.body_size), "--master", args.master,
                   "--partitions", str(args.partitions), "--dir", args.dir]
            # cwd: not a checkout, whose vsqs the Python workers would import first
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=args.dir)
            if done.returncode:
                sys.stderr.write(done.stderr[-4000:])
                raise SystemExit(f"round {round_} of {repo} failed")
            got = json.loads(done.stdout.strip().splitlines()[-1])
            spark_vs_floor = got["spark"] / got["floor"]
            if repo == repos[0]:
                first.append(spark_vs_floor)
            versus = spark_vs_floor / first[-1]
            label = f"{os.path.basename(repo)} ({_report.git_head(repo)})"
            row = [str(round_), label, f"{got['spark']:,.0f}", f"{got['staged']:,.0f}", f"{got['floor']:,.0f}",
                   f"{got['spark'] / got['staged']:.2f}", f"{spark_vs_floor:.2f}",
                   f"{got['staged'] / got['floor']:.2f}", f"{versus:.2f}"]
            rows.append(row)
            print("  ".join(row), flush=True)
    headers = ["round", "vsqs", "spark write msg/s", "staged publish msg/s", "fsync floor msg/s",
               "spark / staged", "spark / floor", "staged / floor", "spark/floor vs first"]
    print(_report.table(headers, rows, right=tuple(range(2, 9))))
    if args.markdown:
        _report.emit([_report.provenance(repos[0], args.dir, f"{args.count:,} messages, {args.master}"),
                      _report.table(headers, rows, right=tuple(range(2, 9)))], args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
