#!/usr/bin/env python3
"""The main job: a PySpark pipeline over a vsqs spool in a local directory.

    scripts/demo                              # ./spool, 10,000 orders, local Spark
    scripts/demo --spool /mnt/shared/spool    # a spool every executor mounts
    scripts/demo --orders 50000 --verbose     # bigger, with Spark's own logging
    scripts/demo --master spark://head:7077 --spool /mnt/shared/spool   # on a cluster

1. The driver generates orders (JSON) and publishes them into the `incoming`
   queue with the data source: df.write.format("vsqs").
2. A snapshot (spark.read.format("vsqs")) shows the queue with SQL.
3. Executors consume `incoming` with vsqs.spark.process_queue: each order is
   validated, priced and converted to EUR, the result published to `results`
   durably, and only then the order deleted. One executor's Python worker is
   killed in the middle of an order (--no-crash to skip): Spark retries the
   task, and the order it held comes back after its visibility timeout. A few
   orders are malformed on purpose: they fail, are retried, and after
   `max_receives` (2) attempts move to the dead-letter queue `incoming.dlq`.
4. A streaming query (spark.readStream.format("vsqs"), Trigger.AvailableNow)
   drains `results` into a summary table, de-duplicating by order id (vsqs
   delivers at least once); a batch is deleted from the queue only after
   Spark committed it.
5. The figures: in, out, re-delivered, dead-lettered, throughput, queue stats.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import random
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import vsqs
import vsqs.spark

VISIBILITY_TIMEOUT = 5.0  # short, so the crashed worker's order comes back quickly
MAX_RECEIVES = 2  # a malformed order is tried twice, then dead-lettered

# -- the input: generated orders ---------------------------------------------------

CATALOG = {  # sku -> (name, unit price in EUR)
    "KB-101": ("mechanical keyboard", 89.00),
    "MS-220": ("wireless mouse", 24.50),
    "MN-270": ("27in monitor", 229.00),
    "HD-330": ("noise-cancelling headphones", 179.00),
    "CB-010": ("usb-c cable", 9.90),
    "DK-400": ("docking station", 139.00),
    "WC-120": ("webcam", 59.00),
    "SS-512": ("512 GB ssd", 64.90),
    "CH-900": ("office chair", 249.00),
    "LP-050": ("laptop stand", 34.00),
}
COUNTRIES = [  # (country, currency, VAT rate, weight)
    ("DE", "EUR", 0.19, 22),
    ("FR", "EUR", 0.20, 14),
    ("NL", "EUR", 0.21, 8),
    ("US", "USD", 0.00, 24),
    ("GB", "GBP", 0.20, 14),
    ("JP", "JPY", 0.10, 6),
    ("CH", "CHF", 0.081, 6),
    ("SE", "SEK", 0.25, 6),
]
EUR_PER = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "JPY": 0.0062, "CHF": 1.04, "SEK": 0.088}
COUPONS = {"SPRING10": 0.10, "WELCOME5": 0.05}


def make_orders(n: int, run: str, seed: int = 7) -> list[bytes]:
    """n orders as JSON, their ids unique to this ``run`` (so a kept spool's
    orders from earlier runs are told apart); about 1 in 700 is malformed
    (the handler rejects it)."""
    rng = random.Random(seed)
    countries = [c for c in COUNTRIES for _ in range(c[3])]
    skus = list(CATALOG)
    start = datetime.datetime(2026, 3, 1, tzinfo=datetime.timezone.utc)
    orders = []
    for i in range(n):
        country, currency, _, _ = rng.choice(countries)
        lines = []
        for sku in rng.sample(skus, rng.choice((1, 1, 1, 2, 2, 3, 4))):
            price = round(CATALOG[sku][1] / EUR_PER[currency], 2)
            lines.append({"sku": sku, "qty": rng.choice((1, 1, 1, 2, 2, 3, 5)), "unit_price": price})
        order: dict[str, object] = {
            "order_id": f"o-{run}-{i:07d}",
            "customer": f"c-{rng.randrange(3000):05d}",
            "country": country,
            "currency": currency,
            "created_at": (start + datetime.timedelta(seconds=i * 7 + rng.randrange(7))).isoformat(),
            "lines": lines,
        }
        if rng.random() < 0.15:
            order["coupon"] = rng.choice(list(COUPONS))
        if rng.random() < 1 / 700:  # malformed on purpose
            if rng.random() < 0.5:
                lines[0]["qty"] = "many"
            else:
                lines[0]["sku"] = "XX-000"
        orders.append(json.dumps(order, separators=(",", ":")).encode())
    return orders


# -- the transformation (runs on the executors) ------------------------------------------


def price_order(body: bytes) -> bytes:
    """Validate an order and price it in EUR (net of coupon, with VAT)."""
    order = json.loads(body)
    vat = {country: rate for country, _, rate, _ in COUNTRIES}[order["country"]]
    subtotal = 0.0
    items = 0
    for line in order["lines"]:
        if line["sku"] not in CATALOG:
            raise ValueError(f"{order['order_id']}: unknown sku {line['sku']!r}")
        if not isinstance(line["qty"], int) or line["qty"] < 1:
            raise ValueError(f"{order['order_id']}: bad quantity {line['qty']!r}")
        subtotal += line["qty"] * line["unit_price"]
        items += line["qty"]
    discount = COUPONS.get(order.get("coupon", ""), 0.0)
    total = subtotal * (1 - discount) * (1 + vat) * EUR_PER[order["currency"]]
    result = {
        "order_id": order["order_id"],
        "country": order["country"],
        "items": items,
        "revenue_eur": round(total, 2),
        "coupon": "coupon" in order,
    }
    return json.dumps(result, separators=(",", ":")).encode()


def crashing_once(fn: Callable[[bytes], bytes], victim: bytes, marker: str) -> Callable[[bytes], bytes]:
    """fn, except that the first time it sees the order ``victim`` the Python
    worker running it dies on the spot (as if the executor were lost)."""

    def handle(body: bytes) -> bytes:
        if victim in body and not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            os._exit(1)
        return fn(body)

    return handle


# -- presentation ----------------------------------------------------------------


class Progress:
    """A status line redrawn in place on a terminal (plain lines otherwise)."""

    def __init__(self) -> None:
        self.tty = sys.stdout.isatty()
        self.width = 0
        self.lock = threading.Lock()  # the status thread and the log handler both write

    def update(self, text: str) -> None:
        if self.tty:
            with self.lock:
                sys.stdout.write("\r" + text.ljust(self.width))
                sys.stdout.flush()
                self.width = len(text)

    def done(self, text: str) -> None:
        with self.lock:
            if self.tty and self.width:
                sys.stdout.write("\r" + " " * self.width + "\r")
                self.width = 0
            print(text, flush=True)


class Announce(logging.Handler):
    """vsqs.spark's warnings (a task attempt that died, when it dies) as lines of the demo."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.WARNING)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        self.progress.done("   ! " + record.getMessage().removeprefix("process_queue: "))


