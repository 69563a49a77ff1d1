"""A Spark driver running a sequence of writes into one group, in one SparkSession.

What users do with one ``TargetSet`` (issue 31): a backfill (``write``), a stream
(``write_stream``), a batch job with ``txsink.spark.epoch(version=...)``, a stream of
grouped writes in ``foreachBatch`` (``version=batch_id``), and moving input files in
between. Several scenarios (each its own group and checkpoint) share the session, to
pay for one Spark start. Each step prints one ``TXSINK-STEP`` line (JSON: scenario,
op, ok, error) and the run goes on after a failed step, so a test sees what was
refused and what was written.

    python -m tests.e2e.identity_driver SPEC_JSON
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.e2e.spark_harness import SCHEMA, DriverRun, finish_driver

ROOT = Path(__file__).resolve().parents[2]


def run(spec: Mapping[str, Any], *, timeout_s: float = 600) -> DriverRun:
    env = dict(os.environ)
    env.pop("TXSINK_FAULTS", None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.identity_driver", json.dumps(spec)], cwd=ROOT,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    return finish_driver(proc, timeout_s, started)


def steps(run: DriverRun, scenario: str) -> list[dict[str, Any]]:
    """The ``TXSINK-STEP`` results of one scenario of a run, in order."""
    found = [json.loads(line.split("TXSINK-STEP ", 1)[1]) for line in run.output.splitlines()
             if "TXSINK-STEP " in line]
    return [r for r in found if r["scenario"] == scenario]


def _drive(spec: dict[str, Any]) -> None:
    import txsink.spark as ts
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("txsink-identity-e2e")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "ERROR")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    ts.register(spark)
    for name, scenario in spec["scenarios"].items():
        _scenario(spark, name, scenario)
    spark.stop()
    print("TXSINK-DRIVER-DONE", flush=True)


def _scenario(spark: Any, name: str, spec: dict[str, Any]) -> None:
    """One group's steps (one ``TargetSet``, one checkpoint)."""
    import txsink.spark as ts

    group = ts.targets(spec["sink_id"], spec["targets"],
                       checkpoint_location=spec["checkpoint"])

    def stream_frame(path: str) -> Any:
        return (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
                .json(path).repartition(2))

    for step in spec["steps"]:
        op = step["op"]
        try:
            if op == "write":
                group.write(spark.read.schema(SCHEMA).json(step["input"]).repartition(2))
            elif op == "stream":
                query = (group.write_stream(stream_frame(step["input"]))
                         .trigger(availableNow=True).start())
                query.awaitTermination()
            elif op == "epoch":
                df = spark.read.schema(SCHEMA).json(step["input"])
                with group.epoch(spark, version=step["version"]) as tx:
                    for target in group.names:
                        tx.write(df, target)
            elif op == "foreach":
                def batch(df: Any, batch_id: int) -> None:
                    with group.epoch(df.sparkSession, version=batch_id) as tx:
                        for target in group.names:
                            tx.write(df, target)

                query = (stream_frame(step["input"]).writeStream.foreachBatch(batch)
                         .option("checkpointLocation", step["checkpoint"])
                         .trigger(availableNow=True).start())
                query.awaitTermination()
            elif op == "move":
                for f in sorted(Path(step["from"]).iterdir()):
                    shutil.move(str(f), Path(step["to"]) / f.name)
            else:
                raise ValueError(f"unknown step {op!r}")
            result: dict[str, Any] = {"scenario": name, "op": op, "ok": True}
        except Exception as exc:
            result = {"scenario": name, "op": op, "ok": False,
                      "error": f"{type(exc).__name__}: {exc}"}
        print("TXSINK-STEP " + json.dumps(result), flush=True)


if __name__ == "__main__":
    _drive(json.loads(sys.argv[1]))
