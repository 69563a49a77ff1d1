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

A group of targets (each exactly once by its own stored positions; see
``docs/realtime.md``) is ``targets=[txsink.spark.target(...), ...]`` with a ``sink_id``,
or a ``txsink.spark.targets(..., realtime=True)`` set.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from txsink.errors import ConfigError, TxsinkError
from txsink.realtime import (
    DEFAULT_COMMIT_INTERVAL_S,
    GroupWriter,
    RealtimeTargetSpec,
    SourcePartition,
    SourceTopics,
)
from txsink.targets import ROUTE_PREFIX, TargetSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from txsink.realtime.stats import RealtimeStats

log = logging.getLogger(__name__)

class TargetSetLike(Protocol):
    """What ``start_realtime`` reads of a ``txsink.spark.TargetSet`` (named by shape: the
    group module imports this one)."""

    sink_id: str
    specs: tuple[TargetSpec, ...]
    checkpoint_location: str | None
    realtime: bool


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
    renamed = _renames(plan)
    output = {str(a.name()): int(a.exprId().id()) for a in _seq(plan.output())}
    for column, wanted in zip(position_columns, POSITION_COLUMNS, strict=True):
        expr_id = output.get(column)
        if expr_id is None:
            raise ConfigError(f"real-time mode: column {column!r} is missing; keep the Kafka "
                              f"source's {wanted!r} column in the output (it carries each "
                              "row's position)" + ("" if column == wanted else
                                                   f" under the name {column!r}, as "
                                                   "position_columns says"),
                              field="transform")
        seen = set()
        while expr_id in renamed and expr_id not in seen:  # `topic AS src_topic`, ...
            seen.add(expr_id)
            expr_id = renamed[expr_id]
        if origin.get(expr_id) != wanted:
            raise ConfigError(f"real-time mode: column {column!r} is not the Kafka source's "
                              f"own {wanted!r} column (it was recomputed, or renamed from "
                              f"another); pass the source's {wanted!r} through unchanged "
                              "(a rename is fine: name it in position_columns)",
                              field="transform")
    return rows


def _renames(plan: Any) -> dict[int, int]:
    """``alias id -> attribute id`` for every plain rename (``topic AS src_topic``) in the
    plan's projections: a renamed position column is still the source's own."""
    out: dict[int, int] = {}
    stack = [plan]
    while stack:
        node = stack.pop()
        if str(node.getClass().getSimpleName()) == "Project":  # (py4j has every attribute)
            for expr in _seq(node.projectList()):
                if str(expr.getClass().getSimpleName()) != "Alias":
                    continue
                child = expr.child()
                if str(child.getClass().getSimpleName()) == "AttributeReference":
                    out[int(expr.exprId().id())] = int(child.exprId().id())
        children = node.children()
        stack.extend(children.apply(i) for i in range(int(children.size())))
    return out


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


#: One target of a writer: its name ("" for a single sink), its real-time target, and
#: the route column holding its rows (None: the row's own columns, positions dropped).
WriterTarget = tuple[str, RealtimeTargetSpec, str | None]


#: The commit timer of a task looks this often whether a commit is due.
TICK_S = 0.025


