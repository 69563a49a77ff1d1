"""Spark's own connectors read what txsink writes exactly as delta-rs and pyiceberg do.

For a table txsink streamed into (each data path: Spark's Parquet writer committed by
the driver, and the ``format("txsink")`` data source): a batch read; time travel to
every log version / snapshot txsink committed, each holding the epochs up to it; a
streaming read of the table as the next pipeline's source (through txsink again),
every row once, also after more epochs arrive; Delta's change data feed on a table
Spark created with it enabled. Then a group of Kafka, PostgreSQL, Delta and Iceberg.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from txsink.targets import target_sink_id

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import (
    as_rows,
    delta_rs_rows,
    delta_txsink_versions,
    iceberg_txsink_snapshots,
    pyiceberg_rows,
    stream,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PATHS = ("native", "datasource")


def stream_arrow() -> bool:
    """Whether this PySpark hands streaming data sources Arrow batches (4.1 and later)."""
    try:
        from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401
    except ImportError:
        return False
    return True


def _sink(path_kind: str, sink_id: str) -> str:
    return target_sink_id(sink_id, "t") if path_kind == "native" else sink_id


def _downstream(lake: Lake, fmt: str, name: str, tmp: Path, out: Path) -> list[Any]:
    """The table as the source of the next pipeline: Spark's streaming read of it,
    through txsink into a Delta table (to the end of what is there), read back."""
    src = (lake.spark.readStream.format(fmt).load(name) if fmt == "delta"
           else lake.spark.readStream.format("iceberg").load(name))
    query = (src.writeStream.format("txsink").option("backend", "delta")
             .option("sink_id", "downstream").option("path", str(out))
             .option("checkpointLocation", str(tmp / "chk-downstream"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the downstream stream did not finish"
    assert query.exception() is None, query.exception()
    return delta_rs_rows(out)


@pytest.mark.parametrize("path_kind", PATHS)
def test_delta_spark_reads_batch_time_travel_and_stream(lake: Lake, tmp_path: Path,
                                                        path_kind: str) -> None:
    table = tmp_path / "delta"
    want = write_input(tmp_path / "in", 0, 3)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "orders")
    sink = _sink(path_kind, "orders")

    spark_rows = as_rows(lake.spark.read.format("delta").load(str(table)).collect())
    assert spark_rows == delta_rs_rows(table) == sorted(want)

    versions = delta_txsink_versions(table, sink)
    assert sorted(versions.values()) == [0, 1, 2], versions
    for version, epoch in versions.items():
        old = as_rows(lake.spark.read.format("delta").option("versionAsOf", version)
                      .load(str(table)).collect())
        assert old == delta_rs_rows(table, version) == sorted(want[:(epoch + 1) * 50]), (
            f"version {version} (epoch {epoch})")

    assert _downstream(lake, "delta", str(table), tmp_path, tmp_path / "down") == sorted(want)
    more = write_input(tmp_path / "in", 3, 2)  # two more epochs; the next run takes them
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "orders")
    assert _downstream(lake, "delta", str(table), tmp_path, tmp_path / "down") == sorted(
        want + more)


@pytest.mark.parametrize("path_kind", PATHS)
def test_iceberg_spark_reads_batch_time_travel_and_stream(lake: Lake, tmp_path: Path,
                                                          path_kind: str) -> None:
    options, name = lake.iceberg(tmp_path / "wh")
    want = write_input(tmp_path / "in", 0, 3)
    stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk",
           "orders")
    sink = _sink(path_kind, "orders")

    assert as_rows(lake.spark.table(name).collect()) == pyiceberg_rows(options) == sorted(want)
    snapshots = iceberg_txsink_snapshots(options, sink)
    assert sorted(snapshots.values()) == [0, 1, 2], snapshots
    for snapshot_id, epoch in snapshots.items():
        # Spark's own time-travel option: Iceberg 1.12 (Spark 4.1) refuses its
        # "snapshot-id" ("no longer supported, use Spark built-in versionAsOf").
        old = as_rows(lake.spark.read.option("versionAsOf", snapshot_id).table(name)
                      .collect())
        assert old == pyiceberg_rows(options, snapshot_id) == sorted(
            want[:(epoch + 1) * 50]), f"snapshot {snapshot_id} (epoch {epoch})"
        sql = as_rows(lake.sql(f"SELECT * FROM {name} VERSION AS OF {snapshot_id}"))
        assert sql == old

    assert _downstream(lake, "iceberg", name, tmp_path, tmp_path / "down") == sorted(want)
    more = write_input(tmp_path / "in", 3, 2)
    stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk",
           "orders")
    assert _downstream(lake, "iceberg", name, tmp_path, tmp_path / "down") == sorted(
        want + more)


@pytest.mark.parametrize("path_kind", PATHS)
def test_delta_change_data_feed_of_a_table_spark_created(lake: Lake, tmp_path: Path,
                                                         path_kind: str) -> None:
    """Spark creates the table with the change data feed on; txsink's epochs show in
    it as inserts, every row once, at the versions txsink committed."""
    table = tmp_path / "cdf"
    lake.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, key INT, amount BIGINT, at TIMESTAMP)"
             " USING delta TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    want = write_input(tmp_path / "in", 0, 3)
    # PySpark 4.0 hands a streaming data source Rows, not Arrow: they are written with
    # the frame's own Spark types (INT, TIMESTAMP), as Arrow from later PySparks is.
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "cdf")
    changes = (lake.spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", 0).load(str(table)).collect())
    assert {r["_change_type"] for r in changes} == {"insert"}
    assert as_rows(changes) == delta_rs_rows(table) == sorted(want)
    versions = delta_txsink_versions(table, _sink(path_kind, "cdf"))
    by_version: dict[int, int] = {}
    for r in changes:
        by_version[int(r["_commit_version"])] = by_version.get(int(r["_commit_version"]), 0) + 1
    assert by_version == dict.fromkeys(versions, 50)


def test_group_with_kafka_and_postgres_reads_back_in_spark(lake: Lake, tmp_path: Path
                                                           ) -> None:
    """One decision per epoch for Kafka, PostgreSQL, Delta and Iceberg; Spark's
    connectors read the two tables as delta-rs and pyiceberg do, and each table
    holds the epochs the other targets hold."""
    from txsink.spark import targets

    from tests.chaos.multi import Group

    lake.need_iceberg()
    group = Group("kafka-postgres-delta-iceberg")
    if group.unavailable:
        pytest.skip(f"a server of the group cannot run here: {group.unavailable}")
    group.start()
    try:
        items = {i["name"]: i for i in group.items("interop")}
        # Kafka takes key and value (what the group's reader reads: the id), PostgreSQL
        # its table's columns.
        items["events"]["select"] = ["CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value"]
        items["totals"]["select"] = ["id", "key", "amount"]
        iceberg_opts, name = lake.iceberg(Path(items["iceberg"]["options"]["warehouse"]),
                                          "db.interop")
        items["iceberg"]["options"] = iceberg_opts
        want = write_input(tmp_path / "in", 0, 3)
        src = __import__("tests.e2e.interop.harness", fromlist=["source"]).source(
            lake.spark, tmp_path / "in")
        query = (targets("lakegroup", list(items.values()),
                         checkpoint_location=str(tmp_path / "chk"))
                 .write_stream(src).trigger(availableNow=True).start())
        assert query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        delta_path = items["delta"]["options"]["path"]
        spark_delta = as_rows(lake.spark.read.format("delta").load(delta_path).collect())
        spark_iceberg = as_rows(lake.spark.table(name).collect())
        assert spark_delta == delta_rs_rows(delta_path) == sorted(want)
        assert spark_iceberg == pyiceberg_rows(iceberg_opts) == sorted(want)
        for item in items.values():
            sid = target_sink_id("lakegroup", item["name"])
            epochs = sorted(e for e, _ in group.rows(item["name"], item["options"], "lakegroup"))
            assert sorted(set(epochs)) == [0, 1, 2], (item["name"], sid)
            assert len(epochs) == len(want), item["name"]
    finally:
        group.stop()
