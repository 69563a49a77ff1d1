"""What ``test_interrupt.py`` interrupts: not collected by the default run (no ``test_``
prefix); run on its own in a child pytest. It starts what a real run holds at once
(PostgreSQL, SeaweedFS, a Spark driver in its own session (paused mid-epoch if it gets there), and a
SparkContext in pytest's own process, whose PySpark replaces the SIGINT handler), says
so in ``$TXSINK_INTERRUPT_READY/ready``, and waits to be interrupted."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.spark_harness import DriverSpec, kill_group, make_input, start_driver


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


@pytest.fixture
def servers() -> Iterator[None]:
    from txsink_postgres.testing import LocalPostgres
    from txsink_s3.testing import LocalSeaweedFS

    with LocalPostgres(), LocalSeaweedFS():
        yield


@pytest.fixture
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("txsink-interrupt")
               .config("spark.ui.enabled", "false").getOrCreate())
    yield session
    session.stop()


def test_wait_for_interrupt(servers: None, spark: Any, tmp_path: Path) -> None:
    ready = Path(os.environ["TXSINK_INTERRUPT_READY"])
    make_input(tmp_path / "in", files=2, rows_per_file=10)
    driver = start_driver(DriverSpec(input_dir=tmp_path / "in", checkpoint=tmp_path / "chk",
                                     sink_id="interrupted",
                                     options={"path": str(tmp_path / "out")}),
                          faults="before-decide@0:pause",
                          env={**os.environ, "TXSINK_FAULTS_PAUSE_DIR": str(ready)})
    try:
        assert spark.range(3).count() == 3
        deadline = time.monotonic() + 300
        while not any(_children(driver.pid)):  # the driver's JVM: Spark is starting there
            assert driver.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (ready / "ready").touch()
        threading.Event().wait(600)
    finally:
        kill_group(driver.pid)
