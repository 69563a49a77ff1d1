"""The in-memory test backend passes the kit too, which also checks the kit itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping

import pytest
from txsink.backend import Backend
from txsink.testing import memory
from txsink.testing.conformance import BackendConformance
from txsink.testing.memory import MemoryBackend


class TestMemoryConformance(BackendConformance):
    backend_name = "memory"
    large_partition_bytes = 8 * 1024 * 1024
    memory_bound_bytes = 10**12  # it keeps rows in memory by design: the kit's check is moot

    @pytest.fixture
    def backend_options(self) -> Iterator[Mapping[str, str]]:
        name = f"conf-{uuid.uuid4().hex}"
        yield {"system": name}
        memory.SYSTEMS.pop(name, None)

    def make_backend(self, options: Mapping[str, str]) -> Backend:
        return MemoryBackend.from_options(options)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, MemoryBackend)
        return [r["id"] for r in backend.system.rows()]
