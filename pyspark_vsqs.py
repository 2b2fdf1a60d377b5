"""Lets Spark find the vsqs data source without registration.

On its first data-source lookup, Spark imports every top-level module named
``pyspark_*`` that its Python workers can import and registers the
``DefaultSource`` it finds, so ``spark.read.format("vsqs")`` works once vsqs
is installed. Kept light: Spark imports it in every lookup.
"""

from vsqs._spark.source import VsqsDataSource as DefaultSource

__all__ = ["DefaultSource"]
