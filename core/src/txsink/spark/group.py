"""Groups of targets from Python: one epoch committed in several systems, or none.

Two ways to write a group, both with one decision per epoch:

* **one write** (streaming or batch): the data source writes every target from each
  task. ``targets(...)`` builds the options and shapes the frame (each target's
  ``select``/``where`` becomes a struct column the tasks route by)::

      orders = txsink.spark.targets("orders", [
          txsink.spark.target("events", "kafka", topic="orders", **kafka),
          txsink.spark.target("totals", "postgres", select=["id", "qty * price AS total"],
                              dsn=dsn, table="public.totals"),
      ], checkpoint_location="/chk/orders")
      orders.write_stream(df).start()

* **grouped writes** in ``foreachBatch`` or a batch job: each ``tx.write`` runs a Spark
  job that only prepares its target; the end of the block decides and commits them all,
  an exception aborts them all::

      def batch(df, batch_id):
          with orders.epoch(df.sparkSession, version=batch_id) as tx:
              tx.write(events_df, "events")
              tx.write(totals_df, "totals")

  ``version`` (Delta's ``txnVersion``) makes a replayed batch a no-op, and it is bound
  to the streaming query that drives the writes: after a checkpoint reset (Spark
  numbers batches from 0 again) the block refuses instead of skipping new batches.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from txsink.backend import Backend
from txsink.coordinator import Coordinator, record_prepared
from txsink.errors import ConfigError
from txsink.faults import NATIVE_BEFORE_RECORD, FaultInjector
from txsink.gate import Gate
from txsink.gate import refuse_feedback as gate_refuse_feedback
from txsink.group import TargetGroup
from txsink.lakehouse import TableBackend
from txsink.model import (
    SALVAGE_ATTEMPT_BASE,
    Committable,
    TransactionContext,
    validate_sink_id,
)
from txsink.plugins import get_plugins
from txsink.spark._proc import owner_alive, owner_token
from txsink.spark.queries import (
    batch_source,
    driving_batch,
    driving_query,
    in_connect_foreach_batch,
    running_checkpoint,
)
from txsink.state import EpochState, StateStore, WriteId
from txsink.targets import (
    GROUP_BACKEND,
    ROUTE_PREFIX,
    TargetSpec,
    check_columns,
    encode_targets,
    parse_targets,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

def target(name: str, backend: str, *, select: str | Sequence[str] | None = None,
           where: str | None = None, epoch_column: str | None = None,
           **options: Any) -> dict[str, Any]:
    """One target of a group: ``options`` are the backend's (e.g. ``topic=...``)."""
    item: dict[str, Any] = {"name": name, "backend": backend, "options": options}
    if select is not None:
        item["select"] = select
    if where is not None:
        item["where"] = where
    if epoch_column is not None:
        item["epoch_column"] = epoch_column
    return item


def shape(df: DataFrame, specs: Sequence[TargetSpec]) -> DataFrame:
    """``df`` as a group's tasks route it: one struct column per target, null where a
    row does not go to that target; ``df`` itself when no target has select/where."""
    if not any(s.shaped for s in specs):
        return df
    columns = []
    for s in specs:
        fields = ", ".join(s.select) if s.select else "*"
        value = f"struct({fields})"
        if s.where:
            value = f"CASE WHEN ({s.where}) THEN {value} END"
        columns.append(f"{value} AS `{ROUTE_PREFIX}{s.name}`")
    return df.selectExpr(*columns)


def spark_columns(schema: StructType) -> dict[str, list[str]]:
    """Top-level columns of a Spark schema with their struct fields (for
    :func:`~txsink.targets.check_columns`)."""
    from pyspark.sql.types import StructType

    return {f.name: ([c.name for c in f.dataType.fields]
                     if isinstance(f.dataType, StructType) else [])
            for f in schema.fields}


def checked_shape(df: DataFrame, specs: Sequence[TargetSpec], group_id: str, *,
                  prefix: str = "targets") -> DataFrame:
    """``df`` shaped for the group's tasks, refused (one line, before any job runs) if
    a target's ``epoch_column`` clashes with a column of its rows."""
    shaped = shape(df, specs)
    check_columns(group_id, specs, spark_columns(shaped.schema), prefix=prefix)
    return shaped


