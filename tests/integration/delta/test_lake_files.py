"""What both table formats share about the files txsink adds, on real tables on local
disk, from txsink's own writer and from files another writer put into the participant's
directory (as Spark's writer does on the native path; ``committable_for_directory``):

* every file and every directory entry leading to it is durable before the participant
  is prepared (a power loss must not take back a file a decision names);
* Delta statistics cover every row group of a column or are left out for it (a row group
  without min/max made the bounds too narrow, and filtered reads skipped rows);
* locations with spaces, non-ASCII letters and (Iceberg) ``%`` work, and the characters
  that cannot are refused at the start, naming the character;
* an epoch without rows into a table that does not exist yet is an epoch like any other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txsink import lakehouse
from txsink.backend import CommitOutcome
from txsink.coordinator import EpochOutcome
from txsink.errors import ConfigError
from txsink.lakehouse import TableBackend, file_stats
from txsink.model import Committable, TransactionContext
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

from tests.lake_tables import coordinator, table_rows

pytestmark = pytest.mark.integration

KINDS = ["delta", "iceberg"]


def make(kind: str, where: Path) -> TableBackend:
    if kind == "delta":
        return DeltaBackend(str(where / "table"))
    return IcebergBackend("db.t", str(where / "wh"))


def spark_like(backend: TableBackend, epoch: int, tables: list[pa.Table],
               sink: str = "orders", row_group_size: int | None = None
               ) -> tuple[TransactionContext, str]:
    """Files written into the participant directory ``native_staging`` names, by another
    writer (here pyarrow, as Spark's writer would: a ``file://`` URI, directories made
    on the way, no fsync)."""
    ctx = TransactionContext(sink, epoch, 0, 0)
    uri, dirname = backend.native_staging(ctx)
    assert uri.startswith("file://"), uri
    folder = Path(uri.removeprefix("file://"))
    folder.mkdir(parents=True)
    for i, table in enumerate(tables):
        pq.write_table(table, folder / f"part-{i:05d}-c000.snappy.parquet",
                       row_group_size=row_group_size)
    (folder / "_SUCCESS").write_text("")
    return ctx, dirname


def recorded_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    synced: list[tuple[str, bool]] = []
    real = lakehouse.fsync_path

    def fsync(path: str, *, directory: bool = False) -> None:
        synced.append((os.path.normpath(path), directory))
        real(path, directory=directory)

    monkeypatch.setattr(lakehouse, "fsync_path", fsync)
    return synced


# -- durability -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("writer", ["native", "txsink"])
def test_every_file_and_directory_is_durable_before_the_participant_is_prepared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, writer: str) -> None:
    """Seen: the native path recorded Spark's files (which Hadoop's local filesystem
    never fsyncs) as prepared, and they were decided, without a single fsync; txsink's
    own writer synced its file and directory but not the epoch's, the sink's and the
    table's directories it had just made."""
    backend = make(kind, tmp_path)
    synced = recorded_fsyncs(monkeypatch)
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64())})
    if writer == "native":
        ctx, dirname = spark_like(backend, 0, [rows, rows])
        committable = backend.committable_for_directory(ctx, dirname)
    else:
        committable = write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                        rows.to_batches())
    files = [os.path.normpath(backend.absolute(f["path"]))
             for f in committable.payload["files"]]
    assert len(files) == (2 if writer == "native" else 1)
    assert {(f, False) for f in files} <= set(synced)
    table_dir, top = Path(backend.table_dir()), Path(backend.durable_top())
    participant = Path(files[0]).parent
    chain = [participant, *[p for p in participant.parents if p == top or top in p.parents]]
    assert table_dir in chain and table_dir.parent in chain
    if kind == "iceberg":  # the namespace's directory is as new: up to the warehouse
        assert top == tmp_path / "wh"
    for d in chain:
        assert (str(d), True) in synced, (d, synced)
    # each once (the syncs run at once: their order is not what makes them durable)
    assert len(synced) == len(set(synced))


