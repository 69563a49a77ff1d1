"""Delta and Iceberg targets through real Spark where the machine and the tables are not
the easy case: the native path (Spark's own Parquet writer) and txsink's data source.

* ``fs.defaultFS`` is not the local filesystem (a ViewFs whose fallback is another
  directory, as HDFS or DBFS would be): Spark is handed ``file://`` URIs and writes
  where the driver reads. Seen before: Spark wrote the epoch elsewhere, the driver
  found no file and committed an empty epoch; every row was lost without a word.
* Locations with a space, a non-ASCII letter and (Iceberg) ``%20``.
* An empty frame is an epoch like any other on both paths: committed, held by the
  table, passed by the consistent cut. (On the native path this held before: Spark
  writes one file with the schema and no row. txsink's writer writes no file at all.)
* Spark's files for an Iceberg table get the table's field ids, so a column dropped and
  added again by another writer shows no old values.
* A row group of Spark's holding a string over 4 KiB: parquet-mr leaves that row
  group's statistics out whole (null count too), so Delta's statistics had no bounds
  and filtered reads found the row; it held before, and is kept as a guard (pyarrow
  keeps the null count, and txsink's own writer is where bounds were too narrow).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.lakehouse import TableBackend
from txsink.targets import target_sink_id
from txsink_delta.backend import DeltaBackend
from txsink_iceberg.backend import IcebergBackend

from tests.e2e.spark_harness import local_spark
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-lake-real", **{"spark.sql.session.timeZone": "UTC"})


def lake(where: Path, *, delta: bool = True) -> list[dict[str, Any]]:
    from txsink.spark import target

    out = [target("iceberg", "iceberg", warehouse=str(where / "wh"), table="db.t")]
    if delta:
        out.insert(0, target("delta", "delta", path=str(where / "delta")))
    return out


def table(where: Path, name: str) -> TableBackend:
    if name == "delta":
        return DeltaBackend(str(where / "delta"))
    return IcebergBackend("db.t", str(where / "wh"))


def ids(backend: TableBackend) -> list[int]:
    if isinstance(backend, DeltaBackend):
        from deltalake import DeltaTable

        found = DeltaTable(backend.table_uri()).to_pyarrow_table(columns=["id"])
    else:
        assert isinstance(backend, IcebergBackend)
        loaded = IcebergBackend(backend.table, backend.warehouse)._load()
        found = loaded.scan(selected_fields=("id",)).to_arrow()
    return sorted(int(i) for i in found.column("id").to_pylist())


def frame(spark: Any, start: int, end: int) -> Any:
    return spark.range(start, end).selectExpr("id", "CAST(id AS STRING) AS s")


def test_spark_writes_where_the_driver_reads_under_another_default_filesystem(
        spark: Any, tmp_path: Path) -> None:
    from txsink.spark import targets

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    conf = {"fs.defaultFS": "viewfs://lakeview/",
            "fs.viewfs.mounttable.lakeview.linkFallback": f"file://{elsewhere}"}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        targets("view", lake(tmp_path), checkpoint_location=str(tmp_path / "chk")).write(
            frame(spark, 0, 10))
    finally:
        for key in conf:
            spark.conf.unset(key)
    for name in ("delta", "iceberg"):
        assert ids(table(tmp_path, name)) == list(range(10)), name
    assert not [p for p in elsewhere.rglob("*") if p.is_file()]


@long_run
@pytest.mark.parametrize("name", ["with space", "unicodé"])
def test_the_native_path_writes_into_locations_with_spaces_and_unicode(
        spark: Any, tmp_path: Path, name: str) -> None:
    from txsink.spark import targets

    where = tmp_path / name
    for start in (0, 10):  # a second epoch reads the first's markers back
        targets("names", lake(where), checkpoint_location=str(tmp_path / "chk")).write(
            frame(spark, start, start + 10))
    for kind in ("delta", "iceberg"):
        backend = table(where, kind)
        assert ids(backend) == list(range(20)), kind
        sink = target_sink_id("names", kind)
        assert backend.highest_epoch(sink) == 1 and backend.holds_epoch(sink, 0)
        assert list(backend.list_prepared(sink)) == []


def test_the_native_path_writes_an_iceberg_warehouse_named_with_a_percent_escape(
        spark: Any, tmp_path: Path) -> None:
    from txsink.spark import targets

    for where, start in ((tmp_path / "a b", 0), (tmp_path / "a%20b", 100)):
        targets("pct", lake(where, delta=False),
                checkpoint_location=str(where / "chk")).write(frame(spark, start, start + 5))
    assert ids(table(tmp_path / "a b", "iceberg")) == list(range(5))
    assert ids(table(tmp_path / "a%20b", "iceberg")) == list(range(100, 105))


def test_an_empty_frame_is_a_normal_epoch_on_the_native_path(spark: Any,
                                                             tmp_path: Path) -> None:
    from txsink.cut import consistent_cut
    from txsink.group import TargetGroup
    from txsink.plugins import get_plugins
    from txsink.spark import targets
    from txsink.targets import parse_targets

    group = targets("empty", lake(tmp_path), checkpoint_location=str(tmp_path / "chk"))
    group.write(frame(spark, 0, 0))
    group.write(frame(spark, 0, 3))
    for kind in ("delta", "iceberg"):
        backend, sink = table(tmp_path, kind), target_sink_id("empty", kind)
        assert [backend.holds_epoch(sink, e) for e in range(3)] == [True, True, False]
        assert ids(backend) == [0, 1, 2]
    tg = TargetGroup.from_specs("empty", parse_targets(lake(tmp_path), "empty"))
    store = get_plugins().state_store(str(tmp_path / "chk" / "txsink"))
    assert consistent_cut(tg, store, "empty").cut == 1


@long_run
@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_empty_frame_is_a_normal_epoch_on_the_data_source(spark: Any, tmp_path: Path,
                                                             kind: str) -> None:
    """txsink's own writer: no task writes a file, and the table does not exist yet."""
    options = ({"path": str(tmp_path / "delta")} if kind == "delta" else
               {"warehouse": str(tmp_path / "wh"), "table": "db.t"})
    for start, end in ((0, 0), (0, 4)):
        (frame(spark, start, end).write.format("txsink").mode("append")
         .option("backend", kind).option("sink_id", "ds")
         .option("checkpointLocation", str(tmp_path / "chk"))
         .options(**options).save())
    backend = table(tmp_path, kind)
    assert [backend.holds_epoch("ds", e) for e in range(3)] == [True, True, False]
    assert backend.highest_epoch("ds") == 1 and ids(backend) == list(range(4))