def takes_native(spec: TargetSpec, df: DataFrame | None = None) -> bool:
    """Whether Spark's own Parquet writer writes ``spec``'s files (the native data path:
    a table format, or the files backend writing Parquet). Not under Spark Connect
    (``df`` a Connect frame): there a ``foreachBatch`` function cannot read its stream's
    query id (no SparkContext), which the data source's tasks report, and the Connect
    client refuses the writer's ``errorifexists`` (every batch of a table target
    failed)."""
    cls = get_plugins().backend_class(spec.backend)
    if not cls.native_parquet_for(spec.options):
        return False
    return df is None or not type(df).__module__.startswith("pyspark.sql.connect")


class TargetSet:
    """The targets of one group, validated, with what a write of them needs.

    ``single``: the one spec is a plain sink (a pipeline file's ``sink:`` without
    targets), written under ``sink_id`` itself with the backend's own state, not as a
    group; only the native data path builds one.
    """

    def __init__(self, sink_id: str, specs: Sequence[TargetSpec], *,
                 checkpoint_location: str | None = None, state_location: str | None = None,
                 realtime: bool = False, single: bool = False) -> None:
        self.sink_id = validate_sink_id(sink_id)
        self.specs = tuple(specs)
        self.checkpoint_location = checkpoint_location
        self.state_location = state_location
        #: Checked for Spark's Real-time Mode (:meth:`start_realtime`), not micro-batches.
        self.realtime = realtime
        if single and len(self.specs) != 1:
            raise ConfigError("a single sink has one target", field="targets")
        self.single = single

    def backend(self) -> Backend:
        """The backend the coordinator drives: the group, or the single sink's own."""
        if self.single:
            spec = self.specs[0]
            return get_plugins().create_backend(spec.backend, spec.options)
        return TargetGroup.from_specs(self.sink_id, self.specs)

    def _micro_batch(self) -> None:
        if self.realtime:
            raise ConfigError(f"group {self.sink_id!r} was built for Real-time Mode "
                              "(realtime=True): start it with .start_realtime(df); build it "
                              "without realtime=True for micro-batches", field="targets",
                              sink_id=self.sink_id)

    def start_realtime(self, df: DataFrame, *, trigger: str = "5 seconds",
                       commit_interval: str | float | None = None,
                       position_columns: Sequence[str] | None = None,
                       query_name: str | None = None) -> StreamingQuery:
        """Start ``df`` in Spark's Real-time Mode into every target, each exactly once by
        its own stored positions (``docs/realtime.md``); the set must be built with
        ``targets(..., realtime=True)`` and a ``checkpoint_location``."""
        from txsink.spark.realtime import POSITION_COLUMNS, start_realtime

        extra: dict[str, Any] = {}
        if commit_interval is not None:
            extra["commit_interval"] = commit_interval
        return start_realtime(df, targets=self, trigger=trigger,
                              position_columns=position_columns or POSITION_COLUMNS,
                              query_name=query_name, **extra)

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.specs]

    def spec(self, name: str | None = None, *, backend: str | None = None) -> TargetSpec:
        """A target by name, or the only one with ``backend``."""
        if name is not None:
            for s in self.specs:
                if s.name == name:
                    return s
            raise ConfigError(f"group {self.sink_id!r} has no target {name!r} (targets: "
                              f"{', '.join(self.names)})", field="target")
        found = [s for s in self.specs if backend is not None and s.backend == backend]
        if len(found) != 1:
            raise ConfigError(
                f"group {self.sink_id!r}: name the target to write (targets: "
                f"{', '.join(f'{s.name} ({s.backend})' for s in self.specs)})"
                + (f"; {len(found)} use backend {backend!r}" if backend else ""),
                field="target")
        return found[0]

    def options(self) -> dict[str, str]:
        """Options for ``format("txsink")`` (target secrets included: Spark's only)."""
        if self.single:
            spec = self.specs[0]
            opts = {**spec.options, "backend": spec.backend, "sink_id": self.sink_id}
        else:
            opts = {"sink_id": self.sink_id, "targets": encode_targets(self.specs)}
        if self.state_location:
            opts["state_location"] = self.state_location
        if self.checkpoint_location:
            opts["checkpointLocation"] = self.checkpoint_location
        return opts

    def shape(self, df: DataFrame) -> DataFrame:
        """``df`` as the data source's ``targets`` option needs it (each target's
        select/where applied as a struct column); the data source refuses other frames
        when a target has select/where."""
        return checked_shape(df, self.specs, self.sink_id)

    def native(self, df: DataFrame | None = None) -> bool:
        """Whether a target takes Spark's own Parquet writer (a table format, or files in
        Parquet; for ``df``: see :func:`takes_native`): then each target is written by
        its own Spark job in one grouped epoch (Spark's writer for those, txsink's for
        the others) instead of one job writing every target."""
        return any(takes_native(s, df) for s in self.specs)

    def native_stream(self, df: DataFrame | None = None) -> bool:
        """Whether a stream of this group takes the native data path (a native target).

        Either path numbers a micro-batch as the data source does (the state's
        ``stream_from`` + batch id, bound to the query's id: :mod:`txsink.gate`), so a
        state one path streamed through is continued by the other."""
        return self.native(df)

    def check_native_filesystems(self, df: DataFrame) -> None:
        """Refuse, before the first batch, a table whose files Spark's own writer would
        put where this Spark session has no filesystem (``s3a://`` without hadoop-aws):
        Spark would fail inside the first batch with a Java error instead."""
        plugins = get_plugins()
        # Each native target's own check of the session (Backend.native_session_conf:
        # a jar, a filesystem, the store it reaches), here, before any claim or epoch.
        for spec in self.specs:
            if takes_native(spec, df):
                member = TargetGroup.from_specs(self.sink_id, [spec]).members[spec.name]
                try:
                    member.backend.native_session_conf(df.sparkSession)
                finally:
                    member.backend.close()
        for spec in self.specs:
            if not getattr(plugins.backend_class(spec.backend), "native_parquet", False):
                continue
            backend = TargetGroup.from_specs(self.sink_id, [spec]).members[spec.name].backend
            try:
                if not isinstance(backend, TableBackend) or not backend.on_s3():
                    continue
                field = f"targets[{spec.name}].options.{backend.location_option}"
            finally:
                backend.close()
            spark = df.sparkSession
            jvm = spark._jvm
            if jvm is None:
                continue  # no JVM here (Spark Connect): the native path is not used
            try:
                jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
                    "s3a", spark._jsc.hadoopConfiguration())
            except Exception as exc:
                if "s3a" not in str(exc):
                    raise
                raise ConfigError(
                    f"group {self.sink_id!r}, target {spec.name!r}: the table is on S3 and "
                    "Spark's own Parquet writer writes its files through s3a://, which this "
                    "Spark session does not have: put hadoop-aws matching Spark's Hadoop "
                    "(and its AWS SDK bundle) on the driver and executor class path, with "
                    "fs.s3a.* settings for the endpoint and credentials",
                    field=field) from None

    def write_stream(self, df: DataFrame) -> DataStreamWriter:
        """``df.writeStream`` to every target, one decision per micro-batch."""
        self._micro_batch()
        refuse_feedback(df, self.backend(), self.sink_id,
                        field="sink" if self.single else "targets")
        if self.native(df) and not self.checkpoint_location:
            plugins = get_plugins()
            if any(issubclass(plugins.backend_class(s.backend), TableBackend)
                   for s in self.specs):
                raise ConfigError(f"group {self.sink_id!r}: give checkpoint_location: a "
                                  "group with table targets streams through foreachBatch, "
                                  "whose checkpoint it is", field="checkpoint_location")
            # Files targets: the checkpoint comes later, on the stream writer, so the
            # stream goes through txsink's data source as before.
        elif self.native_stream(df):
            self.check_state()
            self.check_native_filesystems(df)
            writer = df.writeStream.foreachBatch(_NativeBatch(self))
            return writer.option("checkpointLocation", self.checkpoint_location)
        shaped = self.shape(df)
        self.check_state()
        return shaped.writeStream.format("txsink").options(**self.options())

    def write(self, df: DataFrame) -> None:
        """A batch write of ``df`` to every target: one epoch, all targets or none."""
        self._micro_batch()
        if self.native(df):
            self.check_state()
            self.check_no_stream()
            self.check_native_filesystems(df)
            self.write_epoch(df, None)
            return
        shaped = self.shape(df)
        self.check_state()
        self.check_no_stream()
        shaped.write.format("txsink").mode("append").options(**self.options()).save()

    def check_state(self) -> None:
        """Refuse here, in one line, targets other than the ones the group's state
        recorded: before Spark plans the write, and before any target is touched. (A
        checkpoint given later, on the stream writer, is checked by the data source.)"""
        if self.single or not (self.state_location or self.checkpoint_location):
            return  # a single sink's backend and destination: the coordinator checks them
        refusal = recorded_targets_refusal(self.state(), self.sink_id, self.specs)
        if refusal is not None:
            raise refusal

    def check_no_stream(self) -> None:
        """Refuse a batch write here, in one line, when a stream writes through the
        group's state (its next batches need the next epochs): before Spark plans it,
        where the same refusal came wrapped in a Python traceback inside Spark's error."""
        import os

        from txsink.coordinator.identity import beside_stream

        state = self.state()
        local = state.removeprefix("file://")
        if "://" not in local and not os.path.isfile(os.path.join(local, "meta.json")):
            return  # no state yet (and opening one would create its directory)
        meta = get_plugins().state_store(state).read_meta()
        if meta is not None and meta.sink_id == self.sink_id and meta.stream_from is not None:
            raise beside_stream(self.sink_id, state, meta.stream_from)

    def write_epoch(self, df: DataFrame, version: int | None = None, *,
                    batch_id: int | None = None) -> None:
        """Every target of one epoch, each by its own Spark job (the native data path).

        ``batch_id``: the epoch is micro-batch ``batch_id`` of the stream whose
        ``foreachBatch`` runs this (the stream's identity: :meth:`Gate.open_stream_batch`);
        else a batch write, with identity ``version`` if given."""
        many = len(self.specs) > 1
        if many:
            df = df.persist()
        try:
            tx = (GroupEpoch(df.sparkSession, self, version=None, app_id=None,
                             stream_batch=batch_id) if batch_id is not None
                  else self.epoch(df.sparkSession, version=version))
            with tx:
                for s in self.specs:
                    tx.write(df, s.name)
        finally:
            if many:
                df.unpersist()

    def state(self) -> str:
        if self.state_location:
            return self.state_location
        if self.checkpoint_location:
            return f"{self.checkpoint_location.rstrip('/')}/txsink"
        raise ConfigError("txsink: give the group a checkpoint_location or state_location: "
                          "its coordinator state lives there", field="state_location")

    def epoch(self, spark: SparkSession, *, version: int | None = None,
              app_id: str | None = None, stream_checkpoint: str | None = None) -> GroupEpoch:
        """One epoch of grouped writes (see the module docstring)."""
        self._micro_batch()
        return GroupEpoch(spark, self, version=version, app_id=app_id,
                          stream_checkpoint=stream_checkpoint)


