"""A model-based test of the native path: Spark's own Parquet writer, on files and tables.

:mod:`tests.operations_entry_points` drives the data source and grouped writes into
the in-memory target. This machine drives the native path (issue 39) the way Spark and
operators meet it: ``TargetSet.write_stream``'s ``foreachBatch`` function
(:class:`~txsink.spark.group._NativeBatch`) or a user's ``foreachBatch`` with
``txsink.spark.epoch(..., version=batch_id)``, into real targets on local disk: the
files backend, a Delta or an Iceberg table (deltalake and pyiceberg, no server), or a
group of a files target with another files target (with a ``where``) or a table. For
files targets txsink's data source streams the same state too (Spark Connect streams
files targets through it), as the sequence's path or for one batch. Spark's part is
played in-process:

* **the source** is one replayable log (a Kafka partition); a record's id is its
  offset. Between batches records arrive (none, too: an empty batch);
* **Spark's checkpoint** is a directory (its ``metadata`` holds the query id, as Spark
  writes it) with an offset log and a commit log kept beside it. A batch is planned as
  Spark's ``MicroBatchExecution.populateStartOffsets`` does: the last batch of the
  offset log that the commit log lacks is run again with the same offsets; otherwise a
  new batch is planned from the last batch's end to the source's end. So after a
  checkpoint restored from an older copy, Spark runs the copy's last logged batch
  again with its records, and plans the batches after it anew, over other records
  than the batches of those numbers the targets hold;
* **Spark's writer** (``txsink.spark.group.write_parquet``) writes one Parquet file per
  task (an empty one for a task without rows), ``_SUCCESS`` and ``.crc`` files, and
  reports the rows its tasks wrote; on request, a task's file lands where the driver
  does not look (a node-local path on a cluster);
* **a driver killed** at a protocol point (the coordinator's, and the native path's:
  files staged but not recorded, a commit between two files' links) runs no cleanup;
  which drivers still run is what the model knows (``owner_alive``).

Operations: micro-batches (Spark's replays included) on the sequence's path, one batch
on another path, a backfill beside the stream (the same driver or another), the driver
restarted, the checkpoint replaced (a new query id, from the earliest or the latest
records; the state goes with it when it lives inside), a copy of the checkpoint taken
and restored (the state inside goes back with it), ``txsink resolve`` by hand; for
tables, another writer's compaction (Delta ``optimize.compact``, an Iceberg rewrite of
the table's rows), vacuum / orphan-file removal (Delta ``vacuum``; for Iceberg, which
pyiceberg 0.12 has no procedure for, every file under the table that no metadata names
is deleted, as Iceberg's ``remove_orphan_files`` does), expiry (Delta log cleanup,
Iceberg ``expire_snapshots``) and the loss of Iceberg's SQLite catalog file.

The oracle after every step: no record twice in any target, no record visible that no
batch Spark committed and no decision holds, and (files targets) an epoch number holds
one batch's records for ever; after every batch Spark commits, each target holds
exactly the records of every batch Spark committed or txsink decided (a ``where``
applied), once. A refused operation raised a :class:`~txsink.errors.TxsinkError` and
wrote nothing of its own; the model then follows the way out the error names (the
checkpoint put back, ``txsink resolve --abort --force`` for a participant whose data
maintenance deleted, the table registered again, Spark's retry) and the stream must
go on: never a third outcome, never a wedge. No power loss is modelled (fsync is a
no-op here, and the targets live in memory when the machine has a tmpfs).

A table costs 3-10 times a files target per step: the default run draws a table for
one sequence in six, ``tox -e operations-long`` every kind alike
(``TXSINK_OPERATIONS_NATIVE_KINDS``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import reject
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pyspark import TaskContext
from pyspark.sql import functions as spark_functions
from pyspark.sql.types import LongType, StructField, StructType
from txsink import cli
from txsink import plugins as plugins_module
from txsink.errors import ParticipantLostError, TxsinkError
from txsink.faults import NATIVE_POINTS, POINTS, FaultInjector, FaultRule, InjectedFault
from txsink.spark import group as spark_group
from txsink.spark._proc import OWNER_ENV
from txsink.spark.datasource import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, TxsinkDataSource
from txsink.spark.group import GroupEpoch, TargetSet, _NativeBatch
from txsink.state import DirectoryStateStore, EpochState
from txsink.targets import ROUTE_PREFIX, TargetSpec

from tests.operations_model import FIRED
from tests.spark_standins import StandInSession

SINK = "opsn"
#: Spark tasks per batch: the writer leaves one file per task.
TASKS = 2
#: Target b of a group takes only these records (an empty epoch for it is common).
WHERE = "id % 2 = 0"
#: Records of a backfill (a batch write beside the stream) have ids from here.
BACKFILL_BASE = 1_000_000
#: Failures the model knows, by item of issue 39 (see KNOWN below): a sequence that
#: meets one is discarded (counted in the rules fired) instead of failing, so the
#: default run stays green while they are open; each has a strict regression test in
#: ``tests/unit/test_operations_native.py``. ``TXSINK_OPERATIONS_KNOWN=`` (empty)
#: makes every one fail.
KNOWN_ENV = "TXSINK_OPERATIONS_KNOWN"
KNOWN: dict[str, str] = {}

#: The target kinds a sequence draws from (a kind named twice is drawn twice as often).
#: The default run draws files targets mostly: a table costs 3-10 times a files target per
#: step. ``TXSINK_OPERATIONS_NATIVE_KINDS`` (comma-separated) sets another mix:
#: ``tox -e operations-long`` draws every kind alike.
KINDS_ENV = "TXSINK_OPERATIONS_NATIVE_KINDS"
ALL_KINDS = ("files", "files group", "delta", "delta group", "iceberg", "iceberg group")
DEFAULT_KINDS = ("files",) * 4 + ("files group",) * 6 + ("delta", "iceberg")


def kinds() -> list[str]:
    raw = os.environ.get(KINDS_ENV)
    chosen = DEFAULT_KINDS if not raw else tuple(k.strip() for k in raw.split(","))
    unknown = sorted(set(chosen) - set(ALL_KINDS))
    assert not unknown, f"{KINDS_ENV}: unknown kind(s) {unknown}; known: {ALL_KINDS}"
    return list(chosen)


def known_issues() -> set[str]:
    raw = os.environ.get(KNOWN_ENV)
    return set(KNOWN) if raw is None else {x.strip() for x in raw.split(",") if x.strip()}


def memory_dir() -> str | None:
    """A directory in memory (tmpfs) when the machine has one: no power loss is modelled,
    and a sequence's thousands of renames, links and unlinks cost far less there."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _keep(where: str | None, i: int) -> bool:
    """Whether record ``i`` goes to a target with ``where`` (the model's one condition)."""
    if where is None:
        return True
    assert where == WHERE, where
    return i % 2 == 0