@pytest.mark.parametrize("kind", KINDS)
def test_a_participants_fsyncs_run_at_once_and_all_end_before_it_is_prepared(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """Each fsync waits for a journal commit; one after another they cost a native
    participant ~2.5x what they cost at once (files, then ~8 directories up to the
    table's parent). At once, and still every one finished before the participant is
    described as prepared: none is left running when the call returns."""
    import threading

    backend = make(kind, tmp_path)
    real = lakehouse.fsync_path
    lock, two_inside = threading.Lock(), threading.Event()
    inside: list[str] = []
    done: list[str] = []

    def fsync(path: str, *, directory: bool = False) -> None:
        # Two syncs must be inside at the same time: one after another, the first
        # waits here alone until the timeout.
        with lock:
            inside.append(path)
            if len(inside) >= 2:
                two_inside.set()
        assert two_inside.wait(timeout=30), f"{path} was synced alone"
        real(path, directory=directory)
        done.append(path)

    monkeypatch.setattr(lakehouse, "fsync_path", fsync)
    ctx, dirname = spark_like(backend, 0, [pa.table({"id": pa.array([1, 2], pa.int64())})])
    committable = backend.committable_for_directory(ctx, dirname)
    finished = list(done)
    files = [backend.absolute(f["path"]) for f in committable.payload["files"]]
    assert set(files) <= set(finished)
    assert Path(backend.durable_top()).as_posix() in {os.path.normpath(p) for p in finished}
    assert len(finished) >= 5  # the file and the directories up to the table's parent


# -- Delta statistics -------------------------------------------------------------------


def two_row_groups() -> pa.Table:
    """Two row groups of two rows: the second's string is over 4 KiB, so Parquet writers
    keep no min/max for it there; ``n`` is all null in the second."""
    return pa.table({"s": ["a", "c", "b", "z" * 5000],
                     "n": pa.array([1, 2, None, None], pa.int64())})


def stats_of(table: pa.Table, where: Path, row_group_size: int | None = None
             ) -> dict[str, Any]:
    import json

    pq.write_table(table, where, row_group_size=row_group_size)
    return dict(json.loads(file_stats(pq.ParquetFile(where).metadata)))


@pytest.mark.promise("delta-statistics-hold-for-every-row", "backend")
def test_statistics_give_bounds_only_when_they_hold_for_every_row_and_column(
        tmp_path: Path) -> None:
    # A row group without min/max for s: no bounds (for s, and so for any column).
    stats = stats_of(two_row_groups(), tmp_path / "a.parquet", row_group_size=2)
    assert stats["numRecords"] == 4 and stats["nullCount"] == {"s": 0, "n": 2}
    assert "minValues" not in stats and "maxValues" not in stats
    # Every row group has bounds (an all-null one needs none): bounds for every column.
    whole = pa.table({"s": ["a", "c", "b", "d"], "n": pa.array([1, 2, None, None])})
    stats = stats_of(whole, tmp_path / "b.parquet", row_group_size=2)
    assert stats["minValues"] == {"s": "a", "n": 1}
    assert stats["maxValues"] == {"s": "d", "n": 2}
    # A column of a type without bounds here (a timestamp): none for the others either.
    import datetime

    stamped = whole.append_column("at", pa.array([datetime.datetime(2020, 1, 1)] * 4,
                                                 pa.timestamp("us", tz="UTC")))
    stats = stats_of(stamped, tmp_path / "c.parquet")
    assert "minValues" not in stats and stats["nullCount"]["n"] == 2


@pytest.mark.promise("delta-statistics-hold-for-every-row", "backend")
@pytest.mark.parametrize("writer", ["native", "txsink"])
def test_a_filtered_read_finds_a_row_of_a_row_group_without_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, writer: str) -> None:
    """Seen: maxValues.s was 'c' (the first row group's), and readers that skip files by
    their statistics (delta-rs, DataFusion, Spark) found nothing for s > 'd'."""
    from deltalake import DeltaTable, QueryBuilder

    backend = DeltaBackend(str(tmp_path / "table"))
    if writer == "native":
        ctx, dirname = spark_like(backend, 0, [two_row_groups()], row_group_size=2)
        committable = backend.committable_for_directory(ctx, dirname)
    else:
        monkeypatch.setattr(lakehouse, "ROW_GROUP_ROWS", 2)
        committable = write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                        two_row_groups().to_batches(max_chunksize=2))
    assert pq.ParquetFile(backend.absolute(committable.payload["files"][0]["path"])
                          ).metadata.num_row_groups == 2
    assert backend.commit_all([committable]) == [CommitOutcome.COMMITTED]
    table = DeltaTable(str(tmp_path / "table"))
    assert table.to_pyarrow_table(filters=[("s", ">", "d")]).num_rows == 1
    found = QueryBuilder().register("t", table).execute(
        "SELECT count(*) AS n FROM t WHERE s > 'd'").read_all()
    assert found["n"][0].as_py() == 1
    assert table.to_pyarrow_table(filters=[("n", "=", 2)]).num_rows == 1


