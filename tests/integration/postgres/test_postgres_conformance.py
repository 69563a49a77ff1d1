"""The postgres backend against the conformance kit, on a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from postgres_support import PgServer
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_postgres import PostgresBackend

pytestmark = pytest.mark.integration


@pytest.mark.promise("postgres-exactly-once", "backend")
class TestPostgresConformance(BackendConformance):
    backend_name = "postgres"

    @pytest.fixture
    def backend_options(self, pg_server: PgServer, table_name: str) -> Mapping[str, str]:
        self.server = pg_server
        return pg_server.options(table_name)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, PostgresBackend)
        t = backend.table
        with self.server.connect() as conn:
            rows = conn.execute(f'SELECT id FROM "{t.schema}"."{t.table}"').fetchall()
        return [int(r[0]) for r in rows]
