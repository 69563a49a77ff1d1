"""Throughput of txsink into Delta Lake and Iceberg tables next to Spark's own writer,
and the driver's commit time per epoch.

Not a test: a script that prints figures and writes a JSON result (``--json``). The
baseline is Spark's Parquet writer into a directory on the same disk: neither
``delta-spark`` nor ``iceberg-spark-runtime`` is published for Spark 4.3 (checked on
Maven Central 2026-11-25: ``delta-spark_4.3_2.13`` and
``iceberg-spark-runtime-4.3_2.13`` are missing; Delta 4.4.0 is built for Spark 4.2.0,
Iceberg 1.12.0 for Spark 4.1), so Spark's own Parquet writer, which is what those
connectors write data files with, is the yardstick. txsink writes each epoch through
the native data path (``TargetSet.write``: Spark's Parquet writer into the table's
directory, one log entry / snapshot per epoch from the driver). The ways take turns
(``files_bench.compare``: per-round ratios, median); then epochs of 8 and of 128
Spark partitions are committed and the commit time per epoch (decision to committed,
from the txsink state) is reported as p50/p95.

    uv run python benchmarks/lake_bench.py [--rows 2000000] [--runs 5] [--quick]
        [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from files_bench import compare  # noqa: E402

#: txsink exactly-once into a table / Spark's Parquet writer (issue 33).
TARGET_RATIO = 0.9


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def commit_ms(state: Path) -> list[float]:
    """Decision-to-committed time of every committed epoch in a txsink state."""
    from txsink.state import DirectoryStateStore, EpochState

    store = DirectoryStateStore(state)
    out = []
    for epoch, st in store.states().items():
        record = store.get(epoch)
        if st is EpochState.COMMITTED and record is not None and record.committed_at:
            out.append(1000 * (record.committed_at - record.decided_at))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--commit-epochs", type=int, default=5,
                        help="epochs per partition count for the commit times")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 2 runs")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.runs, args.commit_epochs = 200_000, 2, 3

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from txsink.spark import register, target, targets

    spark = (SparkSession.builder.master("local[2]").appName("txsink-lake-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.log.level", "ERROR")
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.sql.shuffle.partitions", str(args.partitions)).getOrCreate())
    register(spark)
    work = Path(tempfile.mkdtemp(prefix="txsink-lake-bench-"))
    try:
        df = (spark.range(0, args.rows, 1, args.partitions)
              .selectExpr("id", "CAST(id % 1000 AS INT) AS key", "id * 0.5 AS amount",
                          "concat('customer-', CAST(id % 50000 AS STRING)) AS name",
                          "timestamp_seconds(id) AS at")
              .cache())
        df.count()
        print(f"{args.rows:,} rows x 5 columns, {args.partitions} partitions, "
              f"{args.runs} runs each (after one warm-up)", flush=True)

        def group(kind: str, tag: str) -> Any:
            item = (target("t", "delta", path=str(work / f"delta-{tag}")) if kind == "delta"
                    else target("t", "iceberg", warehouse=str(work / f"wh-{tag}"),
                                table="db.t"))
            return targets(f"bench-{kind}-{tag}", [item],
                           state_location=str(work / f"state-{kind}-{tag}"))

        sinks = {
            "spark": lambda i: df.write.mode("append").parquet(str(work / "spark")),
            "delta": lambda i: group("delta", "tp").write(df),
            "iceberg": lambda i: group("iceberg", "tp").write(df),
        }
        ratios = dict(compare("lakehouse tables vs Spark's Parquet writer", sinks,
                              args.runs, args.rows))

        commits: dict[str, dict[str, float]] = {}
        for parts in (8, 128):
            frame = df.repartition(parts).cache()
            frame.count()
            for kind in ("delta", "iceberg"):
                g = group(kind, f"p{parts}")
                for _ in range(args.commit_epochs):
                    g.write(frame)
                ms = commit_ms(work / f"state-{kind}-p{parts}")
                commits[f"{kind} {parts} partitions"] = {
                    "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95),
                    "epochs": len(ms)}
                print(f"  {kind:<8} {parts:>3} partitions: commit p50 "
                      f"{percentile(ms, 0.5):.0f} ms, p95 {percentile(ms, 0.95):.0f} ms "
                      f"({len(ms)} epochs)", flush=True)
            frame.unpersist()
        df.unpersist()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    result: dict[str, Any] = {
        "rows": args.rows, "runs": args.runs, "partitions": args.partitions,
        "quick": args.quick, "baseline": "Spark's Parquet writer (no delta-spark / "
        "iceberg-spark-runtime for Spark 4.3 on Maven Central)",
        "ratios": ratios, "target_ratio": TARGET_RATIO, "commit": commits,
    }
    for name, value in ratios.items():
        print(f"  {name}: {value:.2f} (goal >= {TARGET_RATIO})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
