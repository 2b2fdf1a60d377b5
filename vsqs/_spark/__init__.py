"""The Spark adapter: the ``vsqs`` data source and the executors-as-workers
helpers, over the public vsqs API (pyspark >= 4.0 and pyarrow).

    source.py    the DataSource (format "vsqs"): wires the modules below
    options.py   the data source options, parsed and checked
    schema.py    the read schema (columns of a row per message)
    columns.py   the columns a write takes, and the checks of their values
    reader.py    batch read: a snapshot of the queue
    writer.py    batch and streaming writes: stage per task attempt, publish on commit
    stream.py    streaming read: the driver's plan of each micro-batch (offsets)
    claims.py    streaming read on the executors: claim or re-read, read, delete
    manifest.py  streaming read: what each partition claimed, kept in the queue
    area.py      the queue's .spark/, reached from the queue's directory, never through a link
    process.py   process_queue: Spark tasks as queue workers
    checks.py    the engine's rules, asked so that an error can name a column or option

``vsqs.spark`` is the public face; ``pyspark_vsqs`` lets Spark find the source.
"""

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "vsqs.spark needs pyspark >= 4.0 and pyarrow: pip install 'vsqs[spark]'"
    ) from exc