@pytest.mark.promise("iceberg-field-ids-written", "native")
def test_spark_s_files_carry_the_iceberg_table_s_field_ids(spark: Any,
                                                           tmp_path: Path) -> None:
    from pyiceberg.types import StringType
    from txsink.spark import targets

    where = tmp_path / "ids"
    group = targets("ids", lake(where, delta=False), checkpoint_location=str(tmp_path / "c"))
    group.write(frame(spark, 0, 3))
    backend = table(where, "iceberg")
    assert isinstance(backend, IcebergBackend)
    with backend._load().update_schema() as change:
        change.delete_column("s")
    with backend._load().update_schema() as change:
        change.add_column("s", StringType())
    group.write(frame(spark, 3, 5))
    found = IcebergBackend("db.t", str(where / "wh"))._load().scan().to_arrow().to_pylist()
    assert sorted((r["id"], r["s"]) for r in found) == [
        (0, None), (1, None), (2, None), (3, "3"), (4, "4")]


def test_a_long_string_in_spark_s_files_is_found_by_a_filtered_read(
        spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable
    from txsink.spark import targets

    rows = spark.range(0, 400).selectExpr(
        "id", "IF(id = 399, repeat('z', 5000), CAST(id % 7 AS STRING)) AS s").coalesce(1)
    spark.conf.set("parquet.block.size", "2048")  # several row groups in the one file
    try:
        targets("long", lake(tmp_path, delta=True)[:1],
                checkpoint_location=str(tmp_path / "chk")).write(rows)
    finally:
        spark.conf.unset("parquet.block.size")
    written = DeltaTable(str(tmp_path / "delta"))
    assert written.to_pyarrow_table(filters=[("s", ">", "y")]).column("id").to_pylist() == [399]


def test_a_target_a_grouped_epoch_does_not_write_holds_the_epoch(spark: Any,
                                                                  tmp_path: Path) -> None:
    """``with group.epoch(spark) as tx``: only the Delta target is written; the Iceberg
    target takes part without rows, before its table exists. Both hold the epoch, and
    the cut passes it."""
    from txsink.cut import consistent_cut
    from txsink.group import TargetGroup
    from txsink.plugins import get_plugins
    from txsink.spark import targets
    from txsink.targets import parse_targets

    group = targets("grouped", lake(tmp_path), checkpoint_location=str(tmp_path / "chk"))
    with group.epoch(spark) as tx:
        tx.write(frame(spark, 0, 3), "delta")
    iceberg = table(tmp_path, "iceberg")
    assert isinstance(iceberg, IcebergBackend) and iceberg._load() is None
    for kind in ("delta", "iceberg"):
        assert table(tmp_path, kind).holds_epoch(target_sink_id("grouped", kind), 0), kind
    tg = TargetGroup.from_specs("grouped", parse_targets(lake(tmp_path), "grouped"))
    store = get_plugins().state_store(str(tmp_path / "chk" / "txsink"))
    assert consistent_cut(tg, store, "grouped").cut == 0


def test_a_frame_given_the_table_s_field_ids_is_not_written_twice(spark: Any,
                                                                  tmp_path: Path) -> None:
    """``IcebergBackend.native_frame``: the table's field ids as Spark column metadata,
    which Spark's Parquet writer writes; such files are recorded as Spark wrote them
    (no second write on the driver). For the native path to call before its write."""
    import pyarrow.parquet as pq
    from txsink.model import TransactionContext
    from txsink.spark.group import write_parquet
    from txsink_iceberg.backend import FIELD_ID

    backend = table(tmp_path, "iceberg")
    assert isinstance(backend, IcebergBackend)
    for epoch in (0, 1):  # before the table exists (its fresh ids), then with it
        ctx = TransactionContext("hooked", epoch, 0, 0)
        path, dirname = backend.native_staging(ctx)
        write_parquet(backend.native_frame(frame(spark, epoch * 10, epoch * 10 + 3)), path,
                      backend.native_write_options())
        (committable,) = backend.committables_for_directory(ctx, dirname)
        names = [f["path"] for f in committable.payload["files"]]
        assert names and not any(n.endswith(".ids.parquet") for n in names)
        assert {pq.read_schema(backend.absolute(n)).field("s").metadata[FIELD_ID]
                for n in names} == {b"2"}
        backend.check_prepared([committable])
        assert backend.commit_all([committable])[0].value == "committed"
    assert ids(backend) == [0, 1, 2, 10, 11, 12]
