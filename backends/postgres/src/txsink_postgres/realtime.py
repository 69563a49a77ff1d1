"""Real-time Mode target: rows and a progress row in one PostgreSQL transaction.

The progress table holds, per (sink id, source topic, source partition), the highest
source offset whose rows the target holds, and a ``generation``. Claiming a source
partition bumps the generation; every transaction first locks the progress row
(``SELECT ... FOR UPDATE``) and checks the generation is still its own, so a second
driver or a zombie task of a dead one is fenced before it writes a row, and a claim
waits for the commit in flight and then reads the offset it committed.

No prepared transactions are needed (a plain ``COMMIT`` is the commit point), so
``max_prepared_transactions`` may stay 0 for this mode.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.realtime import NOTHING, PositionTarget, RealtimeTargetSpec, SourcePartition
from txsink.redact import redact

from txsink_postgres.names import TableName

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_TABLE = "public.txsink_progress"


def _sql() -> Any:
    from psycopg import sql

    return sql


class PostgresRealtimeSpec(RealtimeTargetSpec):
    """``dsn`` + ``table`` (+ ``password``, ``progress_table``): see docs/realtime.md."""

    def __init__(self, sink_id: str, options: Mapping[str, str]) -> None:
        opts = {k.lower(): v for k, v in options.items()}
        unknown = set(opts) - {"dsn", "table", "password", "password_env", "progress_table"}
        if unknown:
            raise ConfigError(f"postgres real-time target: unknown option(s) "
                              f"{', '.join(sorted(unknown))}; known: dsn, table, password, "
                              "password_env, progress_table", field=sorted(unknown)[0],
                              sink_id=sink_id)
        if not opts.get("dsn"):
            raise ConfigError("postgres real-time target: option 'dsn' is required "
                              "(a libpq connection string)", field="dsn", sink_id=sink_id)
        if not opts.get("table"):
            raise ConfigError("postgres real-time target: option 'table' is required "
                              "(schema.table, created beforehand)", field="table",
                              sink_id=sink_id)
        self.sink_id = sink_id
        self.dsn = opts["dsn"]
        self.password = opts.get("password") or None
        if opts.get("password_env"):
            # Read on the driver, so a pipeline file never holds the password.
            self.password = os.environ.get(opts["password_env"]) or None
            if self.password is None:
                raise ConfigError(f"postgres real-time target: password_env names "
                                  f"{opts['password_env']!r}, which is not set",
                                  field="password_env", sink_id=sink_id)
        self.table = TableName.parse(opts["table"])
        self.progress = TableName.parse(opts.get("progress_table") or DEFAULT_PROGRESS_TABLE,
                                        field="progress_table")

    def __repr__(self) -> str:
        return f"PostgresRealtimeSpec({self.describe()})"

    def describe(self) -> str:
        return f"postgres table {self.table} (progress in {self.progress})"

    def _server(self) -> tuple[str, str, str]:
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(self.dsn)
        except Exception:
            params = {}
        return (str(params.get("host") or ""), str(params.get("port") or "5432"),
                str(params.get("dbname") or params.get("user") or ""))

    def place(self) -> str:
        # The database and the table, not host or port: a failover promotes a standby
        # under another address (as the micro-batch target's destination).
        return f"postgres database {self._server()[2]} table {self.table}"

    def same_place(self, other: RealtimeTargetSpec) -> bool:
        return (isinstance(other, PostgresRealtimeSpec) and self._server() == other._server()
                and str(self.table) == str(other.table))

    def connect(self, *, autocommit: bool = False) -> Any:
        import psycopg

        try:
            return psycopg.connect(self.dsn, password=self.password, autocommit=autocommit,
                                   connect_timeout=10)
        except psycopg.Error as exc:
            secrets = [s for s in (self.password,) if s]
            raise TxsinkError(f"postgres real-time target: cannot connect: "
                              f"{redact(str(exc).strip(), secrets)}",
                              sink_id=self.sink_id) from None

    def prepare(self) -> None:
        sql = _sql()
        with self.connect(autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", [str(self.table)]).fetchone()
            if exists is None or exists[0] is None:
                raise ConfigError(f"postgres real-time target: table {self.table} does not "
                                  "exist; create it with the pipeline's output columns",
                                  field="table", sink_id=self.sink_id)
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, source_topic text "
                "NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, "
                "generation bigint NOT NULL, PRIMARY KEY (sink_id, source_topic, "
                "source_partition))").format(self._ident(self.progress)))

    @staticmethod
    def _ident(name: TableName) -> Any:
        return _sql().Identifier(name.schema, name.table)

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return PostgresPositionTarget(self, source)

    def stored_positions(self) -> dict[SourcePartition, int]:
        sql = _sql()
        with self.connect(autocommit=True) as conn:
            exists = conn.execute("SELECT to_regclass(%s)", [str(self.progress)]).fetchone()
            if exists is None or exists[0] is None:
                return {}  # no run has prepared it yet
            rows = conn.execute(sql.SQL(
                "SELECT source_topic, source_partition, source_offset FROM {} "
                "WHERE sink_id = %s").format(self._ident(self.progress)),
                [self.sink_id]).fetchall()
        return {SourcePartition(t, p): o for t, p, o in rows}


class PostgresPositionTarget(PositionTarget):
    """One source partition's session: one connection, one transaction per commit."""

    def __init__(self, spec: PostgresRealtimeSpec, source: SourcePartition) -> None:
        self.spec = spec
        self.source = source
        self.conn: Any = None
        self.generation = -1
        self.in_txn = False
        self._key = [spec.sink_id, source.topic, source.partition]

    def _where(self) -> Any:
        return _sql().SQL("sink_id = %s AND source_topic = %s AND source_partition = %s")

    def claim(self) -> int:
        sql = _sql()
        self.conn = self.spec.connect()
        progress = self.spec._ident(self.spec.progress)
        row = self.conn.execute(sql.SQL(
            "INSERT INTO {p} AS p VALUES (%s, %s, %s, %s, 1) ON CONFLICT (sink_id, "
            "source_topic, source_partition) DO UPDATE SET generation = p.generation + 1 "
            "RETURNING source_offset, generation").format(p=progress),
            [*self._key, NOTHING]).fetchone()
        self.conn.commit()
        offset, self.generation = int(row[0]), int(row[1])
        log.debug("sink %s: claimed %s as generation %s at offset %s", self.spec.sink_id,
                  self.source, self.generation, offset)
        return offset

    def _begin(self) -> None:
        sql = _sql()
        row = self.conn.execute(sql.SQL(
            "SELECT generation FROM {} WHERE {} FOR UPDATE").format(
                self.spec._ident(self.spec.progress), self._where()), self._key).fetchone()
        self.in_txn = True
        if row is None or int(row[0]) != self.generation:
            raise FencedError(
                f"sink {self.spec.sink_id}: source partition {self.source} was claimed by a "
                f"newer writer (generation {row[0] if row else 'gone'}, this one "
                f"{self.generation}); this writer stops without writing",
                sink_id=self.spec.sink_id)

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        sql = _sql()
        if not self.in_txn:
            self._begin()
        columns = list(rows[0].keys())
        stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
            self.spec._ident(self.spec.table), sql.SQL(", ").join(map(sql.Identifier, columns)))
        with self.conn.cursor() as cur, cur.copy(stmt) as copy:
            for row in rows:
                copy.write_row([row[c] for c in columns])

    def commit(self, offset: int) -> None:
        sql = _sql()
        if not self.in_txn:
            self._begin()
        cur = self.conn.execute(sql.SQL(
            "UPDATE {} SET source_offset = %s WHERE {} AND generation = %s "
            "AND source_offset < %s").format(self.spec._ident(self.spec.progress),
                                             self._where()),
            [offset, *self._key, self.generation, offset])
        if cur.rowcount != 1:
            raise TxsinkError(f"sink {self.spec.sink_id}: progress of {self.source} did not "
                              f"move to {offset} (fenced or already past it); nothing of this "
                              "transaction was committed", sink_id=self.spec.sink_id)
        self.conn.commit()
        self.in_txn = False

    def abort(self) -> None:
        if self.conn is not None and not self.conn.closed:
            self.conn.rollback()
        self.in_txn = False

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            try:
                conn.rollback()
            finally:
                conn.close()
