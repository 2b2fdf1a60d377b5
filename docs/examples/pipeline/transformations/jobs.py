"""Jobs from the queue SPOOL/jobs into a streaming table, and their results
to the queue SPOOL/done.

``jobs`` is a streaming table fed by the vsqs source: each run of the
pipeline takes what is in the queue, and the messages are deleted once the
table has committed them (a run that dies re-reads them from its checkpoint).
``done`` is a sink that publishes each row once to a vsqs queue.
"""

from pyspark import pipelines as dp
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

spark = SparkSession.active()
spool = spark.conf.get("spark.vsqs.example.spool")


@dp.table(comment="every job message, as it arrived")
def jobs():
    return spark.readStream.format("vsqs").option("maxMessagesPerTrigger", "1000").load(f"{spool}/jobs")


dp.create_sink("done", "vsqs", {"path": f"{spool}/done", "create": "true"})


@dp.append_flow(target="done")
def results():
    return spark.readStream.table("jobs").select(F.upper(F.col("body").cast("string")).alias("body"))