def targets(sink_id: str, items: Sequence[Mapping[str, Any]], *,
            checkpoint_location: str | None = None,
            state_location: str | None = None, realtime: bool = False) -> TargetSet:
    """Validate a group's targets (no I/O); errors name ``targets[name].field``.

    ``realtime=True``: for Spark's Real-time Mode (:meth:`TargetSet.start_realtime`),
    checked against each backend's real-time target (``docs/realtime.md``)."""
    if realtime:
        from txsink.realtime.config import parse_realtime_targets

        specs = parse_realtime_targets(list(items), validate_sink_id(sink_id))
    else:
        specs = parse_targets(list(items), validate_sink_id(sink_id))
    return TargetSet(sink_id, specs, checkpoint_location=checkpoint_location,
                     state_location=state_location, realtime=realtime)


_target_set = targets


def streamed_by_data_source(state_location: str, sink_id: str) -> bool:
    """Whether a streaming query wrote ``sink_id`` through txsink's data source at
    ``state_location`` (read only): its micro-batches are epochs without a write identity,
    so it keeps that path (a state older than the stream binding counts too)."""
    import os

    local = state_location.removeprefix("file://")
    if "://" not in local and not os.path.isfile(os.path.join(local, "meta.json")):
        return False
    store = get_plugins().state_store(state_location)
    meta = store.read_meta()
    if meta is None or meta.sink_id != sink_id:
        return False
    if meta.stream_from is not None:
        return True
    states = store.states()
    if not states:
        return False
    newest = store.get(max(states))
    if newest is None:
        return False
    # A micro-batch of the data source's stream; or a record of a release that said
    # neither what wrote it nor with which identity (taken for a stream, to be safe).
    return newest.origin == "stream" or (newest.origin is None and newest.write is None)


