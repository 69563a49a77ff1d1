"""Delta and Iceberg targets through real Spark, on the native data path: Spark's own
Parquet writer puts each epoch's files into the tables' directories inside
``foreachBatch``, the driver commits one log entry / snapshot per table per batch.

A group of Delta, Iceberg and files (Parquet: Spark's writer too, staged and published
by link) streams a file source; a replayed batch (Spark's commit log one behind) is
written once; a batch write is one more epoch. Timestamps go in (Iceberg refuses
Spark's default INT96 Parquet timestamps). One files sink alone on the same path: a
batch write, then a stream with a replayed batch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.targets import target_sink_id
from txsink_iceberg.backend import IcebergBackend

from tests.e2e.spark_harness import SCHEMA, local_spark, make_input, read_files_output, summarize
from tests.integration.delta.test_delta_backend import log_entries
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

GROUP = "lake"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-lake", **{"spark.sql.session.timeZone": "UTC"})


def lake_targets(tmp: Path) -> list[dict[str, Any]]:
    from txsink.spark import target

    return [target("delta", "delta", path=str(tmp / "delta")),
            target("iceberg", "iceberg", warehouse=str(tmp / "wh"), table="db.events"),
            target("files", "files", select=["id", "key", "amount"],
                   path=str(tmp / "files"))]


def delta_rows(tmp: Path) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(str(tmp / "delta")).to_pyarrow_table().to_pylist()


def iceberg_table(tmp: Path) -> Any:
    return IcebergBackend("db.events", str(tmp / "wh"))._load()


def test_group_stream_into_delta_and_iceberg_on_spark_writer(spark: Any, tmp_path: Path
                                                             ) -> None:
    from pyspark.sql import functions as F
    from txsink.spark import targets

    want = make_input(tmp_path / "in", files=2, rows_per_file=200)
    group = targets(GROUP, lake_targets(tmp_path),
                    checkpoint_location=str(tmp_path / "chk"))

    def run() -> None:
        src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
               .json(str(tmp_path / "in"))
               .withColumn("at", F.timestamp_seconds(F.col("id"))))
        query = group.write_stream(src).trigger(availableNow=True).start()
        assert query.awaitTermination(180), "the stream did not finish"
        assert query.exception() is None

    run()
    for rows in (delta_rows(tmp_path), iceberg_table(tmp_path).scan().to_arrow().to_pylist(),
                 read_files_output(tmp_path / "files")):
        assert summarize(rows) == want
    assert {r["at"].timestamp() for r in delta_rows(tmp_path)} == {
        float(r["id"]) for r in delta_rows(tmp_path)}
    delta_sink = target_sink_id(GROUP, "delta")
    entries = [e["txsink.epoch"] for e in log_entries(tmp_path / "delta")
               if e.get("txsink.sink") == delta_sink]
    assert entries == ["0", "1"]
    assert [s.summary["txsink.epoch"] for s in iceberg_table(tmp_path).snapshots()] == [
        "0", "1"]

    # Spark's commit log one behind: batch 1 runs again, and is written once.
    for name in ("1", ".1.crc"):
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    run()
    assert summarize(delta_rows(tmp_path)) == want
    assert summarize(iceberg_table(tmp_path).scan().to_arrow().to_pylist()) == want
    assert summarize(read_files_output(tmp_path / "files")) == want
    assert len(log_entries(tmp_path / "delta")) == 1 + 2  # CREATE TABLE + one per batch
    assert len(iceberg_table(tmp_path).snapshots()) == 2
    # Nothing prepared is left behind in either table's directory.
    from txsink.group import TargetGroup
    from txsink.targets import parse_targets

    tg = TargetGroup.from_specs(GROUP, parse_targets(lake_targets(tmp_path), GROUP))
    for name in ("delta", "iceberg"):
        m = tg.member(name)
        assert list(m.backend.list_prepared(m.sink_id)) == [], name

    # The stream binds the state as the data source's stream does: a batch write of the
    # group would take the number of one of its next batches, and is refused before
    # anything is written (the batch-then-stream test below writes a batch on the native
    # path).
    from txsink.errors import StateError

    extra = spark.range(10_000, 10_050).selectExpr(
        "id", "CAST(id % 7 AS INT) AS key", "id AS amount", "timestamp_seconds(id) AS at")
    with pytest.raises(StateError, match="a streaming query writes through"):
        targets(GROUP, lake_targets(tmp_path), checkpoint_location=str(tmp_path / "chk")
                ).write(extra)
    assert len(delta_rows(tmp_path)) == 400
    assert iceberg_table(tmp_path).scan().to_arrow().num_rows == 400
    assert len(read_files_output(tmp_path / "files")) == 400


@pytest.mark.promise("backfill-then-stream-above", "native")
@pytest.mark.promise("committed-replay-aborted", "native")
def test_one_files_sink_batch_then_stream_with_a_replay_on_spark_writer(
        spark: Any, tmp_path: Path) -> None:
    """The files backend on the native path (tests/e2e/test_files_native_spark.py has
    the long runs): one sink (a ``TargetSet`` of one files target, as a pipeline file's
    ``sink:`` runs it), a batch write, then a stream into the same target with a
    replayed batch; about 50 s under load, in this module's Spark session."""
    from txsink.files.backend import FilesBackend

    from tests.e2e.spark_harness import leftover_files
    from tests.e2e.test_files_native_spark import one_sink, staged, stream

    out = tmp_path / "out"
    sink = one_sink(tmp_path)
    assert sink.native()
    backfill = spark.range(100_000, 100_050).selectExpr(
        "id", "CAST(id % 7 AS INT) AS key", "id AS amount")
    sink.write(backfill)  # epoch 0, before any stream
    want = make_input(tmp_path / "in", files=2, rows_per_file=200)
    stream(spark, sink, tmp_path)
    # Spark's commit log one behind: batch 1 runs again and is written once.
    for name in ("1", ".1.crc"):
        (tmp_path / "chk" / "commits" / name).unlink(missing_ok=True)
    stream(spark, sink, tmp_path)
    rows = read_files_output(out)
    streamed = [r for r in rows if r["id"] < 100_000]
    assert summarize(streamed) == want
    assert sorted(r["id"] for r in rows if r["id"] >= 100_000) == list(range(100_000, 100_050))
    # Microsecond timestamps, as txsink's own writer writes them (Spark's default: INT96).
    assert {r["at"].timestamp() for r in streamed} == {float(r["id"]) for r in streamed}
    # Whole epochs under the backend's final names; nothing staged or pending is left.
    names = sorted(p.name for p in out.glob("part-*"))
    assert {n[5:15] for n in names} == {"0000000000", "0000000001", "0000000002"}
    assert staged(out) == [] and leftover_files(out) == []
    backend = FilesBackend(str(out))
    assert [backend.holds_epoch("native-one", e) for e in range(4)] == [True] * 3 + [False]


