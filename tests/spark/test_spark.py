"""The Spark integration: the vsqs data source in every mode, and process_queue.

One local[2,2] SparkSession for the module (2 threads; a failed task is tried
twice, so task retries can be forced). The session does not register the
data source: Spark finds it through the top-level ``pyspark_vsqs`` module
(the Python workers start in the repository root, as with ``scripts/test``,
or import an installed vsqs). ``test_register`` runs last.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import vsqs
import vsqs.spark
from tests.conftest import ROOT
from tests.spark import process_cases


@pytest.fixture(scope="module")
def spark():
    saved_env = {key: os.environ.get(key) for key in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers must run this interpreter
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    saved_cwd = os.getcwd()
    os.chdir(ROOT)  # Python workers start here and find pyspark_vsqs like an installed module
    try:
        session = (
            SparkSession.builder.master("local[2,2]")
            .appName("vsqs-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
    finally:
        os.chdir(saved_cwd)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    for key, value in saved_env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _utc(epoch: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.timezone.utc).replace(tzinfo=None)


def _drain(queue: vsqs.Queue) -> list[vsqs.Message]:
    got = []
    while batch := queue.receive_batch(1000, visibility_timeout=300):
        got.extend(batch)
    return got


# -- discovery -------------------------------------------------------------------


def test_found_without_registration(spark, queue):
    # first test of the module: nothing has called vsqs.spark.register yet
    df = spark.read.format("vsqs").load(queue.path)
    assert df.schema == vsqs.spark.SCHEMA
    assert df.collect() == []


# -- batch read ---------------------------------------------------------------------


def test_snapshot_matches_messages_and_changes_nothing(spark, queue):
    queue.publish_batch([b"m%d" % i for i in range(40)])
    queue.publish(b"later", delay=300)
    queue.publish(b"urgent", priority=7, attributes={"kind": "alert", "to": "ops"})
    taken = queue.receive_batch(5, visibility_timeout=300)  # in flight, count 1
    queue.release(taken[0].receipt)  # ready again, count 1
    again = queue.receive_batch(40, visibility_timeout=0)  # expired at once: ready, count 1..2
    assert again
    before = list(queue.messages(bodies=True))
    assert {info.state for info in before} == {"ready", "in_flight", "delayed"}

    rows = spark.read.format("vsqs").option("numPartitions", "3").load(queue.path).collect()

    assert [
        (r.id, r.body, r.state, r.receive_count, r.sent_at, r.priority, r.group, r.attributes)
        for r in rows
    ] == [
        (i.id, i.body, i.state, i.receive_count, _utc(i.sent_at), i.priority, i.group, i.attributes)
        for i in before
    ]
    assert rows[0].body == b"urgent" and rows[0].attributes == {"kind": "alert", "to": "ops"}
    assert list(queue.messages(bodies=True)) == before  # a snapshot changes no message


def test_snapshot_in_partitions_with_sql(spark, queue):
    queue.publish_batch([b"x"] * 30)
    queue.receive_batch(4, visibility_timeout=300)
    df = spark.read.format("vsqs").option("numPartitions", "4").load(queue.path)
    assert df.rdd.getNumPartitions() == 4
    counts = {r.state: r["count"] for r in df.groupBy("state").count().collect()}
    assert counts == {"ready": 26, "in_flight": 4}


def test_snapshot_with_a_chosen_schema(spark, queue):
    queue.publish_batch([b"a", b"b"])
    rows = spark.read.format("vsqs").schema("state string, id string").load(queue.path).collect()
    assert [tuple(r) for r in rows] == [("ready", i.id) for i in queue.messages()]
    with pytest.raises(Exception, match="no column 'colour'"):
        spark.read.format("vsqs").schema("colour string").load(queue.path).collect()
    with pytest.raises(Exception, match="'receive_count' is int, not string"):
        spark.read.format("vsqs").schema("receive_count string").load(queue.path).collect()


# -- batch write ----------------------------------------------------------------------


def test_write_then_receive_returns_every_row_once(spark, tmp_path):
    path = str(tmp_path / "written")  # created by the write
    bodies = [b"row-%d" % i for i in range(500)] + [b"", b"\x00\xff binary"]
    df = spark.createDataFrame([(b,) for b in bodies], "body binary").repartition(4)
    df.write.format("vsqs").mode("append").option("create", "true").save(path)

    queue = vsqs.Queue(path)
    assert queue.stages() == []
    got = _drain(queue)
    assert Counter(m.body for m in got) == Counter(bodies)


def test_write_a_string_body_column(spark, queue):
    df = spark.createDataFrame([("héllo",), ("wörld",)], "body string")
    df.write.format("vsqs").mode("append").save(queue.path)
    assert sorted(m.body for m in _drain(queue)) == sorted(["héllo".encode(), "wörld".encode()])


def _fails_first_attempt_after_staging(path: str, last: int, marker: Path, padding: bytes):
    """A UDF making a row's body; in the first attempt of its task, the row
    ``last`` waits (bounded) until that attempt has staged rows in the queue
    at ``path``, records how many, and fails."""

    def body(n):
        from pyspark import TaskContext

        context = TaskContext.get()
        if n == last and context.attemptNumber() == 0:
            staged = 0
            mark = f"-{context.partitionId()}-{context.attemptNumber()}-"  # in the stage name
            deadline = time.monotonic() + 60
            while staged == 0 and time.monotonic() < deadline:
                for stage in vsqs.Queue(path).stages():
                    if mark in stage:
                        names = os.listdir(os.path.join(path, f".stage.{stage}"))
                        staged = sum(1 for name in names if not name.endswith(".new"))
                time.sleep(0.05)
            marker.write_text(str(staged))
            raise RuntimeError("injected failure of the first attempt")
        return b"row-%d" % n + padding

    return F.udf(body, "binary", useArrow=False)


PADDING = b"." * 2048  # rows big enough to get past the 64 KiB buffers between the processes


def test_retried_write_task_publishes_each_row_once(spark, queue, tmp_path):
    """Partition 0 fails on its last row in its first attempt, after some of
    its rows were staged; Spark retries it. Each row is published once."""
    marker = tmp_path / "first-attempt-failed"
    rows = 400
    udf = _fails_first_attempt_after_staging(queue.path, rows - 1, marker, PADDING)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = spark.range(0, 2 * rows, numPartitions=2).select(udf("id").alias("body"))
        df.write.format("vsqs").mode("append").save(queue.path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert int(marker.read_text()) > 0  # the failed attempt had staged rows
    assert queue.stages() == []  # its stage was dropped, not published
    got = Counter(m.body for m in _drain(queue))
    assert got == Counter(b"row-%d" % n + PADDING for n in range(2 * rows))


def test_retried_stream_write_task_publishes_each_row_once(spark, queue, tmp_path):
    """The same through a streaming write: the driver's commit of the batch
    (made by another writer object than the tasks') drops the failed stage."""
    source = vsqs.Queue(tmp_path / "numbers", create=True)
    rows = 300
    source.publish_batch([str(n) for n in range(rows)])
    marker = tmp_path / "first-attempt-failed"
    udf = _fails_first_attempt_after_staging(queue.path, rows - 1, marker, PADDING)
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        query = (
            spark.readStream.format("vsqs")
            .option("maxMessagesPerTrigger", str(rows))
            .option("numPartitions", "1")
            .load(source.path)
            .select(udf(F.col("body").cast("string").cast("long")).alias("body"))
            .writeStream.format("vsqs")
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start(queue.path)
        )
        query.awaitTermination()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert int(marker.read_text()) > 0
    assert queue.stages() == []
    got = Counter(m.body for m in _drain(queue))
    assert got == Counter(b"row-%d" % n + PADDING for n in range(rows))
    assert source.stats().total == 0


# -- writes with option columns ---------------------------------------------------------

OPTION_SCHEMA = (
    "body binary, delay double, group string, dedup_id string, priority int, "
    "attributes map<string,string>"
)


def test_write_option_columns_null_means_no_option(spark, queue):
    rows = [
        (b"plain", None, None, None, None, None),
        (b"urgent", None, None, None, 9, {"kind": "alert", "to": "ops"}),
        (b"later", 300.0, None, None, None, None),
        (b"in g", None, "g", None, None, None),
        (b"in g, priority 0", None, "g", None, 0, {}),  # 0 is the default: allowed with a group
        (b"order 1", None, None, "order-1", None, None),
        (b"order 1 again", None, None, "order-1", None, None),  # same dedup_id: one is published
        (b"order 1 in g", None, "g", "order-1", None, None),  # ids are per group: its own
    ]
    df = spark.createDataFrame(rows, OPTION_SCHEMA).repartition(3)
    df.write.format("vsqs").mode("append").save(queue.path)

    assert queue.stages() == []
    got = {info.body: info for info in queue.messages(bodies=True)}
    assert len(got) == 7 and len({b"order 1", b"order 1 again"} & set(got)) == 1
    assert (got[b"plain"].priority, got[b"plain"].attributes, got[b"plain"].group) == (0, {}, None)
    assert got[b"plain"].state == "ready"
    assert (got[b"urgent"].priority, got[b"urgent"].attributes) == (9, {"kind": "alert", "to": "ops"})
    assert got[b"later"].state == "delayed" and got[b"later"].visible_at > time.time() + 250
    assert got[b"in g"].group == got[b"in g, priority 0"].group == got[b"order 1 in g"].group == "g"
    assert next(iter(got)) == b"urgent"  # delivered first


def test_rerun_of_a_write_with_dedup_ids_publishes_nothing(spark, queue):
    """A dedup_id column makes re-running a whole write job idempotent for as
    long as the messages are in the queue, or gone less than dedup_window ago."""
    queue.configure(dedup_window=3600)
    df = spark.range(0, 200, numPartitions=2).select(
        F.format_string("order-%d", "id").cast("binary").alias("body"),
        F.format_string("order-%d", "id").alias("dedup_id"),
    )
    df.write.format("vsqs").mode("append").save(queue.path)
    assert queue.stats().total == 200
    consumed = queue.receive_batch(50, visibility_timeout=300)
    for message in consumed:
        message.delete()

    df.write.format("vsqs").mode("append").save(queue.path)  # the same job again
    assert queue.stats().total == 150 and queue.stages() == []  # nothing published

    queue.configure(dedup_window=0)  # now only the messages still queued hold their ids
    df.write.format("vsqs").mode("append").save(queue.path)
    assert queue.stages() == []
    assert Counter(m.body for m in _drain(queue)) == Counter(b"order-%d" % n for n in range(200))


def _expected_options(n: int) -> tuple[int, str | None, dict[str, str], str]:
    """(priority, group, attributes, state) of row n in the retried write below."""
    return (
        n % 10 if n % 3 == 0 else 0,
        f"g{n % 4}" if n % 3 == 1 else None,
        {"n": str(n)},
        "delayed" if n % 7 == 0 else "ready",
    )


def test_retried_write_task_with_option_columns_publishes_each_row_once(spark, queue, tmp_path):
    """As test_retried_write_task_publishes_each_row_once, with every option
    column; only even rows have a dedup_id, so a published stage of the failed
    attempt would show as duplicates of the odd ones."""
    marker = tmp_path / "first-attempt-failed"
    rows = 400
    udf = _fails_first_attempt_after_staging(queue.path, rows - 1, marker, PADDING)
    n = F.col("id")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        df = spark.range(0, 2 * rows, numPartitions=2).select(
            udf("id").alias("body"),
            F.when(n % 7 == 0, F.lit(600)).alias("delay"),  # an int column: any numeric type
            F.when(n % 3 == 1, F.format_string("g%d", n % 4)).alias("group"),
            F.when(n % 2 == 0, F.format_string("d-%d", n)).alias("dedup_id"),
            F.when(n % 3 == 0, (n % 10).cast("tinyint")).alias("priority"),
            F.create_map(F.lit("n"), n.cast("string")).alias("attributes"),
        )
        df.write.format("vsqs").mode("append").save(queue.path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    assert int(marker.read_text()) > 0  # the failed attempt had staged rows
    assert queue.stages() == []
    infos = list(queue.messages(bodies=True))
    assert Counter(info.body for info in infos) == Counter(b"row-%d" % n + PADDING for n in range(2 * rows))
    for info in infos:
        number = int(info.body[4:-len(PADDING)])
        assert (info.priority, info.group, info.attributes, info.state) == _expected_options(number)


def test_stream_write_with_option_columns_copies_a_queue(spark, queue, tmp_path):
    """A stream's read columns feed a write's option columns: a copy keeps
    priority, group and attributes (a grouped message reads as priority 0)."""
    queue.publish_batch([b"a", b"b"], attributes={"k": "v"})
    queue.publish(b"urgent", priority=8)
    queue.publish_batch([b"g1", b"g2"], group="tenant-7")
    target = vsqs.Queue(tmp_path / "copy", create=True)
    query = (
        spark.readStream.format("vsqs")
        .load(queue.path)
        .select("body", "priority", "group", "attributes", F.col("id").alias("dedup_id"))
        .writeStream.format("vsqs")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(target.path)
    )
    query.awaitTermination()
    assert queue.stats().total == 0 and target.stages() == []
    copied = {(i.body, i.priority, i.group, tuple(i.attributes.items())) for i in target.messages(bodies=True)}
    assert copied == {
        (b"a", 0, None, (("k", "v"),)),
        (b"b", 0, None, (("k", "v"),)),
        (b"urgent", 8, None, ()),
        (b"g1", 0, "tenant-7", ()),
        (b"g2", 0, "tenant-7", ()),
    }


def test_bad_option_values_name_their_column_and_publish_nothing(spark, queue):
    # a bad value in the last row, after earlier rows of the task were staged
    df = spark.range(0, 100, numPartitions=1).select(
        F.lit(b"x").alias("body"), F.when(F.col("id") == 99, 42).alias("priority")
    )
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "20")
    try:
        with pytest.raises(Exception, match=r"vsqs column 'priority' must be 0\.\.9 \(or null\), not 42"):
            df.write.format("vsqs").mode("append").save(queue.path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert queue.stats().total == 0 and queue.stages() == []
    # a column of the wrong type is refused on the driver, before any task
    with pytest.raises(Exception, match="'attributes' must be map<string,string>, not map<string,int>"):
        spark.createDataFrame([(b"x", {"k": 1})], "body binary, attributes map<string,int>").write.format(
            "vsqs"
        ).mode("append").save(queue.path)
    with pytest.raises(Exception, match="'priority' must be an integer"):
        spark.createDataFrame([(b"x", 1.5)], "body binary, priority double").write.format("vsqs").mode(
            "append"
        ).save(queue.path)
    assert queue.stats().total == 0 and queue.stages() == []


def test_write_rows_are_checked_without_spark():
    from pyspark.sql.types import (
        BinaryType,
        DoubleType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    from vsqs._spark.columns import WriteColumns, write_columns

    def schema(**columns):
        return StructType([StructField(name, dtype) for name, dtype in columns.items()])

    assert write_columns(schema(body=BinaryType())) == WriteColumns("body")
    columns = write_columns(
        schema(
            Body=StringType(),
            attributes=MapType(StringType(), StringType()),
            priority=IntegerType(),
            delay=DoubleType(),
            group=StringType(),
            dedup_id=StringType(),
        )
    )
    assert columns.body == "Body"
    assert [option for option, _ in columns.options] == ["delay", "group", "dedup_id", "priority", "attributes"]
    for bad, message in [
        (schema(body=BinaryType(), BODY=StringType()), "column 'BODY' is given twice"),
        (schema(body=BinaryType(), delay=StringType()), "'delay' must be a number of seconds"),
        (schema(body=BinaryType(), group=IntegerType()), "'group' must be string, not int"),
        (schema(body=MapType(StringType(), StringType())), "'body' must be binary or string"),
        (schema(body=BinaryType(), at=StringType()), "cannot write column 'at'"),
    ]:
        with pytest.raises(vsqs.InvalidArgument, match=message):
            write_columns(bad)

    def row(body=b"x", delay=None, group=None, dedup_id=None, priority=None, attributes=None):
        return columns.message(body, [delay, group, dedup_id, priority, attributes])

    assert row() == b"x"  # no option: a plain body
    assert row(delay=1, attributes=[("k", "v")]) == vsqs.Outgoing(b"x", delay=1.0, attributes={"k": "v"})
    assert row(group="g", priority=0) == vsqs.Outgoing(b"x", group="g", priority=0)
    for values, message in [
        ({"body": None}, "row whose 'Body' is null"),
        ({"delay": -1.0}, "'delay' must be a number of seconds >= 0"),
        ({"delay": float("nan")}, "'delay' must be a number"),
        ({"delay": 400 * 86400}, "'delay' must be at most"),
        ({"group": ""}, "'group' must be a string of 1-128 characters"),
        ({"dedup_id": "d" * 129}, "'dedup_id' must be a string of 1-128 characters"),
        ({"priority": 10}, "'priority' must be 0..9"),
        ({"attributes": [("k", None)]}, "'attributes' must map attribute 'k' to a string"),
        ({"attributes": [("bad name", "v")]}, "'attributes' must have attribute names"),
        ({"attributes": [(f"k{i}", "v") for i in range(51)]}, "at most 50 attributes"),
        ({"group": "g", "priority": 3}, "columns 'priority' and 'group'"),
    ]:
        with pytest.raises(vsqs.InvalidArgument, match=message):
            row(**values)


# -- bad input ------------------------------------------------------------------------


def test_missing_queue_is_a_clear_error(spark, tmp_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(Exception, match="no queue at"):
        spark.read.format("vsqs").load(missing).collect()
    with pytest.raises(Exception, match="no queue at"):
        spark.createDataFrame([(b"x",)], "body binary").write.format("vsqs").mode("append").save(missing)
    assert not os.path.exists(missing)


def test_missing_path_is_a_clear_error(spark):
    with pytest.raises(Exception, match="needs the queue directory"):
        spark.read.format("vsqs").load().collect()


def test_bad_options_are_named(spark, queue):
    with pytest.raises(Exception, match="'visibilityTimeout' must be a number of seconds > 0, not '-5'"):
        spark.readStream.format("vsqs").option("visibilityTimeout", "-5").load(queue.path)
    with pytest.raises(Exception, match="'numPartitions' must be an integer, not 'many'"):
        spark.read.format("vsqs").option("numPartitions", "many").load(queue.path).collect()
    with pytest.raises(Exception, match="did you mean 'maxMessagesPerTrigger'"):
        spark.readStream.format("vsqs").option("maxMessagesPerTriger", "5").load(queue.path)


def test_bad_dataframes_are_refused_and_publish_nothing(spark, queue):
    with pytest.raises(Exception, match="'body' must be binary or string, not bigint"):
        spark.range(3).withColumnRenamed("id", "body").write.format("vsqs").mode("append").save(queue.path)
    with pytest.raises(Exception, match="needs a 'body' column"):
        spark.range(3).write.format("vsqs").mode("append").save(queue.path)
    with pytest.raises(Exception, match="cannot write column 'extra'"):
        spark.createDataFrame([(b"x", 1)], "body binary, extra int").write.format("vsqs").mode(
            "append"
        ).save(queue.path)
    with pytest.raises(Exception, match="cannot be overwritten"):
        spark.createDataFrame([(b"x",)], "body binary").write.format("vsqs").mode("overwrite").save(
            queue.path
        )
    with pytest.raises(Exception, match="whose 'body' is null"):
        spark.createDataFrame([(b"x",), (None,)], "body binary").coalesce(1).write.format(
            "vsqs"
        ).mode("append").save(queue.path)
    assert queue.stats().total == 0 and queue.stages() == []


def test_options_parse_without_spark():
    parse = vsqs.spark.VsqsDataSource  # noqa: F841  (the options belong to it)
    from vsqs._spark.options import Options

    assert Options.parse({"path": "/q"}) == Options(path="/q")
    parsed = Options.parse(
        {"path": "/q", "create": "TRUE", "maxmessagespertrigger": "7", "visibilitytimeout": "2.5",
         "clockskew": "0", "numpartitions": "3", "checkpointlocation": "/ck"}
    )
    assert (parsed.create, parsed.max_per_trigger, parsed.visibility_timeout, parsed.num_partitions) == (
        True, 7, 2.5, 3,
    )
    for options, message in [
        ({}, "needs the queue directory"),
        ({"path": "/q", "visibilitytimeout": "0"}, "'visibilityTimeout' must be a number of seconds > 0"),
        ({"path": "/q", "visibilitytimeout": "nan"}, "'visibilityTimeout'"),
        ({"path": "/q", "visibilitytimeout": "86400"}, "at most 43200 seconds"),
        ({"path": "/q", "maxmessagespertrigger": "0"}, "'maxMessagesPerTrigger' must be between 1"),
        ({"path": "/q", "create": "perhaps"}, "'create' must be true or false"),
        ({"path": "/q", "clockskew": "-1"}, "'clockSkew'"),
        ({"path": "/q", "visibilitytimeot": "3"}, "did you mean 'visibilityTimeout'"),
    ]:
        with pytest.raises(vsqs.InvalidArgument, match=message):
            Options.parse(options)


# -- streaming read -------------------------------------------------------------------


def test_stream_drains_the_queue_and_deletes_what_spark_committed(spark, queue, tmp_path):
    bodies = [b"s%d" % i for i in range(44)] + [b"urgent"]
    queue.publish_batch(bodies[:-1])
    queue.publish(b"urgent", priority=9, attributes={"kind": "alert"})
    query = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "10")
        .load(queue.path)
        .writeStream.format("memory")
        .queryName("drained")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = spark.table("drained").collect()
    assert Counter(r.body for r in rows) == Counter(bodies)
    assert {r.state for r in rows} == {"in_flight"} and {r.receive_count for r in rows} == {1}
    [urgent] = [r for r in rows if r.body == b"urgent"]
    assert (urgent.priority, urgent.attributes, urgent.group) == (9, {"kind": "alert"}, None)
    assert {r.priority for r in rows if r.body != b"urgent"} == {0}
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [10, 10, 10, 10, 5]
    # the last batch too: Spark never calls commit() for it, latestOffset() deleted it
    assert queue.stats().total == 0


def _batch_recorder(directory: Path, fail_on: int | None = None):
    """A foreachBatch sink idempotent on the batch id: one file per batch."""

    def sink(df, batch_id):
        rows = [(r.id, r.body.decode(), r.receive_count) for r in df.collect()]
        (directory / f"{batch_id}.json").write_text(json.dumps(rows))
        if batch_id == fail_on:
            raise RuntimeError(f"injected crash in batch {batch_id}, before Spark commits it")

    directory.mkdir(exist_ok=True)
    return sink


def _recorded(directory: Path) -> dict[int, list]:
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


def _stream(spark, queue, checkpoint, sink, *, timeout):
    return (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "5")
        .option("visibilityTimeout", str(timeout))
        .load(queue.path)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_stream_restarted_before_the_lease_ran_out_replays_the_same_batch(spark, queue, tmp_path):
    bodies = ["r%d" % i for i in range(12)]
    queue.publish_batch(bodies)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    crashed = _stream(spark, queue, checkpoint, _batch_recorder(out, fail_on=1), timeout=120)
    with pytest.raises(Exception, match="injected crash in batch 1"):
        crashed.awaitTermination()
    first_try = _recorded(out)[1]
    assert queue.stats().in_flight == 5  # batch 1: claimed, not deleted

    _stream(spark, queue, checkpoint, _batch_recorder(out), timeout=120).awaitTermination()
    batches = _recorded(out)
    assert batches[1] == first_try  # the replay read the same messages by their receipts
    assert Counter(body for rows in batches.values() for _, body, _ in rows) == Counter(bodies)
    assert queue.stats().total == 0


def test_stream_killed_before_commit_redelivers_after_the_visibility_timeout(spark, queue, tmp_path):
    bodies = ["k%d" % i for i in range(20)]
    queue.publish_batch(bodies)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    crashed = _stream(spark, queue, checkpoint, _batch_recorder(out, fail_on=1), timeout=1)
    with pytest.raises(Exception, match="injected crash in batch 1"):
        crashed.awaitTermination()
    first = _recorded(out)
    lost_batch = {message_id: count for message_id, _, count in first[1]}
    # A one-second lease may run out before batch 1 claims: batch 1 then takes
    # some of batch 0's messages again (re-delivered, as SQS does), and batch 1's
    # delete of batch 0 leaves them to their new holder. The rest of batch 0 is gone.
    taken_again = {message_id: body for message_id, body, _ in first[0] if message_id in lost_batch}
    assert len(first[0]) == len(lost_batch) == 5
    assert all(lost_batch[i] == count + 1 for i, _, count in first[0] if i in taken_again)  # received once more
    assert queue.stats().total == 15 + len(taken_again)

    # the lease runs out: another consumer receives the batch again (and gives it back)
    deadline = time.monotonic() + 60
    while queue.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.1)
    again = {m.id: m for m in queue.receive_batch(20, visibility_timeout=60)}
    assert set(lost_batch) <= set(again)
    assert all(again[i].receive_count == count + 1 for i, count in lost_batch.items())
    for message in again.values():
        message.release()

    # the restarted query replays batch 1 without them (another consumer took
    # them meanwhile), then receives them as new: nothing lost, none twice but
    # those whose lease ran out in the first run
    _stream(spark, queue, checkpoint, _batch_recorder(out), timeout=60).awaitTermination()
    batches = _recorded(out)
    assert batches[1] == []
    delivered = Counter(body for rows in batches.values() for _, body, _ in rows)
    assert delivered == Counter(bodies) + Counter(taken_again.values())
    assert queue.stats().total == 0


# -- streaming write ---------------------------------------------------------------------


def test_stream_write_publishes_each_batch(spark, queue, tmp_path):
    target = str(tmp_path / "copy")
    bodies = [b"c%d" % i for i in range(30)]
    queue.publish_batch(bodies)
    query = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "12")
        .load(queue.path)
        .select(F.concat(F.lit(b"copy of "), "body").alias("body"))
        .writeStream.format("vsqs")
        .option("create", "true")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination()
    copy = vsqs.Queue(target)
    assert copy.stages() == []
    assert Counter(m.body for m in _drain(copy)) == Counter(b"copy of " + b for b in bodies)
    assert queue.stats().total == 0


# -- executors as workers --------------------------------------------------------------


@pytest.mark.parametrize("case", process_cases.CASES, ids=lambda case: case.__name__)
def test_process_queue(spark, queue, tmp_path, case):
    case(spark, queue, tmp_path)


# -- registration (last: after it, the session's registration wins) ------------------------


def test_register(spark, queue):
    vsqs.spark.register(spark)
    vsqs.spark.register(spark)  # again: harmless
    queue.publish(b"registered")
    assert [r.body for r in spark.read.format("vsqs").load(queue.path).collect()] == [b"registered"]
