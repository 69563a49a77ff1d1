"""Which streaming query a write belongs to, as Spark tells it.

Spark's stream execution sets the query's id (which lives in its checkpoint, whatever
its scheme: a deleted or replaced checkpoint gives a new one) and the batch id as local
properties of the stream's thread; tasks and ``foreachBatch`` functions inherit them.
Every path reads a write's stream here (:mod:`txsink.gate` checks it).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from txsink.model import source_digest

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
    if location.startswith("file:/"):  # as Hadoop prints a local path
        return location[len("file:"):]
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


def driving_batch(spark: SparkSession | None) -> int | None:
    """The micro-batch whose ``foreachBatch`` function runs on this thread, as Spark's
    local property says (None outside one, and under Spark Connect)."""
    try:
        value = spark.sparkContext.getLocalProperty(BATCH_ID_PROPERTY) if spark else None
    except Exception:  # Spark Connect: no SparkContext in the client
        return None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def running_checkpoint(spark: SparkSession | None, query_id: str | None) -> str | None:
    """The checkpoint of the running query ``query_id``, as Spark resolved it (classic
    sessions only; None under Spark Connect or when Spark does not say)."""
    if spark is None or not query_id:
        return None
    try:
        jvm: Any = spark._jvm
        # foreachBatch hands the function a clone of the query's session, whose
        # manager does not list the query: ask the session that started it too.
        sessions = [spark._jsparkSession,
                    jvm.org.apache.spark.sql.SparkSession.getDefaultSession().get()]
        for session in sessions:
            query: Any = session.streams().get(query_id)
            if query is not None:
                return str(query.streamingQuery().resolvedCheckpointRoot()) or None
    except Exception:  # Spark Connect, a stand-in, or an internal Spark changed
        return None
    return None


def batch_source(checkpoint: str | None, batch_id: int | None,
                 spark: SparkSession | None = None) -> str | None:
    """A digest of Spark's offset log entry for micro-batch ``batch_id``
    (``<checkpoint>/offsets/<batch_id>``); None when that cannot be read.

    A batch number alone does not tell a replay: after a checkpoint restored from an
    older copy, Spark runs the copy's last logged batch again with its logged entry,
    and plans the batches after it anew, over other records, under numbers it used
    before. Spark never rewrites an entry, so a replay has the very entry its first run
    had, and a batch planned anew has a new one. The entry's batch timestamp is part of
    the digest: offsets alone do not tell (a file source's offset is an index into its
    own log in the checkpoint, which went back with the copy). Local and ``file://``
    checkpoints are read directly; others through Spark's own Hadoop file system when
    ``spark`` is a classic session."""
    if not checkpoint or batch_id is None or batch_id < 0:
        return None
    text = _offsets_text(checkpoint.rstrip("/"), batch_id, spark)
    if text is None:
        return None
    lines = text.splitlines()
    if len(lines) < 3 or not lines[0].startswith("v"):
        return None  # not an offset log entry (yet): nothing to compare
    return source_digest("\n".join(line.strip() for line in lines[1:]))


def _offsets_text(checkpoint: str, batch_id: int, spark: SparkSession | None) -> str | None:
    path = _local_path(checkpoint)
    if path is not None:
        try:
            with open(os.path.join(path, "offsets", str(batch_id)), encoding="utf-8") as f:
                return f.read()
        except (OSError, ValueError):
            return None
    try:
        jvm: Any = spark._jvm  # type: ignore[union-attr]
        conf = spark._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        if jvm is None:
            return None
        entry = jvm.org.apache.hadoop.fs.Path(checkpoint, f"offsets/{batch_id}")
        fs = entry.getFileSystem(conf)
        if not fs.exists(entry):
            return None
        stream = fs.open(entry)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
    except Exception:  # Spark Connect (no JVM here), or the file system refused
        return None
