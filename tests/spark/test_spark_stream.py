"""Faults of the streaming read: executors claim and record what
they claimed in manifests, so a retried task or a replayed batch re-reads the
same messages, and a restarted query finishes what a killed one held.

Spark on local[2,2] (a failed task is tried twice). Every test would fail if
the guarantee it names were broken: messages claimed but not re-read stay in
flight for the visibility timeout (300 s here), so "the queue is empty
afterwards" fails at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from tests.conftest import ROOT
from tests.spark.stream_driver import driver_runner, kill_at_each_point
from tests.spark.test_spark import spark  # noqa: F401  (the module's local[2,2] session)


def _recorder(directory: Path):
    """A foreachBatch sink idempotent on the batch id: one file per batch."""
    directory.mkdir(exist_ok=True)

    def sink(df, batch_id):
        rows = [(r.id, r.body.decode()) for r in df.collect()]
        (directory / f"{batch_id}.json").write_text(json.dumps(rows))

    return sink


def _recorded(directory: Path) -> dict[int, list]:
    return {int(p.stem): json.loads(p.read_text()) for p in directory.glob("*.json")}


def _dies_in_first_attempts(marker_dir: Path, attempts: int, batch_body_prefix: str):
    """A UDF passing ``id`` through; in the first ``attempts`` attempts of the
    task that meets a body starting with ``batch_body_prefix``, it records the
    ids seen so far and fails (raises), after its partition claimed."""

    def check(message_id, body):
        from pyspark import TaskContext

        context = TaskContext.get()
        if body.startswith(batch_body_prefix) and context.attemptNumber() < attempts:
            seen = marker_dir / f"attempt-{context.stageId()}-{context.partitionId()}-{context.attemptNumber()}"
            with open(seen, "a") as stream:
                stream.write(message_id + "\n")
            if len(seen.read_text().split()) >= 3:  # a few rows in: the claim is under way
                raise RuntimeError("injected failure of a task of the stream")
        return message_id

    return F.udf(check, "string", useArrow=False)


def _query(spark, queue, checkpoint, sink, udf=None, per_trigger=200):  # noqa: F811
    df = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", str(per_trigger))
        .option("numPartitions", "1")
        .option("visibilityTimeout", "300")
        .load(queue.path)
    )
    if udf is not None:
        df = df.select(udf("id", F.col("body").cast("string")).alias("id"), "body")
    return df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint)).trigger(
        availableNow=True
    ).start()


def test_task_killed_mid_claim_is_retried_on_the_same_messages(spark, queue, tmp_path):  # noqa: F811
    """The first attempt of batch 0's task fails after it claimed (and
    recorded) some messages; the retry re-reads them (later batches claim the rest)."""
    bodies = [f"t{i:03d}" for i in range(300)]
    queue.publish_batch(bodies)
    marks, out = tmp_path / "marks", tmp_path / "out"
    marks.mkdir()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        _query(spark, queue, tmp_path / "ck", _recorder(out), _dies_in_first_attempts(marks, 1, "t")).awaitTermination()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    failed = [p for p in marks.iterdir() if p.name.endswith("-0")]
    assert failed, "the first attempt did not fail"
    batches = _recorded(out)
    first_try = {line for p in failed for line in p.read_text().split()}
    delivered = [message_id for rows in batches.values() for message_id, _ in rows]
    assert first_try <= set(delivered)  # re-read by the retry, not left in flight
    assert len(delivered) == len(set(delivered)) == len(bodies)
    assert Counter(body for rows in batches.values() for _, body in rows) == Counter(bodies)
    assert queue.stats().total == 0  # nothing claimed was left behind


def test_query_dying_during_claims_replays_the_same_batch_on_restart(spark, flat_queue, tmp_path):  # noqa: F811
    """Batch 1's task fails in both attempts, after claiming: the query dies
    with batch 1 in its offset log and not committed (as when the driver dies
    while executors claim). The restarted query replays batch 1 with the
    messages the dead run claimed, and drains the queue to empty. (A queue
    without shards: batch 0 must be the "a" messages.)"""
    queue = flat_queue
    bodies = [f"a{i:03d}" for i in range(200)] + [f"b{i:03d}" for i in range(200)]
    queue.publish_batch(bodies)
    marks, out, checkpoint = tmp_path / "marks", tmp_path / "out", tmp_path / "ck"
    marks.mkdir()
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "10")
    try:
        dying = _query(spark, queue, checkpoint, _recorder(out), _dies_in_first_attempts(marks, 2, "b"))
        with pytest.raises(Exception, match="injected failure"):
            dying.awaitTermination()
        assert set(_recorded(out)) == {0}  # batch 1 never reached the sink
        held = queue.stats().in_flight
        assert held > 0  # the dead run's claims of batch 1 (batch 0 deleted by batch 1's tasks)
        claimed_by_the_dead_run = {line for p in marks.iterdir() for line in p.read_text().split()}

        _query(spark, queue, checkpoint, _recorder(out)).awaitTermination()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    batches = _recorded(out)
    assert claimed_by_the_dead_run <= {message_id for message_id, _ in batches[1]}
    assert Counter(body for rows in batches.values() for _, body in rows) == Counter(bodies)
    assert queue.stats().total == 0


LOCAL_CONF = {
    "spark.master": "local[2,2]",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.sql.shuffle.partitions": "2",
}


@pytest.mark.timeout(5 * 600 + 60)  # a hang guard: five drivers, each bounded by driver_runner's 600 s
def test_driver_killed_at_each_point_then_restarted_loses_nothing(flat_queue, tmp_path):
    """A real driver process is SIGKILLed while batch 1's tasks claim, after
    its sink wrote batch 2, once batch 2 is committed and before the next is
    planned, and in the last batch (which only deletes); each time a new
    driver restarts from the checkpoint (tests/spark/stream_driver.py).
    Nothing is lost, a replayed batch is the same batch, the queue ends
    empty. (Five Spark start-ups on one queue and checkpoint: the slowest
    test of the module; the cluster tests run the same on the NFS cluster.)"""
    (tmp_path / "out").mkdir()
    run = driver_runner(LOCAL_CONF, tmp_path)
    kill_at_each_point(run, flat_queue, tmp_path / "ck", tmp_path / "out")


def test_a_replay_whose_manifests_gc_removed_claims_nothing(spark, flat_queue, tmp_path):  # noqa: F811
    """The sink (idempotent on the batch id: it reads the batch, and keeps
    the first copy of an id, as an INSERT ... ON CONFLICT DO NOTHING keyed by
    the batch id would) writes batch 1 and then the query dies before Spark commits it. The query
    stays stopped past gc's grace for its manifests (here: gc with a grace of
    0 removes them), and new messages arrive. The restarted query replays
    batch 1: it must not claim the new messages under batch 1's id (the sink
    would skip them and the next batch delete them: lost); it claims nothing,
    and the next batch takes them."""
    queue = flat_queue
    queue.publish_batch([f"a{i:03d}" for i in range(200)] + [f"b{i:03d}" for i in range(200)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"
    out.mkdir()

    def sink(df, batch_id, dies_after: int | None = None):
        rows = [(r.id, r.body.decode()) for r in df.collect()]
        target = out / f"{batch_id}.json"
        if not target.exists():  # idempotent on the batch id: keeps the first copy (an INSERT keyed by it)
            target.write_text(json.dumps(rows))
        if batch_id == dies_after:
            raise RuntimeError("injected: the query dies after its sink wrote the batch")

    with pytest.raises(Exception, match="injected"):
        _query(spark, queue, checkpoint, lambda df, batch_id: sink(df, batch_id, 1)).awaitTermination()
    assert sorted(_recorded(out)) == [0, 1]
    assert queue.collect_garbage(stage_grace=0) > 0  # batch 1's manifests, as after the grace
    assert not list(Path(queue.path, ".spark").rglob("*.json"))
    late = [f"c{i:03d}" for i in range(150)]
    queue.publish_batch(late)

    _query(spark, queue, checkpoint, sink).awaitTermination()
    batches = _recorded(out)
    assert sorted(body for _, body in batches[1]) == [f"b{i:03d}" for i in range(200)]  # the first run's, kept
    assert Counter(body for seq, rows in batches.items() if seq > 1 for _, body in rows) == Counter(late)
    assert queue.stats().ready == queue.stats().delayed == 0  # the b's: in flight until their lease ends


WORKER_KILLING_DRIVER = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession
    queue_path, checkpoint, out = sys.argv[1:4]
    spark = (SparkSession.builder.master("local[2,2]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.python.daemon.module", "tests.spark.dying_daemon")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")

    def sink(df, batch_id):
        rows = [(r.id, r.body.decode(), r.receive_count) for r in df.collect()]
        with open(os.path.join(out, f"{batch_id}.json"), "w") as stream:
            json.dump(rows, stream)

    (spark.readStream.format("vsqs").option("maxMessagesPerTrigger", "300").option("numPartitions", "1")
        .option("visibilityTimeout", "300").load(queue_path)
        .writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
        .trigger(availableNow=True).start().awaitTermination())
    """
)


