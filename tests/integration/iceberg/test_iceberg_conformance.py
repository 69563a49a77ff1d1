"""The Iceberg backend passes the conformance kit on real Iceberg tables (SQL catalog on
a SQLite file, data on local disk), read back with pyiceberg."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.lake_tables import LakeConformance

pytestmark = pytest.mark.integration


class TestIcebergConformance(LakeConformance):
    backend_name = "iceberg"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"warehouse": str(tmp_path / "warehouse"), "table": "db.orders"}