@pytest.mark.promise("delta-statistics-hold-for-every-row", "backend")
def test_a_filtered_read_on_a_column_without_bounds_finds_its_rows(tmp_path: Path) -> None:
    """Found while fixing the above: delta-rs's pyarrow reader takes a column missing
    from ``minValues`` beside others as all null, and a filter on a timestamp column of
    txsink's files (bounds only for the integer beside it) found no row at all."""
    import datetime

    from deltalake import DeltaTable

    backend = DeltaBackend(str(tmp_path / "table"))
    at = pa.array([datetime.datetime(2020, 1, 1), datetime.datetime(2030, 1, 1)],
                  pa.timestamp("us", tz="UTC"))
    rows = pa.table({"id": pa.array([1, 2], pa.int64()), "at": at})
    epoch = [write_participant(backend, TransactionContext("orders", 0, 0, 0),
                               rows.to_batches())]
    assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED]
    later = pa.scalar(datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC), at.type)
    found = DeltaTable(str(tmp_path / "table")).to_pyarrow_table(filters=[("at", ">", later)])
    assert found.column("id").to_pylist() == [2]


# -- locations --------------------------------------------------------------------------


@pytest.mark.promise("iceberg-hostile-location-refused", "backend")
@pytest.mark.promise("delta-hostile-location-refused", "backend")
@pytest.mark.parametrize(("kind", "char"), [
    ("delta", "#"), ("delta", "?"), ("delta", "%"), ("iceberg", "#"), ("iceberg", "?")])
def test_a_location_with_a_character_that_cannot_work_is_refused_naming_it(
        tmp_path: Path, kind: str, char: str) -> None:
    """Seen: Delta read an empty history at such a location and every start added the
    same files again; Iceberg read another file than the one added (after the decision);
    delta-rs decodes a location's ``%20`` twice and opened another directory."""
    from txsink.plugins import get_plugins

    where = str(tmp_path / f"a{char}b")
    options = {"path": where} if kind == "delta" else {"warehouse": where, "table": "db.t"}
    with pytest.raises(ConfigError) as refused:
        get_plugins().create_backend(kind, options)
    assert f"holds {char!r}" in str(refused.value)
    assert refused.value.field == ("path" if kind == "delta" else "warehouse")
    assert not os.path.exists(where)


