"""Spark Real-time Mode (``trigger(realTime=...)``) with exactly-once output.

Real-time Mode admits only a few sinks (Kafka, ``foreach``, console, memory), so
txsink runs there as a ``foreach`` writer: every row carries the Kafka source
position it came from, and the target stores the highest position it holds in the
same transaction as the rows (:mod:`txsink.realtime`). Pipelines for which that is
unsound are refused before the query starts, with a one-line reason.

Usage::

    from txsink.spark.realtime import start_realtime
    query = start_realtime(
        spark.readStream.format("kafka").option(...).load()
             .selectExpr("key", "upper(CAST(value AS STRING)) AS value",
                         "topic", "partition", "offset"),
        sink_id="orders-rt", backend="kafka",
        options={"topic": "orders-out", "kafka.bootstrap.servers": "..."},
        checkpoint_location="/chk/orders-rt")
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.errors import ConfigError
from txsink.realtime import (
    DEFAULT_COMMIT_INTERVAL_S,
    PositionWriter,
    RealtimeTargetSpec,
    SourcePartition,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

log = logging.getLogger(__name__)

#: The Kafka source's columns that carry each row's position.
POSITION_COLUMNS = ("topic", "partition", "offset")
#: Plan nodes whose output rows each come from exactly one input row, in order.
_ONE_TO_ONE = {"Project", "Filter", "SubqueryAlias", "EventTimeWatermark", "ResolvedHint",
               "View"}
#: One input row to any number of output rows, in order (rows of one record stay together).
_ONE_TO_MANY = {"Generate"}
_SOURCES = {"StreamingRelationV2", "StreamingRelation", "StreamingExecutionRelation"}
_WHY = {
    "Aggregate": "an aggregation", "Join": "a join", "Union": "a union",
    "Deduplicate": "a dropDuplicates", "DeduplicateWithinWatermark": "a dropDuplicates",
    "Window": "a window function", "Sort": "a sort", "Repartition": "a repartition",
    "RepartitionByExpression": "a repartition", "Expand": "a cube/rollup",
    "FlatMapGroupsWithState": "a stateful operator", "MapInPandas": "a mapInPandas",
    "PythonMapInArrow": "a mapInArrow", "MapInArrow": "a mapInArrow",
    "FlatMapGroupsInPandas": "a grouped applyInPandas",
    "TransformWithStateInPandas": "a stateful operator", "Limit": "a limit",
    "GlobalLimit": "a limit", "LocalLimit": "a limit",
}


def check_pipeline(df: DataFrame, position_columns: Sequence[str] = POSITION_COLUMNS) -> str:
    """``"one"`` or ``"many"`` rows per source record, or a ``ConfigError`` saying in one
    line why position-based exactly-once is unsound for this pipeline.

    Reads Spark's analyzed plan: one Kafka source, only row-by-row operators above it,
    and the position columns are the source's own attributes (not recomputed).
    """
    plan = df._jdf.queryExecution().analyzed()
    rows = "one"
    leaves: list[Any] = []
    stack = [plan]
    while stack:
        node = stack.pop()
        name = str(node.getClass().getSimpleName())
        children = node.children()
        count = int(children.size())
        if count == 0:
            if name not in _SOURCES:
                raise ConfigError(f"real-time mode: the pipeline reads from {name}, not a "
                                  "Kafka stream; only Spark's Kafka source carries the "
                                  "positions exactly-once needs", field="source")
            leaves.append(node)
            continue
        if name in _ONE_TO_MANY:
            rows = "many"
        elif name not in _ONE_TO_ONE:
            what = _WHY.get(name, f"a {name}")
            raise ConfigError(f"real-time mode: the pipeline has {what} ({name}): its output "
                              "rows cannot each be traced to one source record's position; "
                              "use micro-batches (format('txsink')) for it", field="transform")
        stack.extend(children.apply(i) for i in range(count))
    if len(leaves) != 1:
        raise ConfigError(f"real-time mode: the pipeline reads {len(leaves)} sources; it "
                          "must read exactly one Kafka stream", field="source")
    source = leaves[0]
    source_name = str(source.sourceName()) if hasattr(source, "sourceName") else "?"
    if source_name.lower() != "kafka":
        raise ConfigError(f"real-time mode: the source is {source_name!r}; only Spark's "
                          "Kafka source (format('kafka')) is supported", field="source")
    origin = {int(a.exprId().id()): str(a.name()) for a in _seq(source.output())}
    output = {str(a.name()): int(a.exprId().id()) for a in _seq(plan.output())}
    for column, wanted in zip(position_columns, POSITION_COLUMNS, strict=True):
        expr_id = output.get(column)
        if expr_id is None:
            raise ConfigError(f"real-time mode: column {column!r} is missing; keep the Kafka "
                              f"source's {wanted!r} column in the output (it carries each "
                              "row's position)", field="transform")
        if origin.get(expr_id) != wanted:
            raise ConfigError(f"real-time mode: column {column!r} is not the Kafka source's "
                              f"own {wanted!r} column (it was recomputed or renamed from "
                              "another); pass the source column through unchanged",
                              field="transform")
    return rows


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(int(scala_seq.size()))]


def target_spec(sink_id: str, backend: str, options: Mapping[str, str]) -> RealtimeTargetSpec:
    """The backend's real-time target, or a ``ConfigError`` if it has none."""
    from txsink.plugins import get_plugins

    cls = get_plugins().backend_class(backend)
    factory = getattr(cls, "realtime_target", None)
    if factory is None:
        raise ConfigError(f"real-time mode: backend {backend!r} has no real-time target; "
                          "supported: kafka, postgres", field="backend", sink_id=sink_id)
    spec: RealtimeTargetSpec = factory(sink_id, dict(options))
    return spec


