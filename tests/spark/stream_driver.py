"""A streaming driver killed at a chosen point, and the test that kills it at each point in turn.

    python -m tests.spark.stream_driver CONF_JSON QUEUE CHECKPOINT OUT PER_TRIGGER PARTITIONS KILL

Drains QUEUE with the vsqs streaming source (``availableNow``) into a
``foreachBatch`` sink that records each batch attempt as
``OUT/<batch id>-<pid>.json`` (the message ids, bodies and receive counts).
KILL says where the driver SIGKILLs its process group (this Python, the
driver JVM and the JVM's Python helpers: all of the driver host at once),
after writing ``OUT/killed-<point>.json``:

- ``claims:B``: a task of batch B, once its first chunk is claimed and
  recorded (the batch is in the offset log, not committed; the other tasks
  may be claiming);
- ``sink:B``: the sink wrote batch B, Spark has not committed it;
- ``plan:B``: batch B is committed and the driver plans the next one
  (``latestOffset``): nothing of the next batch is claimed or logged, and
  batch B is not deleted yet (the next batch's tasks delete it);
- ``settle``: a batch that only deletes (the last of an ``availableNow``
  run), once its first partition deleted its share;
- ``none``: run to the end.

The kill runs where that point is (a task on an executor, the driver's
Python helper that runs ``latestOffset``, the driver itself), so the source
is the vsqs one with the kill added: ``FaultySource`` below, pickled by
value to the executors because this module runs as ``__main__``.

:func:`kill_at_each_point` is the test, shared by the ``local`` tests
(tests/spark/test_spark_stream.py) and the cluster tests
(tests/spark/test_spark_cluster.py): one queue, one checkpoint, a driver
killed at each point in turn, each started again on the checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from vsqs._spark.source import VsqsDataSource
from vsqs._spark.stream import ClaimingStreamReader

FAULTY = "vsqs_faulty"
BATCH_PROPERTY = "vsqs.test.batchId"  # set by the sink: the batch id its tasks run for


def _die(kill: dict[str, Any], detail: dict[str, Any]) -> None:
    """Record where, then SIGKILL the driver's process group (and this process)."""
    marker = Path(kill["out"]) / f"killed-{kill['point']}.json"
    marker.write_text(json.dumps({**detail, "pid": os.getpid()}))
    os.killpg(kill["pgid"], signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)  # where this is not the driver's group (an executor, a daemon's worker)


def _batch_id() -> int | None:
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    value = context.getLocalProperty(BATCH_PROPERTY) or context.getLocalProperty("streaming.sql.batchId")
    return int(value) if value is not None else None


class FaultyReader(ClaimingStreamReader):
    """The vsqs stream reader with a kill at ``self.kill`` (set by FaultySource)."""

    kill: dict[str, Any]

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        kill = self.kill
        if kill["point"] == "plan":
            batch, checkpoint = kill["batch"], Path(kill["checkpoint"])
            if (checkpoint / "commits" / str(batch)).exists() and not (
                checkpoint / "offsets" / str(batch + 1)
            ).exists():
                _die(kill, {"batch": batch})
        return super().latestOffset(start, limit)

    def read(self, partition: Any) -> Any:
        kill, batch = self.kill, _batch_id()
        rows = 0
        for chunk in super().read(partition):
            rows += chunk.num_rows
            if kill["point"] == "claims" and batch == kill["batch"]:
                _die(kill, {"batch": batch, "rows": rows})  # this chunk is claimed and in the manifest
            yield chunk
        if kill["point"] == "settle" and rows == 0 and getattr(partition, "settle", None):
            _die(kill, {"batch": batch})  # its deletes are done: settle() joined them


class FaultySource(VsqsDataSource):
    """``format("vsqs_faulty")``: the vsqs source whose stream reader kills at ``KILL``."""

    KILL: ClassVar[dict[str, Any]] = {}

    @classmethod
    def name(cls) -> str:
        return FAULTY

    def streamReader(self, schema: Any) -> ClaimingStreamReader:
        reader = super().streamReader(schema)
        reader.__class__ = FaultyReader
        reader.kill = dict(self.KILL)
        return reader