# -- Spark's part ------------------------------------------------------------------------------


SCHEMA = StructType([StructField("id", LongType())])


class Column:
    """``pyspark.sql.functions.col(name)`` as a backend shapes the native frame with it
    (``Backend.native_frame``: a column's metadata, e.g. Iceberg's field id)."""

    def __init__(self, name: str, metadata: dict[str, Any] | None = None) -> None:
        self.name = name.strip("`")
        self.metadata = dict(metadata or {})

    def alias(self, name: str, metadata: dict[str, Any] | None = None) -> Column:
        return Column(name, metadata)


class Frame:
    """What the native path uses of a DataFrame: its rows are record ids."""

    def __init__(self, ids: list[int], query: str | None,
                 metadata: dict[str, Any] | None = None) -> None:
        self.ids = ids
        self.query = query
        self.sparkSession = StandInSession(
            {QUERY_ID_PROPERTY: query} if query is not None else None)
        self.schema = SCHEMA
        #: The ``id`` column's metadata (``parquet.field.id``: Spark writes it as the
        #: Parquet field id).
        self.metadata = dict(metadata or {})

    def where(self, condition: str) -> Frame:
        return Frame([i for i in self.ids if _keep(condition, i)], self.query, self.metadata)

    def select(self, *columns: Column) -> Frame:
        assert [c.name for c in columns] == ["id"], columns
        return Frame(self.ids, self.query, columns[0].metadata)

    def persist(self) -> Frame:
        return self

    def unpersist(self) -> Frame:
        return self

    def table(self) -> pa.Table:
        return pa.table({"id": pa.array(self.ids, pa.int64())})


