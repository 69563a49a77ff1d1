"""Which streaming query a write belongs to, as Spark tells it.

Spark's stream execution sets the query's id (which lives in its checkpoint, whatever
its scheme: a deleted or replaced checkpoint gives a new one) and the batch id as local
properties of the stream's thread; tasks and ``foreachBatch`` functions inherit them.
Every path reads a write's stream here (:mod:`txsink.gate` checks it).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Task local property Spark's micro-batch engine sets to the batch id.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
#: Task local property Spark's stream execution sets to the query's id, which lives in
#: the query's checkpoint (whatever its scheme): a deleted or replaced checkpoint gives
#: a new one. Also set for the jobs of ``foreachBatch``, so it names the stream that
#: drives a batch write.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
def _local_path(location: str) -> str | None:
    """A local or ``file://`` location as a path; None for other schemes."""
    if location.startswith("file://"):
        return location[len("file://"):]
    return None if "://" in location else location


def checkpoint_query_id(checkpoint: str) -> str | None:
    """Spark's query id from ``<checkpoint>/metadata`` (local or ``file://`` paths)."""
    path = _local_path(checkpoint) if checkpoint else None
    if not path:
        return None
    try:
        with open(os.path.join(path, "metadata"), encoding="utf-8") as f:
            value = json.loads(f.readline()).get("id")
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def driving_query(spark: SparkSession | None, checkpoint: str | None
                  ) -> tuple[str | None, bool]:
    """The streaming query whose ``foreachBatch`` runs on this thread, and whether that
    is known: Spark sets the query id as a local property of the stream's thread (and of
    its ``foreachBatch`` function's calls). Under Spark Connect, no local property can be
    read: the query id of ``checkpoint``'s metadata (a stream of a ``TargetSet``), else
    not known."""
    try:
        context = spark.sparkContext if spark is not None else None
    except Exception:  # Spark Connect: no SparkContext in the client
        context = None
    if context is not None:
        value = context.getLocalProperty(QUERY_ID_PROPERTY)
        return (str(value) if value else None), True
    query = checkpoint_query_id(checkpoint) if checkpoint else None
    return query, query is not None


#: The module Spark Connect runs ``foreachBatch`` functions in, on the server.
CONNECT_FOREACH_BATCH = "pyspark.sql.connect.streaming.worker.foreach_batch_worker"


def in_connect_foreach_batch() -> bool:
    """Whether this process runs a ``foreachBatch`` function for Spark Connect (its worker
    module is loaded, or is the process's main module)."""
    import sys

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return CONNECT_FOREACH_BATCH in sys.modules or getattr(spec, "name", None) == \
        CONNECT_FOREACH_BATCH
