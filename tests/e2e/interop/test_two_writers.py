"""Two writers of one table: txsink and Spark's own connectors at once.

Spark's Delta writer in ``foreachBatch`` with ``txnAppId``/``txnVersion`` (Delta's
idempotent writes), Spark's own streaming sinks (Delta, Iceberg) running beside a
txsink stream into the same table. The oracle: every row of each writer once."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from txsink.targets import target_sink_id
from txsink_delta.backend import txn_app_id

from tests.e2e.interop.conftest import Lake
from tests.e2e.interop.harness import (
    as_rows,
    delta_rs_rows,
    pyiceberg_rows,
    source,
    stream,
    write_input,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

def _spark_job(lake: Lake, table: Path, app_id: str, versions: range) -> list[Any]:
    """Spark's own idempotent writes: ten rows per version, negative ids."""
    rows = []
    for v in versions:
        df = (lake.spark.range(-1000 - 10 * v, -990 - 10 * v)
              .selectExpr("id", "CAST(0 AS INT) AS key", "0L AS amount",
                          "timestamp_seconds(0) AS at"))
        rows += [(i, 0, 0, 0) for i in range(-1000 - 10 * v, -990 - 10 * v)]
        (df.write.format("delta").mode("append").option("txnAppId", app_id)
         .option("txnVersion", v).save(str(table)))
    return rows


def _sink_id(path_kind: str) -> str:
    """The sink id txsink's Delta target goes by on ``path_kind`` for sink "s"."""
    return target_sink_id("s", "t") if path_kind == "native" else "s"


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_spark_job_after_txsink_with_the_sink_id_as_txn_app_id(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    """A job whose txnAppId is the sink id starts writing after txsink committed
    (before the fix Delta skipped its versions 0 to 3: txsink's txn had that app id, at
    its epoch 3), and txsink goes on after it: every row of both once."""
    table = tmp_path / "t"
    want = write_input(tmp_path / "in", 0, 3)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    want += _spark_job(lake, table, _sink_id(path_kind), range(4))
    want += write_input(tmp_path / "in", 3, 2)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    assert delta_rs_rows(table) == as_rows(lake.spark.read.format("delta").load(
        str(table)).collect()) == sorted(want)
    lake.outcomes.append(f"delta | a Spark job's txnAppId equal to the sink id, after "
                         f"txsink | {path_kind} | exact")


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_txsink_after_a_spark_job_whose_txn_app_id_is_the_sink_id(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    """The job wrote first (before the fix txsink refused the table), then both go on:
    the job's next versions are not skipped, txsink's epochs are not the job's."""
    table = tmp_path / "t"
    want = _spark_job(lake, table, _sink_id(path_kind), range(6))
    want += write_input(tmp_path / "in", 0, 3)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    want += _spark_job(lake, table, _sink_id(path_kind), range(6, 8))
    assert delta_rs_rows(table) == sorted(want)
    lake.outcomes.append(f"delta | a Spark job's txnAppId equal to the sink id, before "
                         f"txsink | {path_kind} | exact")


@pytest.mark.promise("delta-foreign-txn-refused", "backend")
@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_txsink_after_a_spark_job_whose_txn_app_id_is_txsinks(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    """A job that took txsink's own app id (``txsink:<sink id>``) wrote first: refused
    before anything is written, naming the app id."""
    table = tmp_path / "t"
    app_id = txn_app_id(_sink_id(path_kind))
    theirs = _spark_job(lake, table, app_id, range(6))
    write_input(tmp_path / "in", 0, 3)
    with pytest.raises(Exception, match=re.escape(repr(app_id))):
        stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
               tmp_path / "chk", "s")
    assert delta_rs_rows(table) == sorted(theirs)
    lake.outcomes.append(f"delta | a Spark job's txnAppId equal to txsink's "
                         f"(txsink:<sink id>), before txsink | {path_kind} | refused, "
                         "naming it")


def _concurrently(here: Any, there: Any) -> None:
    """``here`` in this thread while ``there`` runs in another (PySpark finds a
    registered Python data source, txsink's, only from the thread that registered it)."""
    errors: list[BaseException] = []

    def call() -> None:
        try:
            there()
        except BaseException as exc:
            errors.append(exc)
    thread = threading.Thread(target=call)
    thread.start()
    try:
        here()
    finally:
        thread.join(600)
    assert not errors, [str(getattr(e, "java_exception", e))[:2000] for e in errors]


def _spark_stream(lake: Lake, fmt: str, where: str, input_dir: Path, checkpoint: Path
                  ) -> None:
    """Spark's own streaming sink: each row with its id negated (the rows told apart)."""
    df = source(lake.spark, input_dir).selectExpr("-id AS id", "key", "amount", "at")
    writer = (df.writeStream.format(fmt).option("checkpointLocation", str(checkpoint))
              .trigger(availableNow=True))
    query = writer.start(where) if fmt == "delta" else writer.toTable(where)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_spark_streaming_sink_beside_txsink(lake: Lake, tmp_path: Path,
                                                  path_kind: str) -> None:
    table = tmp_path / "t"
    want = write_input(tmp_path / "in", 0, 4)
    lake.sql(f"CREATE TABLE delta.`{table}` (id BIGINT, key INT, amount BIGINT, at TIMESTAMP)"
             " USING delta")
    _concurrently(
        lambda: stream(lake.spark, path_kind, "delta", {"path": str(table)},
                       tmp_path / "in", tmp_path / "chk", "s"),
        lambda: _spark_stream(lake, "delta", str(table), tmp_path / "in",
                              tmp_path / "chk-spark"))
    theirs = [(-i, k, a, t) for i, k, a, t in want]
    assert delta_rs_rows(table) == as_rows(lake.spark.read.format("delta").load(
        str(table)).collect()) == sorted(want + theirs)
    lake.outcomes.append(f"delta | Spark's streaming sink beside txsink | {path_kind} | "
                         "exact")


@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_iceberg_spark_streaming_sink_beside_txsink(lake: Lake, tmp_path: Path,
                                                    path_kind: str) -> None:
    options, name = lake.iceberg(tmp_path / "wh", "db.t")
    lake.sql(f"CREATE NAMESPACE IF NOT EXISTS {name.rsplit('.', 1)[0]}")
    lake.sql(f"CREATE TABLE {name} (id BIGINT, key INT, amount BIGINT, at TIMESTAMP) "
             "USING iceberg")
    want = write_input(tmp_path / "in", 0, 4)
    _concurrently(
        lambda: stream(lake.spark, path_kind, "iceberg", options, tmp_path / "in",
                       tmp_path / "chk", "s"),
        lambda: _spark_stream(lake, "iceberg", name, tmp_path / "in",
                              tmp_path / "chk-spark"))
    theirs = [(-i, k, a, t) for i, k, a, t in want]
    assert pyiceberg_rows(options) == as_rows(lake.spark.table(name).collect()) == sorted(
        want + theirs)
    lake.outcomes.append(f"iceberg | Spark's streaming sink beside txsink | {path_kind} | "
                         "exact")
