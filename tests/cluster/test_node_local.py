"""A node-local path on a cluster (issue 39, item 4): the executors write the epoch's
files where the driver cannot see them.

The worker runs in a mount namespace of its own with an empty file system on the
target's directory, as a separate machine's local disk would be. Before the gate, the
driver committed whatever it found in the staging directory (nothing), so the epoch was
committed without its rows and no error. Now the rows Spark's tasks reported writing
are compared with the rows the driver finds: the write is refused, naming the cause,
before anything is decided.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from txsink.errors import StateError
from txsink.spark.group import TargetSet
from txsink.state import DirectoryStateStore
from txsink.targets import TargetSpec
from txsink.testing.spark_cluster import SparkStandaloneCluster

from tests.long_runs import cluster_run

pytestmark = [pytest.mark.spark, pytest.mark.slow, cluster_run,
              pytest.mark.skipif(shutil.which("unshare") is None,
                                 reason="util-linux's unshare gives the worker its own disk")]


def test_a_node_local_path_is_refused_instead_of_committed_without_rows(
        tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    out = tmp_path / "out"
    out.mkdir()
    cluster = SparkStandaloneCluster(workers=1, cores=2, memory="1g", node_local=[out],
                                     directory=tmp_path / "cluster")
    cluster.start()
    spark = None
    try:
        builder = SparkSession.builder.appName("txsink-node-local")
        for key, value in cluster.driver_conf().items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        sink = TargetSet("node-local", [TargetSpec("node-local", "files",
                                                   {"path": str(out)})],
                         state_location=str(tmp_path / "state"), single=True)
        frame = spark.range(0, 1000, numPartitions=4).selectExpr("id", "id * 7 AS value")
        with pytest.raises(StateError, match="reported writing 1000 row"):
            sink.write(frame)
        store = DirectoryStateStore(tmp_path / "state")
        assert store.states() == {}, "an epoch was recorded"
        assert sorted(p.name for p in out.glob("part-*")) == []
    finally:
        if spark is not None:
            spark.stop()
        cluster.cleanup()
