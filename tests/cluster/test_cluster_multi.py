"""A group of targets on a Spark standalone cluster: executors are separate JVMs, and die.

One decision per epoch over three files targets (the cluster's workers and the driver
share this machine's disk). An executor JVM is SIGKILLed while its task writes every
target of epoch 1, and the driver is SIGKILLed with epoch 2 committed in one target
only; the restart finishes it in the others. Long (several minutes): runs in the tox
``cluster`` environment (``TXSINK_CLUSTER_LONG=1``), not in the default run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from txsink.faults import ONCE_DIR_ENV, fired
from txsink.state import DirectoryStateStore
from txsink.testing.spark_cluster import SparkStandaloneCluster

from tests.cluster.test_cluster_exactly_once import cluster_conf
from tests.e2e import multi_driver
from tests.e2e.spark_harness import leftover_files, make_input, read_files_output, summarize

LONG_ENV = "TXSINK_CLUSTER_LONG"
pytestmark = [
    pytest.mark.spark, pytest.mark.fault, pytest.mark.slow,
    pytest.mark.skipif(os.environ.get(LONG_ENV) != "1",
                       reason=f"long cluster variant (several minutes): set {LONG_ENV}=1 or "
                              "run `tox -e cluster`"),
]
TIMEOUT_S = 900


def test_group_on_a_cluster_executor_and_driver_killed(
        spark_cluster: SparkStandaloneCluster, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    once = tmp_path / "faults-fired"
    once.mkdir()
    monkeypatch.setenv(ONCE_DIR_ENV, str(once))
    make_input(tmp_path / "in", files=3, rows_per_file=200)
    names = ("a", "b", "c")
    spec = {"mode": "stream", "input_dir": str(tmp_path / "in"),
            "checkpoint": str(tmp_path / "chk"), "sink_id": "cluster-group",
            "master": spark_cluster.master_url,
            "targets": [{"name": n, "backend": "files",
                         "options": {"path": str(tmp_path / n), "format": "jsonl"}}
                        for n in names]}
    faults = "task-before-pre-commit@1:kill-jvm,after-first-commit@2:kill"
    spec["conf"] = cluster_conf(spark_cluster, faults, once)
    first = multi_driver.run(spec, faults=faults, timeout_s=TIMEOUT_S)
    first.check_killed("after-first-commit@2")
    assert fired(once) == ["after-first-commit@2:kill", "task-before-pre-commit@1:kill-jvm"]
    assert "Lost executor" in first.output, first.output[-3000:]
    shown = [summarize(read_files_output(tmp_path / n)) for n in names]
    assert shown[0] != shown[1] or shown[0] != shown[2]  # epoch 2 in some targets only

    spec["conf"] = cluster_conf(spark_cluster, None, once)
    second = multi_driver.run(spec, timeout_s=TIMEOUT_S).check()
    assert "epoch=2: found DECIDED but not COMMITTED" in second.output
    rows = [json.loads(line) for f in sorted((tmp_path / "in").iterdir())
            for line in f.read_text().splitlines()]
    for n in names:
        assert summarize(read_files_output(tmp_path / n)) == summarize(rows), n
        assert leftover_files(tmp_path / n) == [], n
    records = DirectoryStateStore(tmp_path / "chk" / "txsink").records()
    assert all({c.target for c in r.committables} == set(names) for r in records.values())
    assert spark_cluster.alive_workers() == 2
