"""Delta tables as their owners make them: protocol features, column mapping, a change of
partitioning by another writer, a directory that holds other files, NOT NULL columns.

Each is written (or refused) as the Delta protocol says, and a refusal comes before any
target prepares (at the start) or before the decision (the table changed meanwhile),
naming the feature, the table and what to do; never after the decision, where a refused
commit left the epoch DECIDED and the other targets of a group holding it. Tables with
features delta-rs cannot make are written here as the protocol lays out their log
(``protocol`` and ``metaData`` actions), the way Spark's Delta writes them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.errors import ConfigError, FatalCommitError
from txsink.model import Committable, TransactionContext
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend

from tests.integration.delta.test_delta_conformance import read_table_ids

pytestmark = pytest.mark.integration

ID_FIELD = {"name": "id", "type": "long", "nullable": True, "metadata": {}}


def write_log(table: Path, version: int, *actions: dict[str, Any]) -> None:
    """One log entry, as another writer commits it."""
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    entry = [*actions, {"commitInfo": {"operation": "SET TBLPROPERTIES",
                                       "timestamp": int(time.time() * 1000)}}]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in entry))


def metadata(configuration: dict[str, str] | None = None,
             fields: list[dict[str, Any]] | None = None,
             partitions: list[str] | None = None) -> dict[str, Any]:
    schema = {"type": "struct", "fields": fields or [ID_FIELD]}
    return {"metaData": {"id": "7d5c4fd3-4a7c-4c33-9f0c-7f3b5c3c9a11",
                         "format": {"provider": "parquet", "options": {}},
                         "schemaString": json.dumps(schema),
                         "partitionColumns": partitions or [],
                         "configuration": configuration or {}, "createdTime": 1}}


def protocol(reader: int, writer: int, features: list[str] | None = None,
             reader_features: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if writer == 7:
        out["writerFeatures"] = features or []
    if reader == 3:
        out["readerFeatures"] = reader_features or []
    return {"protocol": out}


def prepared(backend: DeltaBackend, epoch: int, ids: list[int | None],
             schema: pa.Schema | None = None, sink: str = "orders") -> list[Committable]:
    schema = schema or pa.schema([pa.field("id", pa.int64())])
    rows = pa.record_batch([pa.array(ids, pa.int64())], schema=schema)
    return [write_participant(backend, TransactionContext(sink, epoch, 0, 0), [rows])]


# Features txsink (through delta-rs) cannot write: row ids, domains, identity values,
# Iceberg metadata, clustering, in-commit timestamps... (feature, reader features).
REFUSED = [
    ("rowTracking", []), ("domainMetadata", []), ("identityColumns", []),
    ("icebergCompatV2", []), ("clustering", []), ("inCommitTimestamp", []),
    ("typeWidening", ["typeWidening"]), ("vacuumProtocolCheck", ["vacuumProtocolCheck"]),
    ("allowColumnDefaults", []), ("someFutureFeature", []),
]
# Features an append of whole files honours, and delta-rs commits.
SUPPORTED = [
    ("appendOnly", []), ("changeDataFeed", []), ("deletionVectors", ["deletionVectors"]),
    ("timestampNtz", ["timestampNtz"]), ("v2Checkpoint", ["v2Checkpoint"]),
    ("variantType", ["variantType"]),
    ("columnMapping", ["columnMapping"]),  # listed, with mode none: nothing mapped
]


@pytest.mark.promise("delta-unsupported-features-refused", "backend")
@pytest.mark.parametrize(("feature", "readers"), REFUSED, ids=[f for f, _ in REFUSED])
def test_a_table_feature_txsink_cannot_write_is_refused_at_the_start(
        tmp_path: Path, feature: str, readers: list[str]) -> None:
    """Seen: such a table was accepted at the start and every commit then failed after
    the decision ("kept changing under 20 commit attempts")."""
    table = tmp_path / "t"
    write_log(table, 0, protocol(3 if readers else 1, 7, [feature], readers), metadata())
    backend = DeltaBackend(str(table))
    with pytest.raises(ConfigError) as refused:
        backend.preflight("orders")
    assert f"table feature {feature!r}" in str(refused.value)
    assert str(table) in str(refused.value) and refused.value.field == "path"


@pytest.mark.parametrize(("feature", "readers"), SUPPORTED, ids=[f for f, _ in SUPPORTED])
def test_a_table_feature_an_append_honours_is_written(
        tmp_path: Path, feature: str, readers: list[str]) -> None:
    table = tmp_path / "t"
    write_log(table, 0, protocol(3 if readers else 1, 7, [feature], readers), metadata())
    backend = DeltaBackend(str(table))
    backend.preflight("orders")
    epoch = prepared(backend, 0, [1, 2])
    backend.check_prepared(epoch)
    assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED]
    assert backend.holds_epoch("orders", 0)
    added = [json.loads(line)["add"] for line in
             (table / "_delta_log" / f"{1:020d}.json").read_text().splitlines()
             if "add" in json.loads(line)]
    assert [a["stats"] for a in added] and all('"numRecords":2' in a["stats"] for a in added)


@pytest.mark.promise("delta-unsupported-features-refused", "backend")
def test_identity_columns_of_a_legacy_protocol_are_refused(tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_log(table, 0, protocol(2, 6), metadata())
    with pytest.raises(ConfigError, match="identity columns"):
        DeltaBackend(str(table)).preflight("orders")


@pytest.mark.promise("delta-column-mapping-refused", "backend")
@pytest.mark.parametrize("mode", ["name", "id"])
def test_column_mapping_is_refused_at_the_start(tmp_path: Path, mode: str) -> None:
    """Under column mapping a file names its columns by their physical names (and field
    ids, in id mode); txsink's and Spark's files name them as the frame does, so every
    conforming reader would see NULL in every column of txsink's rows."""
    table = tmp_path / "t"
    field = {**ID_FIELD, "metadata": {"delta.columnMapping.id": 1,
                                      "delta.columnMapping.physicalName": "col-5f1d2c"}}
    write_log(table, 0, protocol(2, 5),
              metadata({"delta.columnMapping.mode": mode,
                        "delta.columnMapping.maxColumnId": "1"}, [field]))
    with pytest.raises(ConfigError) as refused:
        DeltaBackend(str(table)).preflight("orders")
    assert f"column mapping (delta.columnMapping.mode={mode}" in str(refused.value)
    assert "NULL" in str(refused.value)


