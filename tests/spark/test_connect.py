"""The vsqs data source over Spark Connect (a thin client, ``remote()``).

A local Spark Connect server from pyspark's own jars (tests/spark/
connect_server.py; loopback, local[2,2]); its Python workers import this
checkout's vsqs. Each operation runs twice, in a fresh Connect session of
its own: one that never called ``vsqs.spark.register`` (Spark finds
``pyspark_vsqs`` on the server's Python path) and one that did (over
Connect, register pickles the class, by reference to vsqs._spark.source, and
sends it to the server, where it is registered for that session only).

``process_queue`` does not work over Connect yet (it needs ``sparkContext``):
test_process_queue_over_connect_fails_today pins the error it gives.
"""

from __future__ import annotations

import os
from collections import Counter

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import vsqs
import vsqs.spark
from tests.spark.connect_server import connect_server, connect_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=["found", "registered"])
def spark(request, connect_url):  # noqa: F811
    from pyspark.sql import SparkSession

    # builder.remote() sets SPARK_CONNECT_MODE_ENABLED=1 in os.environ, for good (stop()
    # removes it only for a "local" remote): left set, every later classic session of
    # this process (another module on the same xdist worker) would act as Connect
    saved = {key: os.environ.get(key) for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    session = SparkSession.builder.remote(connect_url).create()  # a session of its own on the server
    try:
        if request.param == "registered":
            vsqs.spark.register(session)
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _drain(queue: vsqs.Queue) -> list[vsqs.Message]:
    got = []
    while batch := queue.receive_batch(1000, visibility_timeout=300):
        got.extend(batch)
    return got


def test_is_a_connect_session(spark):
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    assert isinstance(spark, RemoteSparkSession)


def test_server_workers_import_this_checkout(spark):
    where = F.udf(lambda _: __import__("vsqs").__file__, "string")
    assert spark.range(1).select(where("id")).first()[0] == vsqs.__file__


def test_batch_read(spark, flat_queue):
    queue = flat_queue
    queue.publish_batch([b"r%d" % i for i in range(20)])
    queue.publish(b"urgent", priority=7, attributes={"kind": "alert"})
    queue.receive_batch(3, visibility_timeout=300)
    before = list(queue.messages(bodies=True))
    df = spark.read.format("vsqs").option("numPartitions", "3").load(queue.path)
    assert df.schema == vsqs.spark.SCHEMA
    rows = df.collect()
    assert [(r.id, r.body, r.state, r.priority, r.attributes) for r in rows] == [
        (i.id, i.body, i.state, i.priority, i.attributes) for i in before
    ]
    counts = {r.state: r["count"] for r in df.groupBy("state").count().collect()}
    assert counts == {"ready": 18, "in_flight": 3}
    assert list(queue.messages(bodies=True)) == before  # a snapshot changes nothing


def test_batch_write(spark, flat_queue):
    queue = flat_queue
    df = spark.createDataFrame([(b"w%d" % i, i % 3) for i in range(25)], "body binary, priority int")
    df.write.format("vsqs").mode("append").save(queue.path)
    assert queue.stages() == []
    got = _drain(queue)
    assert Counter(m.body for m in got) == Counter(b"w%d" % i for i in range(25))


def test_read_stream_to_memory_and_parquet(spark, flat_queue, tmp_path):
    queue = flat_queue
    bodies = [b"s%d" % i for i in range(33)]
    queue.publish_batch(bodies)
    name = f"drained_{abs(hash(str(tmp_path)))}"
    query = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "10")
        .load(queue.path)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    rows = spark.table(name).collect()
    assert Counter(r.body for r in rows) == Counter(bodies)
    # over Connect, progress["numInputRows"] is None (the key is not in the progress's
    # dict; classic answers it): the attribute works on both
    assert [p.numInputRows for p in query.recentProgress if p.numInputRows] == [10, 10, 10, 3]
    assert queue.stats().total == 0

    more = [b"p%d" % i for i in range(17)]
    queue.publish_batch(more)
    out = tmp_path / "parquet"
    (
        spark.readStream.format("vsqs")
        .load(queue.path)
        .select("id", "body")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "ck2"))
        .trigger(availableNow=True)
        .start(str(out))
        .awaitTermination()
    )
    table = pq.read_table(str(out))  # the same host: the client reads what the server wrote
    assert Counter(table.column("body").to_pylist()) == Counter(more)
    assert queue.stats().total == 0


def test_write_stream_copies_a_queue(spark, flat_queue, tmp_path):
    queue = flat_queue
    target = str(tmp_path / "copy")
    bodies = [b"c%d" % i for i in range(30)]
    queue.publish_batch(bodies)
    (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", "12")
        .load(queue.path)
        .select(F.concat(F.lit(b"copy of "), "body").alias("body"))
        .writeStream.format("vsqs")
        .option("create", "true")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(target)
        .awaitTermination()
    )
    copy = vsqs.Queue(target)
    assert copy.stages() == []
    assert Counter(m.body for m in _drain(copy)) == Counter(b"copy of " + b for b in bodies)
    assert queue.stats().total == 0