def recorded_targets_refusal(state_location: str, sink_id: str,
                             specs: Sequence[TargetSpec]) -> ConfigError | None:
    """The refusal of ``specs`` if the state at ``state_location`` recorded other
    targets for the group (read only: no lease is taken, nothing is written)."""
    import os

    from txsink.targets import changed_targets

    local = state_location.removeprefix("file://")
    if "://" not in local and not os.path.isfile(os.path.join(local, "meta.json")):
        return None  # no state yet (and opening one would create its directory)
    meta = get_plugins().state_store(state_location).read_meta()
    if meta is None or meta.sink_id != sink_id:
        return None  # a new state, or another sink's: the coordinator says so
    return changed_targets(meta.targets, specs, sink_id)


def epoch(spark: SparkSession, group: TargetSet | str, *, version: int | None = None,
          targets: Sequence[Mapping[str, Any]] | None = None,
          state_location: str | None = None, app_id: str | None = None,
          stream_checkpoint: str | None = None) -> GroupEpoch:
    """``with txsink.spark.epoch(spark, group=orders, version=batch_id) as tx: ...``.

    ``group`` is a :class:`TargetSet`, or the group's sink id with ``targets`` and
    ``state_location``. ``stream_checkpoint``: the checkpointLocation of the stream whose
    ``foreachBatch`` runs the block, where Spark cannot tell the function its query
    (Spark Connect): a versioned write is bound to that stream's query id, read from the
    checkpoint's metadata (local or ``file://`` paths).
    """
    if isinstance(group, str):
        if targets is None or state_location is None:
            raise ConfigError("txsink.spark.epoch: with a sink id for the group, give its "
                              "targets and state_location too", field="targets")
        group = _target_set(group, targets, state_location=state_location)
    return GroupEpoch(spark, group, version=version, app_id=app_id,
                      stream_checkpoint=stream_checkpoint)


