"""The vsqs data source over Spark Connect (a thin client, ``remote()``).

A local Spark Connect server from pyspark's own jars (tests/spark/
connect_server.py; loopback, local[2,2]); its Python workers import this
checkout's vsqs. Each operation runs twice, in a fresh Connect session of
its own: one that never called ``vsqs.spark.register`` (Spark finds
``pyspark_vsqs`` on the server's Python path) and one that did (over
Connect, register pickles the class, by reference to vsqs._spark.source, and
sends it to the server, where it is registered for that session only).

``process_queue`` runs the same cases as on a classic session
(tests/spark/process_cases.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

import vsqs
import vsqs.spark
from tests.conftest import ROOT
from tests.spark import process_cases
from tests.spark.connect_server import connect_server, connect_url  # noqa: F401  (fixtures)

pytestmark = pytest.mark.timeout(600)


@contextlib.contextmanager
def _session(url: str, *, registered: bool) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    # builder.remote() sets SPARK_CONNECT_MODE_ENABLED=1 in os.environ, for good (stop()
    # removes it only for a "local" remote): left set, every later classic session of
    # this process (another module on the same xdist worker) would act as Connect
    saved = {key: os.environ.get(key) for key in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE")}
    session = SparkSession.builder.remote(url).create()  # a session of its own on the server
    try:
        if registered:
            vsqs.spark.register(session)
        yield session
    finally:
        session.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module", params=["found", "registered"])
def spark(request, connect_url):  # noqa: F811
    with _session(connect_url, registered=request.param == "registered") as session:
        yield session


@pytest.fixture
def one_session(connect_url):  # noqa: F811
    """A registered session of its own, for the tests that need no second mode."""
    with _session(connect_url, registered=True) as session:
        yield session


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


@pytest.mark.parametrize("case", process_cases.CASES, ids=lambda case: case.__name__)
def test_process_queue(spark, flat_queue, tmp_path, case):
    case(spark, flat_queue, tmp_path)


# -- the client dies mid-work: nothing is lost ------------------------------------------


def _client_killed_once_working(connect_url, mode, queue, output, checkpoint):  # noqa: F811
    """Start tests/spark/connect_client.py, SIGKILL it once OUTPUT holds results."""
    with subprocess.Popen(
        [sys.executable, "-m", "tests.spark.connect_client", connect_url, mode, queue.path, output, checkpoint],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    ) as client:
        try:
            assert client.stdout is not None and client.stdout.readline() == b"started\n"
            deadline = time.monotonic() + 120
            while not (os.path.isdir(output) and vsqs.Queue(output).stats().total >= 20):
                if client.poll() is not None:
                    pytest.fail(f"the client ended: {client.stderr.read().decode(errors='replace')[-3000:]}")
                assert time.monotonic() < deadline, "the client produced nothing in 120 s"
                time.sleep(0.05)
            assert queue.stats().total > 0  # killed mid-work
        finally:
            client.kill()


def _delivered_at_least_once(queue, output, bodies):
    results = Counter(m.body for m in _drain(vsqs.Queue(output)))
    assert set(results) == {b"done " + body for body in bodies}  # each at least once, none lost
    assert queue.stats().total == 0


def test_client_killed_during_process_queue_loses_nothing(one_session, flat_queue, tmp_path, connect_url):  # noqa: F811
    queue = flat_queue
    bodies = [b"k%d" % i for i in range(200)]
    queue.publish_batch(bodies)
    output = str(tmp_path / "out")
    _client_killed_once_working(connect_url, "process", queue, output, "")

    # the restart: a new client runs process_queue until the queue is empty (what the
    # dead client's job still held is in flight until that job ends or its lease runs out)
    def fn(body):
        return b"done " + body

    deadline = time.monotonic() + 180
    while queue.stats().total and time.monotonic() < deadline:
        vsqs.spark.process_queue(one_session, queue.path, fn, output=output, parallelism=2, wait=0.5)
    _delivered_at_least_once(queue, output, bodies)


def test_client_killed_during_a_streaming_query_loses_nothing(one_session, flat_queue, tmp_path, connect_url):  # noqa: F811
    queue = flat_queue
    bodies = [b"s%d" % i for i in range(120)]
    queue.publish_batch(bodies)
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "ck")
    vsqs.Queue(output, create=True)
    _client_killed_once_working(connect_url, "stream", queue, output, checkpoint)

    # the restart: the same query (its checkpoint) from a new client, to the end
    def slowly(body):
        return b"done " + body

    (
        one_session.readStream.format("vsqs")
        .load(queue.path)
        .select(F.udf(slowly, "binary")("body").alias("body"))
        .writeStream.format("vsqs")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(output)
        .awaitTermination()
    )
    deadline = time.monotonic() + 60  # messages the killed run's last batch held come back with their lease
    while queue.stats().total and time.monotonic() < deadline:
        time.sleep(0.2)
        (
            one_session.readStream.format("vsqs")
            .load(queue.path)
            .select(F.udf(slowly, "binary")("body").alias("body"))
            .writeStream.format("vsqs")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(output)
            .awaitTermination()
        )
    _delivered_at_least_once(queue, output, bodies)


# -- a declarative pipeline -------------------------------------------------------------

EXAMPLE_PIPELINE = ROOT / "docs" / "examples" / "pipeline"


def _run_pipeline(project, connect_url):  # noqa: F811
    """``spark-pipelines run`` in ``project``, against the test's Connect server
    (the CLI's own Python part, with SPARK_REMOTE: no second JVM)."""
    import pyspark

    cli = os.path.join(os.path.dirname(pyspark.__file__), "pipelines", "cli.py")
    env = {**os.environ, "SPARK_REMOTE": connect_url}
    done = subprocess.run([sys.executable, cli, "run", "--spec", "pipeline.yml"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Run is COMPLETED" in done.stdout


def test_example_pipeline_moves_jobs_through_a_streaming_table_to_a_sink(connect_url, tmp_path):  # noqa: F811
    project = tmp_path / "pipeline"
    shutil.copytree(EXAMPLE_PIPELINE, project)
    spool = tmp_path / "spool"
    spec = (project / "pipeline.yml").read_text()
    spec = spec.replace("file:///tmp/vsqs-pipeline/storage", (tmp_path / "storage").as_uri())
    spec = spec.replace("/tmp/vsqs-pipeline/spool", str(spool))
    (project / "pipeline.yml").write_text(spec)
    jobs = vsqs.Queue(spool / "jobs", create=True)

    jobs.publish_batch([b"job %d" % i for i in range(25)])
    _run_pipeline(project, connect_url)
    done = vsqs.Queue(spool / "done")
    assert Counter(m.body for m in _drain(done)) == Counter(b"JOB %d" % i for i in range(25))
    assert jobs.stats().total == 0  # deleted once the table committed them

    jobs.publish_batch([b"late %d" % i for i in range(5)])  # a second run takes only what is new
    _run_pipeline(project, connect_url)
    assert Counter(m.body for m in _drain(done)) == Counter(b"LATE %d" % i for i in range(5))
    assert jobs.stats().total == 0
