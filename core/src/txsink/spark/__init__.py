"""Spark integration: the ``txsink`` data source. The only package that imports pyspark.

Usage::

    from txsink.spark import register
    register(spark)
    (df.writeStream.format("txsink")
       .option("backend", "files").option("sink_id", "orders")
       .option("path", "/data/orders").option("checkpointLocation", "/chk/orders")
       .start())

Several targets, one decision per epoch (see ``txsink.spark.group``)::

    orders = txsink.spark.targets("orders", [txsink.spark.target("events", "kafka", ...),
                                             txsink.spark.target("totals", "postgres", ...)],
                                  checkpoint_location="/chk/orders")
    orders.write_stream(df).start()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from txsink.spark.datasource import FORMAT, SinkSettings, TxsinkDataSource
from txsink.spark.group import GroupEpoch, TargetSet, epoch, target, targets

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["FORMAT", "GroupEpoch", "SinkSettings", "TargetSet", "TxsinkDataSource", "epoch",
           "register", "target", "targets"]


def register(spark: SparkSession) -> None:
    """Make ``format("txsink")`` available in ``spark`` (idempotent)."""
    spark.dataSource.register(TxsinkDataSource)
