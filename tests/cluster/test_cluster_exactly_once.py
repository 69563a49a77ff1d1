"""Exactly-once on a Spark standalone cluster: executors are separate JVMs, and they die.

The driver runs in client mode in its own process group (see
:mod:`tests.e2e.spark_harness`); the executors run under the cluster's workers. A
fault that fires in a task SIGKILLs the *executor JVM* running it (``kill-jvm``), so
Spark loses the executor, its shuffle output and the task, and has to rerun them on
another executor; a fault in the coordinator SIGKILLs the whole driver.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from txsink.faults import ONCE_DIR_ENV, fired
from txsink.testing.spark_cluster import SparkStandaloneCluster

from tests.e2e.spark_harness import (
    DriverSpec,
    leftover_files,
    make_input,
    read_files_output,
    run_driver,
    summarize,
)
from tests.long_runs import cluster_run

pytestmark = [pytest.mark.spark, pytest.mark.fault, pytest.mark.slow, cluster_run]

TIMEOUT_S = 900


def cluster_conf(cluster: SparkStandaloneCluster, faults: str | None,
                 once_dir: Path) -> dict[str, str]:
    """Driver settings; faults reach executors (and driver-side Python workers, which
    get ``spark.executorEnv`` too) through ``spark.executorEnv``."""
    conf = cluster.driver_conf()
    conf.pop("spark.master")
    conf[f"spark.executorEnv.{ONCE_DIR_ENV}"] = str(once_dir)
    if faults:
        conf["spark.executorEnv.TXSINK_FAULTS"] = faults
    return conf


def test_executor_killed_mid_write_and_driver_killed_after_the_decision(
        spark_cluster: SparkStandaloneCluster, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    once = tmp_path / "faults-fired"
    once.mkdir()
    monkeypatch.setenv(ONCE_DIR_ENV, str(once))
    expected = make_input(tmp_path / "in", files=3, rows_per_file=200)
    out = tmp_path / "out"  # the same disk for driver and executors: one machine
    spec = DriverSpec(input_dir=tmp_path / "in", checkpoint=tmp_path / "chk", sink_id="cl1",
                      options={"path": str(out), "format": "jsonl"},
                      master=spark_cluster.master_url)
    faults = "task-before-pre-commit@1:kill-jvm,after-decide@2:kill"
    spec.conf = cluster_conf(spark_cluster, faults, once)
    first = run_driver(spec, faults=faults, timeout_s=TIMEOUT_S)
    first.check_killed("after-decide@2")
    assert fired(once) == ["after-decide@2:kill", "task-before-pre-commit@1:kill-jvm"]
    assert "Lost executor" in first.output, first.output[-3000:]
    assert leftover_files(out) != []  # epoch 2 is decided, its files still pending

    spec.conf = cluster_conf(spark_cluster, None, once)
    second = run_driver(spec, timeout_s=TIMEOUT_S).check()
    assert "epoch=2: found DECIDED but not COMMITTED" in second.output

    assert summarize(read_files_output(out)) == expected
    assert leftover_files(out) == []
    assert spark_cluster.alive_workers() == 2
