"""The PostgreSQL backend: ``COPY`` into an open transaction, ``PREPARE TRANSACTION``,
``COMMIT PREPARED`` from the driver.

Each participant is one database transaction named by a deterministic gid. Inside
the same transaction the writer inserts a row into a bookkeeping table (the commit
marker), so that after a crash the database itself tells a committed participant
(marker visible) from a rolled-back one (no marker). The transaction id (``xid``)
of the prepared transaction travels in the committable: commit and abort only act
on the transaction that wrote, never on a later one that reuses the gid.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from txsink.backend import Backend, Capability, CommitOutcome, Transaction
from txsink.errors import (
    ConfigError,
    FatalCommitError,
    ParticipantLostError,
    RetriableCommitError,
    ServerUnavailableError,
    SinkOwnedError,
    TxsinkError,
)
from txsink.model import Committable, DeliveryGuarantee, TransactionContext
from txsink.options import Options, Secret
from txsink.redact import redact

from txsink_postgres import csvcopy
from txsink_postgres.names import TableName, like_prefix, make_gid, parse_gid
from txsink_postgres.types import accepts, binary_dump_type, column_converter, pg_type_for

if TYPE_CHECKING:
    import psycopg
    import pyarrow as pa
    from txsink.realtime import RealtimeTargetSpec

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_XID_MASK = 0xFFFFFFFF
_SQLSTATE_UNDEFINED_OBJECT = "42704"  # "prepared transaction ... does not exist"
_SQLSTATE_DUPLICATE_OBJECT = "42710"  # "transaction identifier ... is already in use"
_SQLSTATE_OBJECT_IN_USE = "55006"  # another session is finishing the same gid
_SQLSTATE_INVALID_PASSWORD = "28P01"
_SQLSTATE_UNDEFINED_TABLE = "42P01"
_SQLSTATE_INSUFFICIENT_PRIVILEGE = "42501"

MAX_PREPARED_HINT = (
    "set max_prepared_transactions in postgresql.conf (or run ALTER SYSTEM SET "
    "max_prepared_transactions = 64) to at least the number of writer tasks of one epoch "
    "plus headroom for recovery, e.g. 2 x the number of Spark partitions, then restart "
    "PostgreSQL (the setting needs a restart)"
)


#: Connections an epoch's ``COMMIT PREPARED``s run over (option ``commit_connections``).
#: Each commit waits for its own WAL flush; concurrent ones share a flush (group
#: commit), so more connections mean fewer flushes per epoch: measured at 128
#: participants, 1 connection ~700 ms, 4 ~270 ms, 8 ~110 ms, 16 ~100 ms.
DEFAULT_COMMIT_CONNECTIONS = 8
#: Upper bound of option ``commit_connections``: each is a server backend process.
MAX_COMMIT_CONNECTIONS = 32

#: Where commit markers go unless options ``marker_schema``/``marker_table`` say otherwise.
DEFAULT_MARKER_TABLE = TableName("txsink", "txsink_commits")


@dataclass
class _Plan:
    """How batches of one Arrow schema are copied into the table."""

    schema: pa.Schema
    statement: Any  # psycopg.sql.Composed
    binary: bool
    dump_types: list[str]
    converters: list[Callable[[pa.Array[Any]], Sequence[Any]]]
    #: Whole-batch CSV encoding, when every column's CSV text reads back exactly.
    csv_statement: Any = None
    csv_converters: list[Callable[[pa.Array[Any]], pa.Array[Any]]] | None = None


class _PgTransaction(Transaction):
    def __init__(self, ctx: TransactionContext, conn: psycopg.Connection[Any], gid: str) -> None:
        super().__init__(ctx)
        self.conn = conn
        self.gid = gid
        self.plan: _Plan | None = None
        #: The COPY in progress: one statement streams every batch of a schema.
        self.copy: Any = None
        #: Whether that COPY reads CSV (whole batches) or rows (binary/text).
        self.copy_csv = False
        self._copy_stack = contextlib.ExitStack()

    def describe(self) -> str:
        return f"{super().describe()} gid={self.gid}"

    def open_copy(self, plan: _Plan, *, csv: bool) -> Any:
        cur = self._copy_stack.enter_context(self.conn.cursor())
        self.copy = self._copy_stack.enter_context(
            cur.copy(plan.csv_statement if csv else plan.statement))
        self.copy_csv = csv
        if plan.binary and not csv:
            self.copy.set_types(plan.dump_types)
        return self.copy

    def end_copy(self) -> None:
        """Finish the COPY; the server reports bad data here at the latest."""
        self.copy = None
        self._copy_stack.close()

    def fail_copy(self) -> None:
        """Abandon the COPY (psycopg sends CopyFail) so the connection can roll back."""
        if self.copy is None:
            return
        self.copy = None
        with contextlib.suppress(Exception):
            self._copy_stack.__exit__(RuntimeError, RuntimeError("txsink discard"), None)


class PostgresBackend(Backend):
    """Exactly-once output into one PostgreSQL table through prepared transactions."""

    name: ClassVar[str] = "postgres"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({
        Capability.COMMIT_FROM_ANY_PROCESS,
        Capability.LIST_PREPARED,
        Capability.COMMIT_MARKER,
        Capability.SURVIVES_RESTART,
    })
    #: libpq's secret parameters, as options, as ``connect.*`` options and in the DSN.
    secret_options: ClassVar[frozenset[str]] = frozenset({
        "password", "sslpassword", "connect.sslpassword"})
    connect_retry_option: ClassVar[str | None] = "connect_retry_s"
    guarantees: ClassVar[frozenset[DeliveryGuarantee]] = frozenset(DeliveryGuarantee)
    payload_version: ClassVar[int] = 1

    def __init__(
        self,
        *,
        conninfo: str,
        table: TableName,
        password: Secret | None = None,
        password_env: str | None = None,
        create_table: bool = False,
        marker_table: TableName = DEFAULT_MARKER_TABLE,
        copy_format: str = "auto",
        connect_timeout: int = 10,
        marker_retention_epochs: int = 1000,
        sslpassword: Secret | None = None,
        connect_retry_s: float = 30.0,
        commit_connections: int = DEFAULT_COMMIT_CONNECTIONS,
    ) -> None:
        self.conninfo = conninfo
        self.commit_connections = commit_connections
        self.sslpassword = sslpassword
        self.connect_retry_s = connect_retry_s
        self.table = table
        self.password = password
        self.password_env = password_env
        self.create_table = create_table
        self.marker_table = marker_table
        self.copy_format = copy_format
        self.connect_timeout = connect_timeout
        self.marker_retention_epochs = marker_retention_epochs
        self._driver_conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        #: Idle autocommit connections that commit_all spreads COMMIT PREPARED over.
        self._idle: list[psycopg.Connection[Any]] = []
        self._idle_lock = threading.Lock()

    # -- configuration ------------------------------------------------------------------

    @classmethod
    def realtime_target(cls, sink_id: str, options: Mapping[str, str]) -> RealtimeTargetSpec:
        """The Real-time Mode target (idempotent by source position; docs/realtime.md)."""
        from txsink_postgres.realtime import PostgresRealtimeSpec

        return PostgresRealtimeSpec(sink_id, options)

    @classmethod
    def destination(cls, options: Mapping[str, str]) -> dict[str, str]:
        # The database (from the DSN) and the table. Not host or port: a failover
        # promotes a standby under another address, and the epochs are there too (as
        # Kafka's bootstrap servers may list other brokers of the same cluster). A DSN
        # that does not parse yields no database here: from_options refuses it.
        from psycopg.conninfo import conninfo_to_dict

        try:
            params = conninfo_to_dict(str(options.get("dsn") or ""))
        except Exception:
            params = {}
        for key, value in options.items():
            if key.startswith("connect.") and key[8:] == "dbname":
                params["dbname"] = value
        place = {"dbname": str(params.get("dbname") or "")}
        table = str(options.get("table") or "")
        with contextlib.suppress(ConfigError):
            table = str(TableName.parse(table))  # orders and public.orders: one table
        return {**place, "table": table}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> PostgresBackend:
        from psycopg.conninfo import conninfo_to_dict

        opts = Options(options, owner="postgres backend", secret_keys=cls.secret_options)
        raw_dsn = opts.str("dsn", required=True)
        try:
            params = conninfo_to_dict(raw_dsn)
        except Exception as exc:
            # The message may quote the DSN, which may hold a password.
            raise ConfigError(
                "postgres backend: option 'dsn' is not a valid PostgreSQL connection string "
                "(use postgresql://user@host:port/dbname or 'host=... dbname=...'): "
                f"{redact(str(exc), [raw_dsn])}", field="dsn") from None
        # Further libpq parameters as options: connect.sslmode=require, ...
        sslpassword = opts.secret("sslpassword")
        for key, value in opts.with_prefix("connect.").items():
            if key in ("password", "passfile"):
                raise ConfigError(f"postgres backend: use option 'password' or "
                                  f"'password_env', not 'connect.{key}'",
                                  field=f"connect.{key}")
            if key == "sslpassword":
                if sslpassword is not None:
                    raise ConfigError("postgres backend: give 'sslpassword' once, not also as "
                                      "'connect.sslpassword'", field="connect.sslpassword")
                sslpassword = Secret(value)
                continue
            params[key] = value
        sslpassword = _from_dsn(params, "sslpassword", sslpassword)
        params.setdefault("application_name", "txsink")
        password = _from_dsn(params, "password", opts.secret("password"))
        password_env = opts.optional("password_env")
        if password_env is not None and password is not None:
            raise ConfigError("postgres backend: options 'password' and 'password_env' "
                              "exclude each other", field="password_env")
        table = TableName.parse(opts.str("table", required=True))
        marker_schema = opts.str("marker_schema", "txsink")
        marker_table = TableName(marker_schema, opts.str("marker_table", "txsink_commits"))
        backend = cls(
            conninfo=cls._conninfo(params),
            table=table,
            password=password,
            password_env=password_env,
            create_table=opts.bool("create_table", False),
            marker_table=marker_table,
            copy_format=opts.choice("copy_format", ["auto", "csv", "binary", "text"], "auto"),
            connect_timeout=opts.int("connect_timeout", 10, minimum=1, maximum=3600),
            marker_retention_epochs=opts.int("marker_retention_epochs", 1000, minimum=0),
            sslpassword=sslpassword,
            connect_retry_s=opts.float("connect_retry_s", 30.0, minimum=0.0),
            commit_connections=opts.int("commit_connections", DEFAULT_COMMIT_CONNECTIONS, minimum=1,
                                        maximum=MAX_COMMIT_CONNECTIONS),
        )
        opts.check_unknown()
        return backend

    @staticmethod
    def _conninfo(params: Mapping[str, object]) -> str:
        import psycopg
        from psycopg.conninfo import make_conninfo

        try:
            return make_conninfo(**{k: str(v) for k, v in params.items()})
        except psycopg.ProgrammingError as exc:
            # Raised for parameters libpq does not know; the password is already out.
            raise ConfigError(f"postgres backend: bad connection parameter in 'dsn' or a "
                              f"'connect.*' option: {exc}", field="dsn") from None

    def describe(self) -> str:
        from psycopg.conninfo import conninfo_to_dict

        p = conninfo_to_dict(self.conninfo)
        where = f"{p.get('host', 'localhost')}:{p.get('port', 5432)}/{p.get('dbname', '')}"
        return f"postgres {where} table {self.table}"

    def secret_values(self) -> list[str]:
        values = [s.reveal() for s in (self.password, self.sslpassword) if s is not None]
        if self.password_env is not None and os.environ.get(self.password_env):
            values.append(os.environ[self.password_env])
        return values

    def safe_options(self, options: Mapping[str, str]) -> dict[str, str]:
        safe = super().safe_options(options)
        if "dsn" in safe:
            safe["dsn"] = redact(safe["dsn"], self.secret_values())
            with contextlib.suppress(Exception):
                from psycopg.conninfo import conninfo_to_dict, make_conninfo

                params = conninfo_to_dict(safe["dsn"])
                found = [params.pop(k, None) for k in ("password", "sslpassword")]
                if any(v is not None for v in found):
                    safe["dsn"] = make_conninfo(**{k: str(v) for k, v in params.items()})
        return safe

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_driver_conn"] = None
        state.pop("_lock", None)
        state.pop("_idle", None)
        state.pop("_idle_lock", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("sslpassword", None)
        state.setdefault("connect_retry_s", 30.0)
        state.setdefault("commit_connections", DEFAULT_COMMIT_CONNECTIONS)
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._idle = []
        self._idle_lock = threading.Lock()

    # -- connections --------------------------------------------------------------------

    def _password(self) -> str | None:
        if self.password is not None:
            return self.password.reveal()
        if self.password_env is not None:
            value = os.environ.get(self.password_env)
            if value is None:
                raise ConfigError(
                    f"postgres backend: environment variable {self.password_env!r} named by "
                    "option 'password_env' is not set in this process (Spark executors need "
                    "it too)", field="password_env")
            return value
        return None

    def _clean(self, exc: BaseException) -> str:
        return redact(str(exc).strip(), self.secret_values())

    def _connect(self, *, autocommit: bool) -> psycopg.Connection[Any]:
        """Connect, riding out a server that restarts: transient failures (refused,
        starting up, shutting down, reset) are retried with logged, bounded backoff for
        ``connect_retry_s``; a wrong password, user, database or host name is not."""
        started = time.monotonic()
        deadline = started + self.connect_retry_s
        delay = 0.25
        attempt = 1
        while True:
            try:
                # Each attempt ends by the deadline (libpq's smallest timeout is 2 s): a
                # server that accepts and never answers made a 3-second bound take 10 s.
                left = deadline - time.monotonic()
                return self._connect_once(autocommit=autocommit, timeout=max(
                    2, min(self.connect_timeout, math.ceil(left))))
            except _ConnectError as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _ConnectError(f"{exc} (still failing after {attempt} attempt(s) "
                                        f"in {time.monotonic() - started:.0f}s; option "
                                        "connect_retry_s sets how long to retry, "
                                        f"{self.connect_retry_s:g}s)") from None
                wait = min(delay, left)
                log.warning("%s; attempt %d, retrying in %.2fs", exc, attempt, wait,
                            extra={"txsink_retry": True})
                time.sleep(wait)
                delay = min(delay * 2, 5.0)
                attempt += 1

    def _connect_once(self, *, autocommit: bool,
                      timeout: int | None = None) -> psycopg.Connection[Any]:
        import psycopg

        kwargs: dict[str, Any] = {"connect_timeout": timeout or self.connect_timeout,
                                  "autocommit": autocommit}
        password = self._password()
        if password is not None:
            kwargs["password"] = password
        if self.sslpassword is not None:
            kwargs["sslpassword"] = self.sslpassword.reveal()
        try:
            return psycopg.connect(self.conninfo, **kwargs)
        except psycopg.Error as exc:
            sqlstate = getattr(exc, "sqlstate", None)
            text = self._clean(exc)
            if sqlstate == _SQLSTATE_INVALID_PASSWORD or "password authentication" in text:
                raise ConfigError(
                    f"postgres backend: cannot log in to {self.describe()}: {text}. Check "
                    "the user in 'dsn' and the password ('password' or 'password_env')",
                    field="password") from None
            if not _transient(sqlstate, text):
                raise ConfigError(
                    f"postgres backend: cannot connect to {self.describe()}: {text}. Check "
                    "'dsn' (host, port, user, dbname) and the connect.* options",
                    field="dsn") from None
            raise _ConnectError(f"postgres backend: cannot connect to {self.describe()}: "
                                f"{text}") from None

    @contextlib.contextmanager
    def _driver(self) -> Any:
        """The driver's autocommit connection, reopened after a connection failure."""
        import psycopg

        with self._lock:
            conn = self._driver_conn
            if conn is None or conn.closed:
                conn = self._driver_conn = self._connect(autocommit=True)
            try:
                yield conn
            except psycopg.OperationalError:
                self._driver_conn = None
                with contextlib.suppress(Exception):
                    conn.close()
                raise

    def _borrow(self) -> psycopg.Connection[Any]:
        """An idle commit connection, or a new one (autocommit: COMMIT PREPARED
        cannot run inside a transaction block)."""
        with self._idle_lock:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
        return self._connect(autocommit=True)

    def _give_back(self, conn: psycopg.Connection[Any]) -> None:
        """Keep ``conn`` for the next epoch if it is healthy and idle, else close it."""
        from psycopg.pq import TransactionStatus

        with self._idle_lock:
            if (not conn.closed and conn.info.transaction_status is TransactionStatus.IDLE
                    and len(self._idle) < self.commit_connections):
                self._idle.append(conn)
                return
        with contextlib.suppress(Exception):
            conn.close()

    def close(self) -> None:
        conn, self._driver_conn = self._driver_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for extra in idle:
            with contextlib.suppress(Exception):
                extra.close()

    # -- preflight ----------------------------------------------------------------------

    def preflight(self, sink_id: str) -> None:
        """Server reachable, prepared transactions enabled, table usable, marker table ready."""
        import psycopg

        try:
            conn = self._connect(autocommit=True)
        except _ConnectError as exc:
            # Down, not misconfigured: `txsink run` says "server down".
            raise ServerUnavailableError(str(exc), field="dsn", sink_id=sink_id) from None
        with conn:
            row = conn.execute("SELECT current_setting('max_prepared_transactions')::int, "
                               "current_database()").fetchone()
            assert row is not None
            max_prepared, database = int(row[0]), str(row[1])
            if max_prepared <= 0:
                raise ConfigError(
                    f"postgres backend: {self.describe()} has max_prepared_transactions = 0, "
                    f"so it cannot prepare transactions and txsink cannot write exactly once: "
                    f"{MAX_PREPARED_HINT}", field="dsn", sink_id=sink_id)
            oid = self._table_oid(conn, self.table)
            if oid is None:
                if not self.create_table:
                    raise ConfigError(
                        f"postgres backend: table {self.table} does not exist in database "
                        f"{database!r}; create it, or set option create_table=true to create "
                        "it from the data's schema", field="table", sink_id=sink_id)
                schema_ok = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s",
                                         (self.table.schema,)).fetchone()
                if schema_ok is None:
                    raise ConfigError(f"postgres backend: schema {self.table.schema!r} of "
                                      f"table {self.table} does not exist; create it first",
                                      field="table", sink_id=sink_id)
            else:
                allowed = conn.execute("SELECT has_table_privilege(%s, 'INSERT')",
                                       (oid,)).fetchone()
                if not (allowed and allowed[0]):
                    raise ConfigError(f"postgres backend: the user in 'dsn' may not INSERT "
                                      f"into {self.table}; GRANT INSERT on it", field="table",
                                      sink_id=sink_id)
            try:
                self._ensure_marker_table(conn)
            except psycopg.Error as exc:
                raise ConfigError(
                    f"postgres backend: cannot create the commit-marker table "
                    f"{self.marker_table} ({self._clean(exc)}); create it as a privileged "
                    f"user with:\n{self.marker_ddl(conn)}\nor choose another schema with "
                    "option marker_schema", field="marker_schema", sink_id=sink_id) from None
        log.info("sink=%s postgres preflight ok: %s, max_prepared_transactions=%d",
                 sink_id, self.describe(), max_prepared)

    @staticmethod
    def _table_oid(conn: psycopg.Connection[Any], table: TableName) -> int | None:
        from psycopg import sql

        qualified = sql.Identifier(table.schema, table.table).as_string(conn)
        row = conn.execute("SELECT to_regclass(%s)::oid", (qualified,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def marker_ddl(self, conn: psycopg.Connection[Any]) -> str:
        return "\n".join(s.as_string(conn) + ";" for s in self._marker_statements())

    def _marker_statements(self) -> list[Any]:
        from psycopg import sql

        t = sql.Identifier(self.marker_table.schema, self.marker_table.table)
        index = sql.Identifier(self.marker_table.table + "_sink_epoch")
        return [
            sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self.marker_table.schema)),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ("
                "gid text NOT NULL, xid bigint NOT NULL, sink_id text NOT NULL, "
                "epoch bigint NOT NULL, partition integer NOT NULL, attempt integer NOT NULL, "
                "row_count bigint NOT NULL, target text NOT NULL, "
                "prepared_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (gid, xid))"
            ).format(t),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (sink_id, epoch)").format(index, t),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (sink_id text PRIMARY KEY, state_id text NOT "
                "NULL, state_location text NOT NULL, claimed_at timestamptz NOT NULL "
                "DEFAULT now())").format(self._sinks_table()),
        ]

    def _sinks_table(self) -> Any:
        from psycopg import sql

        return sql.Identifier(self.marker_table.schema, self.marker_table.table + "_sinks")

    def claim_sink(self, sink_id: str, state_id: str, state_location: str) -> None:
        """Bind ``sink_id`` to one query's state in the database, or refuse a second one."""
        from psycopg import sql

        with self._claim_connection(sink_id) as conn:
            self._ensure_marker_table(conn)
            table = self._sinks_table()
            conn.execute(sql.SQL("INSERT INTO {} (sink_id, state_id, state_location) VALUES "
                                 "(%s, %s, %s) ON CONFLICT (sink_id) DO NOTHING").format(table),
                         (sink_id, state_id, state_location))
            row = self._owner_row(conn, sink_id)
        self._refuse_owner(row, sink_id, state_id)

    def check_claim(self, sink_id: str, state_id: str, state_location: str) -> None:
        """:meth:`claim_sink`'s refusal from the owner table as it is: a table not
        created yet holds no owner, and nothing is created or inserted."""
        with self._claim_connection(sink_id) as conn:
            sinks = TableName(self.marker_table.schema, self.marker_table.table + "_sinks")
            row = (self._owner_row(conn, sink_id)
                   if self._table_oid(conn, sinks) is not None else None)
        self._refuse_owner(row, sink_id, state_id)

    def _claim_connection(self, sink_id: str) -> psycopg.Connection[Any]:
        try:
            return self._connect(autocommit=True)
        except _ConnectError as exc:
            # Down, not misconfigured: `txsink run` says "server down".
            raise ServerUnavailableError(str(exc), field="dsn", sink_id=sink_id) from None

    def _owner_row(self, conn: psycopg.Connection[Any], sink_id: str) -> tuple[Any, ...] | None:
        from psycopg import sql

        row = conn.execute(sql.SQL("SELECT state_id, state_location FROM {} "
                                   "WHERE sink_id = %s").format(self._sinks_table()),
                           (sink_id,)).fetchone()
        return None if row is None else tuple(row)

    def _refuse_owner(self, row: tuple[Any, ...] | None, sink_id: str, state_id: str) -> None:
        """Refuse ``state_id`` if the owner row names another state."""
        if row is not None and row[0] != state_id:
            owner_table = f"{self.marker_table.schema}.{self.marker_table.table}_sinks"
            raise SinkOwnedError(
                f"postgres backend: sink {sink_id!r} in {self.describe()} is already written "
                f"by another query (txsink state at {row[1]!r}). A sink id belongs to one "
                "query: give this query its own sink_id, or, if the old query and its "
                f"checkpoint are gone for good, DELETE FROM {owner_table} WHERE sink_id = "
                f"'{sink_id}'", field="sink_id", sink_id=sink_id, owner_state=row[1])

    def _ensure_marker_table(self, conn: psycopg.Connection[Any]) -> None:
        sinks = TableName(self.marker_table.schema, self.marker_table.table + "_sinks")
        if (self._table_oid(conn, self.marker_table) is not None
                and self._table_oid(conn, sinks) is not None):
            return
        with conn.transaction():
            # Concurrent CREATE ... IF NOT EXISTS can still collide: serialize them.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('txsink-marker-ddl'))")
            for statement in self._marker_statements():
                conn.execute(statement)

    # -- executor side ------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> Transaction:
        gid = make_gid(ctx)
        try:
            conn = self._connect(autocommit=False)
        except _ConnectError as exc:
            raise TxsinkError(f"{ctx.describe()}: {exc}", sink_id=ctx.sink_id,
                              epoch=ctx.epoch, participant=ctx.participant) from None
        log.debug("%s gid=%s: transaction opened", ctx.describe(), gid)
        return _PgTransaction(ctx, conn, gid)

    def write(self, txn: Transaction, batch: pa.RecordBatch) -> None:
        import psycopg

        assert isinstance(txn, _PgTransaction)
        try:
            if txn.plan is None or not txn.plan.schema.equals(batch.schema):
                if txn.copy is not None:
                    txn.end_copy()
                txn.plan = self._plan(txn, batch.schema)
            plan = txn.plan
            csv = plan.csv_converters is not None
            copy = txn.copy if txn.copy is not None else txn.open_copy(plan, csv=csv)
            if plan.csv_converters is not None:
                bad = csvcopy.first_unwritable(batch)
                if bad is not None:
                    raise ConfigError(
                        f"postgres backend: column {bad!r} holds a date or timestamp before "
                        "year 1, which txsink cannot write to PostgreSQL; filter or fix those "
                        "rows upstream", field=bad, sink_id=txn.ctx.sink_id)
                copy.write(csvcopy.encode(batch, plan.csv_converters))
            else:
                columns = [convert(batch.column(i))
                           for i, convert in enumerate(plan.converters)]
                for row in zip(*columns, strict=True):
                    copy.write_row(row)
        except ConfigError:
            txn.fail_copy()
            raise
        except psycopg.Error as exc:
            txn.fail_copy()
            raise TxsinkError(
                f"{txn.describe()}: COPY into {self.table} failed: {self._clean(exc)}",
                sink_id=txn.ctx.sink_id, epoch=txn.ctx.epoch,
                participant=txn.ctx.participant) from None
        txn.rows += batch.num_rows

    def pre_commit(self, txn: Transaction) -> Committable:
        import psycopg
        from psycopg import sql

        assert isinstance(txn, _PgTransaction)
        ctx, conn = txn.ctx, txn.conn
        try:
            if txn.copy is not None:
                txn.end_copy()
            row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
            assert row is not None
            xid = int(row[0]) & _XID_MASK
            conn.execute(
                sql.SQL("INSERT INTO {} (gid, xid, sink_id, epoch, partition, attempt, "
                        "row_count, target) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)").format(
                    sql.Identifier(self.marker_table.schema, self.marker_table.table)),
                (txn.gid, xid, ctx.sink_id, ctx.epoch, ctx.partition, ctx.attempt, txn.rows,
                 str(self.table)))
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(txn.gid)))
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == _SQLSTATE_DUPLICATE_OBJECT:
                message = (f"gid {txn.gid} is already prepared: a decided epoch still holds "
                           "this participant name; restart the query so that recovery commits "
                           "it before this epoch is written again")
            elif getattr(exc, "sqlstate", None) == _SQLSTATE_UNDEFINED_TABLE:
                message = (f"the commit-marker table {self.marker_table} does not exist: run "
                           "the driver's preflight first (it creates the table), or create it "
                           "with the DDL in docs/backends/postgres.md")
            elif "max_prepared_transactions" in str(exc):
                message = f"cannot prepare: {self._clean(exc)}; {MAX_PREPARED_HINT}"
            else:
                message = f"finishing COPY or PREPARE failed: {self._clean(exc)}"
            raise TxsinkError(f"{txn.describe()}: {message}", sink_id=ctx.sink_id,
                              epoch=ctx.epoch, participant=ctx.participant) from None
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        log.debug("%s gid=%s xid=%d: prepared %d row(s)", ctx.describe(), txn.gid, xid,
                  txn.rows)
        return Committable.for_context(
            self.name, ctx, {"gid": txn.gid, "xid": xid, "table": str(self.table)},
            rows=txn.rows, payload_version=self.payload_version)

    def finish_in_task(self, txn: Transaction, guarantee: DeliveryGuarantee) -> Committable:
        """at_least_once / none: an ordinary COMMIT of the COPY, no PREPARE, no marker row
        (``none`` also skips waiting for the WAL flush: ``synchronous_commit = off``)."""
        import psycopg

        assert isinstance(txn, _PgTransaction)
        ctx, conn = txn.ctx, txn.conn
        try:
            if txn.copy is not None:
                txn.end_copy()
            if guarantee is DeliveryGuarantee.NONE:
                conn.execute("SET LOCAL synchronous_commit TO OFF")
            conn.commit()
        except psycopg.Error as exc:
            raise TxsinkError(f"{txn.describe()}: finishing COPY or COMMIT failed: "
                              f"{self._clean(exc)}", sink_id=ctx.sink_id, epoch=ctx.epoch,
                              participant=ctx.participant) from None
        finally:
            with contextlib.suppress(Exception):
                conn.close()
        log.debug("%s: committed %d row(s) in the task (%s)", ctx.describe(), txn.rows,
                  guarantee.value)
        return Committable.for_context(self.name, ctx, {"direct": True, "table": str(self.table)},
                                       rows=txn.rows, payload_version=self.payload_version)

    def discard(self, txn: Transaction) -> None:
        assert isinstance(txn, _PgTransaction)
        try:
            txn.fail_copy()
            if not txn.conn.closed:
                txn.conn.rollback()
        finally:
            with contextlib.suppress(Exception):
                txn.conn.close()
        log.debug("%s: discarded before prepare", txn.describe())

    def _plan(self, txn: _PgTransaction, schema: pa.Schema) -> _Plan:
        from psycopg import sql

        columns = self._table_columns(txn.conn)
        if columns is None and self.create_table:
            self.ensure_table(schema)
            # Taking the lock COPY takes anyway makes this session see the new table
            # (a catalog lookup without a lock can miss another session's DDL).
            txn.conn.execute(sql.SQL("LOCK TABLE {} IN ROW EXCLUSIVE MODE").format(
                sql.Identifier(self.table.schema, self.table.table)))
            columns = self._table_columns(txn.conn)
        if columns is None:
            raise ConfigError(f"postgres backend: table {self.table} does not exist; create it "
                              "or set option create_table=true", field="table",
                              sink_id=txn.ctx.sink_id)
        missing = [f.name for f in schema if f.name not in columns]
        if missing:
            raise ConfigError(
                f"postgres backend: table {self.table} has no column(s) "
                f"{', '.join(map(repr, missing))} for the data's field(s); its columns are "
                f"{', '.join(map(repr, columns))}. Rename the fields or add the columns",
                field="table", sink_id=txn.ctx.sink_id)
        problems: list[str] = []
        dump_types: list[str] = []
        converters = []
        for f in schema:
            typname, shown = columns[f.name]
            mapping = pg_type_for(f.type)
            if mapping is None:
                problems.append(f"field {f.name!r} has Arrow type {f.type}, which txsink "
                                "cannot write to PostgreSQL")
                continue
            if not accepts(mapping, typname):
                problems.append(
                    f"field {f.name!r} is {f.type} (Spark {mapping.spark}) but column "
                    f"{self.table}.{f.name} is {shown}; use a column of type {mapping.ddl}")
                continue
            dump_types.append(binary_dump_type(typname) or "")
            converters.append(column_converter(f.type, typname))
        if problems:
            raise ConfigError("postgres backend: the data does not match table "
                              f"{self.table}: " + "; ".join(problems), field="table",
                              sink_id=txn.ctx.sink_id)
        binary = self.copy_format == "binary" or (
            self.copy_format == "auto" and all(dump_types))
        if self.copy_format == "binary" and not all(dump_types):
            text_only = [f.name for f, d in zip(schema, dump_types, strict=True) if not d]
            raise ConfigError(f"postgres backend: copy_format=binary cannot write column(s) "
                              f"{', '.join(text_only)}; use copy_format=auto",
                              field="copy_format")
        csv_converters: list[Callable[[pa.Array[Any]], pa.Array[Any]]] | None = None
        if self.copy_format in ("auto", "csv"):
            found = [csvcopy.csv_converter(f.type) for f in schema]
            if all(c is not None for c in found):
                csv_converters = [c for c in found if c is not None]
            elif self.copy_format == "csv":
                inexact = [f.name for f, c in zip(schema, found, strict=True) if c is None]
                raise ConfigError(f"postgres backend: copy_format=csv cannot write column(s) "
                                  f"{', '.join(inexact)} exactly; use copy_format=auto",
                                  field="copy_format")
        if csv_converters is not None:
            # CSV bytes are UTF-8 whatever the server's default client encoding is.
            txn.conn.execute("SET client_encoding TO 'UTF8'")

        def copy_statement(fmt: str) -> Any:
            return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {})").format(
                sql.Identifier(self.table.schema, self.table.table),
                sql.SQL(", ").join(sql.Identifier(f.name) for f in schema), sql.SQL(fmt))

        log.debug("%s: copying %d column(s) into %s as %s", txn.describe(), len(schema),
                  self.table, "CSV batches" if csv_converters is not None
                  else "binary rows" if binary else "text rows")
        return _Plan(schema, copy_statement("BINARY" if binary else "TEXT"), binary, dump_types,
                     converters, copy_statement("CSV"), csv_converters)

    def _table_columns(self, conn: psycopg.Connection[Any]) -> dict[str, tuple[str, str]] | None:
        """``{column: (typname, formatted type)}`` of the target table, or ``None``."""
        oid = self._table_oid(conn, self.table)
        if oid is None:
            return None
        rows = conn.execute(
            # Domains are checked by their base type.
            "SELECT a.attname, b.typname, format_type(a.atttypid, a.atttypmod) "
            "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
            "JOIN pg_type b ON b.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype "
            "ELSE t.oid END "
            "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped "
            "ORDER BY a.attnum", (oid,)).fetchall()
        return {str(name): (str(typname), str(shown)) for name, typname, shown in rows}

    def ensure_table(self, schema: pa.Schema) -> None:
        """Create the target table from an Arrow schema if it does not exist.

        Runs in its own short transaction (DDL must not sit inside a prepared
        participant, where it would lock the table until the driver commits), so an
        empty table can remain even if the epoch is later aborted.
        """
        from psycopg import sql

        columns = []
        for f in schema:
            mapping = pg_type_for(f.type)
            if mapping is None:
                raise ConfigError(f"postgres backend: cannot create {self.table}: field "
                                  f"{f.name!r} has Arrow type {f.type}, which has no "
                                  "PostgreSQL mapping", field="create_table")
            columns.append(sql.SQL("{} {}").format(sql.Identifier(f.name),
                                                   sql.SQL(mapping.ddl)))
        statement = sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(self.table.schema, self.table.table), sql.SQL(", ").join(columns))
        with self._connect(autocommit=True) as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                         ("txsink-create:" + str(self.table),))
            conn.execute(statement)
        log.info("postgres backend: ensured table %s exists", self.table)

    # -- driver side --------------------------------------------------------------------

    def _ids(self, c: Committable) -> tuple[str, int]:
        payload = self.decode_payload(c.payload_version, c.payload)
        try:
            return str(payload["gid"]), int(payload["xid"])
        except (KeyError, TypeError, ValueError):
            raise FatalCommitError(f"committable of {c.describe()} has no gid/xid: "
                                   f"{dict(c.payload)!r}", sink_id=c.sink_id, epoch=c.epoch,
                                   participant=c.participant) from None

    @staticmethod
    def _prepared_xid(conn: psycopg.Connection[Any], gid: str) -> int | None:
        row = conn.execute("SELECT transaction::text FROM pg_prepared_xacts "
                           "WHERE gid = %s AND database = current_database()",
                           (gid,)).fetchone()
        return None if row is None else int(row[0])

    def commit(self, committable: Committable) -> CommitOutcome:
        import psycopg

        c = committable
        gid, xid = self._ids(c)
        try:
            with self._driver() as conn:
                outcome = self._commit_on(conn, c, gid, xid)
        except (ConfigError, _ConnectError, psycopg.OperationalError) as exc:
            raise RetriableCommitError(
                f"committing {c.describe()} gid={gid}: {self._clean(exc)}",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant) from None
        return outcome

    def holds_epoch(self, sink_id: str, epoch: int) -> bool:
        """A commit-marker row of ``epoch`` is visible: some participant of it committed.

        Markers of prepared, uncommitted participants are inside their transactions
        and invisible here. Markers older than ``marker_retention_epochs`` are pruned.
        """
        from psycopg import sql

        def ask() -> bool:
            with self._driver() as conn:
                row = conn.execute(
                    sql.SQL("SELECT 1 FROM {} WHERE sink_id = %s AND epoch = %s "
                            "LIMIT 1").format(
                        sql.Identifier(self.marker_table.schema, self.marker_table.table)),
                    (sink_id, epoch)).fetchone()
            return row is not None

        return self._retry_driver(f"sink={sink_id} epoch={epoch}: reading commit markers",
                                  ask)

    def highest_epoch(self, sink_id: str) -> int | None:
        """The newest epoch with a visible commit-marker row (-1: none); markers are
        pruned from the old end only."""
        from psycopg import sql

        def ask() -> int:
            with self._driver() as conn:
                # Asked before the first epoch too (a stream binding a new state): a
                # marker table not created yet holds no epoch.
                exists = conn.execute("SELECT to_regclass(%s)", (sql.Identifier(
                    self.marker_table.schema, self.marker_table.table).as_string(conn),
                )).fetchone()
                if exists is None or exists[0] is None:
                    return -1
                row = conn.execute(
                    sql.SQL("SELECT max(epoch) FROM {} WHERE sink_id = %s").format(
                        sql.Identifier(self.marker_table.schema, self.marker_table.table)),
                    (sink_id,)).fetchone()
            return -1 if row is None or row[0] is None else int(row[0])

        return self._retry_driver(f"sink={sink_id}: reading the newest commit marker", ask)

    def _retry_driver(self, what: str, action: Callable[[], _T]) -> _T:
        """Run a driver-side statement again after the connection broke (server restart)."""
        import psycopg

        deadline = time.monotonic() + self.connect_retry_s
        delay = 0.25
        while True:
            try:
                return action()
            except psycopg.OperationalError as exc:
                # A connection that broke under a restart (connecting again already
                # waits on its own in _connect).
                if time.monotonic() >= deadline:
                    raise TxsinkError(f"postgres backend: {what} failed: "
                                      f"{self._clean(exc)}") from None
                log.warning("postgres backend: %s failed (%s); retrying in %.2fs", what,
                            self._clean(exc), delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def epoch_committed(self, sink_id: str, epoch: int,
                        committables: Sequence[Committable]) -> None:
        """Drop commit markers of epochs far behind: only a DECIDED epoch needs its own."""
        if self.marker_retention_epochs <= 0 or epoch < self.marker_retention_epochs:
            return
        from psycopg import sql

        try:
            with self._driver() as conn:
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE sink_id = %s AND epoch < %s").format(
                        sql.Identifier(self.marker_table.schema, self.marker_table.table)),
                    (sink_id, epoch - self.marker_retention_epochs))
        except Exception as exc:
            # Never fail the epoch over housekeeping: the next epoch prunes again.
            log.warning("sink=%s epoch=%d: pruning old commit markers failed: %s", sink_id,
                        epoch, self._clean(exc))

    def _commit_on(self, conn: psycopg.Connection[Any], c: Committable, gid: str,
                   xid: int) -> CommitOutcome:
        if self._prepared_xid(conn, gid) == xid:
            return self._commit_prepared(conn, c, gid, xid)
        return self._settled(conn, c, gid, xid)

    def _commit_prepared(self, conn: psycopg.Connection[Any], c: Committable, gid: str,
                         xid: int) -> CommitOutcome:
        """``COMMIT PREPARED`` of a gid seen prepared with ``xid``; if another session
        finished it in between, the commit marker tells how."""
        import psycopg
        from psycopg import sql

        try:
            conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid)))
            log.debug("sink=%s epoch=%d partition=%d participant=%s gid=%s: committed",
                      c.sink_id, c.epoch, c.partition, c.participant, gid)
            return CommitOutcome.COMMITTED
        except psycopg.OperationalError:
            raise
        except psycopg.Error as exc:
            if getattr(exc, "sqlstate", None) == _SQLSTATE_OBJECT_IN_USE:
                raise RetriableCommitError(
                    f"{c.describe()} gid={gid} is being finished by another session",
                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant) from None
            if getattr(exc, "sqlstate", None) != _SQLSTATE_UNDEFINED_OBJECT:
                raise
        return self._settled(conn, c, gid, xid)

    def _settled(self, conn: psycopg.Connection[Any], c: Committable, gid: str,
                 xid: int) -> CommitOutcome:
        """A participant that is no longer prepared: committed if its marker is visible."""
        from psycopg import sql

        marker = conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE gid = %s AND xid = %s").format(
                sql.Identifier(self.marker_table.schema, self.marker_table.table)),
            (gid, xid)).fetchone()
        if marker is not None:
            return CommitOutcome.ALREADY_COMMITTED
        raise self._lost(c, gid, xid)

    def _lost(self, c: Committable, gid: str, xid: int) -> ParticipantLostError:
        return ParticipantLostError(
            f"participant {c.participant} (gid {gid}, xid {xid}, {c.rows} row(s)) is neither "
            f"prepared nor committed in {self.describe()}: it was rolled back (by an operator, "
            f"or by an abort) and its rows are lost; the commit marker in {self.marker_table} "
            "is absent", sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def commit_all(
        self, committables: Sequence[Committable]
    ) -> list[CommitOutcome | Exception]:
        """Commit an epoch's participants for a cost that hardly grows with their number.

        One query finds which gids are still prepared (with the xid that wrote them)
        and one which of the others left their commit marker; ``COMMIT PREPARED`` then
        runs over up to ``commit_connections`` connections side by side (each commit
        waits for its own WAL flush, so one connection would serialise the fsyncs).
        Each participant is decided exactly as :meth:`commit` decides it.
        """
        import psycopg

        results: list[CommitOutcome | Exception | None] = [None] * len(committables)
        ids: dict[int, tuple[str, int]] = {}
        for i, c in enumerate(committables):
            try:
                ids[i] = self._ids(c)
            except FatalCommitError as exc:
                results[i] = exc
        gids = sorted({gid for gid, _ in ids.values()})
        try:
            with self._driver() as conn:
                prepared = {str(g): int(x) for g, x in conn.execute(
                    "SELECT gid, transaction::text FROM pg_prepared_xacts "
                    "WHERE database = current_database() AND gid = ANY(%s)",
                    (gids,)).fetchall()} if gids else {}
                todo = [i for i, (gid, xid) in ids.items() if prepared.get(gid) == xid]
                gone = [i for i, (gid, xid) in ids.items() if prepared.get(gid) != xid]
                if gone:
                    marked = self._marked(conn, [ids[i][0] for i in gone])
                    for i in gone:
                        gid, xid = ids[i]
                        c = committables[i]
                        if (gid, xid) in marked:
                            log.debug("%s gid=%s: already committed", c.describe(), gid)
                            results[i] = CommitOutcome.ALREADY_COMMITTED
                        else:
                            results[i] = self._lost(c, gid, xid)
                workers = min(self.commit_connections, len(todo))
                if workers <= 1:
                    # One left (the first participant of every epoch): no extra connection.
                    for i in todo:
                        results[i] = self._commit_caught(conn, committables[i], *ids[i])
                    todo = []
        except (ConfigError, _ConnectError, psycopg.OperationalError) as exc:
            return [r if r is not None else self._retriable(committables[i], exc)
                    for i, r in enumerate(results)]
        if todo:
            chunks = [todo[k::workers] for k in range(workers)]
            with ThreadPoolExecutor(max_workers=workers,
                                    thread_name_prefix="txsink-pg-commit") as pool:
                for done in pool.map(lambda chunk: self._commit_chunk(committables, ids, chunk),
                                     chunks):
                    for i, outcome in done:
                        results[i] = outcome
        final: list[CommitOutcome | Exception] = []
        for r in results:
            assert r is not None
            final.append(r)
        return final

    def _marked(self, conn: psycopg.Connection[Any], gids: list[str]) -> set[tuple[str, int]]:
        """The (gid, xid) pairs among ``gids`` whose commit marker is visible."""
        from psycopg import sql

        rows = conn.execute(
            sql.SQL("SELECT gid, xid FROM {} WHERE gid = ANY(%s)").format(
                sql.Identifier(self.marker_table.schema, self.marker_table.table)),
            (sorted(set(gids)),)).fetchall()
        return {(str(g), int(x)) for g, x in rows}

    def _retriable(self, c: Committable, exc: BaseException) -> RetriableCommitError:
        gid = c.payload.get("gid")
        return RetriableCommitError(f"committing {c.describe()} gid={gid}: {self._clean(exc)}",
                                    sink_id=c.sink_id, epoch=c.epoch, participant=c.participant)

    def _commit_caught(self, conn: psycopg.Connection[Any], c: Committable, gid: str,
                       xid: int) -> CommitOutcome | Exception:
        """:meth:`_commit_prepared`, its failure returned (a broken connection raises)."""
        import psycopg

        try:
            return self._commit_prepared(conn, c, gid, xid)
        except psycopg.OperationalError:
            raise
        except Exception as exc:  # handed to the coordinator
            return exc

    def _commit_chunk(self, committables: Sequence[Committable],
                      ids: Mapping[int, tuple[str, int]],
                      chunk: list[int]) -> list[tuple[int, CommitOutcome | Exception]]:
        """Commit ``chunk`` one after the other on one borrowed connection.

        If the connection breaks, the rest of the chunk is answered retriable: the
        coordinator hands those to the next :meth:`commit_all`, which looks again.
        """
        import psycopg

        done: list[tuple[int, CommitOutcome | Exception]] = []
        try:
            conn = self._borrow()
        except (ConfigError, _ConnectError) as exc:
            return [(i, self._retriable(committables[i], exc)) for i in chunk]
        try:
            for i in chunk:
                done.append((i, self._commit_caught(conn, committables[i], *ids[i])))
        except psycopg.OperationalError as exc:
            failed = {i for i, _ in done}
            done += [(i, self._retriable(committables[i], exc)) for i in chunk
                     if i not in failed]
        finally:
            self._give_back(conn)
        return done

    def abort(self, committable: Committable) -> None:
        import psycopg
        from psycopg import sql

        c = committable
        gid, xid = self._ids(c)
        try:
            with self._driver() as conn:
                if self._prepared_xid(conn, gid) != xid:
                    return  # already finished, or the gid now belongs to another attempt
                try:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:
                    if getattr(exc, "sqlstate", None) != _SQLSTATE_UNDEFINED_OBJECT:
                        raise
        except (ConfigError, _ConnectError, psycopg.Error) as exc:
            raise RetriableCommitError(
                f"aborting {c.describe()} gid={gid}: {self._clean(exc)}",
                sink_id=c.sink_id, epoch=c.epoch, participant=c.participant) from None
        log.debug("sink=%s epoch=%d partition=%d participant=%s gid=%s: rolled back",
                  c.sink_id, c.epoch, c.partition, c.participant, gid)

    def list_prepared(self, sink_id: str) -> Iterable[Committable]:
        import psycopg

        def ask() -> list[Any]:
            with self._driver() as conn:
                return list(conn.execute(
                    "SELECT gid, transaction::text FROM pg_prepared_xacts "
                    "WHERE database = current_database() AND gid LIKE %s ESCAPE '\\' "
                    "ORDER BY gid", (like_prefix(sink_id),)).fetchall())

        try:
            rows = self._retry_driver(f"sink={sink_id}: listing prepared transactions", ask)
        except psycopg.Error as exc:
            raise TxsinkError(f"sink={sink_id}: listing prepared transactions in "
                              f"{self.describe()} failed: {self._clean(exc)}",
                              sink_id=sink_id) from None
        found = []
        for gid, xid in rows:
            ctx = parse_gid(str(gid))
            if ctx is None or ctx.sink_id != sink_id:
                continue  # a longer sink id sharing the prefix, or not txsink's
            found.append(Committable.for_context(
                self.name, ctx, {"gid": str(gid), "xid": int(xid), "table": str(self.table)},
                payload_version=self.payload_version))
        return found


def _from_dsn(params: dict[str, Any], key: str, given: Secret | None) -> Secret | None:
    """A secret libpq parameter taken out of the DSN (so it is never kept in it), or the
    one given as an option; both at once is an error naming the option."""
    inline = params.pop(key, None)
    if not inline:
        return given
    if given is not None:
        raise ConfigError(f"postgres backend: give the {key} either in 'dsn' or as option "
                          f"'{key}', not both", field=key)
    return Secret(str(inline))


class _ConnectError(TxsinkError):
    """The server could not be reached for now (retried; fatal once retries run out)."""


#: SQLSTATEs of a server that is restarting or overloaded: retry, do not blame the config.
_TRANSIENT_SQLSTATES = frozenset({
    "57P03",  # cannot_connect_now: the database system is starting up / shutting down
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "53300",  # too_many_connections
    "08000", "08001", "08003", "08004", "08006",  # connection exceptions
})
#: libpq messages (no SQLSTATE) that mean the server is not there *yet*.
_TRANSIENT_TEXT = ("connection refused", "the database system is", "server closed the "
                   "connection", "connection reset", "timeout expired", "no route to host",
                   "could not receive data", "could not send data", "terminating connection",
                   "connection timed out", "network is unreachable", "is the server running")
#: ...and ones that never go away by waiting.
_PERMANENT_TEXT = ("could not translate host name", "does not exist", "no pg_hba.conf entry",
                   "role ", "invalid port", "sslmode", "certificate")


def _transient(sqlstate: str | None, text: str) -> bool:
    lowered = text.lower()
    if any(t in lowered for t in _PERMANENT_TEXT):
        return False
    return sqlstate in _TRANSIENT_SQLSTATES or any(t in lowered for t in _TRANSIENT_TEXT)
