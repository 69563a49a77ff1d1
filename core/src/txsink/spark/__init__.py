"""Spark integration: the ``txsink`` data source. The only package that imports pyspark.

Usage::

    from txsink.spark import register
    register(spark)
    (df.writeStream.format("txsink")
       .option("backend", "files").option("sink_id", "orders")
       .option("path", "/data/orders").option("checkpointLocation", "/chk/orders")
       .start())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txsink.spark.datasource import FORMAT, SinkSettings, TxsinkDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "SinkSettings", "TxsinkDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("txsink")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(TxsinkDataSource)