class RealtimeForeachWriter:
    """Spark's ``foreach`` writer object: per task and batch one :class:`GroupWriter`
    over the targets (one for a single sink), plus a timer that commits rows which
    arrived just before a pause. ``run`` names this query run: later batches of it may
    reuse the sessions an earlier task claimed in the same Python worker (a restarted
    query has another run and claims afresh)."""

    def __init__(self, targets: Sequence[WriterTarget], position_columns: Sequence[str],
                 commit_interval_s: float, rows_per_record: str, sink_id: str,
                 run: str | None = None, topic_ids: Mapping[str, str] | None = None,
                 stats: Any = None) -> None:
        self.targets: list[WriterTarget] = [(str(n), spec, route) for n, spec, route in targets]
        self.run = run or f"{sink_id}/{uuid.uuid4().hex}"
        self.position_columns = tuple(position_columns)
        self.commit_interval_s = commit_interval_s
        self.rows_per_record = rows_per_record
        self.sink_id = sink_id
        #: The source topics' ids as the driver read them before the query started:
        #: every position is recorded with its topic's id, and a claim finding another
        #: id refuses (txsink.realtime.identity).
        self.topic_ids = dict(topic_ids or {})
        #: A Spark accumulator (:class:`StatsParam`) the writer adds its task's rows,
        #: commits and latencies to when the task ends (``None``: not counted).
        self.stats = stats
        self._writer: GroupWriter | None = None
        self._trace: Any = None
        self._stop: threading.Event | None = None
        self._timer: threading.Thread | None = None
        self._timer_error: BaseException | None = None

    _STATE = ("targets", "position_columns", "commit_interval_s", "rows_per_record", "sink_id",
              "run", "topic_ids", "stats")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k in self._STATE}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._trace = _Trace.open(partition_id, epoch_id)
        self._writer = GroupWriter({name: spec for name, spec, _ in self.targets},
                                   commit_interval_s=self.commit_interval_s,
                                   rows_per_record=self.rows_per_record, run=self.run,
                                   trace=None if self._trace is None else self._trace.write,
                                   batch=epoch_id)
        self._stop = threading.Event()
        self._timer_error = None
        self._timer = threading.Thread(target=self._tick, name="txsink-rt-commit",
                                       daemon=True)
        self._timer.start()
        return True

    def _tick(self) -> None:
        assert self._stop is not None and self._writer is not None
        # Often enough that a row waits little past its commit's due time.
        every = max(0.005, min(TICK_S, self.commit_interval_s / 4))
        while not self._stop.wait(every):
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
        topic = str(data.pop(topic_col))
        source = SourcePartition(topic, int(data.pop(partition_col)),
                                 self.topic_ids.get(topic))
        offset = int(data.pop(offset_col))
        routed = {route: data.pop(route, None) for _, _, route in self.targets if route}
        rows: dict[str, Any] = {}
        for name, _, route in self.targets:
            if route is None:
                rows[name] = data
            else:
                value = routed[route]
                rows[name] = None if value is None else value.asDict()
        self._writer.add(source, offset, rows)

    def close(self, error: BaseException | None) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._timer is not None:
            self._timer.join()
        writer, self._writer = self._writer, None
        if writer is None:
            return
        failure = error or self._timer_error
        try:
            writer.close(failure)
        finally:
            if self._trace is not None:
                self._trace.close()
                self._trace = None
        if failure is not None and error is None:
            raise failure
        if self.stats is not None:
            self.stats.add(writer.progress.to_plain())
        for name, stats in writer.stats.items():
            log.info("sink %s%s: batch done: %s written, %s skipped (replayed), %s commits",
                     self.sink_id, f" target {name}" if name else "", stats.written,
                     stats.skipped, stats.commits)


