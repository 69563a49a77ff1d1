"""Iceberg tables are known by uuid and columns by field id, and txsink's claims live where
table maintenance cannot reach them.

* Field ids: every file txsink adds (its own writer's, and Spark's files on the native
  path, written again with ids before they are recorded) carries the table's field ids.
  Files without them are read through the name mapping, and after another writer
  dropped a column and added one of the same name, the old rows showed the dropped
  values under the new column.
* A lost catalog entry: the table's metadata is still at its location, and txsink would
  create an empty table over it (the committed rows vanished for readers). Refused,
  naming the catalog and how to register the table again; that remedy, followed
  literally, brings every row back and the sink goes on.
* A table dropped and created again under its name: refused by uuid.
* The claim (which state owns the sink id) is a table property: orphan-file removal
  deleted the ``_owner.json`` of earlier releases, after which a second query (or one
  whose checkpoint was lost) wrote the source again.
* NOT NULL: a table txsink makes is nullable; a table made NOT NULL by its owner takes
  a nullable frame without nulls, and a real null fails before the decision.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator
from txsink.errors import ConfigError, SinkOwnedError, TxsinkError
from txsink.lakehouse import OWNER_FILE
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_iceberg.backend import FIELD_ID, OWNER_PROPERTY, IcebergBackend

from tests.integration.delta.test_lake_files import spark_like
from tests.lake_tables import coordinator, table_rows

pytestmark = pytest.mark.integration

SINK = "orders"


def backend(tmp_path: Path) -> IcebergBackend:
    return IcebergBackend("db.t", str(tmp_path / "wh"))


def epoch(b: IcebergBackend, e: int, ids: list[int], xs: list[str | None],
          writer: str = "txsink") -> list[Committable]:
    rows = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(xs, pa.string())})
    if writer == "native":
        ctx, dirname = spark_like(b, e, [rows])
        return [b.committable_for_directory(ctx, dirname)]
    return [write_participant(b, TransactionContext(SINK, e, 0, 0), rows.to_batches())]


def commit(b: IcebergBackend, committables: list[Committable]) -> None:
    b.check_prepared(committables)  # what the coordinator does before the decision
    assert b.commit_all(committables) == [CommitOutcome.COMMITTED] * len(committables)


def rows(b: IcebergBackend) -> list[tuple[object, ...]]:
    return sorted(tuple(r.values()) for r in table_rows(b))


# -- field ids --------------------------------------------------------------------------


@pytest.mark.promise("iceberg-field-ids-written", "backend")
@pytest.mark.parametrize("writer", ["txsink", "native"])
def test_a_column_dropped_and_added_again_shows_no_old_values(tmp_path: Path,
                                                              writer: str) -> None:
    from pyiceberg.types import StringType

    b = backend(tmp_path)
    commit(b, epoch(b, 0, [1, 2], ["old1", "old2"], writer))
    files = [b.absolute(f["path"]) for f in b.list_prepared(SINK)] or [
        os.path.join(root, n) for root, _, names in os.walk(b.absolute("txsink"))
        for n in names if n.endswith(".parquet")]
    assert files and all(
        pq.read_schema(f).field("x").metadata[FIELD_ID] == b"2" for f in files)
    table = b.load_table()
    with table.update_schema() as change:
        change.delete_column("x")
    with b.load_table().update_schema() as change:
        change.add_column("x", StringType())
    assert rows(b) == [(1, None), (2, None)]  # the dropped values stay dropped
    fresh = backend(tmp_path)  # a new run: the table's ids now
    commit(fresh, epoch(fresh, 1, [3], ["new3"], writer))
    assert rows(b) == [(1, None), (2, None), (3, "new3")]


@pytest.mark.promise("iceberg-field-ids-written", "backend")
def test_files_written_before_a_column_was_dropped_and_added_again_are_refused(
        tmp_path: Path) -> None:
    """The epoch's files carry the old column's id: refused before its decision, naming
    the column (its next attempt is written with the table's ids)."""
    from pyiceberg.types import StringType

    b = backend(tmp_path)
    commit(b, epoch(b, 0, [1], ["a"]))
    stale = epoch(b, 1, [2], ["b"])
    with b.load_table().update_schema() as change:
        change.delete_column("x")
    with b.load_table().update_schema() as change:
        change.add_column("x", StringType())
    with pytest.raises(ConfigError, match="field id 2") as refused:
        b.check_prepared(stale)
    assert refused.value.field == "x"


def test_a_table_made_from_a_not_null_frame_is_nullable(tmp_path: Path) -> None:
    """Seen: the table kept the first frame's NOT NULL columns and refused every later
    nullable frame, even one without a null."""
    b = backend(tmp_path)
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False),
                        pa.field("x", pa.string(), nullable=False)])
    first = [write_participant(b, TransactionContext(SINK, 0, 0, 0), [pa.record_batch(
        [pa.array([1], pa.int64()), pa.array(["a"])], schema=strict)])]
    commit(b, first)
    assert all(not f.required for f in b.load_table().schema().fields)
    commit(b, epoch(backend(tmp_path), 1, [2, 3], ["b", None]))
    assert rows(b) == [(1, "a"), (2, "b"), (3, None)]


