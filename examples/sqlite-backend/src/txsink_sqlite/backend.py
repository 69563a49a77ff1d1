"""Exactly-once into SQLite without native 2PC: staging tables and an idempotent publish.

* ``begin_transaction`` / ``write``: rows go into a staging table private to the
  participant (``_txsink_stage_<n>``), inside an open SQLite transaction.
* ``pre_commit``: that transaction commits the staging rows together with a row in
  ``_txsink_prepared``. Durable, and invisible: readers query the target table.
* ``commit``: one SQLite transaction copies the staging rows into the target,
  records the participant in ``_txsink_committed`` (the commit marker), drops the
  staging table and the prepared row. All or nothing, so a crash leaves either
  the prepared participant or the marker, and a repeated commit finds the marker.
* ``abort``: drops the staging table and the prepared row.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import ConfigError, ParticipantLostError, StateError
from txsink.model import Committable, TransactionContext, parse_participant
from txsink.options import Options

_TYPES: list[tuple[Callable[[pa.DataType], bool], str]] = [
    (pa.types.is_integer, "INTEGER"),
    (pa.types.is_floating, "REAL"),
    (pa.types.is_string, "TEXT"),
    (pa.types.is_large_string, "TEXT"),
    (pa.types.is_boolean, "INTEGER"),
    (pa.types.is_binary, "BLOB"),
]

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS _txsink_prepared (
    participant TEXT PRIMARY KEY, sink_id TEXT NOT NULL, stage TEXT NOT NULL,
    rows INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS _txsink_committed (
    participant TEXT PRIMARY KEY, sink_id TEXT NOT NULL, stage TEXT NOT NULL);
"""


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _sql_type(field: pa.Field[Any]) -> str:
    for check, name in _TYPES:
        if check(field.type):
            return name
    raise ConfigError(f"sqlite backend: column {field.name!r} has type {field.type}, which this "
                      "example does not map; cast it to a number, string or binary first",
                      field=field.name)


class _SqliteTransaction(Transaction):
    def __init__(self, ctx: TransactionContext, conn: sqlite3.Connection, stage: str) -> None:
        super().__init__(ctx)
        self.conn = conn
        self.stage = stage
        self.created = False


