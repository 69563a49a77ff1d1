"""Spark changes a table's schema between two rounds of a txsink pipeline (each round
a query to the end of its input on the same checkpoint): the next round writes every
row with the right values in the right columns, read back by Spark's connector, or
refuses before anything is written, naming the column."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import as_rows, delta_rs_rows, pyiceberg_rows, stream, write_input

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_iceberg_column_renamed_by_spark_is_refused_naming_it(lake: Lake, tmp_path: Path,
                                                              path_kind: str) -> None:
    options, name = lake.iceberg(tmp_path / "wh", "db.t")
    want = write_input(tmp_path / "in", 0, 2)
    stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk", "s")
    lake.sql(f"ALTER TABLE {name} RENAME COLUMN amount TO total")
    write_input(tmp_path / "in", 2, 1)
    with pytest.raises(Exception, match="amount"):
        stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk",
               "s")
    assert sorted((r["id"], r["total"]) for r in lake.spark.table(name).collect()) == sorted(
        (r[0], r[2]) for r in want)
    lake.outcomes.append(f"iceberg | column renamed by Spark between rounds | {path_kind} | "
                         "refused, naming the column")


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_iceberg_column_widened_by_spark_takes_the_next_epochs(lake: Lake, tmp_path: Path,
                                                               path_kind: str) -> None:
    """int to bigint (a promotion Iceberg allows): txsink's files keep the frame's int,
    which readers widen."""
    options, name = lake.iceberg(tmp_path / "wh", "db.t")
    want = write_input(tmp_path / "in", 0, 2)
    stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk", "s")
    lake.sql(f"ALTER TABLE {name} ALTER COLUMN key TYPE BIGINT")
    want += write_input(tmp_path / "in", 2, 2)
    stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in", tmp_path / "chk", "s")
    assert as_rows(lake.spark.table(name).collect()) == pyiceberg_rows(options) == sorted(want)
    lake.outcomes.append(f"iceberg | column widened (int to bigint) by Spark between rounds "
                         f"| {path_kind} | exact")


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_column_added_by_spark_reads_null_in_txsink_rows(lake: Lake, tmp_path: Path,
                                                               path_kind: str) -> None:
    table = tmp_path / "t"
    want = write_input(tmp_path / "in", 0, 2)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    lake.sql(f"ALTER TABLE delta.`{table}` ADD COLUMNS (note STRING)")
    want += write_input(tmp_path / "in", 2, 1)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    got = lake.spark.read.format("delta").load(str(table)).collect()
    assert as_rows(got) == delta_rs_rows(table) == sorted(want)
    assert {r["note"] for r in got} == {None}
    lake.outcomes.append(f"delta | column added by Spark between rounds | {path_kind} | "
                         "exact, null in txsink's rows")
