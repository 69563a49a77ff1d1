"""The real-table checks where S3 (the session's SeaweedFS) takes another code path than
local disk: a key prefix holding other objects (listed, not a directory), keys with a
space or a non-ASCII letter (delta-rs takes an S3 URL percent-encoded), Spark's files
written again with Iceberg field ids (a new object, the old deleted), a lost catalog
entry found by listing the table's metadata prefix, and an empty epoch's marker."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txsink.backend import CommitOutcome
from txsink.errors import ConfigError
from txsink.lakehouse import TableBackend
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import FIELD_ID, IcebergBackend

from tests.integration.conftest import S3Server
from tests.integration.lake_s3 import access, read_ids

pytestmark = pytest.mark.integration


def options_on_s3(kind: str, s3: S3Server, tmp_path: Path, name: str = "table"
                  ) -> dict[str, str]:
    run = f"real-{uuid.uuid4().hex[:8]}"
    if kind == "delta":
        return {"path": f"s3://{s3.bucket}/{run}/{name}", **access(s3)}
    return {"warehouse": f"s3://{s3.bucket}/{run}/{name}", "table": "db.t",
            "catalog_uri": f"sqlite:///{tmp_path / 'catalog.db'}", **access(s3)}


def create(kind: str, options: dict[str, str]) -> TableBackend:
    backend = get_plugins().create_backend(kind, options)
    assert isinstance(backend, TableBackend)
    return backend


def on_s3(kind: str, s3: S3Server, tmp_path: Path, name: str = "table") -> TableBackend:
    return create(kind, options_on_s3(kind, s3, tmp_path, name))


def put(backend: TableBackend, relative: str, data: bytes) -> None:
    fs, _ = backend._fs()
    with fs.open_output_stream(backend.absolute(relative)) as out:
        out.write(data)


def spark_like_s3(backend: TableBackend, epoch: int, table: pa.Table,
                  sink: str = "orders") -> tuple[TransactionContext, str]:
    """A file put into the participant's prefix by another writer (as Spark's, through
    s3a://: no field ids)."""
    ctx = TransactionContext(sink, epoch, 0, 0)
    uri, dirname = backend.native_staging(ctx)
    assert uri.startswith("s3a://"), uri
    rel = f"{backend.epoch_folder(sink, epoch)}/{dirname}/part-00000-c000.snappy.parquet"
    sink_buffer = pa.BufferOutputStream()
    pq.write_table(table, sink_buffer)
    put(backend, rel, sink_buffer.getvalue().to_pybytes())
    return ctx, dirname


def commit(backend: TableBackend, epoch: list[Committable]) -> None:
    backend.check_prepared(epoch)
    assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED] * len(epoch)
    backend.epoch_committed(epoch[0].sink_id, epoch[0].epoch, epoch)


@pytest.mark.promise("delta-foreign-directory-refused", "backend")
def test_a_prefix_holding_other_objects_is_not_taken_for_a_new_delta_table(
        s3_server: S3Server, tmp_path: Path) -> None:
    backend = on_s3("delta", s3_server, tmp_path)
    assert isinstance(backend, DeltaBackend)
    backend.preflight("orders")
    put(backend, "exports/2026.csv", b"id\n1\n")
    with pytest.raises(ConfigError, match=r"not a Delta table .*\(exports\)"):
        get_plugins().create_backend("delta", {"path": backend.path,
                                               **access(s3_server)}).preflight("orders")


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
@pytest.mark.parametrize("name", ["with space", "unicodé"])
def test_keys_with_a_space_or_unicode_work_on_every_read(
        s3_server: S3Server, tmp_path: Path, kind: str, name: str) -> None:
    options = options_on_s3(kind, s3_server, tmp_path, name)
    backend = create(kind, options)
    backend.preflight("orders")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    commit(backend, [write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                       rows.to_batches())])
    ctx, dirname = spark_like_s3(backend, 1, pa.table({"id": pa.array([3], pa.int64())}))
    commit(backend, [backend.committable_for_directory(ctx, dirname)])
    assert f"/{name}/" in backend.uri("txsink")
    again = create(kind, options)  # another process's view
    assert again.holds_epoch("orders", 0) and again.highest_epoch("orders") == 1
    assert list(again.list_prepared("orders")) == []
    assert sorted(read_ids(again)) == [1, 2, 3]


def test_spark_s_files_on_s3_are_written_again_with_field_ids(
        s3_server: S3Server, tmp_path: Path) -> None:
    from pyiceberg.types import StringType

    backend = on_s3("iceberg", s3_server, tmp_path)
    assert isinstance(backend, IcebergBackend)
    backend.preflight("orders")
    ctx, dirname = spark_like_s3(backend, 0, pa.table({"id": pa.array([1], pa.int64()),
                                                        "x": pa.array(["old"])}))
    c = backend.committable_for_directory(ctx, dirname)
    fs, _ = backend._fs()
    (path,) = [backend.absolute(f["path"]) for f in c.payload["files"]]
    assert path.endswith(".ids.parquet")
    assert pq.read_schema(path, filesystem=fs).field("x").metadata[FIELD_ID] == b"2"
    assert fs.get_file_info(path.replace(".ids.parquet", ".parquet")).type.name == "NotFound"
    commit(backend, [c])
    with backend._load().update_schema() as change:
        change.delete_column("x")
    with backend._load().update_schema() as change:
        change.add_column("x", StringType())
    found = backend._load().scan().to_arrow().to_pylist()
    assert found == [{"id": 1, "x": None}]


@pytest.mark.promise("iceberg-lost-catalog-entry-refused", "backend")
def test_a_lost_catalog_entry_on_s3_is_refused(s3_server: S3Server, tmp_path: Path) -> None:
    backend = on_s3("iceberg", s3_server, tmp_path)
    assert isinstance(backend, IcebergBackend)
    commit(backend, [write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                       [pa.record_batch({"id": pa.array([1], pa.int64())})])])
    (tmp_path / "catalog.db").unlink()
    lost = IcebergBackend("db.t", backend.warehouse, f"sqlite:///{tmp_path / 'catalog.db'}",
                          s3=backend.s3)
    with pytest.raises(ConfigError, match="register_table") as refused:
        lost.preflight("orders")
    assert "s3://" in str(refused.value)


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_empty_epoch_before_the_table_exists_on_s3(s3_server: S3Server, tmp_path: Path,
                                                      kind: str) -> None:
    backend = on_s3(kind, s3_server, tmp_path)
    empty: list[Any] = [write_participant(backend, TransactionContext("orders", 0, 0, 0), [])]
    assert backend.commit_all(empty) == [CommitOutcome.COMMITTED]
    backend.epoch_committed("orders", 0, empty)
    assert backend.holds_epoch("orders", 0) and backend.highest_epoch("orders") == 0
    assert not backend.holds_epoch("orders", 1)  # no marker there: not held
