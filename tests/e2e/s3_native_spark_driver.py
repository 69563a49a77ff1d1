"""A Spark driver streaming JSON-lines files into an S3 target on Spark's own writer
(``writer: spark``), for tests that SIGKILL it at a protocol step and start it again.

    python -m tests.e2e.s3_native_spark_driver SPEC_JSON

SPEC: ``input_dir``, ``checkpoint``, ``sink_id``, ``options`` (the S3 target's),
``conf`` (Spark settings: the s3a and txsink-s3 jars, the endpoint), ``sql_conf`` (set
on the session once it runs). One batch per input
file (``availableNow``), repartitioned into two tasks. ``TXSINK_FAULTS`` kills the whole
process group (driver, JVM, Python workers) at its point. With ``"batch": N`` it
batch-writes N rows instead, and a refusal (:class:`~txsink.errors.ConfigError`) is
printed as ``TXSINK-REFUSED {"field": ..., "message": ...}``.
"""

from __future__ import annotations

import json
import os
import sys


def main(spec: dict[str, object]) -> None:
    if os.environ.get("TXSINK_FAULTS"):
        os.environ["TXSINK_FAULTS_KILL_PID"] = str(-os.getpgrp())
    from pyspark.sql import SparkSession
    from txsink.spark import register, target, targets

    from tests.e2e.spark_harness import SCHEMA

    builder = (SparkSession.builder.master("local[2,4]").appName("txsink-s3-native")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "WARN")
               .config("spark.sql.shuffle.partitions", "2"))
    for key, value in dict(spec["conf"]).items():  # type: ignore[call-overload]
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    for key, value in dict(spec.get("sql_conf") or {}).items():  # type: ignore[call-overload]
        spark.conf.set(key, value)
    group = targets(str(spec["sink_id"]),
                    [target("s3", "s3", **dict(spec["options"]))],  # type: ignore[call-overload]
                    checkpoint_location=str(spec["checkpoint"]))
    if spec.get("batch") is not None:
        from txsink.errors import ConfigError

        df = spark.range(int(spec["batch"])).selectExpr(  # type: ignore[call-overload]
            "id", "CAST(id % 7 AS INT) AS key", "id AS amount")
        try:
            group.write(df)
        except ConfigError as exc:
            print("TXSINK-REFUSED " + json.dumps({"field": exc.field, "message": str(exc)}),
                  flush=True)
        spark.stop()
        print("TXSINK-DRIVER-DONE", flush=True)
        return
    frame = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
             .json(str(spec["input_dir"])).repartition(2))
    query = group.write_stream(frame).trigger(availableNow=True).start()
    query.awaitTermination()
    spark.stop()
    print("TXSINK-DRIVER-DONE", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
