"""The ``txsink`` Spark data source: Spark's writer API mapped onto the 2PC protocol.

Which process runs what (checked with PySpark 4.3):

* **planner** (driver-side Python worker, once per micro-batch, before the batch's
  tasks start): builds the writer and pickles it for the tasks. Recovery runs
  here, when the writer is pickled: DECIDED epochs are committed again and
  orphans of earlier runs aborted, so no task of a replayed batch meets a
  participant that a decision still holds.
* **executors**: ``write`` = begin / write Arrow batches / pre_commit; the
  committable travels back in a :class:`TxsinkCommitMessage`. The epoch is Spark's
  batch id (task local property ``streaming.sql.batchId``) plus the epoch the state
  fixed for micro-batch 0 (0 unless batch writes used the state first; the planner
  reads it for the tasks: :meth:`Coordinator.stream_epoch`); the participant's
  attempt is Spark's task attempt id, unique within the driver across retries,
  speculative copies and stage retries, so two attempts never share a name.
* **committer** (driver-side Python worker): ``commit(messages, batchId)`` decides
  and commits through the :class:`~txsink.coordinator.Coordinator`; ``abort``
  rolls back what was not decided.

The coordinator state lives in ``<checkpointLocation>/txsink`` unless
``state_location`` is given. Spark lower-cases option keys, so backend option
names must be lower case.

Batch writes (``df.write``) reserve a fresh epoch each, and are refused on a state a
stream writes through (its next batches need the next numbers). Given ``txnAppId`` and
``txnVersion`` (Delta's names, same meaning), a write whose version is at or below
the highest committed version of its app id is skipped: that is what makes a re-run
batch job, or ``foreachBatch(lambda df, i: df.write...option("txnVersion", i))``,
exactly once.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from txsink import faults as fault_points
from txsink.backend import Backend
from txsink.coordinator import Coordinator, EpochOutcome, record_prepared
from txsink.errors import CheckpointChangedError, ConfigError, StateError
from txsink.gate import Gate
from txsink.group import TargetGroup, with_epoch, write_group
from txsink.model import Committable, DeliveryGuarantee, TransactionContext, validate_sink_id
from txsink.plugins import get_plugins
from txsink.spark._proc import owner_alive, owner_token
from txsink.spark.queries import (
    BATCH_ID_PROPERTY,
    QUERY_ID_PROPERTY,
    _local_path,
    batch_source,
    checkpoint_query_id,
)
from txsink.state import StateStore, WriteId
from txsink.targets import (
    GROUP_BACKEND,
    TargetSpec,
    check_columns,
    decode_targets,
    duplicate_column,
    parse_targets,
)
from txsink.writer import write_participant

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

try:  # PySpark >= 4.1 hands streaming writers Arrow batches directly.
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pragma: no cover - PySpark 4.0
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    _STREAM_ARROW = False

log = logging.getLogger(__name__)

FORMAT = "txsink"
#: Options that belong to txsink itself; every other option goes to the backend.
#: (``queryname`` is added by Spark's ``DataStreamWriter.queryName``.)
RESERVED_OPTIONS = frozenset({"backend", "sink_id", "checkpointlocation", "state_location",
                              "queryname", "txnappid", "txnversion", "guarantee", "targets",
                              "lease_owner", "txnstreamcheckpoint",
                              *(f"txsink.group.{k}" for k in ("epoch", "target", "owner"))})
#: Options with which ``txsink.spark.epoch`` has a write prepare one target of a group's
#: epoch it reserved (the epoch, the target's name, the reserving owner): the write
#: only prepares, and records its committables in the reservation.
GROUP_EPOCH, GROUP_TARGET, GROUP_OWNER = (f"txsink.group.{k}" for k in ("epoch", "target",
                                                                       "owner"))
#: Longest ``txnAppId``: it is kept in the state's metadata.
MAX_APP_ID = 200
#: Attempt-id offset of the unreported twin the ``duplicate`` fault prepares.
SPECULATIVE_TWIN_OFFSET = 1_000_000
#: Rows per Arrow batch when PySpark hands rows instead of Arrow (PySpark 4.0).
_ROWS_PER_BATCH = 10_000


@dataclass(frozen=True)
class SinkSettings:
    """The parsed options of one ``txsink`` write; picklable, validated on the driver."""

    backend: str
    sink_id: str
    state_location: str
    backend_options: Mapping[str, str] = field(default_factory=dict)
    #: The ``checkpointLocation`` option as given ("" when absent).
    checkpoint: str = ""
    #: Identity of a batch write (``txnAppId``/``txnVersion``), if given.
    write: WriteId | None = None
    #: What readers may see after failures (option ``guarantee``).
    guarantee: DeliveryGuarantee = DeliveryGuarantee.EXACTLY_ONCE
    #: The targets of a group (option ``targets``), else empty.
    targets: tuple[TargetSpec, ...] = ()
    #: A write that prepares one target of a reserved group epoch (``txsink.spark.epoch``):
    #: the epoch, the target's name and the owner that reserved it.
    group_epoch: int | None = None
    group_target: str | None = None
    group_owner: str | None = None
    #: The state lease's owner for this write (option ``lease_owner``; ``txsink run
    #: --remote`` sets it). None: the token of the driver JVM the workers run under.
    owner: str | None = None
    #: The checkpoint of the stream whose ``foreachBatch`` makes this batch write
    #: (option ``txnStreamCheckpoint``): binds its versions to that stream's query id
    #: where the tasks cannot report it (Spark Connect).
    stream_checkpoint: str = ""

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SinkSettings:
        """Validate Spark options (no I/O). Raises ConfigError naming the option."""
        opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
        if "targets" in opts:
            return cls._parse_group(opts)
        backend = opts.get("backend", "").strip()
        if not backend:
            raise ConfigError(
                "txsink: option 'backend' is required, e.g. .option('backend', 'files'); "
                "`txsink backends` lists the installed ones", field="backend")
        sink_id = validate_sink_id(opts.get("sink_id") or None)
        state = _state_location(opts, sink_id)
        backend_options = {k: v for k, v in opts.items() if k not in RESERVED_OPTIONS}
        guarantee = DeliveryGuarantee.parse(opts.get("guarantee", "exactly_once"))
        owner = _lease_owner(opts, sink_id)
        write = _write_id(opts, sink_id)
        stream_checkpoint = opts.get("txnstreamcheckpoint", "").strip().rstrip("/")
        if stream_checkpoint and write is None:
            raise ConfigError("txsink: option 'txnStreamCheckpoint' binds the versions of a "
                              "batch write's txnAppId to a stream: give txnAppId and "
                              "txnVersion too", field="txnStreamCheckpoint", sink_id=sink_id)
        if stream_checkpoint and _local_path(stream_checkpoint) is None:
            raise ConfigError(f"txsink: option 'txnStreamCheckpoint' {stream_checkpoint!r} must "
                              "be a local path or file:// URL (txsink reads the stream's query "
                              "id from its metadata file)", field="txnStreamCheckpoint",
                              sink_id=sink_id)
        settings = cls(backend, sink_id, state, backend_options,
                       opts.get("checkpointlocation", "").rstrip("/"), write,
                       guarantee, owner=owner, stream_checkpoint=stream_checkpoint)
        made = settings.create_backend()  # eager validation of the backend's options
        try:
            made.check_guarantee(guarantee)
        finally:
            made.close()
        return settings

    @classmethod
    def _parse_group(cls, opts: dict[str, str]) -> SinkSettings:
        if opts.get("backend", GROUP_BACKEND) != GROUP_BACKEND:
            raise ConfigError("txsink: options 'backend' and 'targets' exclude each other: "
                              "each target names its own backend", field="backend")
        sink_id = validate_sink_id(opts.get("sink_id") or None)
        stray = sorted(k for k in opts if k not in RESERVED_OPTIONS)
        if stray:
            raise ConfigError(f"txsink: option {stray[0]!r} belongs into a target's options: "
                              "with 'targets', every backend option goes to its target",
                              field=stray[0], sink_id=sink_id)
        guarantee = DeliveryGuarantee.parse(opts.get("guarantee", "exactly_once"))
        specs = parse_targets(decode_targets(opts["targets"]), sink_id, guarantee=guarantee)
        state = _state_location(opts, sink_id)
        checkpoint = opts.get("checkpointlocation", "").rstrip("/")
        epoch = opts.get(GROUP_EPOCH)
        target = opts.get(GROUP_TARGET)
        if target is not None and target not in {s.name for s in specs}:
            raise ConfigError(f"txsink: no target named {target!r} in this group",
                              field=GROUP_TARGET, sink_id=sink_id)
        owner = _lease_owner(opts, sink_id)
        return cls(GROUP_BACKEND, sink_id, state, {}, checkpoint, _write_id(opts, sink_id),
                   guarantee, targets=specs,
                   group_epoch=None if epoch is None else int(epoch), group_target=target,
                   group_owner=opts.get(GROUP_OWNER), owner=owner)

    def create_backend(self) -> Backend:
        if self.targets:
            return TargetGroup.from_specs(self.sink_id, self.targets)
        return get_plugins().create_backend(self.backend, self.backend_options)

    def store(self) -> StateStore:
        return get_plugins().state_store(self.state_location)

    def coordinator(self, backend: Backend, owner: str) -> Coordinator:
        return Coordinator(backend, self.store(), self.sink_id,
                           backend_options=self.backend_options, owner=owner,
                           guarantee=self.guarantee)

    def query_id(self) -> str | None:
        """Spark's query id from ``<checkpointLocation>/metadata`` (local paths only)."""
        return checkpoint_query_id(self.checkpoint)

    def stream_query_id(self) -> str | None:
        """The query id of ``txnStreamCheckpoint``'s stream, None when not given.

        Read when the write commits: the stream wrote its ``metadata`` before its first
        batch, so a stream checkpoint without one is a wrong path, and refused.
        """
        if not self.stream_checkpoint:
            return None
        query = checkpoint_query_id(self.stream_checkpoint)
        if query is None:
            raise StateError(f"txsink: option 'txnStreamCheckpoint' {self.stream_checkpoint!r}: "
                             "no streaming query id in its metadata file; give the "
                             "checkpointLocation of the stream whose foreachBatch makes this "
                             "write. Nothing of this write is committed",
                             sink_id=self.sink_id)
        return query


