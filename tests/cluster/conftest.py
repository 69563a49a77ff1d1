"""A Spark standalone cluster (master + two workers, 1 core / 1 GiB each) on 127.0.0.1,
started once for the session and stopped at its end, also when tests fail.

Skipped with the reason when Java or PySpark is missing. ``TXSINK_SPARK_MASTER``
names an external ``spark://`` master instead (the tests that kill executors or
workers then skip: they can only kill their own).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from txsink.testing.spark_cluster import SparkStandaloneCluster

MASTER_ENV = "TXSINK_SPARK_MASTER"


def _missing() -> str | None:
    if shutil.which("java") is None:
        return "Java is not installed (Spark needs Java 17)"
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "PySpark is not installed (pip install 'txsink[spark]')"
    return None


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkStandaloneCluster]:
    missing = _missing()
    if missing:
        pytest.skip(missing)
    if os.environ.get(MASTER_ENV):
        pytest.skip(f"{MASTER_ENV} names an external cluster; these tests kill executors "
                    "and workers, which they can only do on a cluster they started")
    cluster = SparkStandaloneCluster(workers=2, cores=1, memory="1g")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.cleanup()
