"""Iceberg tables in a warehouse on S3 (the session's SeaweedFS; the SQL catalog on a
SQLite file): the conformance kit, a coordinator killed after its decision, and the
checks that refuse a bad warehouse before any data moves."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.backend import Backend
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.testing.conformance import BackendConformance
from txsink.writer import write_participant
from txsink_iceberg.backend import IcebergBackend

from tests.integration.conftest import S3Server
from tests.integration.lake_s3 import (
    access,
    killed_after_decide_then_restarted,
    orphans,
    read_ids,
    table_options,
)
from tests.long_runs import lake_s3_run

pytestmark = pytest.mark.integration


def iceberg(options: Mapping[str, str]) -> IcebergBackend:
    backend = get_plugins().create_backend("iceberg", options)
    assert isinstance(backend, IcebergBackend)
    return backend


@lake_s3_run
class TestIcebergS3Conformance(BackendConformance):
    backend_name = "iceberg"
    #: See the Delta-on-S3 kit: pyarrow's S3 stream costs a fixed ~80-100 MiB.
    large_partition_bytes = 160 * 1024 * 1024
    memory_bound_bytes = 128 * 1024 * 1024

    @pytest.fixture
    def backend_options(self, s3_server: S3Server, tmp_path: Path) -> Mapping[str, str]:
        return table_options("iceberg", s3_server, tmp_path)

    def read_ids(self, backend: Backend, sink_id: str) -> list[int]:
        assert isinstance(backend, IcebergBackend)
        return read_ids(backend)


@lake_s3_run
@pytest.mark.fault
def test_coordinator_killed_after_decide_on_s3_restarts_exact(s3_server: S3Server,
                                                              tmp_path: Path) -> None:
    killed_after_decide_then_restarted("iceberg", s3_server, tmp_path)


def test_table_files_and_metadata_live_under_the_warehouse(s3_server: S3Server,
                                                           tmp_path: Path) -> None:
    """Data and metadata are objects under the warehouse prefix; the catalog holds the
    s3:// location, and the secret keys are nowhere in the state's options."""
    options = table_options("iceberg", s3_server, tmp_path)
    backend = iceberg(options)
    backend.preflight("s")
    backend.commit(write_participant(backend, TransactionContext("s", 0, 0), [
        pa.record_batch({"id": pa.array(range(20), pa.int64())})]))
    assert sorted(read_ids(backend)) == list(range(20))
    prefix = options["warehouse"].split("/", 3)[3]
    keys = s3_server.keys(prefix)
    assert any("/metadata/" in k and k.endswith(".metadata.json") for k in keys), keys
    assert any("/data/txsink/s/e0000000000/" in k for k in keys), keys
    loaded = backend._load()
    assert loaded is not None and loaded.location() == f"{options['warehouse']}/db/orders"
    safe = backend.safe_options(options)
    assert "secret_access_key" not in safe and "catalog_uri" not in safe
    assert orphans(backend) == []


def test_a_warehouse_on_s3_needs_a_catalog_uri(s3_server: S3Server) -> None:
    with pytest.raises(ConfigError) as info:
        iceberg({"warehouse": f"s3://{s3_server.bucket}/wh", "table": "db.t",
                 **access(s3_server)})
    assert info.value.field == "catalog_uri"


@pytest.mark.promise("iceberg-s3-preflight", "backend")
def test_a_missing_bucket_is_named_before_the_catalog_is_touched(s3_server: S3Server,
                                                                 tmp_path: Path) -> None:
    catalog = tmp_path / "catalog.db"
    backend = iceberg({"warehouse": f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/wh",
                       "table": "db.t", "catalog_uri": f"sqlite:///{catalog}",
                       **access(s3_server)})
    with pytest.raises(ConfigError) as info:
        backend.preflight("s")
    assert info.value.field == "warehouse" and "does not exist" in str(info.value)
    assert not catalog.exists()


@pytest.mark.promise("iceberg-s3-preflight", "backend")
def test_wrong_credentials_are_named_without_the_secret(s3_server: S3Server,
                                                        tmp_path: Path) -> None:
    s3_server.require_local()
    prefix = f"lake-{uuid.uuid4().hex[:8]}"
    backend = iceberg({"warehouse": f"s3://{s3_server.bucket}/{prefix}/wh", "table": "db.t",
                       "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}",
                       **{**access(s3_server), "secret_access_key": "not-the-secret-0042"}})
    with pytest.raises(ConfigError) as info:
        backend.preflight("s")
    assert info.value.field == "secret_access_key"
    assert "not-the-secret-0042" not in str(info.value)
    assert s3_server.keys(prefix) == []
