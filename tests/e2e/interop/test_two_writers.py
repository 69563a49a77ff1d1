"""Two writers of one table: txsink and Spark's own connectors at once.

Spark's Delta writer in ``foreachBatch`` with ``txnAppId``/``txnVersion`` (Delta's
idempotent writes), Spark's own streaming sinks (Delta, Iceberg) running beside a
txsink stream into the same table. The oracle: every row of each writer once."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from txsink.targets import target_sink_id

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

TXN_APP_ID_SHARED = (
    "Delta's txn action is keyed by appId alone, and txsink's appId is the bare sink id: "
    "a Spark job that starts writing the table with txnAppId equal to the sink id after "
    "txsink committed has every write whose txnVersion is at or below txsink's epoch "
    "skipped by Delta, silently (txsink never sees those writes to refuse them). Needs an "
    "appId of txsink's own, reading the bare one of tables written before")


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


@pytest.mark.xfail(strict=True, reason=TXN_APP_ID_SHARED)
@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_spark_job_after_txsink_with_the_sink_id_as_txn_app_id(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    table = tmp_path / "t"
    app_id = target_sink_id("s", "t") if path_kind == "native" else "s"
    want = write_input(tmp_path / "in", 0, 3)
    stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
           tmp_path / "chk", "s")
    want += _spark_job(lake, table, app_id, range(4))
    assert delta_rs_rows(table) == sorted(want)


@pytest.mark.promise("delta-foreign-txn-refused", "backend")
@pytest.mark.parametrize("path_kind", ["datasource", "native"])
def test_delta_txsink_after_a_spark_job_whose_txn_app_id_is_the_sink_id(
        lake: Lake, tmp_path: Path, path_kind: str) -> None:
    """Refused before anything is written, naming the app id (before the fix txsink took
    the job's versions 0-5 for epochs of its own, numbered its stream's epochs after
    them, and the job's next versions were skipped by Delta)."""
    table = tmp_path / "t"
    app_id = target_sink_id("s", "t") if path_kind == "native" else "s"
    theirs = _spark_job(lake, table, app_id, range(6))
    write_input(tmp_path / "in", 0, 3)
    with pytest.raises(Exception, match="txnAppId"):
        stream(lake.spark, path_kind, "delta", {"path": str(table)}, tmp_path / "in",
               tmp_path / "chk", "s")
    assert delta_rs_rows(table) == sorted(theirs)
    lake.outcomes.append(f"delta | a Spark job's txnAppId equal to the sink id, before "
                         f"txsink | {path_kind} | refused, naming it")


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