class RealtimeForeachWriter:
    """Spark's ``foreach`` writer object: one :class:`PositionWriter` per task and batch,
    plus a timer that commits rows which arrived just before a pause. ``run`` names
    this query run: later batches of it may reuse the sessions an earlier task claimed
    in the same Python worker (a restarted query has another run and claims afresh)."""

    def __init__(self, spec: RealtimeTargetSpec, position_columns: Sequence[str],
                 commit_interval_s: float, rows_per_record: str,
                 run: str | None = None) -> None:
        self.spec = spec
        self.run = run or f"{spec.sink_id}/{uuid.uuid4().hex}"
        self.position_columns = tuple(position_columns)
        self.commit_interval_s = commit_interval_s
        self.rows_per_record = rows_per_record
        self._writer: PositionWriter | None = None
        self._stop: threading.Event | None = None
        self._timer: threading.Thread | None = None
        self._timer_error: BaseException | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()
                if k in ("spec", "position_columns", "commit_interval_s", "rows_per_record",
                         "run")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._writer = PositionWriter(self.spec, commit_interval_s=self.commit_interval_s,
                                      rows_per_record=self.rows_per_record, run=self.run)
        self._stop = threading.Event()
        self._timer_error = None
        self._timer = threading.Thread(target=self._tick, name="txsink-rt-commit",
                                       daemon=True)
        self._timer.start()
        return True

    def _tick(self) -> None:
        assert self._stop is not None and self._writer is not None
        while not self._stop.wait(self.commit_interval_s / 2):
            try:
                self._writer.flush_due()
            except BaseException as exc:
                self._timer_error = exc
                return

    def process(self, row: Any) -> None:
        if self._timer_error is not None:
            raise self._timer_error
        assert self._writer is not None
        data = row.asDict()
        topic_col, partition_col, offset_col = self.position_columns
        source = SourcePartition(str(data.pop(topic_col)), int(data.pop(partition_col)))
        offset = int(data.pop(offset_col))
        self._writer.add(source, offset, data)

    def close(self, error: BaseException | None) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._timer is not None:
            self._timer.join()
        writer, self._writer = self._writer, None
        if writer is None:
            return
        failure = error or self._timer_error
        writer.close(failure)
        if failure is not None and error is None:
            raise failure
        log.info("sink %s: batch done: %s written, %s skipped (replayed), %s commits",
                 self.spec.sink_id, writer.stats.written, writer.stats.skipped,
                 writer.stats.commits)


