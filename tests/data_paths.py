"""The three epoch data paths, side by side, on files targets, without a JVM.

A promise of the docs that applies to several data paths gets one test per path
(``tests/unit/test_promise_map.py``); :class:`Sink` writes the same operations through
each, so a test names the operation once and runs it on every path:

* ``datasource``: ``format("txsink")``, a stream's micro-batches (``streamWriter``,
  pickled as Spark ships it to the tasks, then ``commit``/``abort``) and batch writes
  (``TargetSet.write``, or ``df.write`` with ``txnAppId``/``txnVersion``); the targets
  write JSON lines, which keep txsink's own writer;
* ``grouped``: ``txsink.spark.epoch(...)`` in a ``foreachBatch`` function (``version``
  the batch id) or a batch job, each ``tx.write`` a data-source write of one target;
* ``native``: Spark's own Parquet writer (``TargetSet.write_stream``'s ``foreachBatch``,
  ``TargetSet.write``, ``tx.write`` of a Parquet target), played by
  :mod:`tests.integration.files_native_driver`'s stand-in for Spark's writer.

Spark's part is played here as Spark plays it: the query id and batch id are local
properties of the stream's thread and of its tasks, a task runs in a ``TaskContext``,
a failed ``commit`` is followed by ``abort``. Everything else is the real code: the
adapters, the gate, the coordinator, the files backend on disk, the state directory.
The driver is ``TXSINK_OWNER`` (:func:`driver`).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from pyspark import TaskContext
from pyspark.sql.types import LongType, StructField, StructType
from txsink import procfs
from txsink.files.backend import FilesBackend
from txsink.spark import group as spark_group
from txsink.spark._proc import OWNER_ENV
from txsink.spark.datasource import BATCH_ID_PROPERTY, QUERY_ID_PROPERTY, TxsinkDataSource
from txsink.spark.group import TargetSet, _NativeBatch
from txsink.state import DirectoryStateStore
from txsink.targets import TargetSpec

from tests.integration.files_native_driver import FakeFrame, _Writer
from tests.spark_standins import StandInSession

PATHS = ("datasource", "grouped", "native")
SINK = "paths"
#: Rows per write; a data-source write runs them as two tasks.
ROWS = 40
SCHEMA = StructType([StructField("id", LongType()), StructField("value", LongType())])


def rows(key: int, n: int = ROWS) -> pa.Table:
    """The rows of write ``key``: ids ``key * 1000`` up."""
    ids = list(range(key * 1000, key * 1000 + n))
    return pa.table({"id": pa.array(ids, pa.int64()),
                     "value": pa.array([i * 7 for i in ids], pa.int64())})


def ids_of(key: int, n: int = ROWS) -> list[int]:
    return list(range(key * 1000, key * 1000 + n))


def driver_token(name: str, *, alive: bool = False) -> str:
    """The owner token of driver ``name``: a driver JVM on this host that has ended (a
    crashed run, which liveness checks take for gone; fencing does not ask), or with
    ``alive`` this very process (a driver that runs)."""
    if alive:
        stat = procfs.stat(os.getpid())
        assert stat is not None
        return f"{socket.gethostname()}:jvm{os.getpid()}:{stat[2]}"
    # Above Linux's highest pid (4194304): no process has it.
    return f"{socket.gethostname()}:jvm{5_000_000 + sum(map(ord, name))}:1"


@contextlib.contextmanager
def driver(name: str, *, alive: bool = False) -> Iterator[None]:
    """Run the block as driver ``name`` (:func:`driver_token`)."""
    saved = os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = driver_token(name, alive=alive)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = saved


class _Tasks:
    attempt = 0


@contextlib.contextmanager
def _task(partition: int, props: dict[str, str]) -> Iterator[None]:
    _Tasks.attempt += 1
    TaskContext._setTaskContext(None)
    TaskContext(partitionId=partition, attemptNumber=0, taskAttemptId=_Tasks.attempt,
                stageId=0, localProperties=props)
    try:
        yield
    finally:
        TaskContext._setTaskContext(None)


def run_tasks(writer: Any, table: pa.Table, props: dict[str, str], parts: int = 2
              ) -> list[Any]:
    """Spark's tasks of one write: ``parts`` partitions of ``table``."""
    step = -(-table.num_rows // parts) if table.num_rows else 0
    messages = []
    for p in range(parts):
        part = table.slice(p * step, step) if step else table
        with _task(p, props):
            messages.append(writer.write(iter(part.to_batches())))
    return messages


def _props(query: str | None, batch: int | None) -> dict[str, str]:
    props = {}
    if query is not None:
        props[QUERY_ID_PROPERTY] = query
    if batch is not None:
        props[BATCH_ID_PROPERTY] = str(batch)
    return props


class _Write:
    """``df.write``: ``.format("txsink")...save()`` runs a data-source batch write as
    Spark does (plan, tasks, ``commit``; ``abort`` if the commit fails);
    ``.mode("errorifexists")...parquet(path)`` is Spark's own Parquet writer."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame
        self.opts: dict[str, str] = {}
        self.parquet_writer = _Writer(frame.table)

    def format(self, name: str) -> _Write:
        assert name == "txsink"
        return self

    def mode(self, mode: str) -> _Write:
        self.parquet_writer.mode(mode) if mode == "errorifexists" else None
        return self

    def options(self, **opts: str) -> _Write:
        self.opts.update(opts)
        self.parquet_writer.options(**opts)
        return self

    def option(self, key: str, value: Any) -> _Write:
        return self.options(**{key: str(value)})

    def parquet(self, path: str) -> None:
        self.parquet_writer.parquet(path)

    def save(self) -> None:
        writer = TxsinkDataSource(self.opts).writer(SCHEMA, False)
        messages = run_tasks(writer, self.frame.table, self.frame.props)
        try:
            writer.commit(messages)
        except BaseException:
            writer.abort(messages)
            raise


class Frame(FakeFrame):
    """A DataFrame of ``table`` as the txsink helpers use one; ``query``/``batch``: a
    micro-batch of that streaming query (``foreachBatch`` runs on its thread)."""

    def __init__(self, table: pa.Table, *, query: str | None = None,
                 batch: int | None = None) -> None:
        super().__init__(table, query_id=query)
        self.props = _props(query, batch)
        self.sparkSession = StandInSession(self.props)  # type: ignore[assignment]

    @property
    def write(self) -> _Write:  # type: ignore[override]
        return _Write(self)


class Sink:
    """One sink (a group of files targets ``names``, or ``single``) on one data path.

    ``state_location``: keep the state apart from Spark's checkpoint (else it is
    ``<checkpoint>/txsink``). ``paths``: a target's directory (else ``tmp/<name>``);
    ``extra``: a target's other fields and options; ``backends``: a target's backend
    (else ``files``): a plugin's subclass of the files backend."""

    def __init__(self, path: str, tmp: Path, *, names: tuple[str, ...] = ("a", "b"),
                 single: bool = False, sink_id: str = SINK, paths: dict[str, Path] | None = None,
                 state_location: Path | None = None, extra: dict[str, dict[str, Any]] | None = None,
                 backends: dict[str, str] | None = None, ds_options: dict[str, str] | None = None
                 ) -> None:
        assert path in PATHS
        assert not (single and path == "grouped"), "grouped writes write a group"
        self.path, self.tmp, self.sink_id, self.single = path, tmp, sink_id, single
        self.names = (sink_id,) if single else names
        self.chk = tmp / "chk"
        self.state_location = state_location
        #: Options only the data source takes (``guarantee``): its stream and batch writes.
        self.ds_options = dict(ds_options or {})
        fmt = "parquet" if path == "native" else "jsonl"
        self.dirs = {n: (paths or {}).get(n, tmp / n) for n in self.names}
        where: dict[str, Any] = ({"state_location": str(state_location)} if state_location
                                 else {"checkpoint_location": str(self.chk)})
        if single:
            spec = TargetSpec(sink_id, "files", {"path": str(self.dirs[sink_id]), "format": fmt})
            self.group = TargetSet(sink_id, [spec], single=True, **where)
        else:
            self.group = spark_group.targets(sink_id, [
                spark_group.target(n, (backends or {}).get(n, "files"), path=str(self.dirs[n]),
                                   format=fmt,
                                   **(extra or {}).get(n, {}))
                for n in names], **where)

    # -- writes ---------------------------------------------------------------------------

    def stream(self, batch: int, query: str = "q-1", table: pa.Table | None = None) -> None:
        """Micro-batch ``batch`` of the streaming query ``query``."""
        table = rows(batch) if table is None else table
        if self.path == "native":
            _NativeBatch(self.group)(Frame(table, query=query), batch)  # type: ignore[arg-type]
        elif self.path == "grouped":
            frame = Frame(table, query=query, batch=batch)
            with self.group.epoch(frame.sparkSession, version=batch) as tx:  # type: ignore[arg-type]
                for n in self.names:
                    tx.write(frame, n)  # type: ignore[arg-type]
        else:
            self._ds_stream(batch, query, table)

    def _ds_stream(self, batch: int, query: str, table: pa.Table) -> None:
        opts = {**self.group.options(), **self.ds_options}
        if self.state_location is not None:
            opts["checkpointLocation"] = str(self.chk)
        self.chk.mkdir(parents=True, exist_ok=True)
        meta = self.chk / "metadata"  # Spark writes the query's id there when it starts
        if not meta.exists() or json.loads(meta.read_text())["id"] != query:
            meta.write_text(json.dumps({"id": query}) + "\n")
        shipped = pickle.dumps(TxsinkDataSource(opts).streamWriter(SCHEMA, False))  # planned
        messages = run_tasks(pickle.loads(shipped), table, _props(query, batch))
        committer = pickle.loads(shipped)
        try:
            committer.commit(messages, batch)
        except BaseException:
            committer.abort(messages, batch)
            raise

    def batch(self, key: int, *, version: int | None = None, query: str | None = None,
              batch: int | None = None, table: pa.Table | None = None) -> None:
        """A batch write of ``rows(key)``, with the identity ``version`` if given (the
        app id is the sink id); ``query``, ``batch``: run from that stream's
        ``foreachBatch`` for that micro-batch."""
        frame = Frame(rows(key) if table is None else table, query=query, batch=batch)
        if self.path == "grouped":
            with self.group.epoch(frame.sparkSession, version=version) as tx:  # type: ignore[arg-type]
                for n in self.names:
                    tx.write(frame, n)  # type: ignore[arg-type]
        elif self.path == "native":
            if version is None:
                self.group.write(frame)  # type: ignore[arg-type]
            else:
                self.group.write_epoch(frame, version)  # type: ignore[arg-type]
        elif version is None and not self.ds_options:
            self.group.write(frame)  # type: ignore[arg-type]
        else:
            identity = ({} if version is None
                        else {"txnAppId": self.sink_id, "txnVersion": str(version)})
            frame.write.format("txsink").options(**self.group.options(), **self.ds_options,
                                                 **identity).save()

    # -- what is there --------------------------------------------------------------------

    def ids(self, name: str | None = None) -> list[int]:
        """The ids visible in target ``name`` (the only one of a single sink)."""
        where = self.dirs[name or self.names[0]]
        if not where.exists():
            return []
        if self.path == "native":
            table = ds.dataset(str(where), format="parquet").to_table()  # skips _txsink
            return sorted(table.column("id").to_pylist()) if table.num_rows else []
        out = []
        for f in sorted(where.glob("part-*")):
            out += [json.loads(line)["id"] for line in f.read_text().splitlines()]
        return sorted(out)

    def every(self) -> dict[str, list[int]]:
        return {n: self.ids(n) for n in self.names}

    @property
    def state_dir(self) -> Path:
        return self.state_location or self.chk / "txsink"

    def store(self) -> DirectoryStateStore:
        return DirectoryStateStore(self.state_dir)

    def pending(self) -> dict[str, list[str]]:
        """What each target holds prepared, not committed (pending files, staging)."""
        out = {}
        for n, d in self.dirs.items():
            sink_id = self.sink_id if self.single else f"{self.sink_id}--{n}"
            found = [c.participant for c in FilesBackend(str(d)).list_prepared(sink_id)]
            staging = d / "_txsink" / "staging"
            found += sorted(os.listdir(staging)) if staging.exists() else []
            out[n] = found
        return out
