"""The directory state store against the shared state-store suite."""

from __future__ import annotations

from pathlib import Path

import pytest
from txsink.testing.state_store import StateStoreContract


class TestDirectoryStateStore(StateStoreContract):
    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        return str(tmp_path / "state")
