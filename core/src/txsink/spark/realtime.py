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

import json
import logging
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


#: Batches in a row a source partition may end where it started while records wait.
UNREAD_BATCHES = 3


def _offsets(value: Any) -> dict[tuple[str, int], int]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    if not isinstance(value, Mapping):
        return {}
    return {(str(topic), int(p)): int(o) for topic, parts in value.items()
            if isinstance(parts, Mapping) for p, o in parts.items()}


def local_slots(master: str) -> int | None:
    """Task slots of a ``local``/``local[N]``/``local[*]``/``local[N,F]`` master (``None``
    for a cluster, whose slots change with its executors)."""
    import os
    import re

    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    if match[1] in (None, ""):
        return 1
    return (os.cpu_count() or 1) if match[1] == "*" else int(match[1])


def unread_partitions(progresses: Sequence[Mapping[str, Any]], slots: int | None,
                      batches: int = UNREAD_BATCHES) -> list[str]:
    """Source partitions that the last ``batches`` real-time batches (Spark's progress
    reports, ``query.recentProgress``) all ended where they started although the
    source held records past it: no task read them. Spark's Real-time Mode does that
    without an error when it has fewer task slots than source partitions; a running
    task reads every record that waits at its batch's start, so two such batches in a
    row already mean none ran. It answers only when the source has more partitions
    than ``slots`` (the task slots the query has; ``None``: unknown, no answer): an idle
    source whose offsets end on a transaction marker looks the same, measured."""
    recent = [p for p in progresses if p.get("sources")][-batches:]
    if len(recent) < batches:
        return []
    if slots is None or sum(
            len(_offsets(s.get("startOffset"))) for s in recent[-1]["sources"]) <= slots:
        return []
    unread: set[tuple[str, int]] | None = None
    for progress in recent:
        now = set()
        for source in progress["sources"]:
            start, end, latest = (_offsets(source.get(k))
                                  for k in ("startOffset", "endOffset", "latestOffset"))
            now |= {tp for tp, offset in start.items()
                    if end.get(tp) == offset and latest.get(tp, offset) > offset}
        unread = now if unread is None else unread & now
    return [f"{topic}-{p}" for topic, p in sorted(unread or ())]


def unread_error(unread: Sequence[str], sink_id: str) -> ConfigError:
    return ConfigError(
        f"real-time mode: source partition(s) {', '.join(unread)} were not read in "
        f"{UNREAD_BATCHES} batches in a row although records wait there: Spark's Real-time "
        "Mode needs a task slot per source partition (spark.master local[N] with N at least "
        "the source topic's partitions, or that many executor cores); nothing of them is "
        "lost, a run with enough slots reads them", field="spark.master", sink_id=sink_id)


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
    spec.check_columns({f.name: f.dataType.simpleString() for f in df.schema.fields
                        if f.name not in position_columns})
    spec.prepare()
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