def test_write_stream_from_a_file_source(spark, flat_queue, tmp_path):
    queue = flat_queue
    source = tmp_path / "in"
    source.mkdir()
    for part in range(3):
        (source / f"{part}.json").write_text("".join(f'{{"body": "f{part}-{i}"}}\n' for i in range(5)))
    (
        spark.readStream.schema("body string")
        .json(str(source))
        .writeStream.format("vsqs")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start(queue.path)
        .awaitTermination()
    )
    got = Counter(m.body for m in _drain(queue))
    assert got == Counter(f"f{p}-{i}".encode() for p in range(3) for i in range(5))


def test_errors_are_as_on_classic(spark, flat_queue, tmp_path):
    queue = flat_queue
    # over Connect, load() is lazy: the misspelled option fails when the query
    # starts (classic: at load()); the same message
    misspelled = spark.readStream.format("vsqs").option("maxMessagesPerTriger", "5").load(queue.path)
    with pytest.raises(Exception, match="did you mean 'maxMessagesPerTrigger'"):
        misspelled.writeStream.format("memory").queryName("never").option(
            "checkpointLocation", str(tmp_path / "ck")
        ).trigger(availableNow=True).start().awaitTermination()
    with pytest.raises(Exception, match="'numPartitions' must be an integer, not 'many'"):
        spark.read.format("vsqs").option("numPartitions", "many").load(queue.path).collect()
    with pytest.raises(Exception, match="no queue at"):
        spark.read.format("vsqs").load(str(tmp_path / "nope")).collect()
    with pytest.raises(Exception, match="'body' must be binary or string, not bigint"):
        spark.range(3).withColumnRenamed("id", "body").write.format("vsqs").mode("append").save(queue.path)
    assert queue.stats().total == 0


def test_process_queue_over_connect_fails_today(spark, flat_queue, tmp_path):
    """What a user gets today; the next session makes this work (DataFrame API)."""
    queue = flat_queue
    queue.publish_batch([b"x", b"y"])
    with pytest.raises(Exception) as caught:
        vsqs.spark.process_queue(spark, queue.path, bytes.upper, output=str(tmp_path / "out"), wait=0.2)
    print(f"process_queue over Connect: {type(caught.value).__name__}: {caught.value}")
    assert "sparkContext" in str(caught.value)
    assert queue.stats().total == 2  # nothing taken


# -- process_queue on the DataFrame API (sketch: vsqs._spark.process_df) --------------


def process_df_leaves_exactly_the_failed_messages(spark, queue, tmp_path):
    """Shared with test_spark.py (classic): the same run, the same counts."""
    from vsqs._spark.process_df import process_queue_df

    bodies = [b"p%d" % i for i in range(40)]
    ids = dict(zip(queue.publish_batch(bodies), bodies, strict=True))
    bad = {b"p3", b"p17", b"p39"}

    def fn(body):
        if body in bad:
            raise ValueError(f"cannot handle {body!r}")
        return body.upper()

    output = str(tmp_path / "out")
    result = process_queue_df(spark, queue.path, fn, output=output, parallelism=2, wait=0.2)
    assert result == vsqs.spark.ProcessResult(processed=37, failed=3, redelivered=0, lost=0, published=37, tasks=2)
    left = list(queue.messages())
    assert {ids[info.id] for info in left} == bad
    assert Counter(m.body for m in _drain(vsqs.Queue(output))) == Counter(b.upper() for b in bodies if b not in bad)
    assert not os.listdir(os.path.join(queue.path, ".spark", "process"))  # the run's reports removed


def process_df_task_that_dies_redelivers(spark, queue, tmp_path):
    """The Python worker dies holding a message; Spark retries the task; the
    dead attempt's counts come from its report in the spool."""
    import time

    from vsqs._spark.process_df import process_queue_df

    bodies = [b"d%d" % i for i in range(20)]
    queue.publish_batch(bodies)
    marker = tmp_path / "died"

    def fn(body):
        if body == b"d5" and not marker.exists():
            marker.write_text("x")
            os._exit(1)
        return body

    output = str(tmp_path / "out")
    result = process_queue_df(spark, queue.path, fn, output=output, parallelism=1, wait=0.2, visibility_timeout=1)
    assert marker.exists()
    if queue.stats().total:  # the retry finished before d5's lease ran out
        deadline = time.monotonic() + 60
        while queue.stats().in_flight and time.monotonic() < deadline:
            time.sleep(0.1)
        result += process_queue_df(spark, queue.path, fn, output=output, parallelism=1, wait=0.2)
    assert result.died == 1 and result.tasks >= 2
    assert (result.processed, result.published) == (20, 20)
    assert result.redelivered == 1 and result.lost == 0 and result.failed == 0
    assert queue.stats().total == 0
    assert Counter(m.body for m in _drain(vsqs.Queue(output))) == Counter(bodies)


def test_process_df_leaves_exactly_the_failed_messages(spark, flat_queue, tmp_path):
    process_df_leaves_exactly_the_failed_messages(spark, flat_queue, tmp_path)


def test_process_df_task_that_dies_redelivers(spark, flat_queue, tmp_path):
    process_df_task_that_dies_redelivers(spark, flat_queue, tmp_path)