@pytest.mark.promise("iceberg-not-null-checked", "backend")
@pytest.mark.parametrize("writer", ["txsink", "native"])
def test_a_not_null_column_takes_a_nullable_frame_without_nulls_and_refuses_a_null(
        tmp_path: Path, writer: str) -> None:
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    b = backend(tmp_path)
    catalog = b._catalog()
    catalog.create_namespace("db")
    catalog.create_table("db.t", Schema(NestedField(1, "id", LongType(), required=True),
                                        NestedField(2, "x", StringType(), required=False)))
    b = backend(tmp_path)
    commit(b, epoch(b, 0, [1], ["a"], writer))
    rows_with_null = pa.table({"id": pa.array([None], pa.int64()), "x": pa.array(["b"])})

    def prepare() -> None:
        if writer == "native":
            ctx, dirname = spark_like(b, 1, [rows_with_null])
            b.committable_for_directory(ctx, dirname)
        else:
            write_participant(b, TransactionContext(SINK, 1, 0, 0), rows_with_null.to_batches())

    with pytest.raises(ConfigError, match="'id' is NOT NULL") as refused:
        prepare()
    assert refused.value.field == "id"
    assert rows(b) == [(1, "a")]


# -- which table ------------------------------------------------------------------------


def run(b: IcebergBackend, state: Path, e: int, ids: list[int]) -> None:
    """One start and epoch of a query whose txsink state is ``state``."""
    coord = coordinator(b, state, SINK)
    coord.commit_epoch(e, epoch(b, e, ids, [str(i) for i in ids]))


@pytest.mark.promise("iceberg-lost-catalog-entry-refused", "backend")
def test_a_lost_catalog_entry_is_refused_and_registering_the_table_again_restores_it(
        tmp_path: Path) -> None:
    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    run(backend(tmp_path), tmp_path / "state", 1, [3])
    os.unlink(tmp_path / "wh" / "txsink-catalog.db")  # the catalog file is lost
    lost = backend(tmp_path)
    with pytest.raises(ConfigError) as refused:
        lost.preflight(SINK)
    message = str(refused.value)
    assert "catalog 'txsink' (the SQLite catalog" in message
    assert "has no table db.t" in message and "register_table(" in message
    # Nothing was created over it.
    assert lost.load_table() is None
    with pytest.raises(ConfigError, match=r"has no table db\.t"):
        coordinator(lost, tmp_path / "state", SINK)
    # The remedy, as the message gives it.
    call = message.split("catalog.register_table(", 1)[1].split(")", 1)[0]
    name, metadata = (part.strip().strip("'") for part in call.split(","))
    lost._catalog().create_namespace_if_not_exists("db")
    lost._catalog().register_table(name, metadata)
    again = backend(tmp_path)
    again.preflight(SINK)
    run(again, tmp_path / "state", 2, [4])
    assert rows(again) == [(1, "1"), (2, "2"), (3, "3"), (4, "4")]
    assert again.holds_epoch(SINK, 1) and again.highest_epoch(SINK) == 2


@pytest.mark.promise("iceberg-table-uuid-checked", "backend")
def test_a_table_dropped_and_created_again_is_refused_by_its_uuid(tmp_path: Path) -> None:
    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    catalog = b._catalog()
    old = b.load_table()
    catalog.drop_table("db.t")  # its files stay (no purge)
    with pytest.raises(ConfigError, match="dropped without purging"):
        backend(tmp_path).preflight(SINK)
    catalog.create_table("db.t", old.schema(), location=f"file://{tmp_path}/elsewhere")
    new = backend(tmp_path)
    with pytest.raises(ConfigError) as refused:
        coordinator(new, tmp_path / "state", SINK)
    message = str(refused.value)
    assert str(old.metadata.table_uuid) in message
    assert str(new.load_table().metadata.table_uuid) in message
    # The way out when the new table is meant to take the output from now on.
    removal = message.split("catalog.update_namespace_properties(", 1)[1].rsplit(")", 1)[0]
    namespace, key = removal.split(", removals={")
    catalog.update_namespace_properties(namespace.strip("'"),
                                        removals={key.strip("}'")})
    run(backend(tmp_path), tmp_path / "state", 1, [3])
    assert rows(new) == [(3, "3")]