class SparkWriter:
    """``txsink.spark.group.write_parquet``, played: what Spark's writer leaves in the
    directory, and the rows its tasks report. ``misplace``: the next write's first task
    with rows writes where the driver does not look (its rows are reported all the
    same)."""

    def __init__(self) -> None:
        self.misplace = False

    def __call__(self, df: Frame, path: str, options: Any, session_conf: Any = None
                 ) -> int | None:
        out = Path(path.removeprefix("file://"))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.mkdir()  # errorifexists
        job = uuid.uuid4()
        ids = df.ids
        field_id = df.metadata.get("parquet.field.id")
        schema = pa.schema([pa.field("id", pa.int64(), metadata=None if field_id is None
                                     else {b"PARQUET:field_id": str(field_id).encode()})])
        step = max(1, -(-len(ids) // TASKS))
        lost = self.misplace and bool(ids)
        self.misplace = False
        for task in range(TASKS):
            part = ids[task * step:(task + 1) * step]
            if lost and part:
                lost = False
                FIRED["native: a task's files where the driver does not look"] += 1
                continue
            name = f"part-{task:05d}-{job}-c000.snappy.parquet"
            pq.write_table(pa.table({"id": pa.array(part, pa.int64())}, schema=schema),
                           out / name)
            (out / f".{name}.crc").write_bytes(b"crc")
        (out / "_SUCCESS").write_bytes(b"")
        return len(ids)


@dataclass
class Checkpoint:
    """Spark's checkpoint as the model keeps it: the query id (also in the directory's
    ``metadata``), the offset log (batch -> record range) and the commit log."""

    query: str
    #: Where its first batch starts (startingOffsets: earliest 0, latest the end).
    start: int = 0
    offsets: dict[int, tuple[int, int]] = field(default_factory=dict)
    committed: int = -1

    def copy(self) -> Checkpoint:
        return Checkpoint(self.query, self.start, dict(self.offsets), self.committed)


class Unfollowable(AssertionError):
    """A refusal whose way out the model cannot follow (a wedge, or a new message)."""


# -- the model ---------------------------------------------------------------------------------


class NativeModel(RuleBasedStateMachine):
    """One sink (a files target, or a table) or a group (files + files, files + table),
    its stream on one path, the state inside Spark's checkpoint or beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="txsink-opsn-", dir=memory_dir()))
        self.chk = self.tmp / "chk"
        self.tag = uuid.uuid4().hex[:8]
        self.saved_owner = os.environ.get(OWNER_ENV)
        self.writer = SparkWriter()
        self.patches = [mock.patch.object(os, "fsync", return_value=None),
                        mock.patch.object(spark_group, "write_parquet", self.writer),
                        mock.patch.object(GroupEpoch, "__exit__", _exit_unless_killed),
                        mock.patch.object(spark_functions, "col", Column),
                        # Which driver still runs, as /proc would tell: the current run
                        # of the stream's driver; every earlier run was killed or stopped.
                        mock.patch.object(spark_group, "owner_alive",
                                          lambda owner: owner == self.owner)]
        for p in self.patches:
            p.start()
        self.saved_plugins = plugins_module._cached
        self.strict = False
        self.kind = "files"
        self.path = "native"
        self.state_inside = True
        self.targets: dict[str, tuple[str, str | None]] = {}  # name -> (backend, where)
        self.group: TargetSet | None = None
        # Spark and the source
        self.source_end = 0
        self.spark = Checkpoint("q-0")
        self.queries = 1
        self.copies: list[tuple[Path, Checkpoint]] = []
        #: The checkpoint a replacement or a restore put aside (what the operator keeps
        #: when told to put it back).
        self.put_aside: tuple[Path, Checkpoint] | None = None
        self.runs = 0
        self.owner = ""
        self.new_run()
        # txsink's side, as the model knows it
        self.delivered: set[int] = set()
        #: Records a forced resolve gave up while some of them were visible.
        self.given_up: set[int] = set()
        self.last_error: TxsinkError | None = None
        #: (query, batch) -> the records Spark first planned it over.
        self.planned: dict[tuple[str, int], tuple[int, int]] = {}
        #: Records of batches Spark planned anew under a number it had used before.
        self.replanned: set[int] = set()
        self.backfills = 0
        #: The batch (record range) that first delivered each record.
        self.batch_of: dict[int, tuple[int, int]] = {}
        #: files targets: (target, epoch) -> the one batch its files hold, for ever.
        self.epoch_batch: dict[tuple[str, int], tuple[int, int]] = {}
        self._read_cache: dict[tuple[str, int, int], list[int]] = {}

    # -- set-up -------------------------------------------------------------------------------

    @initialize(kind=st.sampled_from(kinds()),
                path=st.sampled_from(["native", "native", "grouped", "datasource"]),
                state_inside=st.booleans())
    def choose(self, kind: str, path: str, state_inside: bool) -> None:
        if path == "datasource" and kind not in ("files", "files group"):
            path = "native"  # tables take Spark's own writer on every Spark
        self.kind, self.path, self.state_inside = kind, path, state_inside
        if kind == "files":
            self.targets = {SINK: ("files", None)}
        elif kind == "files group":
            self.targets = {"a": ("files", None), "b": ("files", WHERE)}
        elif kind in ("delta", "iceberg"):
            self.targets = {SINK: (kind, None)}
        else:
            self.targets = {"a": ("files", None), "t": (kind.split()[0], None)}
        self.group = self.target_set()
        self.make_checkpoint()
        FIRED[f"native: {kind}, {path}, state {'inside' if state_inside else 'beside'}"] += 1

    def teardown(self) -> None:
        for p in reversed(self.patches):
            p.stop()
        plugins_module._cached = self.saved_plugins
        if self.saved_owner is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = self.saved_owner
        TaskContext._setTaskContext(None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def single(self) -> bool:
        return SINK in self.targets

    def location(self, name: str) -> Path:
        return self.tmp / f"target-{name}"

    def options(self, name: str) -> dict[str, str]:
        backend = self.targets[name][0]
        where = str(self.location(name))
        if backend == "iceberg":
            return {"table": "ns.t", "warehouse": where}
        return {"path": where}

    def state_dir(self) -> Path:
        return self.chk / "txsink" if self.state_inside else self.tmp / "state"

    def target_set(self) -> TargetSet:
        where: dict[str, str] = {"checkpoint_location": str(self.chk)}
        if not self.state_inside:
            where["state_location"] = str(self.tmp / "state")
        if self.single:
            backend = self.targets[SINK][0]
            return TargetSet(SINK, [TargetSpec(SINK, backend, self.options(SINK))],
                             single=True, **where)
        return spark_group.targets(SINK, [
            spark_group.target(n, b, **({"where": w} if w else {}), **self.options(n))
            for n, (b, w) in self.targets.items()], **where)

    def new_run(self) -> str:
        self.runs += 1
        self.owner = f"run-{self.runs}-{self.tag}"
        os.environ[OWNER_ENV] = self.owner
        return self.owner

    def make_checkpoint(self) -> None:
        """Spark writes the query's id into ``<checkpoint>/metadata`` when it starts."""
        self.chk.mkdir(parents=True, exist_ok=True)
        (self.chk / "metadata").write_text(json.dumps({"id": self.spark.query}) + "\n")

    # -- what the targets show ----------------------------------------------------------------

    def visible(self, name: str) -> list[tuple[int | None, int]]:
        """(epoch where known, record id) of every row readers of ``name`` see."""
        backend = self.targets[name][0]
        if backend == "files":
            return self._files_rows(self.location(name))
        if backend == "delta":
            return self._delta_rows(self.location(name))
        return self._iceberg_rows(self.location(name))

    def _file_ids(self, path: str) -> list[int]:
        st_ = os.stat(path)
        key = (path, st_.st_ino, st_.st_mtime_ns)
        ids = self._read_cache.get(key)
        if ids is None:
            ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
            self._read_cache[key] = ids
        return ids

    def _files_rows(self, base: Path) -> list[tuple[int | None, int]]:
        out: list[tuple[int | None, int]] = []
        with contextlib.suppress(FileNotFoundError):
            for name in sorted(os.listdir(base)):
                if name.startswith("part-") and name.endswith(".parquet"):
                    epoch = int(name.split("-")[1])
                    out += [(epoch, i) for i in self._file_ids(str(base / name))]
        return out

    def _delta_rows(self, base: Path) -> list[tuple[int | None, int]]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(str(base))
        except TableNotFoundError:
            return []
        out: list[tuple[int | None, int]] = []
        for uri in table.file_uris():
            out += [(None, i) for i in self._file_ids(uri.removeprefix("file://"))]
        return out

    def _iceberg_rows(self, base: Path) -> list[tuple[int | None, int]]:
        table = self.iceberg_table(base)
        if table is None:
            return []
        out: list[tuple[int | None, int]] = []
        for task in table.scan().plan_files():
            out += [(None, i) for i in self._file_ids(task.file.file_path.removeprefix(
                "file://"))]
        return out

    def iceberg_table(self, base: Path) -> Any:
        """The table as a reader finds it through the catalog (none without one: a
        reader's catalog is never created by looking)."""
        from txsink_iceberg.backend import CATALOG_FILE, IcebergBackend

        if not (base / CATALOG_FILE).is_file():
            return None
        return IcebergBackend("ns.t", str(base)).load_table()

    def wants(self, name: str, ids: set[int]) -> set[int]:
        return {i for i in ids if _keep(self.targets[name][1], i)}

    def snapshot(self) -> dict[str, collections.Counter[int]]:
        return {n: collections.Counter(i for _, i in self.visible(n)) for n in self.targets}

    def state_records(self) -> dict[int, EpochState]:
        if not (self.state_dir() / "meta.json").is_file():
            return {}
        return DirectoryStateStore(self.state_dir()).states()

    # -- the oracle ---------------------------------------------------------------------------

    def known(self, item: str, message: str) -> None:
        """A failure KNOWN lists: discard the sequence while it is open, else fail."""
        if item in known_issues() and not self.strict:
            FIRED[f"known: {item} (sequence discarded)"] += 1
            reject()
        raise AssertionError(f"{item}: {message}")

    @invariant()
    def nothing_twice_nothing_undecided(self) -> None:
        for name in self.targets:
            rows = self.visible(name)
            seen = collections.Counter(i for _, i in rows)
            twice = sorted(i for i, n in seen.items() if n > 1)
            if twice:
                self.twice(name, twice)
            stray = sorted(set(seen) - self.wants(name, self.delivered))
            assert not stray, (f"target {name}: records {stray} are visible, but no batch "
                               "Spark committed and no decision holds them")
            if self.targets[name][0] == "files":
                self.one_batch_per_epoch(name, rows)

    def twice(self, name: str, ids: list[int]) -> None:
        raise AssertionError(f"target {name}: records {ids} are visible twice")

    def one_batch_per_epoch(self, name: str, rows: list[tuple[int | None, int]]) -> None:
        """An epoch number holds the rows of one batch, for the life of the sink."""
        for epoch, i in rows:
            assert epoch is not None
            batch = self.batch_of[i]
            first = self.epoch_batch.setdefault((name, epoch), batch)
            assert first == batch, (
                f"target {name}: epoch {epoch} holds record {i} of the batch of records "
                f"{batch[0]}..{batch[1] - 1}, and rows of the batch {first[0]}..{first[1] - 1}:"
                " one epoch number, two batches' rows")

    def deliver(self, ids: list[int]) -> None:
        for i in ids:
            self.batch_of.setdefault(i, (ids[0], ids[-1] + 1))
        self.delivered |= set(ids)

    def exact(self, what: str) -> None:
        """After a batch Spark committed: every target holds every delivered record once."""
        self.nothing_twice_nothing_undecided()
        for name in self.targets:
            have = collections.Counter(i for _, i in self.visible(name))
            want = self.wants(name, self.delivered)
            missing = sorted(want - set(have) - self.given_up)
            if missing:
                self.lost(name, missing, what)
            extra = sorted(set(have) - want)
            assert not extra, f"after {what}: target {name} holds {extra}"

    def lost(self, name: str, missing: list[int], what: str) -> None:
        if set(missing) <= self.replanned:
            self.known("replanned", f"after {what}: target {name} lacks records {missing} of "
                       "a batch Spark planned anew after the checkpoint was restored")
        raise AssertionError(f"after {what}: target {name} lacks records {missing}, which "
                             "batches Spark committed carried")

    # -- Spark runs a batch ---------------------------------------------------------------------

    def plan(self, grow: int) -> tuple[int, tuple[int, int], bool]:
        """The next batch as Spark plans it: (batch id, record range, replayed)."""
        ck = self.spark
        last = max(ck.offsets, default=-1)
        if last > ck.committed:
            return last, ck.offsets[last], True
        self.source_end += grow
        start = ck.offsets[last][1] if last >= 0 else ck.start
        batch = ck.committed + 1
        ck.offsets[batch] = (start, self.source_end)
        self.log_offsets(batch, self.source_end)
        planned = self.planned.setdefault((ck.query, batch), (start, self.source_end))
        if planned != (start, self.source_end):
            # A batch number the query ran before, over other records: Spark planned it
            # anew after a checkpoint restored from an older copy.
            FIRED["native: a batch planned anew after a restore"] += 1
            self.replanned |= set(range(start, self.source_end))
        return batch, (start, self.source_end), False

    def log_offsets(self, batch: int, end: int) -> None:
        """Spark's offset log entry of a planned batch, as Spark writes it before the
        batch runs: a version line, the batch's metadata (its timestamp differs at each
        plan), and each source's end offset."""
        folder = self.chk / "offsets"
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000)}
        (folder / str(batch)).write_text(
            f"v1\n{json.dumps(meta)}\n{json.dumps({'orders': {'0': end}})}")

    @contextlib.contextmanager
    def faults(self, kill: str | None) -> Iterator[None]:
        injector = FaultInjector([FaultRule(kill, None, "raise")] if kill else [])
        with mock.patch.object(FaultInjector, "from_env", classmethod(lambda cls: injector)):
            yield

    def run(self, path: str, batch: int, ids: list[int]) -> None:
        """One micro-batch of the stream through ``path``, as Spark calls it."""
        assert self.group is not None
        frame = Frame(ids, self.spark.query)
        if path == "native":
            _NativeBatch(self.group)(frame, batch)  # type: ignore[arg-type]
        elif path == "grouped":
            with self.group.epoch(frame.sparkSession, version=batch) as tx:  # type: ignore[arg-type]
                for name in self.group.names:
                    tx.write(frame, name)  # type: ignore[arg-type]
        else:
            self.run_data_source(batch, ids)

    def run_data_source(self, batch: int, ids: list[int]) -> None:
        """txsink's data source as Spark runs a micro-batch: the writer is planned (and
        pickled to the committer), each task writes its rows, the committer commits."""
        assert self.group is not None
        writer = TxsinkDataSource(self.group.options()).streamWriter(self.ds_schema(), False)
        shipped = pickle.dumps(writer)
        step = max(1, -(-len(ids) // TASKS))
        messages = []
        for task in range(TASKS):
            part = ids[task * step:(task + 1) * step]
            TaskContext._setTaskContext(None)
            TaskContext(partitionId=task, attemptNumber=0,
                        taskAttemptId=int(time.time() * 1e6) % 10**9, stageId=0,
                        localProperties={BATCH_ID_PROPERTY: str(batch),
                                         QUERY_ID_PROPERTY: self.spark.query})
            try:
                messages.append(pickle.loads(shipped).write(iter([self.ds_rows(part)])))
            finally:
                TaskContext._setTaskContext(None)
        pickle.loads(shipped).commit(messages, batch)

    def ds_schema(self) -> StructType:
        if self.single or all(w is None for _, w in self.targets.values()):
            return SCHEMA
        return StructType([StructField(f"{ROUTE_PREFIX}{n}", SCHEMA) for n in self.targets])

    def ds_rows(self, ids: list[int]) -> pa.RecordBatch:
        """The rows as the data source receives them (a group with a ``where``: one
        struct column per target, null where a record does not go)."""
        if self.ds_schema() is SCHEMA:
            return pa.record_batch({"id": pa.array(ids, pa.int64())})
        columns = {}
        for n, (_, where) in self.targets.items():
            columns[f"{ROUTE_PREFIX}{n}"] = pa.array(
                [{"id": i} if _keep(where, i) else None for i in ids],
                pa.struct([("id", pa.int64())]))
        return pa.record_batch(columns)

    def decided_now(self, before: dict[int, EpochState]) -> set[int]:
        """Epochs decided since ``before`` (new, or RESERVED before)."""
        after = self.state_records()
        return {e for e, s in after.items() if s in (EpochState.DECIDED, EpochState.COMMITTED)
                and before.get(e) in (None, EpochState.RESERVED)}

    def batch(self, path: str, *, grow: int = 1, kill: str | None = None,
              misplace: bool = False) -> str:
        """Spark runs the next batch on ``path``: ``ok`` (Spark logs it), ``killed``
        (the driver died; Spark runs it again at the next start) or ``refused``."""
        batch, (start, end), replayed = self.plan(grow)
        ids = list(range(start, end))
        FIRED[f"native: batch on {path}" + (" (a replay)" if replayed else "")
              + (" without rows" if not ids else "")] += 1
        before, records = self.snapshot(), self.state_records()
        self.writer.misplace = misplace
        try:
            with self.faults(kill):
                self.run(path, batch, ids)
        except InjectedFault as exc:
            FIRED[f"native: driver killed at {exc.point}"] += 1
            if self.decided_now(records):
                self.deliver(ids)
            self.new_run()
            return "killed"
        except TxsinkError as exc:
            self.refused(exc, before, records)
            self.last_error = exc
            return "refused"
        finally:
            self.writer.misplace = False
        self.deliver(ids)
        self.spark.committed = batch
        return "ok"

    def refused(self, exc: TxsinkError, before: dict[str, collections.Counter[int]],
                records: dict[int, EpochState]) -> None:
        """A refusal: loud, and nothing of the refused write is visible or decided
        (recovery of earlier decisions may have finished meanwhile)."""
        text = re.sub(r"sink=\S+ (epoch=\d+:? )?|\S*/\S*|\d+ row\(s\)", "", str(exc))
        FIRED[f"native: loud {type(exc).__name__}: {' '.join(text.split()[:7])}"] += 1
        assert not self.decided_now(records), f"refused ({exc}) after a decision"
        for name, had in self.snapshot().items():
            new = set(had) - set(before[name])
            assert new <= self.wants(name, self.delivered), (
                f"refused ({type(exc).__name__}: {exc}), but target {name} shows records "
                f"{sorted(new - self.delivered)} of it")

    # -- remedies -----------------------------------------------------------------------------

    def go_on(self, what: str, *, attempts: int = 4) -> None:
        """Run the stream's next batch until Spark commits one, following the way out of
        each refusal; a stream that cannot go on is a wedge."""
        for _ in range(attempts):
            outcome = self.batch(self.path, grow=1)
            if outcome == "ok":
                self.exact(what)
                return
            if outcome == "refused":
                assert self.last_error is not None
                self.remedy(self.last_error)
        raise AssertionError(f"after {what}: the stream cannot go on; last refusal: "
                             f"{self.last_error}")

    def remedy(self, exc: TxsinkError) -> None:
        """Do what the refusal says."""
        text = str(exc)
        FIRED[f"native: remedy for {type(exc).__name__}"] += 1
        if "restore the checkpoint" in text.lower() or "Restore the stream's checkpoint" in (
                text) or "already written by another query" in text or (
                "belongs to the txsink state" in text):
            assert self.put_aside is not None, f"no checkpoint to put back: {text}"
            self.put_back()
            return
        if "reported writing" in text:
            return  # Spark retries the batch; the files land where the driver looks
        if "a streaming query writes through this sink's state" in text and (
                self.path == "grouped"):
            # A micro-batch of another path (write_stream) bound the state to the stream:
            # the stream goes on through write_stream, as the refusal says.
            self.path = "native"
            FIRED["native: the stream moved to write_stream"] += 1
            return
        if isinstance(exc, ParticipantLostError) and exc.epoch is not None:
            # docs/operations.md: a decided participant's data is gone (vacuum, orphan-file
            # removal): restore the data, or give the epoch up; Spark replays the batch.
            code, said = self.cli("resolve", str(self.state_dir()), "--epoch", str(exc.epoch),
                                  "--abort", "--force")
            assert code == 0, f"resolve --abort --force of epoch {exc.epoch} refused: {said}"
            FIRED["native: resolve --abort --force (a participant lost)"] += 1
            self.forced()
            self.new_run()
            return
        found = re.search(r"register_table\('([^']+)', '([^']+)'\)", text)
        if found is not None:
            self.register_table(found[1], found[2])
            return
        if "Put the newest state back" in text or "Restore the newest state" in text:
            assert self.put_aside is not None, f"no newer state to put back: {text}"
            self.put_back()
            return
        raise Unfollowable(f"a refusal the model cannot follow: {type(exc).__name__}: {text}")

    def forced(self) -> None:
        """A decided epoch given up by ``resolve --abort --force``: a stream batch's
        rows come back with Spark's replay; a backfill's are given up for good (the
        operator was told), those a target still shows stay."""
        shown = self.snapshot()
        for i in self.delivered:
            if i >= BACKFILL_BASE and any(i not in shown[n] for n in self.targets
                                          if _keep(self.targets[n][1], i)):
                self.given_up.add(i)

    def register_table(self, name: str, metadata: str) -> None:
        """``catalog.register_table(name, metadata)``, as the refusal says."""
        from pyiceberg.catalog.sql import SqlCatalog
        from txsink_iceberg.backend import CATALOG_FILE

        table = self.table
        assert table is not None
        base = self.location(table)
        catalog = SqlCatalog("txsink", uri=f"sqlite:///{base}/{CATALOG_FILE}",
                             warehouse=f"file://{base}")
        with contextlib.suppress(Exception):
            catalog.create_namespace(name.split(".")[0])
        catalog.register_table(name, metadata)
        FIRED["native: iceberg table registered again"] += 1

    def put_back(self) -> None:
        """Put the checkpoint put aside back (with the state inside it)."""
        assert self.put_aside is not None
        copy, spark = self.put_aside
        self.put_aside = None
        shutil.rmtree(self.chk, ignore_errors=True)
        shutil.copytree(copy, self.chk)
        self.spark = spark.copy()
        self.new_run()
        FIRED["native: checkpoint put back"] += 1

    def keep(self) -> tuple[Path, Checkpoint]:
        copy = self.tmp / f"copy-{uuid.uuid4().hex[:8]}"
        shutil.copytree(self.chk, copy)
        return copy, self.spark.copy()

    # -- rules ----------------------------------------------------------------------------------

    @rule(n=st.integers(1, 3), grow=st.integers(0, 3),
          kill=st.sampled_from([None] * 6 + list(POINTS) + list(NATIVE_POINTS)),
          misplace=st.sampled_from([False] * 5 + [True]))
    def stream(self, n: int, grow: int, kill: str | None, misplace: bool) -> None:
        """The stream's next batches; the last one maybe killed, or with a task's files
        where the driver does not look."""
        for k in range(n):
            last = k == n - 1
            outcome = self.batch(self.path, grow=grow, kill=kill if last else None,
                                 misplace=misplace and last)
            if outcome == "refused":
                assert self.last_error is not None
                self.remedy(self.last_error)
                self.go_on("a refusal's way out")
                return
            if outcome == "killed":
                self.go_on("a killed driver's restart")
                return
        self.exact("stream batches")

    @precondition(lambda self: self.kind in ("files", "files group"))
    @rule(path=st.sampled_from(["native", "grouped", "datasource"]), grow=st.integers(0, 2))
    def other_path(self, path: str, grow: int) -> None:
        """One batch through another path on the same state and checkpoint (a Spark
        Connect client streams files targets through the data source)."""
        outcome = self.batch(path, grow=grow)
        if outcome == "ok":
            self.exact(f"a batch on {path}")
        else:
            self.go_on(f"a batch on {path} that was {outcome}")

    @rule()
    def restart(self) -> None:
        FIRED["native: restart"] += 1
        self.new_run()
        self.go_on("a restart")

    @rule(earliest=st.booleans())
    def replace_checkpoint(self, earliest: bool) -> None:
        """The checkpoint is deleted (with the state, when it lives inside) and the query
        starts on a new one, from the earliest records or the latest; the old one is
        kept aside (the way back the refusal names)."""
        FIRED["native: checkpoint replaced"] += 1
        self.put_aside = self.keep()
        shutil.rmtree(self.chk)
        self.spark = Checkpoint(f"q-{self.queries}", 0 if earliest else self.source_end)
        self.queries += 1
        self.make_checkpoint()
        self.new_run()
        self.go_on("the checkpoint replaced")

    @rule()
    def copy_checkpoint(self) -> None:
        FIRED["native: checkpoint copied"] += 1
        self.copies.append(self.keep())

    @precondition(lambda self: self.copies)
    @rule(data=st.data())
    def restore_checkpoint(self, data: st.DataObject) -> None:
        """An older copy of the checkpoint is put back (the state inside goes back with
        it); the newest is kept aside."""
        FIRED["native: checkpoint restored from a copy"] += 1
        copy, spark = data.draw(st.sampled_from(self.copies))
        self.put_aside = self.keep()
        shutil.rmtree(self.chk)
        shutil.copytree(copy, self.chk)
        self.spark = spark.copy()
        self.new_run()
        self.go_on("the checkpoint restored from a copy")

    @rule(same_driver=st.booleans(), kill=st.sampled_from([None] * 4 + list(POINTS)))
    def backfill(self, same_driver: bool, kill: str | None) -> None:
        """A batch write of other records into the sink while the stream runs."""
        assert self.group is not None
        FIRED["native: backfill" + (" (same driver)" if same_driver else "")] += 1
        self.backfills += 1
        ids = [BACKFILL_BASE + self.backfills * 100 + i for i in range(2)]
        before, records = self.snapshot(), self.state_records()
        stream_owner = self.owner
        if not same_driver:
            os.environ[OWNER_ENV] = f"backfill-{self.backfills}-{self.tag}"
        restart = False
        try:
            with self.faults(kill):
                self.group.write(Frame(ids, None))  # type: ignore[arg-type]
        except InjectedFault:
            if self.decided_now(records):
                self.deliver(ids)
            restart = True  # the driver died (the stream's too, in the same driver)
        except TxsinkError as exc:
            self.refused(exc, before, records)
        else:
            self.deliver(ids)
            # It took the lease: the stream's driver, if another, is fenced; it is
            # started again.
            restart = not same_driver
        os.environ[OWNER_ENV] = stream_owner
        if restart:
            self.new_run()
        self.go_on("a backfill beside the stream")

    @precondition(lambda self: self.has_state())
    @rule(how=st.sampled_from(["--commit", "--abort", "--force"]), data=st.data())
    def resolve(self, how: str, data: st.DataObject) -> None:
        """``txsink resolve STATE --epoch N`` of an epoch in doubt (the query stopped)."""
        states = self.state_records()
        open_ = sorted(e for e, s in states.items() if s is not EpochState.COMMITTED)
        if not open_:
            return
        epoch = data.draw(st.sampled_from(open_), label="epoch")
        FIRED[f"native: resolve {how} ({states[epoch].value})"] += 1
        argv = ["--abort", "--force"] if how == "--force" else [how]
        before = self.snapshot()
        code, text = self.cli("resolve", str(self.state_dir()), "--epoch", str(epoch), *argv)
        self.new_run()
        if code != 0:
            assert self.snapshot() == before, f"resolve {how} refused ({text}) but changed things"
            FIRED["native: loud resolve refused"] += 1
        elif how == "--force" and states[epoch] is EpochState.DECIDED:
            self.forced()
        self.go_on(f"resolve {how}")

    @property
    def table(self) -> str | None:
        """The name of the table target, if the sink has one."""
        return next((n for n, (b, _) in self.targets.items() if b != "files"), None)

    @precondition(lambda self: self.table is not None)
    @rule(op=st.sampled_from(["compact", "vacuum", "expire", "lose the catalog"]),
          then=st.booleans())
    def maintain(self, op: str, then: bool = True) -> None:
        """Another writer or an operator works on the table between batches (``then``:
        the stream's next batch runs right after; else whatever the next step does)."""
        name = self.table
        assert name is not None
        backend, base = self.targets[name][0], self.location(name)
        if op == "lose the catalog" and backend != "iceberg":
            return
        before = self.snapshot()[name]
        done = (delta_maintenance if backend == "delta" else iceberg_maintenance)(base, op)
        if not done:
            return
        FIRED[f"native: {backend} {op}"] += 1
        if op != "lose the catalog":
            assert self.snapshot()[name] == before, f"{backend} {op} changed the rows readers see"
        if then:
            self.go_on(f"{backend} {op}")

    def has_state(self) -> bool:
        return (self.state_dir() / "meta.json").is_file()

    def cli(self, *argv: str) -> tuple[int, str]:
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(list(argv))
        return code, out.getvalue() + err.getvalue()


def delta_maintenance(base: Path, op: str) -> bool:
    """One of Delta's own maintenance calls (delta-rs); False: nothing to do yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(str(base))
    except TableNotFoundError:
        return False
    if op == "compact":
        table.optimize.compact()
    elif op == "vacuum":
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    else:  # expire: the log's old entries cleaned up, as a short logRetentionDuration does
        table.alter.set_table_properties({"delta.logRetentionDuration": "interval 0 seconds"},
                                         raise_if_not_exists=False)
        table = DeltaTable(str(base))
        table.create_checkpoint()
        table.cleanup_metadata()
    return True


def iceberg_maintenance(base: Path, op: str) -> bool:
    """Iceberg maintenance (pyiceberg; orphan-file removal as Iceberg's procedure does
    it); False: nothing to do yet."""
    from txsink_iceberg.backend import CATALOG_FILE, IcebergBackend

    catalog_file = base / CATALOG_FILE
    if not catalog_file.is_file():
        return False
    if op == "lose the catalog":
        catalog_file.unlink()
        return True
    table = IcebergBackend("ns.t", str(base)).load_table()
    if table is None:
        return False
    if op == "compact":  # another writer rewrites the table's rows into new files
        rows = table.scan().to_arrow()
        if rows.num_rows == 0:
            return False
        table.overwrite(rows)
    elif op == "expire":
        current = table.current_snapshot()
        old = [s.snapshot_id for s in table.metadata.snapshots
               if current is None or s.snapshot_id != current.snapshot_id]
        if not old:
            return False
        table.maintenance.expire_snapshots().by_ids(old).commit()
    else:
        remove_orphan_files(table)
    return True


def remove_orphan_files(table: Any) -> list[str]:
    """Delete every file under the table's location that its metadata does not name:
    what Iceberg's ``remove_orphan_files`` procedure does (with ``older_than`` now)."""
    io = table.io
    named = {table.metadata_location}
    named |= {entry.metadata_file for entry in table.metadata.metadata_log}
    for snapshot in table.metadata.snapshots:
        named.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            named.add(manifest.manifest_path)
            named |= {e.data_file.file_path
                      for e in manifest.fetch_manifest_entry(io, discard_deleted=False)}
    named = {n.removeprefix("file://") for n in named}
    root = table.location().removeprefix("file://")
    gone = []
    for folder, _, files in os.walk(root):
        for f in files:
            path = os.path.join(folder, f)
            if path not in named:
                os.unlink(path)
                gone.append(path)
    return gone


def _exit_unless_killed(self: GroupEpoch, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: Any) -> None:
    """A killed driver runs no cleanup: the block's end neither decides nor aborts."""
    if exc_type is not None and issubclass(exc_type, InjectedFault):
        return None
    return _REAL_EXIT(self, exc_type, exc, tb)


_REAL_EXIT: Callable[..., None] = GroupEpoch.__exit__


#: Sequences of this machine (else ``TXSINK_OPERATIONS_EXAMPLES``): its steps run whole
#: batches into real files and tables, so the long run takes fewer of them.
EXAMPLES_ENV = "TXSINK_OPERATIONS_NATIVE_EXAMPLES"


def settings_for(default: int) -> dict[str, Any]:
    """Hypothesis settings: ``default`` sequences (or ``TXSINK_OPERATIONS_NATIVE_EXAMPLES``,
    ``TXSINK_OPERATIONS_EXAMPLES``) of up to 10 steps (a step runs batches end to end,
    recovery included)."""
    from tests.operations_model import settings_for as base

    out = {**base(default), "stateful_step_count": 10}
    if os.environ.get(EXAMPLES_ENV):
        out["max_examples"] = int(os.environ[EXAMPLES_ENV])
    return out
