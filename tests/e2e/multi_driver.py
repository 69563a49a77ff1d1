"""A Spark driver writing one group of targets, in a subprocess the tests can SIGKILL.

Two modes over the same input (JSON-lines files, one micro-batch per file,
``availableNow``, as :mod:`tests.e2e.spark_harness`):

* ``stream``: ``txsink.spark.targets(...).write_stream(frame)``: each task writes every
  target, one decision per micro-batch;
* ``foreach``: ``foreachBatch`` with ``txsink.spark.epoch(...)``: one Spark job per
  target prepares it, the block's end decides. ``raise_at`` makes the block raise after
  its first write in that batch (once: a marker file remembers it), which must abort
  every target's participants.

    python tests/e2e/multi_driver.py SPEC_JSON
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.e2e.spark_harness import SCHEMA, DriverRun, finish_driver

ROOT = Path(__file__).resolve().parents[2]


def start(spec: Mapping[str, Any], *, faults: str | None = None,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    child_env = dict(os.environ if env is None else env)
    child_env.pop("TXSINK_FAULTS", None)
    if faults:
        child_env["TXSINK_FAULTS"] = faults
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    child_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.multi_driver", json.dumps(spec)], cwd=ROOT,
        env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)


def run(spec: Mapping[str, Any], *, faults: str | None = None, timeout_s: float = 900,
        env: Mapping[str, str] | None = None) -> DriverRun:
    """Run the driver to its end (or its death at ``faults``); never leaves a process."""
    started = time.monotonic()
    return finish_driver(start(spec, faults=faults, env=env), timeout_s, started)


def _drive(spec: dict[str, Any]) -> None:
    if os.environ.get("TXSINK_FAULTS"):
        # Driver, JVM and Python workers die together, like a lost driver machine.
        os.environ["TXSINK_FAULTS_KILL_PID"] = str(-os.getpgrp())
    import txsink.spark as ts
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(spec.get("master", "local[2,4]"))
               .appName("txsink-multi-e2e").config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN")
               .config("spark.sql.shuffle.partitions", str(spec.get("partitions", 2))))
    for key, value in spec.get("conf", {}).items():  # e.g. a standalone cluster's
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    ts.register(spark)
    frame = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
             .json(spec["input_dir"]).repartition(spec.get("partitions", 2)))
    if spec["mode"] == "stream":
        group = ts.targets(spec["sink_id"], spec["targets"],
                           checkpoint_location=spec["checkpoint"])
        query = group.write_stream(frame).trigger(availableNow=True).start()
    else:
        group = ts.targets(spec["sink_id"], spec["targets"], state_location=spec["state"])
        marker = Path(spec["state"] + "-raised")
        raise_at = spec.get("raise_at")

        def batch(df: Any, batch_id: int) -> None:
            with group.epoch(df.sparkSession, version=batch_id) as tx:
                for i, name in enumerate(group.names):
                    tx.write(df, name)
                    if i == 0 and batch_id == raise_at and not marker.exists():
                        marker.write_text("raised")
                        raise RuntimeError(f"raised in the block of batch {batch_id}")

        query = (frame.writeStream.foreachBatch(batch)
                 .option("checkpointLocation", spec["checkpoint"])
                 .trigger(availableNow=True).start())
    query.awaitTermination()
    batches = [p["batchId"] for p in query.recentProgress]
    spark.stop()
    print(f"TXSINK-DRIVER-DONE batches={batches}", flush=True)


if __name__ == "__main__":
    _drive(json.loads(sys.argv[1]))
