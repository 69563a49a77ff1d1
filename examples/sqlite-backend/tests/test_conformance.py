"""The example backend passes txsink's conformance kit against a real SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from pathlib import Path

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_sqlite import SqliteBackend


class TestSqliteConformance(BackendConformance):
    backend_name = "sqlite"
    large_partition_bytes = 16 * 1024 * 1024
    memory_bound_bytes = 64 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"database": str(tmp_path / "out.db"), "table": "events"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, SqliteBackend)
        with sqlite3.connect(backend.database) as conn:
            try:
                return [r[0] for r in conn.execute("SELECT id FROM events")]
            except sqlite3.OperationalError:  # no table yet: nothing committed
                return []