class StatsParam:
    """The accumulator of a real-time query's writers: :meth:`RealtimeStats.to_plain`
    dicts, added (Spark's ``AccumulatorParam`` protocol)."""

    def zero(self, value: Any) -> dict[str, dict[str, Any]]:
        return {}

    def addInPlace(self, a: dict[str, dict[str, Any]],
                   b: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from txsink.realtime.stats import merge_plain

        return merge_plain(a, b)


#: The accumulator of each query this driver started (by query run id).
_STATS: dict[str, Any] = {}


def query_stats(query: StreamingQuery) -> RealtimeStats:
    """What the writers of ``query`` (started by :func:`start_realtime` in this driver)
    did in the real-time batches that completed so far: rows, commits and latencies per
    target (``""`` for a single sink). Tasks report when they end, so a batch's numbers
    arrive with its end."""
    from txsink.realtime.stats import RealtimeStats

    acc = _STATS.get(str(query.runId))
    return RealtimeStats.from_plain(acc.value if acc is not None else None)


#: Where each writer traces its commits when set (a directory): one JSON line per
#: commit, with the source offsets, when each row reached the writer and when the
#: commit began and ended; no row data. For latency breakdowns
#: (``benchmarks/realtime_bench.py``), not for production.
TRACE_ENV = "TXSINK_REALTIME_TRACE"


class _Trace:
    def __init__(self, path: str, fields: dict[str, Any]) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._fields = fields

    @classmethod
    def open(cls, partition_id: int, epoch_id: int) -> _Trace | None:
        import os
        import time

        folder = os.environ.get(TRACE_ENV)
        if not folder:
            return None
        return cls(os.path.join(folder, f"writer-{os.getpid()}.jsonl"),
                   {"task": partition_id, "batch": epoch_id, "opened": time.time()})

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({**self._fields, **record}) + "\n"
        with self._lock:
            self._file.write(line)

    def close(self) -> None:
        import time

        self.write({"closed": time.time()})
        with self._lock:
            self._file.close()


#: Batches in a row a source partition may end where it started while records wait.
UNREAD_BATCHES = 3


def source_offsets(value: Any) -> dict[tuple[str, int], int]:
    """A Kafka source's offsets in Spark's progress (JSON text or a mapping)."""
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
            len(source_offsets(s.get("startOffset"))) for s in recent[-1]["sources"]) <= slots:
        return []
    unread: set[tuple[str, int]] | None = None
    for progress in recent:
        now = set()
        for source in progress["sources"]:
            start, end, latest = (source_offsets(source.get(k))
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


def start_realtime(df: DataFrame, *, sink_id: str | None = None, backend: str | None = None,
                   options: Mapping[str, str] | None = None,
                   targets: TargetSetLike | Sequence[Mapping[str, Any] | TargetSpec] | None = None,
                   checkpoint_location: str | None = None, trigger: str = "5 seconds",
                   commit_interval: str | float = DEFAULT_COMMIT_INTERVAL_S,
                   position_columns: Sequence[str] = POSITION_COLUMNS,
                   query_name: str | None = None,
                   field_prefix: str = "targets") -> StreamingQuery:
    """Start ``df`` in Spark's Real-time Mode, exactly once into ``backend``, or into each
    of ``targets`` (a group: ``txsink.spark.target(...)`` items with ``sink_id``, or a
    ``txsink.spark.targets(..., realtime=True)`` set, which brings its sink id and
    checkpoint).

    ``df`` must read Spark's Kafka source and keep its ``topic``, ``partition`` and
    ``offset`` columns, under these names or renamed (``topic AS src_topic``) and named
    in ``position_columns`` (topic, partition, offset); they are not written to the
    target (a group target's ``select`` may write them under other names).
    ``commit_interval`` bounds how long a row the writer holds stays invisible.
    Refuses, before anything runs, a pipeline whose output rows cannot each be traced
    to one source record (an aggregation, a join, ...), a backend without a real-time
    target, a target writing a topic the query reads, stored positions of another
    source topic (recreated) or of another place (a sink id reused), and a group target
    that would miss records another target holds. ``field_prefix`` names a group's
    targets in errors (``sink.targets`` for files; a single sink is then ``sink``).
    """
    interval = parse_seconds(commit_interval, "commit_interval")
    if targets is not None:
        plan = _group_plan(df, sink_id=sink_id, backend=backend, options=options,
                           targets=targets, checkpoint_location=checkpoint_location,
                           position_columns=position_columns, prefix=field_prefix)
    else:
        plan = _single_plan(df, sink_id=sink_id, backend=backend, options=options,
                            checkpoint_location=checkpoint_location,
                            position_columns=position_columns, prefix=field_prefix)
    return _start_plan(df, plan, trigger=trigger, interval=interval,
                       position_columns=position_columns, query_name=query_name)


class _Plan:
    """What one start writes: the sink id, its checkpoint, and per target (``""`` for a
    single sink) its backend, real-time target and select/where."""

    def __init__(self, sink_id: str, checkpoint: str, prefix: str,
                 backends: dict[str, str], built: dict[str, RealtimeTargetSpec],
                 specs: Sequence[TargetSpec]) -> None:
        self.sink_id, self.checkpoint, self.prefix = sink_id, checkpoint, prefix
        self.backends, self.built, self.specs = backends, built, tuple(specs)

    @property
    def group(self) -> bool:
        return bool(self.specs)


def _single_plan(df: DataFrame, *, sink_id: str | None, backend: str | None,
                 options: Mapping[str, str] | None, checkpoint_location: str | None,
                 position_columns: Sequence[str], prefix: str) -> _Plan:
    from txsink.realtime.config import check_single_sink_id

    if not sink_id or not backend or options is None:
        raise ConfigError("start_realtime: give sink_id, backend and options (one target), "
                          "or targets (a group)", field="targets")
    if not checkpoint_location:
        raise ConfigError("start_realtime: checkpoint_location is required",
                          field="checkpoint_location", sink_id=sink_id)
    check_single_sink_id(sink_id, "sink.sink_id" if prefix.startswith("sink.") else "sink_id")
    _check_frame(df, sink_id, position_columns)
    spec = target_spec(sink_id, backend, options)
    return _Plan(sink_id, checkpoint_location, "sink" if prefix.startswith("sink.") else "",
                 {"": backend}, {"": spec}, ())


def _group_plan(df: DataFrame, *, sink_id: str | None, backend: str | None,
                options: Mapping[str, str] | None,
                targets: TargetSetLike | Sequence[Mapping[str, Any] | TargetSpec],
                checkpoint_location: str | None, position_columns: Sequence[str],
                prefix: str) -> _Plan:
    from txsink.model import validate_sink_id
    from txsink.realtime.config import parse_realtime_targets, realtime_specs

    if backend is not None or options is not None:
        raise ConfigError("start_realtime: give either backend and options (one target) or "
                          "targets (a group), not both", field="targets")
    if not isinstance(targets, Sequence):
        if not targets.realtime:
            raise ConfigError(
                f"start_realtime: the targets of {targets.sink_id!r} were checked for "
                "micro-batches; build them with txsink.spark.targets(..., realtime=True)",
                field="targets", sink_id=targets.sink_id)
        if sink_id is not None and sink_id != targets.sink_id:
            raise ConfigError(f"start_realtime: sink_id {sink_id!r} is not the target set's "
                              f"{targets.sink_id!r}; leave sink_id out", field="sink_id")
        sink_id = targets.sink_id
        checkpoint_location = checkpoint_location or targets.checkpoint_location
        specs = targets.specs
    else:
        if not sink_id:
            raise ConfigError("start_realtime: a group of targets needs its sink_id (each "
                              "target's own is <sink_id>--<name>)", field="sink_id")
        items = [t.to_dict() if isinstance(t, TargetSpec) else t for t in targets]
        specs = parse_realtime_targets(items, validate_sink_id(sink_id), prefix=prefix)
    if not checkpoint_location:
        raise ConfigError("start_realtime: checkpoint_location is required",
                          field="checkpoint_location", sink_id=sink_id)
    _check_frame(df, sink_id, position_columns)
    built = realtime_specs(sink_id, specs, prefix=prefix)
    return _Plan(sink_id, checkpoint_location, prefix, {s.name: s.backend for s in specs},
                 built, specs)


def _start_plan(df: DataFrame, plan: _Plan, *, trigger: str, interval: float,
                position_columns: Sequence[str], query_name: str | None) -> StreamingQuery:
    """Every check and refusal before the query starts, the same for a single sink and
    a group (a single sink is a group of one target named ``""``): the pipeline's shape,
    no target feeding a topic the query reads, the columns each target writes, the
    stored positions' identity (source topic, destination) and, against the checkpoint's
    record, what a run may start with (:mod:`txsink.realtime.group`)."""
    from txsink.gate import position_refusal
    from txsink.realtime.group import (
        MEMBERS_FILE,
        StartPoint,
        members_record,
        options_field,
        read_members,
        start_refusal,
        target_field,
    )
    from txsink.spark.realtime_source import SparkKafkaSource

    sink_id, prefix = plan.sink_id, plan.prefix
    rows = check_pipeline(df, position_columns)
    if plan.group:
        shaped, routes = _shape(df, plan.specs, position_columns, sink_id, prefix)
        check_pipeline(shaped, position_columns)
    else:
        shaped, routes = df, {"": None}
    source = SparkKafkaSource(df)
    try:
        _check_no_feedback(source, plan, sink_id)
        _check_columns(df, plan, position_columns)
        topic_ids = source.topic_ids(source.topics())
        positions: dict[str, dict[SourcePartition, int]] = {}
        for name, spec in plan.built.items():
            here = options_field(prefix, name)
            try:
                spec.prepare()
                stored = spec.stored()
            except ConfigError as exc:
                where = here + (f".{exc.field}" if exc.field else "")
                raise ConfigError(f"{where}: {exc}", field=where, sink_id=sink_id) from None
            except TxsinkError as exc:  # a server away: name the target it belongs to
                raise TxsinkError(f"{target_field(prefix, name) or 'sink'}: {exc}",
                                  sink_id=sink_id) from None
            refusal = position_refusal(spec.sink_id, stored, spec.destination(),
                                       topic_ids, source.end_offsets, field=here)
            if refusal is not None:
                raise refusal
            positions[name] = {s: p.offset for s, p in stored.items()}
    finally:
        source.close()
    spark = df.sparkSession
    start = StartPoint(fresh=_checkpoint_fresh(spark, plan.checkpoint),
                       earliest=(_source_option(df, "startingOffsets") or "").lower()
                       == "earliest")
    members = f"{plan.checkpoint.rstrip('/')}/{MEMBERS_FILE}"
    refusal, warnings = start_refusal(sink_id, plan.backends, plan.built, positions,
                                      read_members(_read_text(spark, members)), start,
                                      prefix=prefix)
    if refusal is not None:
        raise refusal
    for line in warnings:
        log.warning("%s", line)
    _write_text(spark, members, members_record(sink_id, plan.backends, plan.built))
    if plan.group:
        log.info("sink %s: real-time mode into %d targets (%s), commit every %.0f ms",
                 sink_id, len(plan.built),
                 "; ".join(f"{n}: {s.describe()}" for n, s in plan.built.items()),
                 interval * 1000)
    else:
        log.info("sink %s: real-time mode into %s, commit every %.0f ms", sink_id,
                 plan.built[""].describe(), interval * 1000)
    stats: Any = spark.sparkContext.accumulator({}, StatsParam())  # type: ignore[arg-type]
    writer = RealtimeForeachWriter([(n, plan.built[n], routes[n]) for n in plan.built],
                                   position_columns, interval, rows, sink_id,
                                   topic_ids=topic_ids, stats=stats)
    query = _start(shaped, writer, plan.checkpoint, trigger, query_name)
    _STATS[str(query.runId)] = stats
    hold(query, spark, plan.checkpoint, sink_id)
    return query


def _check_columns(df: DataFrame, plan: _Plan, position_columns: Sequence[str]) -> None:
    """What each target would write, as its select makes the rows."""
    from txsink.realtime.group import target_field

    if not plan.group:
        plan.built[""].check_columns({f.name: f.dataType.simpleString()
                                      for f in df.schema.fields
                                      if f.name not in position_columns})
        return
    for t in plan.specs:
        part = df.selectExpr(*t.select) if t.select else df
        try:
            plan.built[t.name].check_columns({
                f.name: f.dataType.simpleString() for f in part.schema.fields
                if t.select or f.name not in position_columns})
        except ConfigError as exc:
            where = target_field(plan.prefix, t.name) + (".select" if t.select else "")
            raise ConfigError(f"{where}: {exc}", field=where, sink_id=plan.sink_id) from None


def _check_frame(df: DataFrame, sink_id: str, position_columns: Sequence[str]) -> None:
    if len(position_columns) != 3:
        raise ConfigError("position_columns: name the topic, partition and offset columns",
                          field="position_columns", sink_id=sink_id)
    if not df.isStreaming:
        raise ConfigError("real-time mode needs a streaming DataFrame (spark.readStream)",
                          field="source", sink_id=sink_id)


def _start(df: DataFrame, writer: RealtimeForeachWriter, checkpoint_location: str,
           trigger: str, query_name: str | None) -> StreamingQuery:
    clear_unfinished_first_batch(df, checkpoint_location)
    stream = (df.writeStream.outputMode("update").foreach(writer)
              .option("checkpointLocation", checkpoint_location)
              .trigger(realTime=trigger))  # type: ignore[call-overload]
    if query_name:
        stream = stream.queryName(query_name)
    query: StreamingQuery = stream.start()
    return query


#: The heartbeat thread of each query this driver started (by query run id).
_HOLDERS: dict[str, threading.Thread] = {}


def hold(query: StreamingQuery, spark: SparkSession, checkpoint: str, sink_id: str) -> None:
    """Keep the query's heartbeat in its checkpoint while it is active, from a daemon
    thread of this driver (:mod:`txsink.realtime.holder`: what ``txsink status`` and
    ``txsink reset`` read), and mark it released when the query ends.

    The file system handle is taken now: the release is written after ``query.stop()``,
    when the session may be stopping too (:func:`release_hold` waits for it)."""
    import os
    import socket
    import time

    from txsink.realtime.holder import BEAT_S, HOLDER_FILE, holder_record

    fs, path = _hadoop_path(spark, f"{checkpoint.rstrip('/')}/{HOLDER_FILE}")
    facts = {"sink_id": sink_id, "query_id": str(query.id), "run_id": str(query.runId),
             "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}

    def beat(released: float | None = None, ended: str | None = None) -> None:
        text = holder_record(**facts, beat=time.time(),  # type: ignore[arg-type]
                             released=released, ended=ended)
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    try:
        beat()
    except Exception as exc:
        log.warning("sink %s: cannot write the query's heartbeat in %s (%s): `txsink "
                    "status` will not show that a query holds the sink, and `txsink reset` "
                    "will not refuse while it runs", sink_id, checkpoint, exc)
        return

    def run() -> None:
        try:
            last = time.monotonic()
            while query.isActive:
                time.sleep(0.25)
                if time.monotonic() - last >= BEAT_S and query.isActive:
                    beat()
                    last = time.monotonic()
            error = query.exception()
            ended = "stopped" if error is None else (
                "failed: " + (str(error).strip().splitlines() or ["?"])[0][:300])
            beat(time.time(), ended)
        except Exception as exc:  # the JVM is gone (its driver stopped): nothing to beat
            log.debug("sink %s: heartbeat ends: %s", sink_id, exc)

    thread = threading.Thread(target=run, name=f"txsink-rt-holder-{sink_id}", daemon=True)
    _HOLDERS[str(query.runId)] = thread
    thread.start()


def release_hold(query: StreamingQuery, timeout_s: float = 10.0) -> None:
    """After ``query.stop()``: wait (bounded) until its heartbeat says it ended, so a
    ``txsink status`` or ``reset`` right after does not take it for a running one."""
    thread = _HOLDERS.pop(str(query.runId), None)
    if thread is not None:
        thread.join(timeout_s)


def _shape(df: DataFrame, specs: Sequence[TargetSpec], position_columns: Sequence[str],
           sink_id: str, prefix: str) -> tuple[DataFrame, dict[str, str | None]]:
    """``df`` plus one struct column per target with ``select``/``where`` (null where a
    row does not go to it), its rows' columns checked one target at a time so a bad
    expression names the target; the route column of each target (None: the row's own
    columns, positions dropped)."""
    from txsink.spark.messages import _is_spark_error, spark_message
    from txsink.targets import duplicate_column

    base = [c for c in df.columns if c not in position_columns]
    routes: dict[str, str | None] = {}
    exprs: list[str] = []
    for t in specs:
        here = f"{prefix}[{t.name}]"
        part = df
        for key, apply in (("where", t.where), ("select", t.select)):
            if not apply:
                continue
            try:
                part = (part.where(str(t.where)) if key == "where"
                        else part.selectExpr(*t.select))
                part.schema  # noqa: B018 - analysed here, where the error can name the target
            except Exception as exc:
                if not _is_spark_error(exc):
                    raise
                raise ConfigError(f"{here}.{key}: Spark cannot apply it to the rows the sink "
                                  f"receives: {spark_message(exc)}", field=f"{here}.{key}",
                                  sink_id=sink_id) from None
        columns = part.columns if t.select else base
        twice = duplicate_column(columns)
        if twice is not None:
            where = f"{here}.select" if t.select else here
            raise ConfigError(f"{where}: the rows of target {t.name!r} have the column "
                              f"{twice!r} twice (names are compared case-blind, as Spark "
                              "does); give each its own name", field=where, sink_id=sink_id)
        if not t.shaped:
            routes[t.name] = None
            continue
        fields = ", ".join(t.select) if t.select else ", ".join(f"`{c}`" for c in base)
        value = f"struct({fields})"
        if t.where:
            value = f"CASE WHEN ({t.where}) THEN {value} END"
        routes[t.name] = f"{ROUTE_PREFIX}{t.name}"
        exprs.append(f"{value} AS `{ROUTE_PREFIX}{t.name}`")
    if not exprs:
        return df, routes
    return df.selectExpr(*[f"`{c}`" for c in df.columns], *exprs), routes


def _check_no_feedback(source: SourceTopics, plan: _Plan, sink_id: str) -> None:
    """Refuse a target that writes a topic the query reads, on the cluster it reads (the
    gate's :func:`~txsink.gate.feedback_refusal`; the judgement is the target's:
    ``RealtimeTargetSpec.feeds``, the Kafka backend's)."""
    from txsink.gate import feedback_refusal
    from txsink.realtime.group import options_field

    feeding = [(f"{options_field(plan.prefix, name)}.topic", spec.place())
               for name, spec in plan.built.items() if spec.feeds(source)]
    refusal = feedback_refusal(source, feeding, sink_id=sink_id)
    if refusal is not None:
        raise refusal


def _source_option(df: DataFrame, key: str) -> str | None:
    """An option of the pipeline's Kafka source, read from Spark's plan."""
    stack = [df._jdf.queryExecution().analyzed()]
    while stack:
        node = stack.pop()
        children = node.children()
        count = int(children.size())
        if count == 0:
            for attr in ("extraOptions", "options"):
                if hasattr(node, attr):
                    try:
                        value = getattr(node, attr)().get(key)
                    except Exception:
                        continue
                    if isinstance(value, str):
                        return value.strip()
                    if value is not None and hasattr(value, "isDefined"):
                        return str(value.get()).strip() if value.isDefined() else None
            return None
        stack.extend(children.apply(i) for i in range(count))
    return None


def _jvm(spark: SparkSession) -> Any:
    jvm = spark._jvm
    if jvm is None:
        raise ConfigError("real-time mode needs a local driver (no Spark Connect)",
                          field="remote")
    return jvm


def _hadoop_path(spark: SparkSession, path: str) -> tuple[Any, Any]:
    hpath = _jvm(spark).org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark._jsc.hadoopConfiguration()), hpath


def _checkpoint_fresh(spark: SparkSession, checkpoint: str) -> bool:
    """Whether Spark's checkpoint holds no offsets yet (the next run starts from the
    source's startingOffsets, not from a checkpointed position)."""
    fs, path = _hadoop_path(spark, f"{checkpoint.rstrip('/')}/offsets")
    if not fs.exists(path):
        return True
    return not any(not str(s.getPath().getName()).startswith(".")
                   for s in fs.listStatus(path))


def _read_text(spark: SparkSession, path: str) -> str | None:
    fs, hpath = _hadoop_path(spark, path)
    if not fs.exists(hpath):
        return None
    stream = fs.open(hpath)
    try:
        data = _jvm(spark).org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
    finally:
        stream.close()
    return str(data)


def _write_text(spark: SparkSession, path: str, text: str) -> None:
    fs, hpath = _hadoop_path(spark, path)
    stream = fs.create(hpath, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def delete_positions(*, sink_id: str | None = None, backend: str | None = None,
                     options: Mapping[str, str] | None = None,
                     targets: TargetSetLike | Sequence[Mapping[str, Any] | TargetSpec]
                     | None = None,
                     source_topics: Sequence[str] | None = None) -> list[str]:
    """Delete a real-time sink's stored positions (every target's, for a group), or
    only those of ``source_topics`` (a source topic deleted and recreated), fencing the
    sessions that held them: what ``txsink reset`` does from a pipeline file, without
    the checkpoint. Stop the query first. The rows the targets hold stay: a run reading
    their records again writes them again. Returns one line per position deleted."""
    from txsink.model import validate_sink_id
    from txsink.realtime.config import parse_realtime_targets, realtime_specs

    if targets is None:
        if not sink_id or not backend or options is None:
            raise ConfigError("delete_positions: give sink_id, backend and options (one "
                              "target), or targets (a group)", field="targets")
        specs = {"": target_spec(sink_id, backend, options)}
    elif isinstance(targets, Sequence):
        if not sink_id:
            raise ConfigError("delete_positions: a group of targets needs its sink_id",
                              field="sink_id")
        items = [t.to_dict() if isinstance(t, TargetSpec) else t for t in targets]
        specs = realtime_specs(sink_id, parse_realtime_targets(items,
                                                               validate_sink_id(sink_id)))
    else:
        specs = realtime_specs(targets.sink_id, targets.specs)
    lines: list[str] = []
    for name, spec in specs.items():
        lines += [f"target {name}: {line}" if name else line
                  for line in spec.delete_positions(source_topics)]
    return lines
