"""Real-time Mode target: rows and a progress row in one PostgreSQL transaction.

The progress table holds, per (sink id, source topic, source partition), the highest
source offset whose rows the target holds, the source topic's id it was counted in, the
table the rows went to, and a ``generation``. Claiming a source partition gives its row
a new generation; every transaction first locks the progress row (``SELECT ... FOR
UPDATE``) and checks the generation is still its own, so a second driver or a zombie
task of a dead one is fenced before it writes a row, and a claim waits for the commit
in flight and then reads the offset it committed.

Generations come from a sequence (``<progress table>_generation``), never from the row:
a row deleted to start over (``txsink reset``) and claimed again gets a generation no
older session ever held, so a zombie task that claimed before the deletion stays fenced
(with generations counted per row it would have held generation 1 again, and written
into the new run's positions).

A zombie task that had not claimed yet holds no row to delete: the run's own generation,
drawn from the same sequence when the driver prepares the target, travels with the spec
to the tasks, and ``delete_positions`` records one in the sink's **reset row** (source
topic ``''``, source partition -1: no Kafka topic has an empty name). A claim of a run
prepared before the reset is refused before it takes a generation. Claims and resets of
one sink id exclude each other by an advisory lock (shared / exclusive), so a claim either
sees the reset row or is seen, and deleted, by the reset.

No prepared transactions are needed (a plain ``COMMIT`` is the commit point), so
``max_prepared_transactions`` may stay 0 for this mode.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from txsink.errors import ConfigError, FencedError, TxsinkError
from txsink.realtime import (
    NOTHING,
    PositionTarget,
    RealtimeTargetSpec,
    SourcePartition,
    StoredPosition,
    older_run_refusal,
)
from txsink.realtime.places import endpoints, share_endpoint
from txsink.redact import redact

from txsink_postgres.names import TableName

log = logging.getLogger(__name__)

DEFAULT_PROGRESS_TABLE = "public.txsink_progress"
#: The key of a sink's reset row in the progress table (never a source partition's).
RESET_TOPIC, RESET_PARTITION = "", -1


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
        self.generations = TableName(self.progress.schema,
                                     f"{self.progress.table[:52]}_generation")
        #: The database's own name (``current_database()``), once prepare() connected.
        self.database = ""

    def __repr__(self) -> str:
        return f"PostgresRealtimeSpec({self.describe()})"

    def describe(self) -> str:
        return f"postgres table {self.table} (progress in {self.progress})"

    def _params(self) -> dict[str, Any]:
        from psycopg.conninfo import conninfo_to_dict

        try:
            return dict(conninfo_to_dict(self.dsn))
        except Exception:
            return {}

    def _database(self) -> str:
        params = self._params()
        return self.database or str(params.get("dbname") or params.get("user") or "")

    def _endpoints(self) -> list[tuple[str, str]]:
        """The servers the DSN names (libpq takes lists: ``host=a,b port=5432,5433``)."""
        params = self._params()
        hosts = str(params.get("host") or "").split(",")
        ports = str(params.get("port") or "5432").split(",")
        return [(h.strip(), (ports[i] if i < len(ports) else ports[-1]).strip() or "5432")
                for i, h in enumerate(hosts)]

    def destination(self) -> dict[str, str]:
        # The database and the table, not host or port: a failover promotes a standby
        # under another address (as the micro-batch target's destination). The database
        # is the server's own name for it once prepare() connected. The progress table
        # too: under another one the target's positions are gone.
        return {"database": self._database(), "table": str(self.table),
                "progress_table": str(self.progress)}

    def place(self) -> str:
        return f"postgres database {self._database()} table {self.table}"

    def same_place(self, other: RealtimeTargetSpec) -> bool:
        # One table of one database on one server, whatever alias or order names it.
        return (isinstance(other, PostgresRealtimeSpec) and self._database() == other._database()
                and str(self.table) == str(other.table)
                and share_endpoint(endpoints(",".join(f"{h}:{p}" for h, p in self._endpoints())),
                                   endpoints(",".join(f"{h}:{p}"
                                                      for h, p in other._endpoints()))))

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
            exists = conn.execute("SELECT to_regclass(%s), current_database()",
                                  [str(self.table)]).fetchone()
            if exists is None or exists[0] is None:
                raise ConfigError(f"postgres real-time target: table {self.table} does not "
                                  "exist; create it with the pipeline's output columns",
                                  field="table", sink_id=self.sink_id)
            self.database = str(exists[1])
            progress = self._ident(self.progress)
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink_id text NOT NULL, source_topic text "
                "NOT NULL, source_partition integer NOT NULL, source_offset bigint NOT NULL, "
                "generation bigint NOT NULL, topic_id text, destination text, "
                "PRIMARY KEY (sink_id, source_topic, source_partition))").format(progress))
            # Progress tables of releases that recorded neither: their rows are adopted
            # (the driver checks them against the topic's end first).
            for column in ("topic_id", "destination"):
                conn.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} text").format(
                    progress, sql.Identifier(column)))
            self._prepare_generations(conn)
            self.run = int(conn.execute(sql.SQL("SELECT nextval({})").format(
                sql.Literal(str(self.generations)))).fetchone()[0])

    def _lock(self, conn: Any, *, exclusive: bool) -> None:
        """The advisory lock of this sink id's claims (shared) and resets (exclusive),
        for the rest of the transaction."""
        fn = "pg_advisory_xact_lock" if exclusive else "pg_advisory_xact_lock_shared"
        conn.execute(f"SELECT {fn}(hashtextextended(%s, 0))",
                     [f"txsink-rt-reset/{self.progress}/{self.sink_id}"])

    def _reset_generation(self, conn: Any) -> int | None:
        """The generation of this sink id's last reset (``None``: never reset)."""
        sql = _sql()
        row = conn.execute(sql.SQL(
            "SELECT generation FROM {} WHERE sink_id = %s AND source_topic = %s AND "
            "source_partition = %s").format(self._ident(self.progress)),
            [self.sink_id, RESET_TOPIC, RESET_PARTITION]).fetchone()
        return None if row is None else int(row[0])

    def _prepare_generations(self, conn: Any) -> None:
        """The generation sequence, started past every generation a row holds (rows of
        releases that counted generations per row): under a lock that keeps claims out,
        so no generation is ever handed out twice."""
        sql = _sql()
        seq, progress = self._ident(self.generations), self._ident(self.progress)
        conn.execute(sql.SQL("CREATE SEQUENCE IF NOT EXISTS {}").format(seq))
        issued = sql.SQL("SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 "
                         "END FROM {}").format(seq)
        top = conn.execute(sql.SQL("SELECT coalesce(max(generation), 0) FROM {}").format(
            progress)).fetchone()[0]
        if int(top) <= int(conn.execute(issued).fetchone()[0]):
            return  # every generation a row holds came from the sequence
        with conn.transaction():
            conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(progress))
            conn.execute(sql.SQL(
                "SELECT setval({seq_name}, greatest(({issued}), "
                "(SELECT coalesce(max(generation), 0) FROM {p})), true)").format(
                    seq_name=sql.Literal(str(self.generations)), issued=issued, p=progress))

    @staticmethod
    def _ident(name: TableName) -> Any:
        return _sql().Identifier(name.schema, name.table)

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return PostgresPositionTarget(self, source)

    def stored(self) -> dict[SourcePartition, StoredPosition]:
        sql = _sql()
        with self.connect(autocommit=True) as conn:
            if not self._progress_exists(conn):
                return {}  # no run has prepared it yet
            columns = self._identity_columns(conn)
            rows = conn.execute(sql.SQL(
                "SELECT source_topic, source_partition, source_offset, {} FROM {} "
                "WHERE sink_id = %s AND source_partition >= 0").format(
                    columns, self._ident(self.progress)), [self.sink_id]).fetchall()
        return {SourcePartition(t, p): position_of(o, i, d) for t, p, o, i, d in rows}

    def _progress_exists(self, conn: Any) -> bool:
        exists = conn.execute("SELECT to_regclass(%s)", [str(self.progress)]).fetchone()
        return exists is not None and exists[0] is not None

    def _identity_columns(self, conn: Any) -> Any:
        """``topic_id, destination`` (NULLs in a progress table of an older release that
        no run of this one has prepared yet: read only, it is not changed here)."""
        sql = _sql()
        have = {r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
            "AND NOT attisdropped", [str(self.progress)]).fetchall()}
        return sql.SQL(", ").join(
            sql.Identifier(c) if c in have else sql.SQL("NULL::text")
            for c in ("topic_id", "destination"))

    def delete_positions(self, topics: Sequence[str] | None = None) -> list[str]:
        """Delete this sink id's progress rows (of ``topics`` only, if given): a session
        that held one is fenced at its next transaction (its row is gone, and the next
        claim gets a generation it never held); a claim of a run prepared before this is
        refused (the reset row records a generation past that run's)."""
        sql = _sql()
        with self.connect(autocommit=True) as conn:
            if not self._progress_exists(conn):
                return []  # no run prepared it: no task to fence
            progress = self._ident(self.progress)
            where = sql.SQL("sink_id = %s AND source_partition >= 0")
            params: list[Any] = [self.sink_id]
            if topics is not None:
                where = sql.SQL("sink_id = %s AND source_partition >= 0 AND "
                                "source_topic = ANY(%s)")
                params.append(list(topics))
            with conn.transaction():
                self._lock(conn, exclusive=True)
                conn.execute(sql.SQL(
                    "INSERT INTO {p} (sink_id, source_topic, source_partition, "
                    "source_offset, generation) VALUES (%s, %s, %s, %s, nextval({seq})) "
                    "ON CONFLICT (sink_id, source_topic, source_partition) DO UPDATE SET "
                    "generation = EXCLUDED.generation").format(
                        p=progress, seq=sql.Literal(str(self.generations))),
                    [self.sink_id, RESET_TOPIC, RESET_PARTITION, NOTHING])
                rows = conn.execute(sql.SQL(
                    "DELETE FROM {} WHERE {} RETURNING source_topic, source_partition, "
                    "source_offset").format(progress, where), params).fetchall()
        return [f"{SourcePartition(t, p)}: offset {o} (row deleted from {self.progress})"
                for t, p, o in sorted(rows)]