def _write_id(opts: Mapping[str, str], sink_id: str) -> WriteId | None:
    app_id = opts.get("txnappid", "").strip()
    version = opts.get("txnversion", "").strip()
    if not app_id and not version:
        return None
    if not app_id or not version:
        missing = "txnAppId" if not app_id else "txnVersion"
        raise ConfigError(f"txsink: option {missing!r} is required with the other of "
                          "txnAppId/txnVersion: together they name one batch write, which "
                          "is committed at most once", field=missing, sink_id=sink_id)
    if len(app_id) > MAX_APP_ID or not app_id.isprintable():
        raise ConfigError(f"txsink: option 'txnAppId' must be at most {MAX_APP_ID} printable "
                          "characters", field="txnAppId", sink_id=sink_id)
    try:
        number = int(version)
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"txsink: option 'txnVersion' must be a whole number >= 0 that grows "
                          f"with each write of the app id (e.g. the foreachBatch batch id), "
                          f"got {version[:40]!r}", field="txnVersion", sink_id=sink_id)
    return WriteId(app_id, number)


#: Sinks already warned that their versioned writes in a stream's foreachBatch name no
#: stream checkpoint (once per process).
_UNCHECKED_WARNED: set[str] = set()


class TxsinkCommitMessage(WriterCommitMessage):
    """Carries one serialized :class:`~txsink.model.Committable` from a task to the driver,
    with the id of the streaming query the task ran for and its micro-batch (None
    outside a stream). A task of a group carries one committable per target: the first,
    and the others in ``more``."""

    def __init__(self, committable: bytes, query_id: str | None = None,
                 more: tuple[bytes, ...] = (), batch_id: int | None = None) -> None:
        self.committable = committable
        self.query_id = query_id
        self.more = more
        self.batch_id = batch_id

    def __repr__(self) -> str:
        return f"TxsinkCommitMessage({len(self.committable)} bytes)"


