"""The Iceberg backend passes the conformance kit on real Iceberg tables (SQL catalog on
a SQLite file, data on local disk), read back with pyiceberg."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_iceberg.backend import IcebergBackend

from tests.lake_tables import table_ids

pytestmark = pytest.mark.integration


class TestIcebergConformance(BackendConformance):
    backend_name = "iceberg"
    large_partition_bytes = 48 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"warehouse": str(tmp_path / "warehouse"), "table": "db.orders"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, IcebergBackend)
        return table_ids(backend)