@pytest.mark.promise("delta-table-checked-before-each-epoch", "backend")
def test_a_feature_turned_on_after_the_start_is_refused_before_the_decision(
        tmp_path: Path) -> None:
    """Another writer turns on row tracking while the pipeline runs: the next epoch is
    refused before its decision; an epoch decided before it fails at commit at once,
    naming the feature (it kept retrying 20 times as a lost race)."""
    table = tmp_path / "t"
    backend = DeltaBackend(str(table))
    backend.preflight("orders")
    first = prepared(backend, 0, [1, 2])
    assert backend.commit_all(first) == [CommitOutcome.COMMITTED]
    decided = prepared(backend, 1, [3])
    backend.check_prepared(decided)  # decided now
    created = next(json.loads(line)["metaData"] for line in
                   (table / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
                   if "metaData" in json.loads(line))
    write_log(table, 2, protocol(3, 7, ["rowTracking", "domainMetadata"], []),
              {"metaData": {**created, "configuration": {"delta.enableRowTracking": "true"}}})
    later = prepared(backend, 2, [4])
    with pytest.raises(ConfigError, match="table feature 'rowTracking'"):
        backend.check_prepared(later)
    started = time.monotonic()
    (answer,) = backend.commit_all(decided)
    assert isinstance(answer, FatalCommitError), answer
    assert "rowTracking" in str(answer) and "stays DECIDED" in str(answer)
    assert time.monotonic() - started < 10  # no 20 tries with back-off
    assert sorted(read_table_ids(str(table))) == [1, 2]


@pytest.mark.promise("delta-partitioned-refused", "backend")
def test_a_table_partitioned_by_another_writer_is_refused_before_the_decision(
        tmp_path: Path) -> None:
    """Seen: the epochs after another writer re-partitioned the table were added without
    partition values (readers put their rows nowhere or in a null partition)."""
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "t"
    backend = DeltaBackend(str(table))
    backend.preflight("orders")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("key", pa.int64())])

    def epoch(e: int, ids: list[int]) -> list[Committable]:
        rows = pa.record_batch([pa.array(ids, pa.int64()), pa.array(ids, pa.int64())],
                               schema=schema)
        return [write_participant(backend, TransactionContext("orders", e, 0, 0), [rows])]

    assert backend.commit_all(epoch(0, [1, 2])) == [CommitOutcome.COMMITTED]
    decided = epoch(1, [3])
    backend.check_prepared(decided)
    write_deltalake(str(table), DeltaTable(str(table)).to_pyarrow_table(), mode="overwrite",
                    partition_by=["key"], schema_mode="overwrite")
    with pytest.raises(ConfigError, match=r"partition columns \(key") as refused:
        backend.check_prepared(epoch(2, [4]))
    assert refused.value.field == "path"
    (answer,) = backend.commit_all(decided)
    assert isinstance(answer, FatalCommitError) and "partition columns" in str(answer)
    assert sorted(read_table_ids(str(table))) == [1, 2]
    with pytest.raises(ConfigError, match="partition columns"):
        DeltaBackend(str(table)).preflight("orders")