def main() -> int:
    conf_json, queue, checkpoint, out_dir, per_trigger, partitions, kill_at = sys.argv[1:8]
    out = Path(out_dir)
    out.mkdir(exist_ok=True)
    point, _, batch = kill_at.partition(":")
    FaultySource.KILL = {
        "point": point, "batch": int(batch or -1), "pgid": os.getpgid(0), "out": str(out),
        "checkpoint": checkpoint,
    }

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in json.loads(conf_json).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(FaultySource)

    def sink(df, batch_id: int) -> None:
        spark.sparkContext.setLocalProperty(BATCH_PROPERTY, str(batch_id))
        rows = sorted((r.id, r.body.decode(), r.receive_count) for r in df.collect())
        (out / f"{batch_id}-{os.getpid()}.json").write_text(json.dumps(rows))
        if point == "sink" and batch_id == FaultySource.KILL["batch"]:
            _die(FaultySource.KILL, {"batch": batch_id})

    query = (
        spark.readStream.format(FAULTY)
        .option("maxMessagesPerTrigger", per_trigger)
        .option("numPartitions", partitions)
        .option("visibilityTimeout", "300")  # longer than the test: a message back by timeout fails it
        .load(queue)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


# -- the test ---------------------------------------------------------------------------

# (kill, how many messages a run may deliver before it) with 10 a trigger, 2
# partitions and 50 messages: batches 0-4 claim 10 each, batch 5 only deletes
KILLS = ["claims:1", "sink:2", "plan:2", "settle"]
MESSAGES, PER_TRIGGER, PARTITIONS = 50, 10, 2


def kill_at_each_point(run: Callable[[list[str]], int], queue: Any, checkpoint: Path, out: Path) -> None:
    """Kill the driver at each point of KILLS in turn, restarting it on one
    checkpoint, then let it finish; check what each point promises, and at
    the end that one copy of each batch id holds every message once.

    ``run(args)`` runs this module as a driver with ``args`` (QUEUE ...
    KILL) and returns its exit status.
    """
    bodies = [f"k{i:02d}" for i in range(MESSAGES)]
    queue.publish_batch(bodies)
    common = [queue.path, str(checkpoint), str(out), str(PER_TRIGGER), str(PARTITIONS)]
    def committed(batch: int) -> bool:
        return (checkpoint / "commits" / str(batch)).exists()

    def logged(batch: int) -> bool:
        return (checkpoint / "offsets" / str(batch)).exists()

    for kill in KILLS:
        point, _, batch_text = kill.partition(":")
        status = run([*common, kill])
        marker = out / f"killed-{point}.json"
        assert status == -signal.SIGKILL and marker.exists(), f"the driver was not killed at {kill} ({status})"
        where = json.loads(marker.read_text())
        batch = int(batch_text) if batch_text else where["batch"]
        assert where["batch"] == batch
        if point == "claims":  # logged, not committed, and what its tasks claimed is held
            assert logged(batch) and not committed(batch) and queue.stats().in_flight > 0
        elif point == "sink":  # written by the sink, not committed
            assert logged(batch) and not committed(batch) and _attempts(out)[batch]
        elif point == "plan":  # committed, the next batch neither logged nor deleting it yet
            assert committed(batch) and not logged(batch + 1)
            held = {message.id for message in queue.messages()}
            assert {row[0] for row in _attempts(out)[batch][0]} <= held
        else:  # settle: a batch with no rows, logged, not committed
            assert logged(batch) and not committed(batch) and not _attempts(out).get(batch, [[]])[-1]
    assert run([*common, "none"]) == 0

    attempts = _attempts(out)
    assert len(attempts[2]) == 2  # batch 2 ran twice: before the kill in its sink and after the restart
    for batch_id, runs in attempts.items():
        assert all(rows == runs[0] for rows in runs), f"batch {batch_id} replayed differently"
    # one copy of each batch id (what a sink idempotent on the batch id keeps) holds every message once
    delivered = Counter(body for runs in attempts.values() for _, body, _ in runs[0])
    assert delivered == Counter(bodies)
    assert {count for runs in attempts.values() for _, _, count in runs[0]} == {1}  # none back by timeout
    assert queue.stats().total == 0
    left = [name for _, _, names in os.walk(os.path.join(queue.path, ".spark", "stream")) for name in names]
    assert left == []  # every manifest settled


def driver_runner(conf: dict[str, str], logs: Path) -> Callable[[list[str]], int]:
    """``run(args)`` for :func:`kill_at_each_point`: this module as a driver with
    Spark conf ``conf``, in a process group of its own (which it kills), its
    output in ``logs``; an exit other than 0 or SIGKILL fails with the log."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def run(args: list[str]) -> int:
        log = logs / f"driver-{args[-1].replace(':', '-')}.log"
        with open(log, "wb") as output:
            driver = subprocess.Popen(
                [sys.executable, "-m", "tests.spark.stream_driver", json.dumps(conf), *args],
                cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:
                status = driver.wait(timeout=600)
            finally:
                try:  # whatever happened, nothing of that driver is left behind
                    os.killpg(driver.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if status not in (0, -signal.SIGKILL):
            raise AssertionError(f"driver exited {status}:\n{log.read_text(errors='replace')[-3000:]}")
        return status

    return run


def _attempts(out: Path) -> dict[int, list[list]]:
    """The rows of each batch id's attempts, in the order they were recorded."""
    found: dict[int, list[tuple[float, list]]] = {}
    for path in out.glob("*-*.json"):
        if path.name.startswith("killed-"):
            continue
        found.setdefault(int(path.name.split("-")[0]), []).append(
            (path.stat().st_mtime, json.loads(path.read_text()))
        )
    return {batch: [rows for _, rows in sorted(runs, key=lambda run: run[0])] for batch, runs in found.items()}


if __name__ == "__main__":
    sys.exit(main())