NAMES = {"delta": ["with space", "unicodé"], "iceberg": ["with space", "unicodé", "pct%x",
                                                           "pct%20y"]}


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, ns in NAMES.items() for n in ns])
@pytest.mark.parametrize("writer", ["native", "txsink"])
def test_a_location_with_spaces_unicode_or_percent_works_on_every_read(
        tmp_path: Path, kind: str, name: str, writer: str) -> None:
    """Commit, then another process's view: the table holds the epoch, a second commit
    adds nothing, nothing is left as prepared, a reader sees the rows once."""
    where = tmp_path / name
    backend = make(kind, where)
    backend.preflight("orders")
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    if writer == "native":
        ctx, dirname = spark_like(backend, 0, [rows])
        epoch = [backend.committable_for_directory(ctx, dirname)]
    else:
        epoch = [write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                   rows.to_batches())]
    backend.check_prepared(epoch)
    assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED]
    backend.epoch_committed("orders", 0, epoch)
    again = make(kind, where)
    assert again.holds_epoch("orders", 0) and again.highest_epoch("orders") == 0
    assert again.commit_all(epoch) == [CommitOutcome.ALREADY_COMMITTED]
    assert list(again.list_prepared("orders")) == []
    assert sorted(r["id"] for r in table_rows(again)) == [1, 2]


def test_two_iceberg_warehouses_whose_names_decode_alike_keep_their_own_catalogs(
        tmp_path: Path) -> None:
    """Seen: the default catalog's SQLite URL was not escaped, so the warehouse
    ``a%20b`` opened the catalog of ``a b``: its epoch 0 answered "already committed"
    and nothing of it was written."""
    plain = make("iceberg", tmp_path / "a b")
    escaped = make("iceberg", tmp_path / "a%20b")
    for backend, ids in ((plain, [1]), (escaped, [2])):
        epoch = [write_participant(backend, TransactionContext("orders", 0, 0, 0),
                                   [pa.record_batch({"id": pa.array(ids, pa.int64())})])]
        backend.check_prepared(epoch)
        assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED]
    assert [r["id"] for r in table_rows(plain)] == [1]
    assert [r["id"] for r in table_rows(escaped)] == [2]
    assert (tmp_path / "a%20b" / "wh" / "txsink-catalog.db").exists()


# -- an epoch without rows --------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_an_epoch_without_rows_before_the_table_exists_is_a_normal_epoch(
        tmp_path: Path, kind: str) -> None:
    """Seen: the empty epoch committed, but nothing recorded it: ``holds_epoch`` said
    no and ``highest_epoch`` -1, so the consistent cut of a group stayed below it until
    rows came."""
    backend = make(kind, tmp_path)
    coord = coordinator(backend, tmp_path / "state", "orders")
    empty = [write_participant(backend, TransactionContext("orders", 0, p, 0), [])
             for p in range(2)]
    assert coord.commit_epoch(0, empty) is EpochOutcome.COMMITTED
    again = make(kind, tmp_path)
    assert again.holds_epoch("orders", 0) and again.highest_epoch("orders") == 0
    assert not again.holds_epoch("orders", 1)
    rows = [write_participant(backend, TransactionContext("orders", 1, 0, 0),
                              [pa.record_batch({"id": pa.array([7], pa.int64())})])]
    assert coord.commit_epoch(1, rows) is EpochOutcome.COMMITTED
    assert coord.commit_epoch(2, [write_participant(
        backend, TransactionContext("orders", 2, 0, 0), [])]) is EpochOutcome.COMMITTED
    again = make(kind, tmp_path)
    assert [again.holds_epoch("orders", e) for e in range(4)] == [True, True, True, False]
    assert again.highest_epoch("orders") == 2
    assert [r["id"] for r in table_rows(again)] == [7]


@pytest.mark.parametrize("kind", KINDS)
def test_spark_s_empty_file_for_an_epoch_without_rows_makes_the_table(
        tmp_path: Path, kind: str) -> None:
    """Spark's writer leaves one file with the schema and no row for an empty frame: the
    table is made from it (every column nullable) and holds the epoch."""
    backend = make(kind, tmp_path)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    ctx, dirname = spark_like(backend, 0, [schema.empty_table()])
    epoch: list[Committable] = [backend.committable_for_directory(ctx, dirname)]
    assert epoch[0].rows == 0
    backend.check_prepared(epoch)
    assert backend.commit_all(epoch) == [CommitOutcome.COMMITTED]
    backend.epoch_committed("orders", 0, epoch)
    assert backend.holds_epoch("orders", 0) and table_rows(backend) == []