def position_of(offset: int, topic_id: str | None, destination: str | None) -> StoredPosition:
    dest = None
    if destination:
        try:
            data = json.loads(destination)
        except ValueError:
            data = None
        if isinstance(data, dict):
            dest = {str(k): str(v) for k, v in data.items()}
    return StoredPosition(int(offset), topic_id or None, dest)


class PostgresPositionTarget(PositionTarget):
    """One source partition's session: one connection, one transaction per commit.

    Reusable between tasks: every transaction first checks the session's generation
    (``SELECT ... FOR UPDATE``), so a kept session that another claimed meanwhile is
    refused before it writes a row, and :meth:`still_holds` asks the same first."""

    reusable = True

    def __init__(self, spec: PostgresRealtimeSpec, source: SourcePartition) -> None:
        self.spec = spec
        self.source = source
        self.conn: Any = None
        self.generation = -1
        self.in_txn = False
        self._key = [spec.sink_id, source.topic, source.partition]
        self._destination = json.dumps(spec.destination(), sort_keys=True)

    def identity(self) -> tuple[str, Mapping[str, str]]:
        return self.spec.sink_id, self.spec.destination()

    def _where(self) -> Any:
        return _sql().SQL("sink_id = %s AND source_topic = %s AND source_partition = %s")

    def claim(self) -> StoredPosition:
        sql = _sql()
        self.conn = self.spec.connect()
        progress = self.spec._ident(self.spec.progress)
        # Under the sink's shared advisory lock: a reset either committed before (its
        # row is read here) or waits for this claim (and deletes the row it takes).
        self.spec._lock(self.conn, exclusive=False)
        refusal = older_run_refusal(self.spec.sink_id, self.source, self.spec.run,
                                    self.spec._reset_generation(self.conn))
        if refusal is not None:
            self.close()
            raise refusal
        row = self.conn.execute(sql.SQL(
            "INSERT INTO {p} AS p (sink_id, source_topic, source_partition, source_offset, "
            "generation, topic_id, destination) VALUES (%s, %s, %s, %s, nextval({seq}), %s, "
            "%s) ON CONFLICT (sink_id, source_topic, source_partition) DO UPDATE SET "
            "generation = EXCLUDED.generation RETURNING source_offset, generation, topic_id, "
            "destination").format(p=progress,
                                  seq=sql.Literal(str(self.spec.generations))),
            [*self._key, NOTHING, self.source.topic_id, self._destination]).fetchone()
        self.conn.commit()
        self.generation = int(row[1])
        stored = position_of(row[0], row[2], row[3])
        log.debug("sink %s: claimed %s as generation %s at offset %s", self.spec.sink_id,
                  self.source, self.generation, stored.offset)
        return stored

    def still_holds(self) -> bool:
        """Whether the progress row still carries this session's generation."""
        import psycopg

        sql = _sql()
        if self.conn is None or self.conn.closed:
            return False
        try:
            row = self.conn.execute(sql.SQL("SELECT generation FROM {} WHERE {}").format(
                self.spec._ident(self.spec.progress), self._where()), self._key).fetchone()
            self.conn.rollback()  # no transaction left open while the session idles
        except psycopg.Error as exc:  # the server restarted meanwhile: claim again
            log.info("sink %s: kept session of %s lost its connection (%s); claiming "
                     "again", self.spec.sink_id, self.source, exc)
            return False
        return row is not None and int(row[0]) == self.generation

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
            "UPDATE {} SET source_offset = %s, topic_id = coalesce(%s, topic_id), "
            "destination = %s WHERE {} AND generation = %s AND source_offset < %s").format(
                self.spec._ident(self.spec.progress), self._where()),
            [offset, self.source.topic_id, self._destination, *self._key, self.generation,
             offset])
        if cur.rowcount != 1:
            raise TxsinkError(f"sink {self.spec.sink_id}: progress of {self.source} did not "
                              f"move to {offset} (fenced or already past it); nothing of this "
                              "transaction was committed", sink_id=self.spec.sink_id)
        self.conn.commit()
        self.in_txn = False

    def abort(self) -> None:
        import psycopg

        self.in_txn = False
        if self.conn is not None and not self.conn.closed:
            try:
                self.conn.rollback()
            except psycopg.Error as exc:  # a broken connection: nothing was committed
                log.debug("sink %s: rollback for %s: %s", self.spec.sink_id, self.source,
                          exc)

    def close(self) -> None:
        import psycopg

        conn, self.conn = self.conn, None
        if conn is not None and not conn.closed:
            try:
                conn.rollback()
            except psycopg.Error as exc:
                log.debug("sink %s: rollback for %s: %s", self.spec.sink_id, self.source,
                          exc)
            finally:
                conn.close()
