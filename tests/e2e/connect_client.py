"""A Spark Connect client for the Connect tests, run in a process of its own.

    python tests/e2e/connect_client.py SPEC_JSON

SPEC is ``{"remote": "sc://...", "action": "batch" | "foreach", ...}``; the result is
one JSON line on stdout. In its own process so that the test process never holds a
Connect session (gRPC threads, pandas) next to the classic sessions of other tests.

* ``batch``: ``{"input": DIR, "writes": [{options}, ...]}``: each write is
  ``df.write.format("txsink")`` of the input files' rows with those options; the
  result lists, per write, ``"ok"`` or the error.
* ``foreach``: ``{"input": DIR, "checkpoint": CHK, "options": {...}}``: a stream over
  the input (one file per batch) whose ``foreachBatch`` writes each batch with the
  options plus ``txnVersion=batch_id``; the result is ``"ok"`` or the query's error.
* ``group_stream``: ``TargetSet.write_stream`` of a group with one Delta target (see
  :func:`group_stream`); the result is ``"ok"`` or the query's error.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

SCHEMA = "id BIGINT"
TRANSFORM = ("id", "CAST(id % 5 AS STRING) AS key", "CAST(id AS STRING) AS value")
#: Spark waits a fixed 10 s for the Python process that runs a foreachBatch function to
#: connect back (PythonWorkerFactory's simple worker); on a loaded machine its imports
#: take longer, and the start fails before anything runs. Started again, up to this often.
FOREACH_STARTS = 3


def error_text(exc: BaseException) -> str:
    """The error as the client got it (the server's Python traceback included), cut."""
    return f"{type(exc).__name__}: {str(exc).strip()[:6000]}"


def batch(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    frame = spark.read.schema(SCHEMA).json(spec["input"]).selectExpr(*TRANSFORM)
    outcomes = []
    for options in spec["writes"]:
        try:
            frame.write.format("txsink").mode("append").options(**options).save()
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(error_text(exc))
    return {"writes": outcomes}


def foreach(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    options = dict(spec["options"])

    def write(df: Any, batch_id: int) -> None:
        from txsink.spark import register

        register(df.sparkSession)  # the function's session is not the client's
        (df.write.format("txsink").mode("append").options(**options)
           .option("txnVersion", str(batch_id)).save())

    stream = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
              .json(spec["input"]).selectExpr(*TRANSFORM))
    query = None
    for attempt in range(FOREACH_STARTS):
        try:
            query = (stream.writeStream.foreachBatch(write)
                     .option("checkpointLocation", spec["checkpoint"]).start())
            break
        except Exception as exc:
            if "failed to connect back" not in str(exc) or attempt == FOREACH_STARTS - 1:
                raise
            time.sleep(2)
    assert query is not None
    try:
        query.processAllAvailable()
        outcome = "ok"
    except Exception as exc:
        outcome = error_text(exc)
    finally:
        query.stop()
    return {"query": outcome, "query_id": str(query.id)}


def group_stream(spark: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """``txsink.spark.targets(...).write_stream(df)`` of a group with one Delta target
    (``{"input", "checkpoint", "state", "path", "sink_id"}``), until the input is read."""
    from txsink.spark import target, targets

    group = targets(spec["sink_id"], [target("t", "delta", path=spec["path"])],
                    checkpoint_location=spec["checkpoint"], state_location=spec["state"])
    stream = (spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1)
              .json(spec["input"]).selectExpr(*TRANSFORM))
    query = group.write_stream(stream).trigger(availableNow=True).start()
    refusal = None
    try:
        query.awaitTermination()
        outcome = "ok"
    except Exception as exc:
        outcome = error_text(exc)
        # txsink's own words, wherever Spark's wrapping put them
        refusal = next((line.strip() for line in str(exc).splitlines()
                        if "txsink" in line and "Error" in line), None)
    return {"query": outcome, "query_id": str(query.id), "refusal": refusal}


def main() -> int:
    spec = json.loads(sys.argv[1])
    from pyspark.sql.connect.session import SparkSession
    from txsink.spark import register

    spark = SparkSession.builder.remote(spec["remote"]).create()
    try:
        register(spark)
        result = {"batch": batch, "foreach": foreach,
                  "group_stream": group_stream}[spec["action"]](spark, spec)
    finally:
        spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
