"""The files backend on the native data path, through real Spark: Spark's own Parquet
writer stages each epoch's files, the driver records them and publishes them by link.

The default run's test is in tests/e2e/test_lake_spark.py (it shares that module's
Spark session): one sink, a batch write, then a stream with a replayed batch. Here, for
the long runs: a reset checkpoint refused; a group whose files target takes Spark's
writer beside one that keeps txsink's (JSON lines, an epoch column); ``txsink run`` of a
pipeline file.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.files.backend import FilesBackend
from txsink.spark.group import TargetSet
from txsink.targets import TargetSpec, target_sink_id

from tests.e2e.spark_harness import (
    SCHEMA,
    leftover_files,
    local_spark,
    make_input,
    read_files_output,
    summarize,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, long_run]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-files-native", **{"spark.sql.session.timeZone": "UTC"})


def staged(out: Path) -> list[str]:
    staging = out / "_txsink" / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []


def one_sink(tmp_path: Path) -> TargetSet:
    return TargetSet("native-one", [TargetSpec("native-one", "files",
                                               {"path": str(tmp_path / "out")})],
                     checkpoint_location=str(tmp_path / "chk"), single=True)


def stream(spark: Any, sink: TargetSet, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
           .json(str(tmp_path / "in")).withColumn("at", F.timestamp_seconds("id")))
    query = sink.write_stream(src).trigger(availableNow=True).start()
    assert query.awaitTermination(180), "the stream did not finish"
    assert query.exception() is None


@pytest.mark.promise("checkpoint-deleted-with-state-refused", "native")
@long_run
def test_a_reset_checkpoint_of_a_native_files_sink_is_refused(spark: Any,
                                                              tmp_path: Path) -> None:
    """Deleted with the txsink state inside it: Spark numbers batches from 0 again under
    a new query id; the directory's owner record refuses the new state before anything
    is written."""
    want = make_input(tmp_path / "in", files=2, rows_per_file=100)
    stream(spark, one_sink(tmp_path), tmp_path)
    shutil.rmtree(tmp_path / "chk")
    with pytest.raises(Exception, match="already written by another query"):
        stream(spark, one_sink(tmp_path), tmp_path)
    assert summarize(read_files_output(tmp_path / "out")) == want
    assert staged(tmp_path / "out") == []


# tests/e2e/test_lake_spark.py streams a files target in a group on this path in the
# default run; this one (an epoch column, a JSON-lines target beside it) costs 40 s more.
@long_run
def test_group_files_target_on_spark_writer_beside_txsinks_writer(spark: Any,
                                                                   tmp_path: Path) -> None:
    from txsink.spark import target, targets

    want = make_input(tmp_path / "in", files=2, rows_per_file=150)
    group = targets("native-group", [
        target("parquet", "files", path=str(tmp_path / "parquet"), epoch_column="txsink_epoch"),
        target("jsonl", "files", path=str(tmp_path / "jsonl"), format="jsonl")],
        checkpoint_location=str(tmp_path / "chk"))
    src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
           .json(str(tmp_path / "in")))
    query = group.write_stream(src).trigger(availableNow=True).start()
    assert query.awaitTermination(180) and query.exception() is None
    parquet, jsonl = (read_files_output(tmp_path / n) for n in ("parquet", "jsonl"))
    assert summarize(parquet) == summarize(jsonl) == want
    assert {r["txsink_epoch"] for r in parquet} == {0, 1}
    assert staged(tmp_path / "parquet") == []
    assert leftover_files(tmp_path / "jsonl") == []
    sink = target_sink_id("native-group", "parquet")
    assert FilesBackend(str(tmp_path / "parquet")).holds_epoch(sink, 1)


@long_run
def test_pipeline_file_with_a_files_sink_runs_on_spark_writer(tmp_path: Path) -> None:
    """``txsink run`` of a pipeline file whose one sink is files in Parquet: each batch's
    files written by Spark, published under the backend's names; a second run after
    more input adds its batches once; ``txsink cut`` reads the epoch markers."""
    import json
    import os
    import subprocess
    import sys

    from tests.e2e.spark_harness import kill_group

    want = make_input(tmp_path / "in", files=2, rows_per_file=150)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(json.dumps({
        "name": "native-files", "source": {"type": "files", "format": "json",
                                           "path": str(tmp_path / "in"), "schema": SCHEMA,
                                           "options": {"maxFilesPerTrigger": 1}},
        "sink": {"backend": "files", "sink_id": "native-pipe",
                 "options": {"path": str(tmp_path / "out")}},
        "checkpoint": str(tmp_path / "chk"), "trigger": {"available_now": True},
        "spark": {"master": "local[2]", "conf": {"spark.ui.enabled": "false"}}}))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)

    def txsink(*args: str) -> str:
        proc = subprocess.Popen([sys.executable, "-m", "txsink.cli", *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            kill_group(proc.pid)
        assert proc.returncode == 0, stdout + stderr[-4000:]
        return stdout

    txsink("run", str(pipeline))
    assert summarize(read_files_output(tmp_path / "out")) == want
    extra = [{"id": i, "key": i % 7, "amount": i} for i in range(1000, 1100)]
    later = tmp_path / "in" / "input-0009.json"
    later.write_text("".join(json.dumps(r) + "\n" for r in extra))
    os.utime(later, (1_700_000_100, 1_700_000_100))
    txsink("run", str(pipeline))
    rows = read_files_output(tmp_path / "out")
    assert summarize(rows) == summarize([*(r for r in rows if r["id"] < 1000), *extra])
    assert summarize(r for r in rows if r["id"] < 1000) == want and len(rows) == 400
    names = sorted(p.name for p in (tmp_path / "out").glob("part-*"))
    assert {n[5:15] for n in names} == {"0000000000", "0000000001", "0000000002"}, names
    assert all(n.endswith(".parquet") and len(n) == len("part-0000000000-00000.parquet")
               for n in names)
    assert staged(tmp_path / "out") == [] and leftover_files(tmp_path / "out") == []
    cut = json.loads(txsink("cut", "--json", str(pipeline)))
    assert cut["cut"] == 2, cut


@pytest.mark.promise("replanned-batch-refused", "native")
@long_run
def test_a_checkpoint_restored_from_an_older_copy_stops_instead_of_losing_rows(
        spark: Any, tmp_path: Path) -> None:
    """Spark's own offset log: a copy of the checkpoint (the state inside) taken after
    two batches, two more batches, the copy put back. Spark plans batch 2 anew (a file
    source's offset is an index into its own log, which went back with the copy: only
    the entry's plan differs); taken for a replay by its number it would be skipped, and
    the files that arrived since lost. Refused, nothing written; the newest copy put
    back, the stream finishes exactly once."""
    chk, out = tmp_path / "chk", tmp_path / "out"
    make_input(tmp_path / "in", files=2, rows_per_file=100)
    stream(spark, one_sink(tmp_path), tmp_path)
    shutil.copytree(chk, tmp_path / "copy")
    four = make_input(tmp_path / "in", files=4, rows_per_file=100)
    stream(spark, one_sink(tmp_path), tmp_path)
    shutil.copytree(chk, tmp_path / "newest")
    shutil.rmtree(chk)
    shutil.copytree(tmp_path / "copy", chk)
    want = make_input(tmp_path / "in", files=5, rows_per_file=100)
    with pytest.raises(Exception, match="planned micro-batch 2 anew"):
        stream(spark, one_sink(tmp_path), tmp_path)
    assert summarize(read_files_output(out)) == four
    assert staged(out) == []
    shutil.rmtree(chk)
    shutil.copytree(tmp_path / "newest", chk)
    stream(spark, one_sink(tmp_path), tmp_path)
    assert summarize(read_files_output(out)) == want
    assert leftover_files(out) == []
