"""Names re-pointed by Spark's own connectors and by an Iceberg REST catalog, while a
txsink pipeline is stopped between rounds: each round is a query to the end of its
input on the same checkpoint, on each data path (``format("txsink")``, a group's
``write_stream`` with Spark's Parquet writer, ``foreachBatch`` with
``txsink.spark.epoch``). The oracle: the next round refuses before anything is
written, naming the cause, or every row is in the table exactly once."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import (
    pyiceberg_rows,
    pyiceberg_table,
    source,
    stream,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PATHS = ("datasource", "native", "epoch")
COLUMNS = "(id BIGINT, key INT, amount BIGINT, at TIMESTAMP)"


def run(lake: Lake, path_kind: str, backend: str, options: Mapping[str, str], tmp: Path,
        sink_id: str = "s") -> None:
    """One round: every input file, through txsink, on ``path_kind``."""
    if path_kind != "epoch":
        stream(lake.spark, path_kind, backend, options, tmp / "in", tmp / "chk", sink_id)
        return
    from txsink.spark import target, targets

    group = targets(sink_id, [target("t", backend, **options)],
                    state_location=str(tmp / "state"))

    def batch(df: Any, batch_id: int) -> None:
        with group.epoch(df.sparkSession, version=batch_id) as tx:
            tx.write(df, "t")

    query = (source(lake.spark, tmp / "in").writeStream.foreachBatch(batch)
             .option("checkpointLocation", str(tmp / "chk"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(300), "the stream did not finish"
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


@pytest.fixture(scope="module")
def rest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from txsink_iceberg.testing import LocalRestCatalog, RestCatalogUnavailable

    server = LocalRestCatalog(tmp_path_factory.mktemp("rest"))
    try:
        server.start()
    except RestCatalogUnavailable as exc:
        pytest.skip(f"Iceberg's REST catalog server cannot run here: {exc}")
    try:
        yield server
    finally:
        server.stop()


def _iceberg(lake: Lake, catalog: str, tmp: Path, request: pytest.FixtureRequest
             ) -> tuple[dict[str, str], str]:
    """txsink's options and Spark's name for one table, in a SQL catalog on SQLite or
    behind Iceberg's REST catalog server (the same catalog for both)."""
    if catalog == "sql":
        return lake.iceberg(tmp / "wh", "db.t")
    lake.need_iceberg()
    server = request.getfixturevalue("rest")
    name = f"r{abs(hash(str(tmp))) % 10**8}"
    namespace = f"ns{name}"
    lake.catalog(name, {"type": "rest", "uri": server.uri, "cache-enabled": "false"})
    options = {"catalog_type": "rest", "catalog_uri": server.uri,
               "warehouse": str(server.warehouse), "table": f"{namespace}.t",
               "catalog_name": name}
    return options, f"{name}.{namespace}.t"


@pytest.mark.promise("iceberg-table-uuid-checked", "backend")
@pytest.mark.parametrize("catalog", ["sql", "rest"])
@pytest.mark.parametrize("path_kind", PATHS)
def test_iceberg_table_purged_with_its_namespace_and_made_again_by_spark(
        lake: Lake, tmp_path: Path, request: pytest.FixtureRequest, path_kind: str,
        catalog: str) -> None:
    """Spark drops the table with its files, drops the namespace (the catalog's record
    of the sink's table goes with it) and makes both again under the same names. The
    next round refuses before writing: the new table holds nothing of the sink, while
    txsink's folder says a table there held its epochs (before the fix the round wrote
    its epoch into the new table, as if the first ones were there)."""
    options, name = _iceberg(lake, catalog, tmp_path, request)
    namespace = name.rsplit(".", 1)[0]
    write_input(tmp_path / "in", 0, 2)
    run(lake, path_kind, "iceberg", options, tmp_path)
    assert len(pyiceberg_rows(options)) == 100
    lake.sql(f"DROP TABLE {name} PURGE")
    lake.sql(f"DROP NAMESPACE {namespace}")
    lake.sql(f"CREATE NAMESPACE {namespace}")
    lake.sql(f"CREATE TABLE {name} {COLUMNS} USING iceberg")
    write_input(tmp_path / "in", 2, 1)
    with pytest.raises(Exception, match="holds nothing of sink"):
        run(lake, path_kind, "iceberg", options, tmp_path)
    assert lake.sql(f"SELECT * FROM {name}") == []
    lake.outcomes.append(f"iceberg ({catalog} catalog) | DROP TABLE PURGE, namespace and "
                         f"table made again by Spark | {path_kind} | refused")