@pytest.mark.promise("iceberg-table-uuid-checked", "backend")
def test_a_table_made_again_at_the_old_location_is_refused(tmp_path: Path) -> None:
    """The catalog was lost and someone made the table again by hand, at its old
    location: another table's metadata is there."""
    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    schema, location = b.load_table().schema(), b.load_table().location()
    os.unlink(tmp_path / "wh" / "txsink-catalog.db")
    fresh = backend(tmp_path)
    fresh._catalog().create_namespace("db")
    fresh._catalog().create_table("db.t", schema, location=location)
    with pytest.raises(ConfigError, match="shares its location"):
        backend(tmp_path).preflight(SINK)


# -- claims -----------------------------------------------------------------------------


@pytest.mark.promise("iceberg-sink-owner", "backend")
def test_the_claim_outlives_orphan_file_removal(tmp_path: Path) -> None:
    """Seen: orphan-file removal deleted ``_owner.json`` (no snapshot names it), and a
    second query (a new state) was then accepted and wrote the source again."""
    b = backend(tmp_path)
    run(b, tmp_path / "first", 0, [1])
    claim = json.loads(b.load_table().properties[OWNER_PROPERTY + SINK])
    assert claim["state_location"] == str(tmp_path / "first")
    owner = Path(b.absolute(f"txsink/{SINK}/{OWNER_FILE}"))
    owner.unlink(missing_ok=True)  # what remove_orphan_files does to it
    second = Coordinator(backend(tmp_path), DirectoryStateStore(tmp_path / "second"), SINK,
                         plugins=build_plugins())
    with pytest.raises(SinkOwnedError) as refused:
        second.start()
    assert "remove table property txsink.owner.orders" in str(refused.value)
    assert rows(b) == [(1, "1")]


def test_a_claim_of_an_earlier_release_moves_into_the_table(tmp_path: Path) -> None:
    """A sink claimed by ``_owner.json`` alone (earlier releases): its next start carries
    the claim into the table property, so losing the file loses nothing."""
    b = backend(tmp_path)
    run(b, tmp_path / "first", 0, [1])
    with b.load_table().transaction() as tx:  # as an earlier release left the table
        tx.remove_properties(OWNER_PROPERTY + SINK)
    owner = Path(b.absolute(f"txsink/{SINK}/{OWNER_FILE}"))
    owner.parent.mkdir(parents=True, exist_ok=True)
    owner.write_text(json.dumps({"sink_id": SINK, "state_id": "old-state",
                                 "state_location": "/old"}))
    with pytest.raises(SinkOwnedError, match="/old"):
        coordinator(backend(tmp_path), tmp_path / "first", SINK)
    owner.write_text(json.dumps({
        "sink_id": SINK, "state_location": str(tmp_path / "first"),
        "state_id": DirectoryStateStore(tmp_path / "first").read_meta().state_id}))
    run(backend(tmp_path), tmp_path / "first", 1, [2])
    assert OWNER_PROPERTY + SINK in b.load_table().properties
    owner.unlink()
    with pytest.raises(SinkOwnedError):
        coordinator(backend(tmp_path), tmp_path / "second", SINK)


def test_the_refusal_s_way_out_followed_literally_lets_a_new_state_take_the_sink(
        tmp_path: Path) -> None:
    b = backend(tmp_path)
    run(b, tmp_path / "first", 0, [1])
    with pytest.raises(SinkOwnedError) as refused:
        coordinator(backend(tmp_path), tmp_path / "second", SINK)
    message = str(refused.value)
    key = message.split("tx.remove_properties('", 1)[1].split("'", 1)[0]
    with b.load_table().transaction() as tx:
        tx.remove_properties(key)
    leftover = message.split("and delete ", 1)[1].split(" if it is there", 1)[0]
    Path(leftover).unlink(missing_ok=True)
    # (the table holds epoch 0 of the sink: the new query's epoch 0 would be a replay)
    run(backend(tmp_path), tmp_path / "second", 1, [5])
    assert rows(b) == [(1, "1"), (5, "5")]