@contextlib.contextmanager
def watching(progress: Progress, status: Callable[[], str], every: float = 0.25) -> Iterator[None]:
    """Redraw ``status()`` until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every):
            with contextlib.suppress(Exception):  # a status line must never break the job
                progress.update(status())

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def output_to(path: str | None) -> Iterator[None]:
    """Send this process's stdout/stderr (so the JVM it starts) to ``path``."""
    if path is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def start_spark(master: str, verbose: bool, log_path: str | None) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    builder = (
        SparkSession.builder.master(master)
        .appName("vsqs-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):  # a single host: keep Spark on the loopback interface
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    with output_to(log_path):  # the JVM keeps these descriptors: its logs go to the file
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    return spark


def with_retries(master: str) -> str | None:
    """A local master that retries a failed task (local[N] gives up at once:
    the killed worker would fail the job), or None if ``master`` is fine."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,(\d+))?\])?", master)
    if match is None or (match.group(2) is not None and int(match.group(2)) > 1):
        return None  # a cluster (spark.task.maxFailures, 4 by default), or retries already
    return f"local[{match.group(1) or 1},4]"


def dead_letters(queue: vsqs.Queue, marker: bytes) -> tuple[str, int]:
    """The dead-letter queue's name, and how many of its messages hold ``marker``."""
    dlq = queue.dead_letter_queue()
    if dlq is None:
        return "-", 0
    return os.path.basename(dlq.path), sum(1 for info in dlq.messages(bodies=True) if marker in (info.body or b""))


def rate(count: float, seconds: float) -> str:
    return f"{count / max(seconds, 1e-9):,.0f}/s"


# -- the job -----------------------------------------------------------------------


def first_line(exc: BaseException) -> str:
    """The first informative line of an error (a Py4J error's is its Java exception's)."""
    java = getattr(exc, "java_exception", None)
    text = str(java) if java is not None else str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:300] if lines else repr(exc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spool", default="spool", help="spool directory (default ./spool)")
    parser.add_argument("--orders", type=int, default=10_000, help="orders to generate (default 10,000)")
    parser.add_argument(
        "--master", default="local[*,4]", help="Spark master (default local[*,4]: a failed task is retried)"
    )
    parser.add_argument("--parallelism", type=int, default=None, help="executor tasks (default: Spark's)")
    parser.add_argument("--no-crash", action="store_true", help="do not kill an executor worker")
    parser.add_argument("--keep", action="store_true", help="keep the spool from an earlier run")
    parser.add_argument("--verbose", action="store_true", help="show Spark's own logging")
    args = parser.parse_args()
    if args.orders < 1:
        parser.error("--orders must be at least 1")

    if not args.no_crash and (retrying := with_retries(args.master)) is not None:
        print(f"--master {args.master} would not retry the task whose worker the demo kills: "
              f"running on {retrying} (--no-crash to keep {args.master})")
        args.master = retrying

    spool = os.path.abspath(args.spool)
    if not args.keep and os.path.isdir(spool):
        shutil.rmtree(spool)
    os.makedirs(spool, exist_ok=True)
    incoming = vsqs.Queue(os.path.join(spool, "incoming"), create=True)
    results = vsqs.Queue(os.path.join(spool, "results"), create=True)
    incoming.configure(max_receives=MAX_RECEIVES)  # dead-letter queue: incoming.dlq
    progress = Progress()
    print(f"vsqs demo: a PySpark pipeline over the spool {spool}")

    log_path = None
    if not args.verbose:
        fd, log_path = tempfile.mkstemp(prefix="vsqs-demo-spark-", suffix=".log")
        os.close(fd)
    progress.update("starting Spark ...")
    started = time.monotonic()
    logging.getLogger("vsqs.spark").addHandler(Announce(progress))
    spark = start_spark(args.master, args.verbose, log_path)
    vsqs.spark.register(spark)  # (Spark would also find it through pyspark_vsqs)
    cores = spark.sparkContext.defaultParallelism
    tasks = args.parallelism or cores
    progress.done(
        f"  Spark {spark.version} on {spark.sparkContext.master} ({cores} cores) "
        f"started in {time.monotonic() - started:.1f}s"
    )
    checkpoint = tempfile.mkdtemp(prefix="vsqs-demo-checkpoint-")
    ok = False
    try:
        ok = run(spark, args, incoming, results, progress, tasks, time.monotonic(), checkpoint)
    except Exception as exc:  # noqa: BLE001 - one line, not Py4J's page of Java: the whole trace is in the log
        progress.done(f"FAILED: {type(exc).__name__}: {first_line(exc)}")
    finally:
        with output_to(log_path):
            spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
        if log_path and ok:
            os.remove(log_path)
        elif log_path:
            print(f"Spark's log is in {log_path}", file=sys.stderr)
    return 0 if ok else 1


def run(
    spark: SparkSession,
    args: argparse.Namespace,
    incoming: vsqs.Queue,
    results: vsqs.Queue,
    progress: Progress,
    tasks: int,
    began: float,
    checkpoint: str,
) -> bool:
    """Steps 1 to 5 and the figures (``began``: when Spark was up); True if
    every order of this run is accounted for."""
    spool = os.path.dirname(incoming.path)
    run_id = datetime.datetime.now(datetime.timezone.utc).strftime("%y%m%d%H%M%S")
    mine = f'"order_id":"o-{run_id}-'.encode()  # in the body of each of this run's orders
    earlier = incoming.stats().total  # orders a kept spool still holds from an earlier run
    # 1. publish: rows -> messages, staged per task attempt, published on commit
    step = time.monotonic()
    orders = make_orders(args.orders, run_id)
    frame = spark.createDataFrame([(body,) for body in orders], "body binary").repartition(tasks)

    writing_since: list[float] = []  # when the first row was staged: Spark's tasks run

    def publishing() -> str:
        stats = incoming.stats()
        if not writing_since and (stats.staged or stats.total > earlier):
            writing_since.append(time.monotonic())
        return (f"1. publishing: {stats.staged:,} staged by the tasks, "
                f"{stats.total - earlier:,} published / {len(orders):,}")

    with watching(progress, publishing):
        frame.write.format("vsqs").mode("append").save(incoming.path)
    published = time.monotonic() - step
    starting = (writing_since[0] if writing_since else time.monotonic()) - step
    progress.done(
        f"1. published {len(orders):,} orders into incoming with df.write.format('vsqs') "
        f"in {published:.1f}s: {starting:.1f}s until Spark's first tasks ran, then "
        f"{rate(len(orders), published - starting)}"
        + (f"; {earlier:,} more were left from an earlier run" if earlier else "")
    )

    # 2. a snapshot, with SQL
    snapshot = spark.read.format("vsqs").load(incoming.path)
    by_state = {r.state: r["count"] for r in snapshot.groupBy("state").count().collect()}
    size = snapshot.agg(F.sum(F.length("body"))).first()[0] or 0
    progress.done(
        f"2. snapshot of incoming (spark.read.format('vsqs')): {by_state}, "
        f"{size / 1e6:.1f} MB of JSON"
    )

    # 3. executors as workers, with a crash
    handler: Callable[[bytes], bytes] = price_order
    if not args.no_crash:
        victim = f'"order_id":"o-{run_id}-{len(orders) // 2:07d}"'.encode()
        handler = crashing_once(price_order, victim, os.path.join(spool, ".demo-crashed"))
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(spool, ".demo-crashed"))
    total = vsqs.spark.ProcessResult()
    step = time.monotonic()
    first_round = 0.0
    settled_first = 0
    rounds = 0
    print(
        f"3. {tasks} executor tasks consume incoming -> results "
        f"(vsqs.spark.process_queue, visibility timeout {VISIBILITY_TIMEOUT:g}s"
        + ("; one worker will be killed mid-order" if not args.no_crash else "")
        + ")",
        flush=True,
    )
    while True:
        rounds += 1
        round_start = time.monotonic()

        def status(this_round: int = rounds) -> str:
            done = results.stats().total
            return (
                f"   round {this_round}: {done:,} results, {incoming.stats().total:,} orders left"
                f"  ({rate(done, time.monotonic() - step)})"
            )

        with watching(progress, status):
            got = vsqs.spark.process_queue(
                spark,
                incoming,
                handler,
                output=results,
                parallelism=tasks,
                concurrency=2,
                visibility_timeout=VISIBILITY_TIMEOUT,
                wait=0.5,
                retry_delay=0,
            )
        total += got
        left = incoming.stats()
        if rounds == 1:
            first_round = time.monotonic() - round_start
            settled_first = len(orders) - left.total
        died = " (the attempt that died included)" if got.died else ""
        progress.done(
            f"   round {rounds}: processed {got.processed:,}{died}, failed {got.failed:,}, "
            f"re-delivered {got.redelivered:,} in {time.monotonic() - round_start:.1f}s; "
            f"incoming now {left.ready:,} ready, {left.in_flight:,} in flight, "
            f"{left.dead_lettered:,} dead-lettered"
        )
        if left.total == 0 or rounds == 6:
            break
        if left.in_flight:  # held by a worker that died, or failed: visible again after the timeout
            with watching(progress, lambda: f"   waiting for {incoming.stats().in_flight} lease(s) to run out"):
                deadline = time.monotonic() + VISIBILITY_TIMEOUT * 3
                while incoming.stats().in_flight and time.monotonic() < deadline:
                    time.sleep(0.2)
    processed_in = time.monotonic() - step

    # 4. inspect the results before they are consumed (a snapshot changes nothing)
    inspected = spark.read.format("vsqs").load(results.path).select(
        F.get_json_object(F.col("body").cast("string"), "$.order_id").alias("order_id")
    )
    out = inspected.count()
    distinct = inspected.distinct().count()
    this_run = inspected.where(F.col("order_id").startswith(f"o-{run_id}-")).distinct().count()
    progress.done(
        f"4. results (snapshot): {out:,} messages for {distinct:,} distinct orders"
        + (f" ({distinct - this_run:,} of them from an earlier run)" if distinct != this_run else "")
    )

    # 5. a streaming query drains results into a summary table
    step = time.monotonic()
    schema = "order_id string, country string, items int, revenue_eur double, coupon boolean"
    query = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "2500")
        .option("visibilityTimeout", "120")
        .load(results.path)
        .select(F.from_json(F.col("body").cast("string"), schema).alias("r"))
        .select("r.*")
        .dropDuplicates(["order_id"])  # at-least-once in, effectively once in the table
        .groupBy("country")
        .agg(
            F.count("*").alias("orders"),
            F.sum("items").alias("items"),
            F.round(F.sum("revenue_eur"), 2).alias("revenue_eur"),
            F.round(F.avg("revenue_eur"), 2).alias("avg_order_eur"),
            F.sum(F.col("coupon").cast("int")).alias("coupons"),
        )
        .writeStream.outputMode("complete")
        .format("memory")
        .queryName("summary")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )

    def stream_status() -> str:
        rows = sum(p["numInputRows"] for p in query.recentProgress)
        return f"5. streaming: {rows:,} results read, {results.stats().total:,} left in the queue"

    with watching(progress, stream_status):
        query.awaitTermination()
    streamed = time.monotonic() - step
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    read = sum(p["numInputRows"] for p in batches)
    progress.done(
        f"5. streaming query (spark.readStream.format('vsqs'), availableNow) read {read:,} results "
        f"in {len(batches)} micro-batches, {streamed:.1f}s; summary table:"
    )
    summary = spark.table("summary").orderBy(F.desc("revenue_eur")).collect()
    print(f"   {'country':<8}{'orders':>8}{'items':>8}{'revenue EUR':>15}{'avg EUR':>10}{'coupons':>9}")
    for row in summary:
        print(
            f"   {row.country:<8}{row.orders:>8,}{row['items']:>8,}{row.revenue_eur:>15,.2f}"
            f"{row.avg_order_eur:>10,.2f}{row.coupons:>9,}"
        )
    summarized = sum(row.orders for row in summary)
    revenue = sum(row.revenue_eur for row in summary)
    print(f"   {'total':<8}{summarized:>8,}{'':>8}{revenue:>15,.2f}")

    # 6. the figures
    left = incoming.stats()
    dlq_name, dead = dead_letters(incoming, mine)  # this run's orders in the dead-letter queue
    dead_total = left.dead_lettered
    after = results.stats()
    crashed = not args.no_crash
    duplicates = out - distinct
    print("figures:")
    print(f"  in              {len(orders):>8,}  orders published by this run"
          + (f" (and {earlier:,} left from an earlier run)" if earlier else ""))
    print(f"  processed       {total.processed:>8,}  orders priced, results published, orders deleted"
          + (f"; {total.died} task attempt(s) died: their work up to then included" if total.died else ""))
    print(f"  out             {out:>8,}  results; "
          + (f"{duplicates:,} duplicate(s): an order processed again after a failure (at-least-once)"
             if duplicates else "no duplicates"))
    print(
        f"  re-delivered    {total.redelivered:>8,}  orders received again ("
        + ("the one the killed worker held, and " if crashed else "")
        + "malformed ones tried again)"
    )
    print(f"  dead-lettered   {dead:>8,}  malformed orders of this run moved to {dlq_name}"
          + (f" (it holds {dead_total:,} in all, with earlier runs')" if dead_total != dead else ""))
    print(
        f"  throughput      {rate(len(orders), published - starting)} published (step 1, once its tasks ran), "
        f"{rate(settled_first, first_round)} processed in round 1 ({tasks} tasks x 2 threads), "
        f"{rate(read, streamed)} streamed (step 5)"
    )
    print(f"  wall time       {time.monotonic() - began:>7.1f}s  after Spark started "
          f"({rate(len(orders), time.monotonic() - began)} end to end); "
          f"processing {processed_in:.1f}s in {rounds} round(s)")
    for name, stats in (("incoming", left), ("results", after)):
        print(
            f"  {name:<15} ready {stats.ready}, in flight {stats.in_flight}, "
            f"delayed {stats.delayed}, dead-lettered {stats.dead_lettered}"
        )
    ok = this_run + dead == len(orders) and summarized == distinct and left.total == 0 and after.total == 0
    if ok:
        print("OK: every order of this run is in the summary or the dead-letter queue, and both queues are drained")
    else:
        print(
            f"MISMATCH: {len(orders):,} orders in, {this_run:,} in the results + {dead:,} dead-lettered; "
            f"summary {summarized:,} of {distinct:,} distinct; left in incoming {left.total:,}, "
            f"in results {after.total:,}"
        )
    return ok


if __name__ == "__main__":
    sys.exit(main())