def driving_query(messages: Sequence[WriterCommitMessage | None]) -> str | None:
    """The streaming query the tasks of one write ran for, as they report it.

    Read from the running query itself, so it holds for every checkpoint scheme
    (local, HDFS, S3, ...) and for checkpoints given by
    ``spark.sql.streaming.checkpointLocation``.
    """
    ids = {getattr(m, "query_id", None) for m in messages if m is not None}
    ids.discard(None)
    if len(ids) > 1:
        raise StateError(f"txsink: the tasks of one write report different streaming queries "
                         f"({', '.join(sorted(str(i) for i in ids))}); nothing was committed")
    return next(iter(ids), None)


def _task_query_id() -> str | None:
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty(QUERY_ID_PROPERTY) if tc is not None else None
    return str(value) if value else None


def _task_batch_id() -> int | None:
    """The micro-batch whose ``foreachBatch`` runs this task's write (None outside)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    value = tc.getLocalProperty(BATCH_ID_PROPERTY) if tc is not None else None
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def driving_batch(messages: Sequence[WriterCommitMessage | None]) -> int | None:
    """The micro-batch the tasks of one write ran for, when they all report the same."""
    ids = {getattr(m, "batch_id", None) for m in messages if m is not None}
    ids.discard(None)
    return next(iter(ids)) if len(ids) == 1 else None


def decode_messages(messages: Sequence[WriterCommitMessage | None]) -> list[Committable | None]:
    out: list[Committable | None] = []
    for m in messages:
        if m is None:
            out.append(None)
        elif isinstance(m, TxsinkCommitMessage):
            out.append(Committable.from_bytes(m.committable))
            out += [Committable.from_bytes(b) for b in getattr(m, "more", ())]
        else:
            raise StateError(f"txsink: unexpected commit message {type(m).__name__}")
    return out


def arrow_schema(schema: StructType | None) -> pa.Schema | None:
    """The Arrow schema Spark's own Arrow transfer gives ``schema`` (timestamps in UTC),
    None where PySpark cannot convert it (the rows' own types are then taken)."""
    if schema is None:
        return None
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        try:
            return to_arrow_schema(schema, timezone="UTC")  # PySpark 4.3
        except TypeError:
            # PySpark 4.0-4.2 take no ``timezone`` (UTC is their ``timestamp_utc``
            # default): asked with one, every frame fell back to the rows' inferred
            # types, and a table Spark made refused the INT written as BIGINT.
            return to_arrow_schema(schema)
    except Exception:
        return None


def _as_arrow_value(value: Any, kind: pa.DataType) -> Any:
    """A Row's value as Arrow takes it for ``kind``: Spark hands timestamps as naive
    datetimes in this process's local time."""
    if value is None:
        return None
    if pa.types.is_timestamp(kind) and kind.tz is not None and getattr(
            value, "tzinfo", 1) is None:
        return value.astimezone(datetime.timezone.utc)
    if pa.types.is_struct(kind) and isinstance(value, dict):
        return {f.name: _as_arrow_value(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind) and isinstance(value, list):
        return [_as_arrow_value(v, kind.value_type) for v in value]
    if pa.types.is_map(kind) and isinstance(value, dict):
        return [(k, _as_arrow_value(v, kind.item_type)) for k, v in value.items()]
    return value


def _rows_to_batches(rows: Iterator[Any], schema: pa.Schema | None = None
                     ) -> Iterator[pa.RecordBatch]:
    """Rows (PySpark 4.0 hands a streaming writer Rows, not Arrow) as Arrow batches of
    the frame's own Spark types (``schema``): inferred from the Python values, an INT
    column became BIGINT and a timestamp lost its time zone."""
    chunk: list[dict[str, Any]] = []

    def batch() -> pa.RecordBatch:
        if schema is None:
            return pa.RecordBatch.from_pylist(chunk)
        return pa.RecordBatch.from_pylist(
            [{f.name: _as_arrow_value(row.get(f.name), f.type) for f in schema}
             for row in chunk], schema=schema)

    for row in rows:
        chunk.append(row.asDict(recursive=True))
        if len(chunk) >= _ROWS_PER_BATCH:
            yield batch()
            chunk = []
    if chunk:
        yield batch()


def _write_task(settings: SinkSettings, epoch: int | None, iterator: Iterator[Any],
                *, arrow: bool, offset: int = 0,
                schema: pa.Schema | None = None) -> TxsinkCommitMessage:
    """Executor side: one participant per task attempt. ``epoch`` None: a micro-batch
    of the streaming sink, epoch ``offset`` + its batch id."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:  # pragma: no cover - Spark always runs write() in a task
        raise StateError("txsink: write() called outside a Spark task")
    batch_id = tc.getLocalProperty(BATCH_ID_PROPERTY)
    if epoch is None and batch_id is not None:
        epoch = offset + int(batch_id)
    elif batch_id is not None and settings.write is None and tc.partitionId() == 0:
        # A batch write inside foreachBatch: it has its own epoch, but a replayed
        # micro-batch writes again unless the write carries an identity.
        how = ("pass version=batch_id to txsink.spark.epoch" if settings.group_target
               else "pass .option('txnAppId', ...).option('txnVersion', batch_id)")
        log.warning("sink=%s epoch=%d: batch write inside foreachBatch (stream batch %s) "
                    "without a write identity: if Spark replays that batch, its rows are "
                    "written again; %s for exactly once", settings.sink_id, epoch, batch_id,
                    how)
    if epoch is None:
        raise StateError(f"txsink: task has no '{BATCH_ID_PROPERTY}' property; cannot tell "
                         "which epoch it writes", sink_id=settings.sink_id)
    ctx = TransactionContext(settings.sink_id, epoch, tc.partitionId(), tc.taskAttemptId())
    injector = fault_points.FaultInjector.from_env()
    first_attempt = tc.attemptNumber() == 0
    batches: Iterator[pa.RecordBatch] = (iterator if arrow
                                         else _rows_to_batches(iterator, schema))
    duplicate = first_attempt and injector.armed(fault_points.TASK_AFTER_PRE_COMMIT, epoch,
                                                 "duplicate")
    kept: list[pa.RecordBatch] = []

    def stream() -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if duplicate:
                kept.append(batch)
            yield batch
        if first_attempt:
            injector.hit(fault_points.TASK_BEFORE_PRE_COMMIT, epoch)

    backend = settings.create_backend()
    if isinstance(backend, TargetGroup):
        try:
            return _write_group_task(settings, backend, ctx, stream(), kept, duplicate,
                                     injector, first_attempt)
        finally:
            backend.close()
    try:
        committable = write_participant(backend, ctx, stream(), settings.guarantee)
        if duplicate:
            # Test-only: what a speculative copy that lost Spark's commit race leaves.
            twin = TransactionContext(ctx.sink_id, epoch, ctx.partition,
                                      ctx.attempt + SPECULATIVE_TWIN_OFFSET)
            lost = write_participant(backend, twin, iter(kept))
            log.warning("fault injection: prepared unreported twin %s", lost.describe())
        if first_attempt:
            injector.hit(fault_points.TASK_AFTER_PRE_COMMIT, epoch)
    finally:
        backend.close()
    return TxsinkCommitMessage(committable.to_bytes(), _task_query_id(),
                               batch_id=_task_batch_id())


def _write_group_task(settings: SinkSettings, group: TargetGroup, ctx: TransactionContext,
                      batches: Iterator[pa.RecordBatch], kept: list[pa.RecordBatch],
                      duplicate: bool, injector: fault_points.FaultInjector,
                      first_attempt: bool) -> TxsinkCommitMessage:
    """A task of a group: a participant in every target (or, for a write that prepares
    one target of a reserved epoch, in that target alone)."""
    if settings.group_target is not None:
        m = group.member(settings.group_target)
        one = TransactionContext(m.sink_id, ctx.epoch, ctx.partition, ctx.attempt)
        batches = (with_epoch(m.spec, b, ctx.epoch) for b in batches)
        c = dataclasses.replace(write_participant(m.backend, one, batches), target=m.name)
        committables = [c]
        if duplicate:
            twin = TransactionContext(m.sink_id, ctx.epoch, ctx.partition,
                                      ctx.attempt + SPECULATIVE_TWIN_OFFSET)
            lost = write_participant(m.backend, twin, iter(kept))
            log.warning("fault injection: prepared unreported twin %s", lost.describe())
    else:
        committables = write_group(group, ctx.epoch, ctx.partition, ctx.attempt, batches)
        if duplicate:
            for lost in write_group(group, ctx.epoch, ctx.partition,
                                    ctx.attempt + SPECULATIVE_TWIN_OFFSET, iter(kept)):
                log.warning("fault injection: prepared unreported twin %s", lost.describe())
    if first_attempt:
        injector.hit(fault_points.TASK_AFTER_PRE_COMMIT, ctx.epoch)
    return TxsinkCommitMessage(committables[0].to_bytes(), _task_query_id(),
                               tuple(c.to_bytes() for c in committables[1:]),
                               batch_id=_task_batch_id())


class _Finisher:
    """Driver side shared by the batch and the streaming writer."""

    settings: SinkSettings
    owner: str

    def _run(self, action: str, epoch: int, messages: Sequence[WriterCommitMessage | None],
             *, recover_below: bool = False, query_id: str | None = None,
             write_query: str | None = None, stream: bool = False,
             source: str | None = None) -> EpochOutcome | None:
        """Commit or abort ``epoch`` (for a stream: its micro-batch id, mapped to the
        epoch by the state, :meth:`Coordinator.stream_epoch`). ``source``: a batch
        write's driving micro-batch's offsets digest (a stream's own is read here)."""
        committables = decode_messages(messages)
        backend = self.settings.create_backend()
        try:
            # The lease fences: once a newer run of the query started, this run's
            # coordinator gets FencedError here instead of taking the sink back.
            coordinator = self.settings.coordinator(backend, self.owner)
            gate = Gate(coordinator)
            if action == "commit":
                # Normally the planner already recovered; doing it again is cheap and
                # keeps the output right even if the planner hook never ran.
                try:
                    if stream:
                        gate.start_stream(query_id, recover=False)
                    else:
                        coordinator.start(recover=False, query_id=query_id)
                except CheckpointChangedError:
                    _discard(backend, epoch, committables)
                    raise
                batch = epoch
                if stream:
                    source = batch_source(self.settings.checkpoint, batch)
                if stream:
                    epoch = coordinator.stream_epoch(epoch)
                if recover_below:
                    coordinator.recover(up_to_epoch=epoch - 1)
                guarantee = self.settings.guarantee
                outcome = (gate.decide(epoch, committables, write_query=write_query,
                                       source=source, batch_id=batch)
                           if guarantee.transactional
                           else coordinator.record_epoch(epoch, committables, guarantee,
                                                         write_query=write_query))
                log.info("sink=%s epoch=%d: %s", self.settings.sink_id, epoch, outcome.value)
                return outcome
            coordinator.start(recover=False, query_id=query_id, stream=stream)
            if stream:
                epoch = coordinator.stream_epoch(epoch)
            if not self.settings.guarantee.transactional:
                done = [c for c in committables if c is not None]
                if done:
                    log.warning(
                        "sink=%s epoch=%d: Spark aborted the batch, but under %s %d task(s) "
                        "had already committed %d row(s), which stay visible; if Spark runs "
                        "the batch again, readers see them twice", self.settings.sink_id,
                        epoch, self.settings.guarantee.value, len(done),
                        sum(c.rows for c in done))
                # Committed participants cannot be rolled back; only orphans (attempts
                # that prepared and failed before committing) are aborted.
                committables = [None] * len(committables)
            coordinator.abort_epoch(epoch, committables)
            return None
        finally:
            backend.close()


def _discard(backend: Backend, epoch: int, committables: Sequence[Committable | None]) -> None:
    """Roll back a refused batch's participants: no decision names them, and leaving
    them prepared would hold them until a start with the right checkpoint."""
    done = [c for c in committables if c is not None]
    for c in done:
        backend.abort(c)
    if done:
        log.warning("sink=%s epoch=%d: the checkpoint does not belong to this sink's state; "
                    "this batch's %d participant(s) (%d row(s)) were rolled back, nothing "
                    "of it is written", done[0].sink_id, epoch, len(done),
                    sum(c.rows for c in done))


class TxsinkStreamWriter(_StreamWriterBase, _Finisher):
    """Micro-batch writer: one epoch per Spark batch id."""

    def __init__(self, settings: SinkSettings, owner: str,
                 schema: StructType | None = None) -> None:
        self.settings = settings
        self.owner = owner
        self._planned = False
        #: The frame's types, for PySpark 4.0, which hands streaming writers Rows.
        self.arrow_schema = None if _STREAM_ARROW else arrow_schema(schema)
        #: The epoch of micro-batch 0 (the state fixes it; the planner reads it for
        #: the tasks, which write micro-batch b as this + b).
        self.epoch_offset = 0

    # Pickling happens only in the planner, right before the tasks are shipped.
    def __getstate__(self) -> dict[str, Any]:
        if not self._planned:
            self._before_tasks()
            self._planned = True
        state = dict(self.__dict__)
        state.pop("_planned", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._planned = True

    def _before_tasks(self) -> None:
        backend = self.settings.create_backend()
        try:
            backend.preflight(self.settings.sink_id)
            gate = Gate(self.settings.coordinator(backend, self.owner))
            # No task of this run writes yet: every prepared participant that no
            # decided epoch holds is a leftover (crashed run, failed attempt).
            gate.start_stream(self.settings.query_id())
            self.epoch_offset = gate.coordinator.stream_epoch(0)
        finally:
            backend.close()

    def write(self, iterator: Iterator[Any]) -> TxsinkCommitMessage:
        return _write_task(self.settings, None, iterator, arrow=_STREAM_ARROW,
                           offset=self.epoch_offset,
                           schema=getattr(self, "arrow_schema", None))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._run("commit", batchId, messages, recover_below=True,
                  query_id=driving_query(messages) or self.settings.query_id(), stream=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self._run("abort", batchId, messages,
                  query_id=driving_query(messages) or self.settings.query_id(), stream=True)


class TxsinkBatchWriter(DataSourceArrowWriter, _Finisher):
    """One-off write: a single epoch reserved in the state on the driver.

    Two writes running at once reserve distinct epochs. A write with an identity
    (``txnAppId``/``txnVersion``) that was committed before is skipped whole.
    """

    def __init__(self, settings: SinkSettings, owner: str) -> None:
        self.settings = settings
        self.owner = owner
        self.skip = False
        self.epoch = -1
        if settings.group_epoch is not None:
            # Prepares one target of an epoch txsink.spark.epoch reserved and decides;
            # epoch -1: the epoch's identity is committed, the write only tells which
            # streaming query drives it (checked against the one that committed it).
            self.epoch = settings.group_epoch
            self.skip = settings.group_epoch < 0
            return
        backend = settings.create_backend()
        try:
            backend.preflight(settings.sink_id)
            # The stream driving this write (foreachBatch) is known from its tasks only:
            # a skip is confirmed at commit (Gate.committed_before).
            opened = Gate(settings.coordinator(backend, owner)).open_write(
                settings.write, None, query_known=False, holder_alive=owner_alive)
        finally:
            backend.close()
        self.skip, self.epoch = opened.skip is not None, opened.epoch
        if not self.skip:
            log.info("sink=%s epoch=%d: batch write planned", settings.sink_id, self.epoch)

    def write(self, iterator: Iterator[Any]) -> TxsinkCommitMessage:
        if self.skip:
            return TxsinkCommitMessage(b"", _task_query_id(), batch_id=_task_batch_id())
        return _write_task(self.settings, self.epoch, iterator, arrow=True)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        query = self._write_query(messages) if self.settings.write is not None else None
        if self.settings.group_epoch is not None and not self.skip:
            self._record_group_target(messages, query)
            return
        if self.skip:
            if self.settings.write is not None:
                # Skipped as committed: only if the versions count for this same driver
                # (this stream, or no stream for both).
                backend = self.settings.create_backend()
                try:
                    Gate(self.settings.coordinator(backend, self.owner)).committed_before(
                        self.settings.write, query, source=self._source(messages))
                finally:
                    backend.close()
            return
        outcome = self._run("commit", self.epoch, messages, write_query=query,
                            source=self._source(messages))
        if outcome is not EpochOutcome.COMMITTED:
            raise StateError(
                f"sink={self.settings.sink_id} epoch={self.epoch}: the batch write's epoch "
                f"was found {outcome.value if outcome else 'unknown'} in the state; its data "
                "was aborted and nothing of this write is committed",
                sink_id=self.settings.sink_id, epoch=self.epoch)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.skip:
            return
        if self.settings.group_epoch is not None:
            # The reserving driver aborts the whole epoch; what this write prepared is
            # referenced by no record yet: roll it back now.
            backend = self.settings.create_backend()
            try:
                _discard(backend, self.epoch, decode_messages(messages))
            finally:
                backend.close()
            return
        self._run("abort", self.epoch, messages)

    def _record_group_target(self, messages: list[WriterCommitMessage | None],
                             query: str | None) -> None:
        """Add this write's committables (one target) to the reserved epoch's record."""
        committables = decode_messages(messages)
        failed = sum(1 for c in committables if c is None)
        done = [c for c in committables if c is not None]
        if failed:
            raise StateError(f"sink={self.settings.sink_id} epoch={self.epoch}: {failed} "
                             "task(s) of the write sent no committable",
                             sink_id=self.settings.sink_id, epoch=self.epoch)
        assert self.settings.group_owner is not None
        try:
            record_prepared(self.settings.store(), self.settings.group_owner, self.epoch,
                            done, query)
        except BaseException:
            backend = self.settings.create_backend()
            try:
                _discard(backend, self.epoch, done)
            finally:
                backend.close()
            raise

    def _source(self, messages: Sequence[WriterCommitMessage | None]) -> str | None:
        """The offsets digest of the micro-batch whose ``foreachBatch`` makes this
        versioned write, from ``txnStreamCheckpoint``'s offset log (the batch its tasks
        ran for): a version committed before from another entry is a batch Spark planned
        anew, refused (:meth:`Gate.refuse_replanned`). None without the option: this
        process cannot ask Spark where the stream's checkpoint is."""
        if self.settings.write is None:
            return None
        batch = driving_batch(messages)
        if not self.settings.stream_checkpoint:
            if batch is not None and self.settings.sink_id not in _UNCHECKED_WARNED:
                _UNCHECKED_WARNED.add(self.settings.sink_id)
                log.warning("sink=%s: txnAppId/txnVersion writes in the foreachBatch of a "
                            "stream, without option txnStreamCheckpoint: after the stream's "
                            "checkpoint is restored from an older copy, a version Spark "
                            "planned anew cannot be told from a replay and is skipped by its "
                            "number (its newer records lost). Give txnStreamCheckpoint (the "
                            "stream's checkpointLocation) to have it refused instead",
                            self.settings.sink_id)
            return None
        return batch_source(self.settings.stream_checkpoint, batch)

    def _write_query(self, messages: Sequence[WriterCommitMessage | None]) -> str | None:
        """The stream driving this write: as its tasks report it (classic Spark runs a
        ``foreachBatch`` write on the stream's thread), else from ``txnStreamCheckpoint``
        (under Spark Connect the write runs on a thread of its own, without the
        stream's properties). Both given and different: the option names another
        stream's checkpoint, refused."""
        reported = driving_query(messages)
        named = self.settings.stream_query_id()
        if reported is not None and named is not None and reported != named:
            raise StateError(
                f"txsink: option 'txnStreamCheckpoint' {self.settings.stream_checkpoint!r} "
                f"belongs to the streaming query {named}, but this write is driven by the "
                f"query {reported}; nothing of this write is committed",
                sink_id=self.settings.sink_id)
        return reported or named


def _state_location(opts: Mapping[str, str], sink_id: str) -> str:
    """Option ``state_location``, else ``<checkpointLocation>/txsink``."""
    state = opts.get("state_location") or ""
    if state:
        return state
    checkpoint = opts.get("checkpointlocation", "").rstrip("/")
    if not checkpoint:
        raise ConfigError(
            "txsink: option 'checkpointLocation' is required: the coordinator keeps "
            "its pending-transaction state under it (or set 'state_location')",
            field="checkpointLocation", sink_id=sink_id)
    return f"{checkpoint}/txsink"


def _lease_owner(opts: Mapping[str, str], sink_id: str) -> str | None:
    """Option ``lease_owner``: the lease's owner for a driver that is not the JVM's."""
    owner = opts.get("lease_owner", "").strip() or None
    if owner is not None and (len(owner) > MAX_APP_ID or not owner.isprintable()):
        raise ConfigError(f"txsink: option 'lease_owner' must be at most {MAX_APP_ID} "
                          "printable characters", field="lease_owner", sink_id=sink_id)
    return owner

class TxsinkDataSource(DataSource):
    """``df.write.format("txsink")`` and ``df.writeStream.format("txsink")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.settings = SinkSettings.parse(options)

    def writer(self, schema: StructType, overwrite: bool) -> TxsinkBatchWriter:
        _refuse_overwrite(overwrite, "mode('overwrite')")
        self._check_group(schema)
        return TxsinkBatchWriter(self.settings, self.settings.owner or owner_token())

    def streamWriter(self, schema: StructType, overwrite: bool) -> TxsinkStreamWriter:
        _refuse_overwrite(overwrite, "outputMode('complete')")
        self._check_group(schema)
        return TxsinkStreamWriter(self.settings, self.settings.owner or owner_token(), schema)

    def _check_group(self, schema: StructType) -> None:
        """A group's frame is refused before any task runs if it would be misrouted (not
        shaped while a target has select/where) or corrupted (an epoch column named like
        a column of the rows), and so is a set of targets the state did not record: here
        rather than when the writer is pickled, where the refusal drowned in a
        PicklingError."""
        settings = self.settings
        twice = duplicate_column(schema.fieldNames())
        if twice is not None:
            raise ConfigError(
                f"txsink: sink {settings.sink_id!r}: the rows have the column {twice!r} twice "
                "(names are compared case-blind, as Spark does), which no target can hold "
                "faithfully (Parquet would be unreadable, JSON lines and databases would keep "
                "one of the values); nothing was written. Give each column its own name",
                field="columns", sink_id=settings.sink_id)
        if not settings.targets:
            return
        from txsink.spark.group import recorded_targets_refusal, spark_columns

        check_columns(settings.sink_id, settings.targets, spark_columns(schema),
                      only=settings.group_target)
        refusal = recorded_targets_refusal(settings.state_location, settings.sink_id,
                                           settings.targets)
        if refusal is not None:
            raise refusal


def _refuse_overwrite(overwrite: bool, what: str) -> None:
    if overwrite:
        raise ConfigError(f"txsink appends exactly once; {what} is not supported: use "
                          "append (or update) mode", field="mode")