@pytest.mark.promise("iceberg-table-uuid-checked", "backend")
def test_a_table_dropped_with_its_files_is_not_made_again_silently(tmp_path: Path) -> None:
    """Dropped and purged: nothing is left at its location, and only the catalog's own
    record (the namespace property) says the sink wrote a table by that name."""
    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    b._catalog().purge_table("db.t")
    with pytest.raises(ConfigError, match="not in the catalog any more") as refused:
        backend(tmp_path).preflight(SINK)
    message = str(refused.value)
    # The way out, literally: the property removed, the old folder moved away.
    removal = message.split("catalog.update_namespace_properties(", 1)[1].split("), and", 1)[0]
    namespace, key = removal.split(", removals={")
    b._catalog().update_namespace_properties(namespace.strip("'"), removals={key.strip("}'")})
    folder = message.split("and move ", 1)[1].split(" away if it is still there", 1)[0]
    Path(folder).rename(tmp_path / "old-sink-folder")
    run(backend(tmp_path), tmp_path / "state", 1, [3])
    assert rows(b) == [(3, "3")]


@pytest.mark.promise("iceberg-table-uuid-checked", "backend")
@pytest.mark.parametrize("how", ["namespace-dropped", "catalog-lost"])
def test_a_table_purged_and_made_again_without_the_catalog_s_record_is_refused(
        tmp_path: Path, how: str) -> None:
    """Dropped with its files, and another table made at its location (as Spark's
    catalog makes it), after the record of the sink's table went too: with its
    namespace (dropped and made again), or with the catalog file. Only txsink's folder
    is left to say that a table of this name held the sink's epochs."""
    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    schema, location = b.load_table().schema(), b.load_table().location()
    b._catalog().purge_table("db.t")
    if how == "namespace-dropped":
        b._catalog().drop_namespace("db")
    else:
        os.unlink(tmp_path / "wh" / "txsink-catalog.db")
    other = backend(tmp_path)._catalog()
    other.create_namespace("db")
    other.create_table("db.t", schema, location=location)
    with pytest.raises(ConfigError, match="holds nothing of sink") as refused:
        coordinator(backend(tmp_path), tmp_path / "state", SINK)
    message = str(refused.value)
    assert "epochs 0 to 0" in message
    assert rows(backend(tmp_path)) == []  # nothing written into the new table
    # The way out, literally, when the new table is to take the output from now on.
    folder = message.split("), but ", 1)[1].split(" holds ", 1)[0]
    Path(folder).rename(tmp_path / "old-sink-folder")
    run(backend(tmp_path), tmp_path / "state", 1, [3])
    assert rows(backend(tmp_path)) == [(3, "3")]


@pytest.mark.promise("iceberg-older-catalog-entry-refused", "backend")
def test_a_catalog_restored_from_an_older_copy_is_refused(tmp_path: Path) -> None:
    """The catalog file is restored from a copy made after epoch 0: its entry points
    at an older metadata file of the same table (same uuid), which lacks epochs 1 and 2.
    Before the fix the next epoch was written on top of it, and epochs 1 and 2 were
    gone from every reader for good."""
    import shutil

    run(backend(tmp_path), tmp_path / "state", 0, [1, 2])
    shutil.copy(tmp_path / "wh" / "txsink-catalog.db", tmp_path / "catalog-copy.db")
    run(backend(tmp_path), tmp_path / "state", 1, [3])
    run(backend(tmp_path), tmp_path / "state", 2, [4])
    shutil.copy(tmp_path / "catalog-copy.db", tmp_path / "wh" / "txsink-catalog.db")
    assert rows(backend(tmp_path)) == [(1, "1"), (2, "2")]
    with pytest.raises(TxsinkError, match="older than the table") as refused:
        run(backend(tmp_path), tmp_path / "state", 3, [5])
    message = str(refused.value)
    assert "epochs 1 to 2" in message
    assert rows(backend(tmp_path)) == [(1, "1"), (2, "2")]  # nothing written
    # The way back, literally: the entry dropped (no purge), the newest file registered.
    newest, folder = message.split("newest metadata file (", 1)[1].split(")", 1)[0].split(
        " in ")
    catalog = backend(tmp_path)._catalog()
    catalog.drop_table("db.t")
    catalog.register_table("db.t", f"{folder}/{newest}")
    run(backend(tmp_path), tmp_path / "state", 3, [5])
    assert rows(backend(tmp_path)) == [(1, "1"), (2, "2"), (3, "3"), (4, "4"), (5, "5")]


@pytest.mark.promise("iceberg-lost-table-refused", "backend")
def test_a_table_whose_catalog_entry_and_metadata_are_gone_is_not_made_again_empty(
        tmp_path: Path) -> None:
    import shutil

    b = backend(tmp_path)
    run(b, tmp_path / "state", 0, [1, 2])
    location = b.load_table().location().removeprefix("file://")
    os.unlink(tmp_path / "wh" / "txsink-catalog.db")
    shutil.rmtree(f"{location}/metadata")
    with pytest.raises(ConfigError, match="no metadata is left") as refused:
        backend(tmp_path).preflight(SINK)
    assert "epochs 0 to 0" in str(refused.value)
