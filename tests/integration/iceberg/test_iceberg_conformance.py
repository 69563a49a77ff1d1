"""The Iceberg backend passes the conformance kit on real Iceberg tables (SQL catalog on
a SQLite file, data on local disk), read back with pyiceberg."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_iceberg.backend import IcebergBackend

pytestmark = pytest.mark.integration


def read_table_ids(backend: IcebergBackend) -> list[int]:
    table = IcebergBackend(backend.table, backend.warehouse, backend.catalog_uri).load_table()
    if table is None:
        return []
    return [int(i) for i in table.scan(selected_fields=("id",)).to_arrow().column(
        "id").to_pylist()]


class TestIcebergConformance(BackendConformance):
    backend_name = "iceberg"
    large_partition_bytes = 48 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"warehouse": str(tmp_path / "warehouse"), "table": "db.orders"}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, IcebergBackend)
        return read_table_ids(backend)
