"""A Spark driver for batch-write tests: run as a subprocess by :func:`run_batch_driver`.

Modes (``spec["mode"]``):

* ``save``: one ``df.write.format("txsink")`` of the JSON input, with ``options``.
* ``threads``: two saves of two inputs from two threads of one SparkSession at once.
* ``foreach``: a stream over the JSON input (one file per micro-batch, or
  ``max_files_per_trigger``) whose ``foreachBatch`` batch-writes each micro-batch with
  ``txnAppId``/``txnVersion`` (and ``txnStreamCheckpoint`` when
  ``name_stream_checkpoint``).

Like :mod:`tests.e2e.spark_harness`, the driver runs in its own session so a fault
kill (or a test failure) takes its JVM and Python workers with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from tests.e2e.spark_harness import SCHEMA, DriverRun, finish_driver


def run_batch_driver(spec: Mapping[str, Any], *, faults: str | None = None,
                     env: Mapping[str, str] | None = None,
                     timeout_s: float = 240) -> DriverRun:
    child_env = dict(os.environ if env is None else env)
    child_env.pop("TXSINK_FAULTS", None)
    if faults:
        child_env["TXSINK_FAULTS"] = faults
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    child_env["SPARK_LOCAL_IP"] = "127.0.0.1"
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tests.e2e.batch_driver", json.dumps(spec)],
                            env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    return finish_driver(proc, timeout_s, started)


def _save(spark: Any, spec: Mapping[str, Any], input_dir: str,
          extra: Mapping[str, str] | None = None) -> None:
    (spark.read.schema(SCHEMA).json(input_dir).repartition(2)
     .write.format("txsink").mode("append")
     .option("backend", spec.get("backend", "files")).option("sink_id", spec["sink_id"])
     .option("checkpointLocation", spec["checkpoint"])
     .options(**spec.get("options", {})).options(**(extra or {})).save())


def _drive(spec: Mapping[str, Any]) -> None:
    if os.environ.get("TXSINK_FAULTS"):
        os.environ["TXSINK_FAULTS_KILL_PID"] = str(-os.getpgrp())
    from pyspark.sql import SparkSession
    from txsink.spark import register

    spark = (SparkSession.builder.master("local[2]").appName("txsink-batch-e2e")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "WARN")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    register(spark)
    mode = spec["mode"]
    if mode == "save":
        _save(spark, spec, spec["input_dir"])
    elif mode == "threads":
        errors: list[BaseException] = []
        gate = threading.Barrier(2)

        def one(input_dir: str) -> None:
            try:
                # Spark looks Python data sources up in the JVM thread's active
                # session, which a new thread does not inherit.
                spark._jvm.SparkSession.setActiveSession(spark._jsparkSession)
                gate.wait()
                _save(spark, spec, input_dir)
            except BaseException as exc:  # reported below, the test reads the output
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(d,)) for d in spec["input_dirs"]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for exc in errors:
            print(f"TXSINK-THREAD-ERROR {type(exc).__name__}: {exc}", flush=True)
    elif mode == "foreach":
        def write_batch(frame: Any, batch_id: int) -> None:
            frame.write.format("txsink").mode("append") \
                .option("backend", spec.get("backend", "files")) \
                .option("sink_id", spec["sink_id"]) \
                .option("checkpointLocation", spec["state"]) \
                .option("txnAppId", spec["app_id"]).option("txnVersion", batch_id) \
                .options(**({"txnStreamCheckpoint": spec["checkpoint"]}
                            if spec.get("name_stream_checkpoint") else {})) \
                .options(**spec.get("options", {})).save()

        query = (spark.readStream.schema(SCHEMA)
                 .option("maxFilesPerTrigger", spec.get("max_files_per_trigger", 1))
                 .json(spec["input_dir"]).repartition(2).writeStream
                 .option("checkpointLocation", spec["checkpoint"])
                 .foreachBatch(write_batch).trigger(availableNow=True).start())
        query.awaitTermination()
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    spark.stop()
    print("TXSINK-DRIVER-DONE", flush=True)


if __name__ == "__main__":
    _drive(json.loads(sys.argv[1]))