@pytest.mark.promise("delta-foreign-directory-refused", "backend")
def test_a_directory_with_other_files_is_not_taken_for_a_new_table(tmp_path: Path) -> None:
    """A later VACUUM of a table made in it deletes every file its log does not name:
    the owner's. Refused at the start, and before the decision when the files came
    after it; txsink's own folder alone (an epoch prepared, never committed) is fine."""
    table = tmp_path / "t"
    backend = DeltaBackend(str(table))
    backend.preflight("orders")  # nothing there yet
    early = prepared(backend, 0, [1])  # txsink's folder only
    DeltaBackend(str(table)).preflight("orders")
    (table / "customers.csv").write_text("id\n1\n")
    (table / "archive").mkdir()
    with pytest.raises(ConfigError) as refused:
        DeltaBackend(str(table)).preflight("orders")
    assert "not a Delta table" in str(refused.value)
    assert "archive, customers.csv" in str(refused.value) and "VACUUM" in str(refused.value)
    with pytest.raises(ConfigError, match="not a Delta table"):
        backend.check_prepared(early)
    assert not (table / "_delta_log").exists()


@pytest.mark.promise("delta-created-table-nullable", "backend")
def test_a_table_made_from_a_not_null_frame_takes_nullable_frames(tmp_path: Path) -> None:
    """Seen: the table kept the first frame's NOT NULL columns and refused every later
    nullable frame (without a null) as "of another type"."""
    table = tmp_path / "t"
    backend = DeltaBackend(str(table))
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False),
                        pa.field("tags", pa.list_(pa.field("item", pa.string(),
                                                           nullable=False)), nullable=False)])
    loose = pa.schema([pa.field("id", pa.int64()), pa.field("tags", pa.list_(pa.string()))])

    def epoch(e: int, schema: pa.Schema, ids: list[int | None]) -> list[Committable]:
        rows = pa.record_batch([pa.array(ids, pa.int64()),
                                pa.array([["a"]] * len(ids), pa.list_(pa.string()))],
                               schema=schema)
        return [write_participant(backend, TransactionContext("orders", e, 0, 0), [rows])]

    assert backend.commit_all(epoch(0, strict, [1])) == [CommitOutcome.COMMITTED]
    for e, ids in ((1, [2]), (2, [3, None])):
        later = epoch(e, loose, ids)
        backend.check_prepared(later)
        assert backend.commit_all(later) == [CommitOutcome.COMMITTED]
    from deltalake import DeltaTable

    got = DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(got, key=str) == sorted([1, 2, 3, None], key=str)


@pytest.mark.promise("delta-not-null-checked", "backend")
def test_a_nested_not_null_the_files_cannot_prove_is_refused_naming_it(
        tmp_path: Path) -> None:
    from deltalake import DeltaTable

    table = tmp_path / "t"
    strict = pa.schema([pa.field("id", pa.int64()),
                        pa.field("tags", pa.list_(pa.field("item", pa.string(),
                                                           nullable=False)))])
    DeltaTable.create(str(table), schema=strict)
    backend = DeltaBackend(str(table))
    rows = pa.record_batch([pa.array([1], pa.int64()), pa.array([["a", None]])],
                           schema=pa.schema([("id", pa.int64()),
                                             ("tags", pa.list_(pa.string()))]))
    epoch = [write_participant(backend, TransactionContext("orders", 0, 0, 0), [rows])]
    with pytest.raises(ConfigError, match="NOT NULL field or element inside") as refused:
        backend.check_prepared(epoch)
    assert refused.value.field == "tags"


@pytest.mark.promise("delta-lost-log-refused", "backend")
def test_a_table_whose_log_was_deleted_is_not_made_again_empty(tmp_path: Path) -> None:
    """The log is gone (deleted, or the table made again by another writer): txsink's
    folder still says a table here held the sink's epochs. Refused at the start and at
    the claim, naming the folder; moving it away (the remedy) starts the sink over."""
    import shutil

    from deltalake import write_deltalake
    from txsink.coordinator import Coordinator
    from txsink.plugins import build_plugins
    from txsink.state import DirectoryStateStore

    table = tmp_path / "t"
    backend = DeltaBackend(str(table))
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "orders",
                        plugins=build_plugins())
    coord.start()
    for e in range(2):
        coord.commit_epoch(e, prepared(backend, e, [e]))
    shutil.rmtree(table / "_delta_log")
    with pytest.raises(ConfigError, match="its _delta_log is gone") as refused:
        DeltaBackend(str(table)).preflight("orders")
    assert "epochs 0 to 1" in str(refused.value)
    write_deltalake(str(table), pa.table({"id": pa.array([99], pa.int64())}))  # replaced
    with pytest.raises(ConfigError, match="does not know the sink"):
        Coordinator(DeltaBackend(str(table)), DirectoryStateStore(tmp_path / "state"),
                    "orders", plugins=build_plugins()).start()
    folder = str(refused.value).split(" holds ", 1)[0].removeprefix("delta backend: ")
    shutil.move(folder, tmp_path / "old-epochs")  # the remedy, literally
    again = Coordinator(DeltaBackend(str(table)), DirectoryStateStore(tmp_path / "new"),
                        "orders", plugins=build_plugins())
    again.start()
    again.commit_epoch(0, prepared(DeltaBackend(str(table)), 0, [5]))
    assert sorted(read_table_ids(str(table))) == [5, 99]
