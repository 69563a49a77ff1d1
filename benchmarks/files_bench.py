"""Throughput of the txsink files sink next to Spark's built-in Parquet sink.

Not a test (pytest does not collect it): a script that prints figures. Both sinks
write the same cached, generated DataFrame as Parquet (snappy) in the same Spark
session, alternating runs; the throughput ratio txsink / Spark (the median of the
ratios of back-to-back pairs, steadier on a shared machine) is printed at the end
(target: >= 0.8; the native data path, ``native``: >= 0.9). Usage::

    uv run python benchmarks/files_bench.py [--rows 2000000] [--runs 5] [--streaming]
        [--partitions 2] [--conf KEY=VALUE ...]

A third sink, ``py-noop``, is a Python data source that only reads its input: it is
the floor for any PySpark Python data source, so ``txsink/py-noop`` isolates
txsink's own cost (2PC, Parquet encoding) from Spark's JVM-to-Arrow hand-over, which
dominates (measured in the Python worker: about 80% of a txsink task waits for it).

A fourth, ``native``, is the files backend on the native data path (what pipeline
files and ``TargetSet.write`` / ``write_stream`` take for Parquet): Spark's own
Parquet writer stages the epoch's files and txsink publishes them by link at commit,
so no row goes through Python.

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from proc_cpu import tree_cpu_seconds
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, WriterCommitMessage

#: The native data path / Spark's Parquet writer (issue 33).
NATIVE_TARGET = 0.9


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
    from txsink.spark.group import TargetSet
    from txsink.targets import TargetSpec

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

        def native_files(i: int) -> None:
            TargetSet(f"nbench-{i}", [TargetSpec(f"nbench-{i}", "files",
                                                 {"path": str(work / f"native-{i}")})],
                      state_location=str(work / f"native-state-{i}"), single=True).write(df)

        def python_noop(i: int) -> None:
            df.write.format(_DrainSource.name()).mode("append").save()

        spark.dataSource.register(_DrainSource)
        results = compare("batch write", {"spark": spark_parquet, "txsink": txsink_files,
                                          "native": native_files, "py-noop": python_noop},
                          args.runs, args.rows)
        if args.streaming:
            source_dir = work / "source"
            df.write.parquet(str(source_dir))
            schema = df.schema

            def stream(fmt: str, i: int) -> None:
                reader = spark.readStream.schema(schema).parquet(str(source_dir))
                if fmt == "native":
                    sink = TargetSet(f"nsbench-{i}", [TargetSpec(
                        f"nsbench-{i}", "files", {"path": str(work / f"s-{fmt}-{i}")})],
                        checkpoint_location=str(work / f"s-{fmt}-chk-{i}"), single=True)
                    (sink.write_stream(reader).trigger(availableNow=True).start()
                     .awaitTermination())
                    return
                writer = reader.writeStream.option(
                    "checkpointLocation", str(work / f"s-{fmt}-chk-{i}"))
                if fmt == "txsink":
                    writer = (writer.format("txsink").option("backend", "files")
                              .option("sink_id", f"sbench-{i}").option("format", "parquet")
                              .option("path", str(work / f"s-{fmt}-{i}")))
                else:
                    writer = writer.format("parquet").option("path", str(work / f"s-{fmt}-{i}"))
                writer.trigger(availableNow=True).start().awaitTermination()

            results += compare("streaming (availableNow)",
                               {"spark": lambda i: stream("spark", i),
                                "txsink": lambda i: stream("txsink", i),
                                "native": lambda i: stream("native", i)}, args.runs, args.rows)
        print()
        for name, ratio in results:
            goal = NATIVE_TARGET if "native" in name else 0.8
            verdict = "" if "py-noop" in name else (
                f" (meets the {goal} target)" if ratio >= goal
                else f" (BELOW the {goal} target)")
            print(f"RATIO {name} = {ratio:.2f}{verdict}")
        print("py-noop is a Python data source that only reads its input: no Python sink "
              "can be faster, so txsink/py-noop is txsink's own cost.")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def compare(name: str, sinks: dict[str, Callable[[int], None]], runs: int,
            rows: int) -> list[tuple[str, float]]:
    """Time each sink ``runs`` times, round-robin; ratios are against ``spark``."""
    for fn in sinks.values():
        fn(-1)  # warm-up: JIT, Python workers, class loading
    times: dict[str, list[float]] = {label: [] for label in sinks}
    cpu: dict[str, list[float]] = {label: [] for label in sinks}
    for i in range(runs):
        for label, fn in sinks.items():
            cpu_before = tree_cpu_seconds()
            started = time.perf_counter()
            fn(i)
            times[label].append(time.perf_counter() - started)
            cpu[label].append(tree_cpu_seconds() - cpu_before)
    print(f"\n{name}: load average {os.getloadavg()[0]:.1f} at the end")
    for label, ts in times.items():
        med = statistics.median(ts)
        runs_s = ", ".join(f"{t:.2f}s" for t in ts)
        print(f"  {label:<8} median {med:.2f}s = {rows / med:>12,.0f} rows/s ({runs_s})")
    # With every core busy, wall-clock ratios follow CPU-second ratios: printing
    # both tells a slower code path from a busier machine.
    for label, cs in cpu.items():
        med_cpu = statistics.median(cs)
        print(f"  {label:<8} CPU {med_cpu:.2f} s (JVM + Python workers + driver), "
              f"{med_cpu / statistics.median(times[label]):.2f} of {os.cpu_count()} cores busy")
    # Sinks of one round ran back to back, so the machine's load is similar within a
    # round: the median of per-round ratios is steadier than a ratio of medians.
    out = []
    for label in sinks:
        if label == "spark":
            continue
        pairs = [s / t for s, t in zip(times["spark"], times[label], strict=True)]
        print(f"  per-round ratios {label}/spark: {', '.join(f'{r:.2f}' for r in pairs)}")
        out.append((f"{name}, {label}/spark", statistics.median(pairs)))
    if "py-noop" in times and "txsink" in times:
        pairs = [n / t for n, t in zip(times["py-noop"], times["txsink"], strict=True)]
        out.append((f"{name}, txsink/py-noop", statistics.median(pairs)))
    return out


class _DrainWriter(DataSourceArrowWriter):
    """Reads every Arrow batch and writes nothing: the floor of any Python data source."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class _DrainSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bench-python-noop"

    def writer(self, schema: Any, overwrite: bool) -> _DrainWriter:
        return _DrainWriter()


if __name__ == "__main__":
    main()
