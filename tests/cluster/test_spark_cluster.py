"""The standalone-cluster launcher itself: a killed worker comes back, and stopping
leaves no process behind (master, workers, executors)."""

from __future__ import annotations

import os

import pytest
from txsink.testing.spark_cluster import SparkStandaloneCluster, descendants

from tests.long_runs import cluster_run

from .conftest import _missing

pytestmark = [pytest.mark.spark, pytest.mark.slow, cluster_run]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_killed_worker_restarts_and_stop_leaves_nothing(tmp_path: os.PathLike[str]) -> None:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    cluster = SparkStandaloneCluster(workers=1, directory=tmp_path)
    try:
        cluster.start()
        assert cluster.alive_workers() == 1
        old = cluster.worker_pid(0)
        cluster.kill_worker(0)
        assert not _alive(old)
        cluster.restart_worker(0)
        assert cluster.worker_pid(0) != old
        assert cluster.alive_workers() >= 1
        assert cluster.master is not None
        pids = [cluster.master.pid, cluster.worker_pid(0),
                *descendants(cluster.master.pid), *descendants(cluster.worker_pid(0))]
    finally:
        cluster.cleanup()
    assert [p for p in pids if _alive(p)] == []
    assert "Starting Spark master" in (tmp_path / "master.log").read_text()  # type: ignore[operator]
