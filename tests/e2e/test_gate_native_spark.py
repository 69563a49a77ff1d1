"""The native path's gate on Spark itself, through ``txsink run`` (issue 39, items 3, 4
and 14): a group of Parquet files targets streamed by Spark's own writer, with a batch
whose rows the transform filters out and a target whose ``where`` matches nothing.

Before: the empty epoch failed after the decision (``min() arg is an empty sequence``)
and stayed DECIDED at every restart; a stream that ended normally left its lease held
(its driver's token differed from the workers'), and ``txsink status`` said it
crashed. tests/unit/test_gate_native.py has the fast cases without a JVM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from txsink.state import DirectoryStateStore, EpochState

from tests.e2e.spark_harness import (
    SCHEMA,
    kill_group,
    leftover_files,
    local_spark,
    make_input,
    read_files_output,
    summarize,
)
from tests.long_runs import long_run

pytestmark = [pytest.mark.spark, pytest.mark.slow]

TXSINK = [sys.executable, "-m", "txsink.cli"]


def _pipeline(tmp_path: Path) -> Path:
    text = f"""
name: gate-native
source:
  type: files
  format: json
  path: {tmp_path / "in"}
  schema: "id LONG, amount LONG"
  options:
    maxFilesPerTrigger: 1
transform: SELECT id, amount FROM source WHERE amount > 0
sink:
  sink_id: gate-native
  targets:
    - name: all
      backend: files
      options:
        path: {tmp_path / "all"}
    - name: big
      backend: files
      where: amount > 1000
      options:
        path: {tmp_path / "big"}
checkpoint: {tmp_path / "chk"}
trigger:
  available_now: true
spark:
  master: local[2]
  conf:
    spark.ui.enabled: false