@pytest.mark.timeout(900)  # a hang guard: a Spark of its own, on a shared machine
def test_worker_killed_between_a_claim_and_its_record_loses_nothing(flat_queue, tmp_path):
    """Crash point: the executor's Python worker is SIGKILLed after
    ``receive_batch`` claimed chunk 1 of batch 0 and before the manifest
    recorded it (tests/spark/dying_daemon.py). Spark retries the task, which
    re-reads chunk 0 and claims on; the killed chunk is held by no manifest.
    Nothing is lost: every other message is delivered once, and the killed
    chunk's messages, exactly, are still in the queue, in flight under the
    receipts the dead worker got (valid: nothing touched them since), so
    they come back when that lease runs out (here: made visible at once by
    those receipts, as the lease's end would) and are received whole."""
    queue = flat_queue
    bodies = [f"k{i:03d}" for i in range(300)]
    queue.publish_batch(bodies)
    out, checkpoint, script, marker = tmp_path / "out", tmp_path / "ck", tmp_path / "driver.py", tmp_path / "died"
    out.mkdir()
    script.write_text(WORKER_KILLING_DRIVER)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               VSQS_TEST_DIE_BEFORE_RECORD=str(marker))
    command = [sys.executable, str(script), queue.path, str(checkpoint), str(out)]
    finished = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=600, check=False)
    assert finished.returncode == 0, finished.stderr.decode()[-3000:]
    assert marker.exists(), "no worker died between a claim and its record"
    orphaned = json.loads(marker.read_text())
    assert len(orphaned) == 100  # chunk 1: CLAIM_FIRST (50) doubled

    delivered = [row for rows in _recorded(out).values() for row in rows]
    ids = [message_id for message_id, _, _ in delivered]
    assert len(ids) == len(set(ids)) == 200  # every message the manifests knew, once
    held = {info.id: info for info in queue.messages()}
    orphaned_ids = {receipt.split(":")[1][:35] for receipt in orphaned}  # QUEUE_ID:KEY...: the ids
    assert set(held) == orphaned_ids  # the killed chunk, exactly, is what is left ...
    assert all(info.state == "in_flight" for info in held.values())  # ... held until the lease runs out
    assert not orphaned_ids & set(ids)

    for receipt in orphaned:  # the lease's end, now: the dead worker's receipts still hold the messages
        queue.change_visibility(receipt, 0)
    came_back = queue.receive_batch(300, visibility_timeout=300)
    assert sorted(m.body.decode() for m in came_back) == sorted(set(bodies) - {b for _, b, _ in delivered})
    assert Counter(b for _, b, _ in delivered) + Counter(m.body.decode() for m in came_back) == Counter(bodies)
    for message in came_back:
        message.delete()
    assert queue.stats().total == 0
