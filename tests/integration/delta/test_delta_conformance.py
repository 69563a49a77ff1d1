"""The Delta backend passes the conformance kit on real Delta tables on local disk, read
back with delta-rs (what any reader of the table sees)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.lake_tables import LakeConformance

pytestmark = pytest.mark.integration


class TestDeltaConformance(LakeConformance):
    backend_name = "delta"

    @pytest.fixture
    def backend_options(self, tmp_path: Path) -> Mapping[str, str]:
        return {"path": str(tmp_path / "table")}
