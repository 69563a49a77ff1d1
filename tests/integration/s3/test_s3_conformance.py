"""The S3 backend against the conformance kit, on a real S3-compatible server."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from txsink.backend import Backend
from txsink.testing.conformance import BackendConformance
from txsink_s3.backend import S3Backend

from .conftest import PART, S3Server

pytestmark = pytest.mark.integration


class TestS3Conformance(BackendConformance):
    backend_name = "s3"
    # 64 parts' worth of Arrow data (~170 MiB of Parquet): far more than memory may grow.
    large_partition_bytes = 64 * PART
    # Part buffer, one row group, a part in flight, and pyarrow's Parquet encoder, whose
    # dictionary pages and allocator (mimalloc) keep ~60-100 MiB regardless of size.
    memory_bound_bytes = 26 * PART

    @pytest.fixture
    def backend_options(self, s3_server: S3Server, prefix: str) -> Mapping[str, str]:
        self.server = s3_server
        self.prefix = prefix
        return s3_server.options(prefix)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, S3Backend)
        return self.server.read_ids(backend.base(sink_id) + "/")
