"""The S3 backend against the conformance kit, on a real S3-compatible server."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_s3.backend import S3Backend

from .conftest import PART, S3Server

pytestmark = pytest.mark.integration


@pytest.mark.promise("s3-memory-bounded", "backend")
class TestS3Conformance(BackendConformance):
    backend_name = "s3"
    # 40 parts' worth of Arrow data (over 100 MiB of Parquet, 20+ parts): holding the
    # partition, even encoded, would exceed the bound below.
    large_partition_bytes = 40 * PART
    # Measured ~50 MiB: a part being filled, one in flight, and pyarrow's Parquet
    # encoder (several times its row group of part_size / 4) plus allocator slack.
    memory_bound_bytes = 16 * PART

    @pytest.fixture
    def backend_options(self, s3_server: S3Server, prefix: str) -> Mapping[str, str]:
        self.server = s3_server
        self.prefix = prefix
        return s3_server.options(prefix)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, S3Backend)
        return self.server.read_ids(backend.base(sink_id) + "/")