@long_run
def test_pipeline_file_with_table_targets_runs_on_spark_writer(tmp_path: Path) -> None:
    """``txsink run`` of examples/pipelines/orders_lake.yaml: the rate source's rows
    0..n-1 in both tables, each committed batch one log entry and one snapshot."""
    import subprocess

    from tests.e2e.test_cli_demo import REPO, _txsink_run

    env = {**os.environ, "TXSINK_DEMO_DIR": str(tmp_path / "lake"),
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)
    stdout = _txsink_run("orders_lake.yaml", env, "--max-batches", "2")
    assert "batch 1: " in stdout, stdout
    from deltalake import DeltaTable

    delta = sorted(r["order_id"] for r in DeltaTable(
        str(tmp_path / "lake" / "delta" / "orders")).to_pyarrow_table().to_pylist())
    iceberg = sorted(r["order_id"] for r in IcebergBackend(
        "shop.orders", str(tmp_path / "lake" / "warehouse"))._load().scan()
        .to_arrow().to_pylist())
    assert delta == iceberg == list(range(len(delta)))
    # `txsink cut` reads each table's own markers: both hold the same epochs.
    import json

    cut = subprocess.run([sys.executable, "-m", "txsink.cli", "cut", "--json",
                          str(REPO / "examples/pipelines/orders_lake.yaml")], env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    assert cut.returncode == 0, cut.stdout + cut.stderr
    found = json.loads(cut.stdout)
    assert found["cut"] >= 1, found


def test_a_pipeline_group_with_a_table_and_a_select_gives_each_target_its_columns(
        spark: Any, tmp_path: Path) -> None:
    """The frame ``txsink run`` writes for a group with a table target and a target with
    ``select``. Seen: the first batch failed (UNRESOLVED_COLUMN `id`): the table path,
    which applies each target's select itself, got the frame already shaped for txsink's
    data source (struct columns)."""
    from txsink.config import parse_pipeline
    from txsink.plugins import get_plugins
    from txsink.spark.pipeline import pipeline_frame
    from txsink.spark.run_batch import run_batch

    want = make_input(tmp_path / "in", files=1, rows_per_file=60)
    cfg = parse_pipeline({
        "name": "lake-select", "mode": "batch",
        "source": {"type": "files", "path": str(tmp_path / "in"), "format": "json",
                   "schema": SCHEMA},
        "sink": {"sink_id": "lake-select", "targets": [
            {"name": "lake", "backend": "delta", "options": {"path": str(tmp_path / "delta")}},
            {"name": "files", "backend": "files", "select": ["id", "amount * 2 AS twice"],
             "options": {"path": str(tmp_path / "files")}}]},
        "checkpoint": str(tmp_path / "chk")})
    store = get_plugins().state_store(f"{cfg.checkpoint}/txsink")
    result = run_batch(pipeline_frame(spark, cfg, {}), cfg, store, lambda line: None)
    assert result.epochs == 1
    rows = delta_rows(tmp_path)
    assert summarize(rows) == want
    assert set(rows[0]) == {"id", "key", "amount"}
    files = read_files_output(tmp_path / "files")
    assert sorted((r["id"], r["twice"]) for r in files) == sorted(
        (r["id"], r["amount"] * 2) for r in rows)