class SqliteBackend(Backend):
    name: ClassVar[str] = "sqlite"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.COMMIT_FROM_ANY_PROCESS, Capability.LIST_PREPARED,
        Capability.COMMIT_MARKER, Capability.SURVIVES_RESTART,
    })

    def __init__(self, database: str, table: str) -> None:
        self.database = database
        self.table = table

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SqliteBackend:
        opts = Options(options, owner="sqlite backend")
        database = opts.str("database", required=True)
        table = opts.str("table", required=True)
        if not table.replace("_", "a").isalnum() or table.startswith("_txsink"):
            raise ConfigError(f"sqlite backend: option 'table' must be a plain name of letters, "
                              f"digits and '_', got {table!r}", field="table")
        opts.check_unknown()
        return cls(database, table)

    def describe(self) -> str:
        return f"sqlite table {self.table} in {self.database}"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.database, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript(_BOOKKEEPING)
        return conn

    @contextlib.contextmanager
    def _session(self) -> Iterator[sqlite3.Connection]:
        conn = self._connect()
        try:
            yield conn
        finally:
            conn.close()

    def preflight(self, sink_id: str) -> None:
        if not Path(self.database).parent.is_dir():
            raise ConfigError(f"sqlite backend: the directory of database {self.database!r} "
                              "does not exist", field="database", sink_id=sink_id)
        with self._session():
            pass

    # -- executor side ------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")
        return _SqliteTransaction(ctx, conn, f"_txsink_stage_{ctx.participant}")

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        assert isinstance(txn, _SqliteTransaction)
        stage, target = _quote(txn.stage), _quote(self.table)
        if not txn.created:
            cols = ", ".join(f"{_quote(f.name)} {_sql_type(f)}" for f in batch.schema)
            txn.conn.execute(f"CREATE TABLE IF NOT EXISTS {target} ({cols})")
            txn.conn.execute(f"DROP TABLE IF EXISTS {stage}")
            txn.conn.execute(f"CREATE TABLE {stage} ({cols})")
            txn.created = True
        marks = ", ".join("?" * batch.num_columns)
        names = ", ".join(_quote(n) for n in batch.schema.names)
        rows = zip(*(c.to_pylist() for c in batch.columns), strict=True)
        txn.conn.executemany(f"INSERT INTO {stage} ({names}) VALUES ({marks})", rows)
        txn.rows += batch.num_rows

    def pre_commit(self, txn: Transaction) -> Committable:
        assert isinstance(txn, _SqliteTransaction)
        ctx = txn.ctx
        stage = txn.stage if txn.created else None
        try:
            if stage is not None:
                txn.conn.execute("INSERT INTO _txsink_prepared VALUES (?, ?, ?, ?)",
                                 (ctx.participant, ctx.sink_id, stage, txn.rows))
            txn.conn.execute("COMMIT")
        except sqlite3.IntegrityError:
            txn.conn.execute("ROLLBACK")
            raise StateError(f"sqlite backend: participant {ctx.participant} is already "
                             "prepared", participant=ctx.participant) from None
        finally:
            txn.conn.close()
        return Committable.for_context(self.name, ctx, {"stage": stage}, rows=txn.rows)

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _SqliteTransaction)
        with contextlib.suppress(sqlite3.Error):
            txn.conn.execute("ROLLBACK")
        txn.conn.close()

    # -- driver side --------------------------------------------------------------------

    def commit(self, committable: Committable) -> CommitOutcome:
        stage = committable.payload.get("stage")
        if stage is None:
            return CommitOutcome.COMMITTED  # an empty participant publishes nothing
        if stage != f"_txsink_stage_{committable.participant}":
            raise StateError(f"sqlite backend: committable of {committable.participant} names "
                             f"an unexpected table {stage!r}", participant=committable.participant)
        with self._session() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute("SELECT 1 FROM _txsink_committed WHERE participant = ?",
                                (committable.participant,)).fetchone():
                    conn.execute("ROLLBACK")
                    return CommitOutcome.ALREADY_COMMITTED
                if not conn.execute("SELECT 1 FROM _txsink_prepared WHERE participant = ?",
                                    (committable.participant,)).fetchone():
                    conn.execute("ROLLBACK")
                    raise ParticipantLostError(
                        f"sqlite backend: {committable.describe()} is neither prepared nor "
                        "committed", sink_id=committable.sink_id, epoch=committable.epoch,
                        participant=committable.participant)
                conn.execute(f"INSERT INTO {_quote(self.table)} SELECT * FROM {_quote(stage)}")
                conn.execute("INSERT INTO _txsink_committed VALUES (?, ?, ?)",
                             (committable.participant, committable.sink_id, stage))
                conn.execute("DELETE FROM _txsink_prepared WHERE participant = ?",
                             (committable.participant,))
                conn.execute(f"DROP TABLE {_quote(stage)}")
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return CommitOutcome.COMMITTED

    def abort(self, committable: Committable) -> None:
        with self._session() as conn:
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute("SELECT stage FROM _txsink_prepared WHERE participant = ?",
                               (committable.participant,)).fetchone()
            if row is not None:
                conn.execute(f"DROP TABLE IF EXISTS {_quote(row[0])}")
                conn.execute("DELETE FROM _txsink_prepared WHERE participant = ?",
                             (committable.participant,))
            conn.execute("COMMIT")

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """The commit marker of some participant of ``epoch`` is recorded."""
        with self._session() as conn:
            names = conn.execute("SELECT participant FROM _txsink_committed WHERE sink_id = ?",
                                 (sink_id,)).fetchall()
        return any((ctx := parse_participant(str(name))) is not None and ctx.epoch == epoch
                   for (name,) in names)

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        with self._session() as conn:
            rows: list[Any] = conn.execute(
                "SELECT participant, stage, rows FROM _txsink_prepared WHERE sink_id = ?",
                (sink_id,)).fetchall()
        out = []
        for participant, stage, count in rows:
            ctx = parse_participant(participant)
            if ctx is not None:
                out.append(Committable.for_context(self.name, ctx, {"stage": stage}, rows=count))
        return out
