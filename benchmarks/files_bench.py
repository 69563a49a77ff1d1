"""Throughput of the txsink files sink next to Spark's built-in Parquet sink.

Not a test (pytest does not collect it): a script that prints figures. Both sinks
write the same cached, generated DataFrame as Parquet (snappy) in the same Spark
session, alternating runs; the throughput ratio txsink / Spark (the median of the
ratios of back-to-back pairs, steadier on a shared machine) is printed at the end
(target: >= 0.8). Usage::

    uv run python benchmarks/files_bench.py [--rows 2000000] [--runs 5] [--streaming]
        [--partitions 2] [--conf KEY=VALUE ...]

Where the time goes (2M rows, one partition, measured in the Python worker): about
80% of a txsink task waits for Spark's JVM to convert rows to Arrow for the Python
data source; writing Parquet with pyarrow and the 2PC steps take the rest.

``--streaming`` also compares one micro-batch of a streaming query per run
(``writeStream`` to txsink vs Spark's file sink) on the same data read from a
Parquet directory, so the per-batch commit protocol is included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--streaming", action="store_true")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark configuration for the session (both sinks)")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from txsink.spark import register

    builder = (SparkSession.builder.master(args.master).appName("txsink-files-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "ERROR")
             .config("spark.sql.shuffle.partitions", str(args.partitions)))
    for pair in args.conf:
        key, _, value = pair.partition("=")
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    work = Path(tempfile.mkdtemp(prefix="txsink-bench-"))
    try:
        df = (spark.range(0, args.rows, 1, args.partitions)
              .selectExpr("id", "CAST(id % 1000 AS INT) AS key", "id * 0.5 AS amount",
                          "concat('customer-', CAST(id % 50000 AS STRING)) AS name")
              .cache())
        df.count()
        print(f"{args.rows:,} rows x 4 columns, {args.partitions} partitions, "
              f"master {args.master}, {args.runs} runs each (after one warm-up)")

        def spark_parquet(i: int) -> None:
            df.write.mode("overwrite").parquet(str(work / f"spark-{i}"))

        def txsink_files(i: int) -> None:
            (df.write.format("txsink").mode("append")
             .option("backend", "files").option("sink_id", f"bench-{i}")
             .option("path", str(work / f"txsink-{i}")).option("format", "parquet")
             .option("checkpointLocation", str(work / f"txsink-chk-{i}"))
             .save())

        results = compare("batch write", spark_parquet, txsink_files, args.runs, args.rows)
        if args.streaming:
            source_dir = work / "source"
            df.write.parquet(str(source_dir))
            schema = df.schema

            def stream(fmt: str, i: int) -> None:
                reader = spark.readStream.schema(schema).parquet(str(source_dir))
                writer = reader.writeStream.option(
                    "checkpointLocation", str(work / f"s-{fmt}-chk-{i}"))
                if fmt == "txsink":
                    writer = (writer.format("txsink").option("backend", "files")
                              .option("sink_id", f"sbench-{i}").option("format", "parquet")
                              .option("path", str(work / f"s-{fmt}-{i}")))
                else:
                    writer = writer.format("parquet").option("path", str(work / f"s-{fmt}-{i}"))
                writer.trigger(availableNow=True).start().awaitTermination()

            results += compare("streaming (availableNow)", lambda i: stream("spark", i),
                               lambda i: stream("txsink", i), args.runs, args.rows)
        print()
        for name, ratio in results:
            verdict = "meets" if ratio >= 0.8 else "BELOW"
            print(f"RATIO {name}: txsink/spark = {ratio:.2f} ({verdict} the 0.8 target)")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def compare(name: str, baseline: Callable[[int], None], candidate: Callable[[int], None],
            runs: int, rows: int) -> list[tuple[str, float]]:
    baseline(-1)  # warm-up: JIT, Python workers, class loading
    candidate(-1)
    times: dict[str, list[float]] = {"spark": [], "txsink": []}
    for i in range(runs):
        for label, fn in (("spark", baseline), ("txsink", candidate)):
            started = time.perf_counter()
            fn(i)
            times[label].append(time.perf_counter() - started)
    med = {k: statistics.median(v) for k, v in times.items()}
    # Each pair ran back to back, so the machine's load is similar within a pair: the
    # median of the per-pair ratios is steadier than a ratio of medians on a busy box.
    pairs = [s / t for s, t in zip(times["spark"], times["txsink"], strict=True)]
    print(f"\n{name}:")
    for label in ("spark", "txsink"):
        runs_s = ", ".join(f"{t:.2f}s" for t in times[label])
        print(f"  {label:<7} median {med[label]:.2f}s = {rows / med[label]:>12,.0f} rows/s "
              f"({runs_s})")
    print(f"  per-pair ratios: {', '.join(f'{r:.2f}' for r in pairs)}")
    return [(name, statistics.median(pairs))]


if __name__ == "__main__":
    main()
