"""A Spark Connect client the tests kill: ``python -m tests.spark.connect_client
URL MODE QUEUE OUTPUT CHECKPOINT``.

MODE ``process``: process_queue from QUEUE to OUTPUT, slowly (10 ms a message).
MODE ``stream``: a streaming query from QUEUE to the queue OUTPUT, slowly, until killed.
It prints ``started`` once its session is up.
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import vsqs.spark


def slowly(body: bytes) -> bytes:
    time.sleep(0.01)
    return b"done " + body


def main(url: str, mode: str, queue: str, output: str, checkpoint: str) -> None:
    spark = SparkSession.builder.remote(url).create()
    vsqs.spark.register(spark)
    print("started", flush=True)
    if mode == "process":
        vsqs.spark.process_queue(spark, queue, slowly, output=output, parallelism=2, wait=0.5, visibility_timeout=2)
    else:
        slow = F.udf(slowly, "binary")
        (
            spark.readStream.format("vsqs")
            .option("maxMessagesPerTrigger", "10")
            .option("visibilityTimeout", "5")
            .load(queue)
            .select(slow("body").alias("body"))
            .writeStream.format("vsqs")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="100 milliseconds")
            .start(output)
            .awaitTermination()
        )


if __name__ == "__main__":
    main(*sys.argv[1:6])