"""
    path = tmp_path / "gate.yaml"
    path.write_text(text)
    return path


@pytest.mark.promise("run-releases-lease", "native")
def test_empty_batches_commit_and_a_stream_that_ends_releases_its_lease(
        tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    files = {  # one micro-batch each (maxFilesPerTrigger: 1)
        "0.json": [(i, 5) for i in range(0, 50)],
        "1.json": [(i, -1) for i in range(50, 80)],  # the transform keeps none
        "2.json": [(i, 2000) for i in range(80, 90)],  # the only rows of target big
    }
    for name, rows in files.items():
        (tmp_path / "in" / name).write_text(
            "".join(json.dumps({"id": i, "amount": a}) + "\n" for i, a in rows))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)
    proc = subprocess.Popen([*TXSINK, "run", str(_pipeline(tmp_path))], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        kill_group(proc.pid)
    assert proc.returncode == 0, stdout + stderr[-4000:]
    assert "done (query finished)" in stdout, stdout
    assert sorted(r["id"] for r in read_files_output(tmp_path / "all")) == [
        *range(0, 50), *range(80, 90)]
    assert sorted(r["id"] for r in read_files_output(tmp_path / "big")) == list(range(80, 90))
    assert leftover_files(tmp_path / "all") == leftover_files(tmp_path / "big") == []

    status = subprocess.run([*TXSINK, "status", str(tmp_path / "chk"), "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    state = json.loads(status.stdout)
    assert state["in_doubt"] == [], state
    assert [e["state"] for e in state["epochs"]] == ["committed"] * 3, state["epochs"]
    assert state["lease"]["held"] is False, state["lease"]


#: A JVM that starts a command twice, one run after the other, as a CI agent or a
#: scheduler (Jenkins, Oozie, Rundeck: JVMs) runs a job twice while it lives itself.
_LAUNCHER = """
public class Launch {
    public static void main(String[] args) throws Exception {
        for (int run = 0; run < 2; run++) {
            Process p = new ProcessBuilder(args).inheritIO().start();
            System.out.println("LAUNCHER run " + run + " exit " + p.waitFor());
        }
    }
}
"""


@long_run
@pytest.mark.skipif(shutil.which("java") is None, reason="needs a java launcher on PATH")
def test_txsink_run_started_by_another_jvm_releases_its_lease(tmp_path: Path) -> None:
    """The native path's driver side named the nearest JVM above it as the lease owner:
    the launching JVM, not Spark's. ``txsink run`` released its Spark JVM's lease, so the
    launcher's stayed held, and the launcher's second run was refused (``checkpoint ...
    is in use by another run``) for as long as the launcher lived."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "0.json").write_text(
        "".join(json.dumps({"id": i, "amount": 5}) + "\n" for i in range(40)))
    launcher = tmp_path / "Launch.java"
    launcher.write_text(_LAUNCHER)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("TXSINK_FAULTS", None)
    env.pop("TXSINK_OWNER", None)
    proc = subprocess.Popen(["java", str(launcher), *TXSINK, "run", str(_pipeline(tmp_path))],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        kill_group(proc.pid)
    assert "LAUNCHER run 0 exit 0" in stdout, stdout + stderr[-4000:]
    assert "in use by another run" not in stdout + stderr, stdout + stderr[-4000:]
    assert "LAUNCHER run 1 exit 0" in stdout, stdout + stderr[-4000:]
    assert sorted(r["id"] for r in read_files_output(tmp_path / "all")) == list(range(40))
    assert DirectoryStateStore(tmp_path / "chk" / "txsink").lease_info().get(
        "released_at") is not None


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    yield from local_spark("txsink-gate-native")


@pytest.mark.promise("native-empty-epoch-normal", "native")
def test_a_stateful_querys_no_data_batch_is_a_normal_epoch(spark: Any, tmp_path: Path) -> None:
    """Item 3: an aggregation with a watermark runs a batch without input rows (to move
    the watermark and emit what it closed); on Spark's own writer that epoch has no
    file with rows, and it failed after the decision."""
    from pyspark.sql import functions as F
    from txsink.spark.group import TargetSet
    from txsink.targets import TargetSpec

    make_input(tmp_path / "in", files=2, rows_per_file=50)
    src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
           .json(str(tmp_path / "in")).withColumn("at", F.timestamp_seconds("id"))
           .withWatermark("at", "1 second")
           .groupBy(F.window("at", "10 seconds")).agg(F.count("*").alias("n"))
           .select(F.col("window.start").cast("long").alias("start"), "n"))
    sink = TargetSet("stateful", [TargetSpec("stateful", "files", {"path": str(tmp_path / "out")})],
                     checkpoint_location=str(tmp_path / "chk"), single=True)
    query = sink.write_stream(src).outputMode("append").trigger(availableNow=True).start()
    assert query.awaitTermination(180), "the stream did not finish"
    assert query.exception() is None, query.exception()
    store = DirectoryStateStore(tmp_path / "chk" / "txsink")
    states = store.states()
    assert states and set(states.values()) == {EpochState.COMMITTED}, states
    rows = read_files_output(tmp_path / "out")
    assert sum(r["n"] for r in rows) <= 100 and len({r["start"] for r in rows}) == len(rows)


@pytest.mark.promise("checkpoint-replaced-refused", "native")
@long_run
def test_a_native_stream_on_a_replaced_checkpoint_is_refused_on_spark(
        spark: Any, tmp_path: Path) -> None:
    """Item 1 on Spark itself: ``write_stream`` with a separate ``state_location``, the
    checkpoint deleted. Spark's query id reaches the ``foreachBatch`` function as a
    local property; the new query's first batch is refused, nothing is written."""
    from pyspark.sql import functions as F
    from txsink.spark import target, targets

    want = make_input(tmp_path / "in", files=2, rows_per_file=100)
    group = targets("replaced", [target("a", "files", path=str(tmp_path / "a")),
                                 target("b", "files", path=str(tmp_path / "b"))],
                    checkpoint_location=str(tmp_path / "chk"),
                    state_location=str(tmp_path / "state"))

    def run() -> Any:
        src = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
               .json(str(tmp_path / "in")).withColumn("at", F.timestamp_seconds("id")))
        query = group.write_stream(src).trigger(availableNow=True).start()
        try:
            finished = query.awaitTermination(180)
        except Exception:  # a failed query raises here: it finished, with its error
            finished = True
        assert finished, "the stream did not finish"
        return query.exception()

    assert run() is None
    shutil.rmtree(tmp_path / "chk")
    failure = run()
    assert failure is not None and "deleted or replaced" in str(failure), failure
    for t in ("a", "b"):
        assert summarize(read_files_output(tmp_path / t)) == want, t
        assert leftover_files(tmp_path / t) == []