@pytest.mark.parametrize("path_kind", PATHS)
def test_iceberg_table_replaced_by_spark_is_refused(lake: Lake, tmp_path: Path,
                                                    path_kind: str) -> None:
    """CREATE OR REPLACE TABLE keeps the table's uuid and its snapshots, and leaves no
    current snapshot: every epoch's rows are gone from what readers see, and the next
    round stops, naming the epochs the table lost."""
    options, name = lake.iceberg(tmp_path / "wh", "db.t")
    write_input(tmp_path / "in", 0, 2)
    run(lake, path_kind, "iceberg", options, tmp_path)
    lake.sql(f"CREATE OR REPLACE TABLE {name} {COLUMNS} USING iceberg")
    write_input(tmp_path / "in", 2, 1)
    with pytest.raises(Exception, match="off the branch"):
        run(lake, path_kind, "iceberg", options, tmp_path)
    assert lake.sql(f"SELECT * FROM {name}") == []
    lake.outcomes.append(f"iceberg | CREATE OR REPLACE TABLE by Spark | {path_kind} | "
                         "refused")


@pytest.mark.promise("iceberg-older-catalog-entry-refused", "backend")
@pytest.mark.parametrize("path_kind", PATHS)
def test_iceberg_table_registered_again_from_an_older_metadata_file(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    """Spark drops the table (its files stay) and registers it again from an older
    metadata file (CALL system.register_table): the same table by uuid, without the
    later epochs. The next round stops, naming the epochs and the newest file; before
    the fix it wrote its epoch on top, and the later epochs were gone for good."""
    options, name = lake.iceberg(tmp_path / "wh", "db.t")
    catalog, ident = name.split(".", 1)
    write_input(tmp_path / "in", 0, 1)
    run(lake, path_kind, "iceberg", options, tmp_path)
    old = lake.sql(f"SELECT file FROM {name}.metadata_log_entries ORDER BY timestamp DESC "
                   "LIMIT 1")[0]["file"]
    write_input(tmp_path / "in", 1, 2)
    run(lake, path_kind, "iceberg", options, tmp_path)
    assert len(pyiceberg_rows(options)) == 150
    lake.sql(f"DROP TABLE {name}")
    lake.sql(f"CALL {catalog}.system.register_table(table => '{ident}', "
             f"metadata_file => '{old}')")
    assert len(lake.sql(f"SELECT * FROM {name}")) == 50
    write_input(tmp_path / "in", 3, 1)
    with pytest.raises(Exception, match="older than the table"):
        run(lake, path_kind, "iceberg", options, tmp_path)
    assert len(lake.sql(f"SELECT * FROM {name}")) == 50
    lake.outcomes.append(f"iceberg | table registered again by Spark from an older metadata "
                         f"file | {path_kind} | refused")


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_iceberg_rest_maintenance_by_spark_between_rounds(
        lake: Lake, tmp_path: Path, request: pytest.FixtureRequest, path_kind: str) -> None:
    """Behind the REST catalog: Spark compacts and expires every snapshot but the
    newest between rounds (the markers of earlier epochs go with them), then rolls the
    table back past an epoch. Every row once after the maintenance; the rollback stops
    the next round, naming it."""
    options, name = _iceberg(lake, "rest", tmp_path, request)
    catalog, ident = name.split(".", 1)
    want = write_input(tmp_path / "in", 0, 3)
    run(lake, path_kind, "iceberg", options, tmp_path)
    lake.sql(f"CALL {catalog}.system.rewrite_data_files(table => '{ident}', "
             "options => map('min-input-files', '2'))")
    lake.sql(f"CALL {catalog}.system.expire_snapshots(table => '{ident}', "
             "older_than => current_timestamp(), retain_last => 1)")
    want += write_input(tmp_path / "in", 3, 2)
    run(lake, path_kind, "iceberg", options, tmp_path)
    assert pyiceberg_rows(options) == sorted(want)
    # (Not Spark's metadata table {name}.snapshots: Iceberg 1.10's client asks the REST
    # server for it with an escaped namespace separator, which the server's Jetty
    # refuses: "Suspicious Path Character".)
    before = pyiceberg_table(options).current_snapshot().snapshot_id
    write_input(tmp_path / "in", 5, 1)
    run(lake, path_kind, "iceberg", options, tmp_path)
    lake.sql(f"CALL {catalog}.system.rollback_to_snapshot('{ident}', {before})")
    write_input(tmp_path / "in", 6, 1)
    with pytest.raises(Exception, match="rolled back past epochs"):
        run(lake, path_kind, "iceberg", options, tmp_path)
    assert pyiceberg_rows(options) == sorted(want)
    lake.outcomes.append(f"iceberg (REST catalog) | rewrite_data_files, expire_snapshots "
                         f"between rounds; rollback_to_snapshot | {path_kind} | exact; "
                         "rollback refused")
