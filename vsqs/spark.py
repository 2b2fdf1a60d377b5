"""vsqs for PySpark: the ``vsqs`` data source and executors as queue workers.

    import vsqs.spark
    vsqs.spark.register(spark)                          # format("vsqs") (also found without it)
    spark.read.format("vsqs").load("/spool/jobs")       # a snapshot: one row per message
    df.select("body").write.format("vsqs").mode("append").save("/spool/jobs")
    # optional write columns (null: no option): delay, group, dedup_id, priority, attributes
    spark.readStream.format("vsqs").load("/spool/jobs") # claims, deletes after Spark's commit
    vsqs.spark.process_queue(spark, "/spool/jobs", handle, output="/spool/done")

Needs pyspark >= 4.0 (4.2 for streaming reads) and pyarrow: ``pip install
vsqs[spark]``. Options, semantics and deployment notes: ``docs/spark.md``.
The implementation lives in ``vsqs._spark``; this module is its public face.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vsqs._spark.columns import WRITE_COLUMNS
from vsqs._spark.options import OPTIONS
from vsqs._spark.process import ProcessResult, process_queue
from vsqs._spark.schema import COLUMNS, SCHEMA
from vsqs._spark.source import NAME, VsqsDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "COLUMNS",
    "NAME",
    "OPTIONS",
    "SCHEMA",
    "WRITE_COLUMNS",
    "ProcessResult",
    "VsqsDataSource",
    "process_queue",
    "register",
]


def register(spark: SparkSession) -> None:
    """Register the ``vsqs`` data source with ``spark``.

    Not needed when vsqs is installed where Spark's Python workers can import
    it: Spark finds the top-level ``pyspark_vsqs`` module by itself. Calling it
    anyway is harmless (the session's registration wins).
    """
    spark.dataSource.register(VsqsDataSource)
