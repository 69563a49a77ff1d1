"""The Delta backend passes the conformance kit on real Delta tables on local disk, read
back with delta-rs (what any reader of the table sees)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_delta.backend import DeltaBackend

from tests.lake_tables import table_ids

pytestmark = pytest.mark.integration


class TestDeltaConformance(BackendConformance):
    backend_name = "delta"
    large_partition_bytes = 48 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"path": str(tmp_path / "table")}

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, DeltaBackend)
        return table_ids(backend)