class GroupEpoch:
    """One epoch of a group: writes prepare, the block's end decides.

    The adapter of grouped writes and of Spark's own writer (the native path) to the
    gate (:mod:`txsink.gate`): it opens the epoch (a batch write's reservation, or a
    stream's micro-batch), records what each target's job prepared, and has the gate
    decide. ``stream_batch``: the block writes micro-batch ``stream_batch`` of the
    streaming query that runs it (``foreachBatch`` of :meth:`TargetSet.write_stream`).
    """

    def __init__(self, spark: SparkSession, group: TargetSet, *, version: int | None,
                 app_id: str | None, stream_batch: int | None = None,
                 stream_checkpoint: str | None = None) -> None:
        if version is not None and (not isinstance(version, int) or version < 0):
            raise ConfigError(f"txsink.spark.epoch: version must be a whole number >= 0 (e.g. "
                              f"the foreachBatch batch id), got {version!r}", field="version")
        self.spark = spark
        self.group = group
        self.write_id = (None if version is None
                         else WriteId(app_id or group.sink_id, version))
        self.stream_batch = stream_batch
        self.stream_checkpoint = (stream_checkpoint or "").rstrip("/") or None
        self.epoch = -1
        self.skipped = False
        self.owner = owner_token()
        self.written: dict[str, int] = {}
        self._store: StateStore | None = None
        #: The streaming query that drives this block, and whether that is known.
        self._query: str | None = None
        self._query_known = False
        #: The digest of the driving micro-batch's offsets in Spark's offset log, when
        #: it can be read (see :func:`txsink.spark.queries.batch_source`).
        self._source: str | None = None

    # -- the block ------------------------------------------------------------------------

    def _gate(self, backend: Backend) -> Gate:
        if self._store is None:
            self._store = get_plugins().state_store(self.group.state())
        # A single sink's options go into the state (secret-free), as its data source
        # records them: `txsink status` / `resolve` and the destination check read them.
        options = dict(self.group.specs[0].options) if self.group.single else None
        return Gate(Coordinator(backend, self._store, self.group.sink_id, owner=self.owner,
                                backend_options=options))

    def __enter__(self) -> GroupEpoch:
        self.group.check_state()  # before preflight claims a new target's output
        self._query, self._query_known = driving_query(
            self.spark, self.stream_checkpoint or (
                self.group.checkpoint_location if self.stream_batch is not None else None))
        if (self.write_id is not None and not self._query_known
                and in_connect_foreach_batch()):
            raise ConfigError(
                f"txsink.spark.epoch: group {self.group.sink_id!r}: a versioned write in a "
                "foreachBatch function under Spark Connect cannot learn which stream drives "
                "it (Spark Connect gives the function no query id), so a replaced stream "
                "checkpoint could not be told from a replay and its batches would be "
                "skipped. Give the stream's checkpointLocation: txsink.spark.epoch(..., "
                "stream_checkpoint=...) (a local or file:// path); nothing was written",
                field="stream_checkpoint", sink_id=self.group.sink_id)
        self._source = self._batch_source()
        backend = self.group.backend()
        try:
            backend.preflight(self.group.sink_id)
            gate = self._gate(backend)
            if self.stream_batch is not None:
                opened = gate.open_stream_batch(self.stream_batch, self._query, self.owner,
                                                legacy_app_id=self.group.sink_id,
                                                source=self._source)
            else:
                opened = gate.open_write(self.write_id, self._query,
                                         query_known=self._query_known,
                                         holder_alive=owner_alive, source=self._source)
        finally:
            backend.close()
        self.epoch, self.skipped = opened.epoch, opened.skip is not None
        if opened.skip is not None:
            what = (f"micro-batch {self.stream_batch} (epoch {opened.epoch}) of the query "
                    f"{self._query or '(id unknown)'}" if self.stream_batch is not None
                    else f"grouped write {self.write_id}")
            log.warning("sink=%s: %s is %s; its writes are skipped, nothing is written",
                        self.group.sink_id, what, opened.skip)
        return self

    def _batch_source(self) -> str | None:
        """The driving micro-batch's offsets digest: a stream's own batch (its
        checkpoint is the group's), or a versioned write in a stream's
        ``foreachBatch`` (the batch Spark names, else the version, in the stream's
        checkpoint: ``stream_checkpoint``, else as the running query says, else the
        group's)."""
        if self.stream_batch is not None:
            return batch_source(self.group.checkpoint_location, self.stream_batch, self.spark)
        if self.write_id is None or self._query is None:
            return None
        checkpoint = (self.stream_checkpoint or running_checkpoint(self.spark, self._query)
                      or self.group.checkpoint_location)
        batch = driving_batch(self.spark)
        return batch_source(checkpoint, self.write_id.version if batch is None else batch,
                            self.spark)

    def write(self, df: DataFrame, target: str | None = None, *,
              backend: str | None = None) -> None:
        """Prepare ``df`` in one target (by name, or the only one with ``backend``)."""
        spec = self.group.spec(target, backend=backend)
        if spec.name in self.written:
            raise ConfigError(f"group {self.group.sink_id!r} epoch {self.epoch}: target "
                              f"{spec.name!r} is written once per epoch; union the frames "
                              "first", field="target")
        if spec.where:
            df = df.where(spec.where)
        if spec.select:
            df = df.selectExpr(*spec.select)
        check_columns(self.group.sink_id, [spec], spark_columns(df.schema), only=spec.name)
        if takes_native(spec, df):
            self._write_native(df, spec)
            self.written[spec.name] = 1
            return
        opts = {**self.group.options(), "state_location": self.group.state(),
                "txsink.group.epoch": str(-1 if self.skipped else self.epoch),
                "txsink.group.target": spec.name, "txsink.group.owner": self.owner}
        opts.pop("checkpointLocation", None)
        if self.write_id is not None:
            opts.update(txnAppId=self.write_id.app_id, txnVersion=str(self.write_id.version))
            if self.stream_checkpoint:
                opts["txnStreamCheckpoint"] = self.stream_checkpoint
        if self.skipped and (self.write_id is None or self._query_known):
            return  # a replay: nothing of it is written, its identity was checked
        # Skipped as committed, under Spark Connect (no driving query known here): the
        # write's tasks report the stream they run for, which the commit checks against
        # the one that wrote the version.
        df.write.format("txsink").mode("append").options(**opts).save()
        self.written[spec.name] = 1

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.skipped:
            return
        backend = self.group.backend()
        try:
            gate = self._gate(backend)
            record = gate.coordinator.store.get(self.epoch)
            prepared: list[Committable] = list(record.committables) if (
                record is not None and record.state is EpochState.RESERVED) else []
            if exc_type is not None:
                gate.coordinator.abort_epoch(self.epoch, prepared)
                log.warning("sink=%s epoch=%d: the grouped write failed (%s); every target's "
                            "participants were rolled back", self.group.sink_id, self.epoch,
                            exc_type.__name__)
                return
            record = gate.reserved(self.epoch)
            query = record.write.query_id if record.write is not None else None
            try:
                gate.decide(self.epoch, gate.with_empty_participants(self.epoch, prepared),
                            write_query=query, source=self._source)
            except BaseException:
                self._abort_undecided(gate, prepared)
                raise
        finally:
            backend.close()

    def _abort_undecided(self, gate: Gate, prepared: list[Committable]) -> None:
        """After a failed decide: roll the epoch back if no decision was recorded (its
        state write failed: a full or read-only disk), so the replay of the batch can
        reserve and write it again instead of finding it reserved at every try. A
        recorded decision is never undone: its commit is finished by the next start, and
        an epoch another run of the query took over is that run's to finish."""
        try:
            if not self._still_reserved():
                return
            gate.coordinator.abort_epoch(self.epoch, prepared)
        except Exception as exc:  # the original error says what failed first
            log.error("sink=%s epoch=%d: no decision was recorded and rolling the epoch "
                      "back failed too (%s); `txsink resolve --epoch %d --abort` ends it",
                      self.group.sink_id, self.epoch, exc, self.epoch)
            return
        log.warning("sink=%s epoch=%d: no decision was recorded; every target's "
                    "participants were rolled back and the epoch's reservation dropped, so "
                    "a replay writes it again", self.group.sink_id, self.epoch)

    def _still_reserved(self) -> bool:
        """Whether this block's epoch is still reserved by this run: another driver of
        the query may have taken it over (and prepared its own participants of it) while
        this run's Spark job ran."""
        assert self._store is not None
        record = self._store.get(self.epoch)
        return (record is not None and record.state is EpochState.RESERVED
                and record.owner == self.owner)

    def _write_native(self, df: DataFrame, spec: TargetSpec) -> None:
        """Spark's own Parquet writer puts the target's files of this epoch into a
        directory no reader lists (the table's directory; the files backend's staging
        area); the gate checks them against what Spark's tasks reported writing, and
        records them as one participant of the reserved epoch."""
        if self.skipped:
            return
        if self.group.single:
            part: Backend = self.group.backend()
            sink_id, backend = self.group.sink_id, part
        else:
            group = TargetGroup.from_specs(self.group.sink_id, [spec])
            part = group
            member = group.members[spec.name]
            sink_id, backend = member.sink_id, member.backend
        try:
            # A fresh attempt number per write (milliseconds), below salvage's range.
            ctx = TransactionContext(sink_id, self.epoch, 0,
                                     int(time.time() * 1000) % SALVAGE_ATTEMPT_BASE)
            path, dirname = backend.native_staging(ctx)
            if spec.epoch_column:
                from pyspark.sql import functions as F

                df = df.withColumn(spec.epoch_column, F.lit(self.epoch).cast("long"))
            df = backend.native_frame(df)
            prepared: list[Committable] = []
            try:
                reported = write_parquet(df, path, backend.native_write_options(),
                                         backend.native_session_conf(df.sparkSession))
                prepared = backend.committables_for_directory(ctx, dirname)
                assert self._store is not None
                Gate(Coordinator(part, self._store, self.group.sink_id, owner=self.owner)
                     ).check_reported(self.epoch, prepared, reported, where=path)
            except BaseException:
                for c in prepared:
                    backend.abort(c)
                backend.discard_staging(ctx, dirname, still_ours=self._still_reserved)
                raise
            committable = (prepared if self.group.single
                           else group._tag(spec.name, prepared))
            FaultInjector.from_env().hit(NATIVE_BEFORE_RECORD, self.epoch)
            try:
                record_prepared(self._store, self.owner, self.epoch, committable,
                                self._query)
            except BaseException:
                for c in committable:
                    backend.abort(c)
                raise
            log.info("sink=%s epoch=%d target=%s: Spark's Parquet writer prepared %d "
                     "participant(s), %d row(s)", self.group.sink_id, self.epoch, spec.name,
                     len(committable), sum(c.rows for c in committable))
        finally:
            part.close()


