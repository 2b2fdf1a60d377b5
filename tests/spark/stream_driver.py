"""A streaming driver for the cluster tests, run as its own process so it can be killed.

    python -m tests.spark.stream_driver CONF_JSON QUEUE CHECKPOINT OUT PER_TRIGGER KILL_AT

Drains QUEUE with ``readStream.format("vsqs")`` (``availableNow``) into a
``foreachBatch`` sink that records each batch attempt as
``OUT/<batch id>-<pid>.json`` (the message ids, bodies and receive counts).
With KILL_AT >= 0 the driver SIGKILLs its own process group (this Python and
the driver JVM it started) right after recording batch KILL_AT: Spark has
run the batch but not committed it, as when a driver host dies mid-batch.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main() -> int:
    conf_json, queue, checkpoint, out_dir, per_trigger, kill_at = sys.argv[1:7]
    conf = json.loads(conf_json)
    out, kill_batch = Path(out_dir), int(kill_at)
    out.mkdir(exist_ok=True)

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def sink(df, batch_id: int) -> None:
        rows = sorted((r.id, r.body.decode(), r.receive_count) for r in df.collect())
        path = out / f"{batch_id}-{os.getpid()}.json"
        path.write_text(json.dumps(rows))
        if batch_id == kill_batch:
            os.killpg(os.getpgid(0), signal.SIGKILL)  # this Python and the driver JVM, at once

    query = (
        spark.readStream.format("vsqs")
        .option("maxMessagesPerTrigger", per_trigger)
        .option("visibilityTimeout", "300")
        .load(queue)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