#: The temporary file of Spark's atomic checkpoint writes (``.<name>.<uuid>.tmp``).
_TEMP_ENTRY = re.compile(r"\..+\.tmp")


def clear_unfinished_first_batch(df: DataFrame, checkpoint_location: str) -> list[str]:
    """Delete the temporary offset-log file a driver killed during the query's first
    real-time batch leaves behind, when the offset log has no entry yet.

    Real-time Mode writes a batch's offsets when the batch ends; a driver killed while
    batch 0's entry was being written leaves ``offsets/.0.<uuid>.tmp``, and every later
    start then fails with ``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY`` (the offset log
    must be empty on batch 0): the query could never be resumed. The file is an
    unfinished write Spark never reads, and with no finished entry the query starts
    from its starting offsets either way, so removing it changes nothing but that.
    Returns the names removed."""
    jvm: Any = df.sparkSession._jvm
    hadoop_conf = df.sparkSession._jsc.hadoopConfiguration()
    offsets = jvm.org.apache.hadoop.fs.Path(checkpoint_location, "offsets")
    fs = offsets.getFileSystem(hadoop_conf)
    if not fs.exists(offsets):
        return []
    names = [str(status.getPath().getName()) for status in fs.listStatus(offsets)]
    if any(not _TEMP_ENTRY.fullmatch(name) for name in names):
        return []  # a finished entry (or something else): Spark decides, not txsink
    for name in names:
        fs.delete(jvm.org.apache.hadoop.fs.Path(offsets, name), False)
        log.warning("checkpoint %s: removed %s, an unfinished write of the first batch's "
                    "offsets (its driver was killed); the query starts from its starting "
                    "offsets", checkpoint_location, name)
    return names


def parse_seconds(text: str | float, field: str) -> float:
    """``'250 milliseconds'``, ``'1 second'`` or a number of seconds."""
    if isinstance(text, int | float):
        return float(text)
    parts = str(text).split()
    units = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1.0,
             "second": 1.0, "seconds": 1.0}
    try:
        if len(parts) == 2 and parts[1].lower() in units:
            return float(parts[0]) * units[parts[1].lower()]
        return float(text)
    except ValueError:
        pass
    raise ConfigError(f"{field}: {text!r} is not a duration such as '250 milliseconds'",
                      field=field)


def start_realtime(df: DataFrame, *, sink_id: str, backend: str, options: Mapping[str, str],
                   checkpoint_location: str, trigger: str = "5 seconds",
                   commit_interval: str | float = DEFAULT_COMMIT_INTERVAL_S,
                   position_columns: Sequence[str] = POSITION_COLUMNS,
                   query_name: str | None = None) -> StreamingQuery:
    """Start ``df`` in Spark's Real-time Mode, exactly once into ``backend``.

    ``df`` must read Spark's Kafka source and keep its ``topic``, ``partition`` and
    ``offset`` columns (renamed through ``position_columns`` if needed); they are not
    written to the target. ``commit_interval`` bounds how long a row the writer holds
    stays invisible. Refuses, before anything runs, a pipeline whose output rows cannot
    each be traced to one source record (an aggregation, a join, ...) and a backend
    without a real-time target.
    """
    interval = parse_seconds(commit_interval, "commit_interval")
    if len(position_columns) != 3:
        raise ConfigError("position_columns: name the topic, partition and offset columns",
                          field="position_columns", sink_id=sink_id)
    if not df.isStreaming:
        raise ConfigError("real-time mode needs a streaming DataFrame (spark.readStream)",
                          field="source", sink_id=sink_id)
    rows = check_pipeline(df, position_columns)
    spec = target_spec(sink_id, backend, options)
    spec.prepare()
    clear_unfinished_first_batch(df, checkpoint_location)
    log.info("sink %s: real-time mode into %s, commit every %.0f ms", sink_id,
             spec.describe(), interval * 1000)
    writer = (df.writeStream.outputMode("update")
              .foreach(RealtimeForeachWriter(spec, position_columns, interval, rows))
              .option("checkpointLocation", checkpoint_location)
              .trigger(realTime=trigger))  # type: ignore[call-overload]
    if query_name:
        writer = writer.queryName(query_name)
    query: StreamingQuery = writer.start()
    return query