def refuse_feedback(df: DataFrame, backend: Backend, sink_id: str, *,
                    field: str = "sink") -> None:
    """Before a stream starts: refused when a target writes a topic its Kafka source
    reads (:meth:`Gate.refuse_feedback`); nothing to judge for other sources."""
    from txsink.spark.realtime_source import kafka_source

    try:
        source = kafka_source(df)
        if source is not None:
            gate_refuse_feedback(backend, sink_id, source, field=field)
    finally:
        backend.close()


def write_parquet(df: DataFrame, path: str, options: Mapping[str, str],
                  session_conf: Mapping[str, str] | None = None) -> int | None:
    """Spark's own Parquet writer: ``df`` into ``path``, a new directory, with the
    session settings ``session_conf`` (restored after). Returns the rows Spark's tasks
    reported writing (an :class:`~pyspark.sql.Observation` of the write), None where
    this Spark cannot observe a write.

    Microsecond timestamps, as txsink's own writer and Iceberg readers take them (Spark
    writes INT96 by default)."""
    from pyspark.sql import functions as F

    spark = df.sparkSession
    settings = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
                **(session_conf or {})}
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, setting in settings.items():
        spark.conf.set(key, setting)
    try:
        observation: Any = None
        try:
            from pyspark.sql import Observation

            observation = Observation(f"txsink-{uuid.uuid4().hex}")
            observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        except Exception:  # a Spark that cannot observe this frame: nothing to compare
            observation, observed = None, df
        observed.write.mode("errorifexists").options(**options).parquet(path)
    finally:
        for key, was in before.items():
            if was is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, was)
    if observation is None:
        return None
    try:
        return int(observation.get["rows"])
    except Exception:  # pragma: no cover - the write ran; only its count is missing
        log.warning("Spark did not report the rows it wrote into %s; they are not "
                    "compared with the files found", path)
        return None


class _NativeBatch:
    """The ``foreachBatch`` function of a native stream: one grouped epoch per
    micro-batch, numbered and checked as the data source's stream numbers its batches (a
    replayed batch writes nothing; a replaced checkpoint is refused)."""

    def __init__(self, group: TargetSet) -> None:
        self.group = group

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.group.write_epoch(df, batch_id=batch_id)


__all__ = ["GROUP_BACKEND", "GroupEpoch", "TargetSet", "epoch", "shape", "target", "targets"]
