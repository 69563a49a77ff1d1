"""Throughput of txsink into Delta Lake and Iceberg tables next to the connectors' own
Spark writers, and the driver's commit time per epoch.

Not a test: a script that prints figures and writes a JSON result (``--json``). In one
run, on one Spark session with both connectors:

* Delta: txsink (the native data path: Spark's Parquet writer into the table, one log
  entry per epoch from the driver) against delta-spark's writer, as a batch append
  (``df.write.format("delta").mode("append")``) and as a stream (``foreachBatch``
  with ``txnAppId``/``txnVersion``, delta-spark's own exactly-once recipe, against
  txsink's stream);
* Iceberg: txsink against Iceberg's Spark writer, as a batch append
  (``writeTo(...).append()``) and as its streaming sink (``format("iceberg")``), on
  the same catalog (a SQL catalog on a SQLite file: txsink's default);
* the driver's commit per epoch (decided to committed) at 8 and 128 participants.

The connectors are published for Spark 4.0-4.2, not for uv.lock's 4.3
(:mod:`txsink.testing.lake_connectors`): under a PySpark without them the script runs
itself again in an environment with PySpark 4.1 (delta-spark 4.3.0, Iceberg 1.12.0),
made once with uv under ``~/.cache/txsink/bench-pyspark41``. Ratios are the connector's
time over txsink's (>= 1.0: txsink at least as fast), the median of per-round ratios.

    uv run python benchmarks/lake_bench.py [--rows 2000000] [--runs 5] [--quick]
        [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from files_bench import compare  # noqa: E402

#: txsink exactly-once into a table / the connector's own writer (issue 40).
TARGET_RATIO = 1.0
#: The PySpark line the script runs on when the installed one has no connectors.
FALLBACK_PYSPARK = "pyspark>=4.1,<4.2"
FALLBACK_ENV = "bench-pyspark41"
#: Micro-batches per streaming run.
STREAM_BATCHES = 8


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


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


def _connectors() -> Any:
    from txsink.testing.lake_connectors import ConnectorsUnavailable, connectors

    try:
        found = connectors()
    except ConnectorsUnavailable:
        return None
    return found if found.delta and found.iceberg else None


def _fallback_python() -> str:
    """An interpreter with PySpark 4.1 and txsink's core, Delta and Iceberg (made once)."""
    from txsink.testing.maven import cache_dir

    venv = cache_dir().parent / FALLBACK_ENV
    python = venv / "bin" / "python"
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit(f"lake_bench: no Delta/Iceberg connector for this PySpark, and no "
                         f"uv to make an environment with {FALLBACK_PYSPARK}")
    if not python.exists():
        subprocess.run([uv, "venv", "-q", "-p", sys.executable, str(venv)], check=True)
    subprocess.run([uv, "pip", "install", "-q", "-p", str(python), FALLBACK_PYSPARK,
                    "pandas>=2.2,<3", "-e", f"{ROOT}/core", "-e", f"{ROOT}/backends/delta",
                    "-e", f"{ROOT}/backends/iceberg"], check=True)
    return str(python)


def session(found: Any, wh: Path, app: str, partitions: int) -> Any:
    """A local Spark session with both connectors, txsink registered, and one Iceberg
    catalog (``bench``: a SQL catalog on a SQLite file, txsink's default) for both
    writers, its namespace ``db`` made."""
    from pyspark.sql import SparkSession
    from txsink.spark import register
    from txsink.testing import lake_connectors as lc
    from txsink_iceberg.backend import IcebergBackend
    from txsink_iceberg.testing import spark_jdbc_catalog

    conf = lc.session_conf(found, lc.jars(found), iceberg_catalogs={
        "bench": spark_jdbc_catalog(IcebergBackend("db.t", str(wh), catalog_name="bench"))})
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "ERROR")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", str(partitions)))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    spark.sql("CREATE NAMESPACE IF NOT EXISTS bench.db")
    return spark


def rows_frame(spark: Any, rows: int, partitions: int) -> Any:
    """The benchmark's rows (five columns of the usual kinds), cached."""
    return (spark.range(0, rows, 1, partitions)
            .selectExpr("id", "CAST(id % 1000 AS INT) AS key", "id * 0.5 AS amount",
                        "concat('customer-', CAST(id % 50000 AS STRING)) AS name",
                        "timestamp_seconds(id) AS at")
            .cache())


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

    found = _connectors()
    if found is None:
        python = _fallback_python()
        print(f"no Delta/Iceberg connector for this PySpark: running on {python} "
              f"({FALLBACK_PYSPARK})", flush=True)
        return subprocess.run([python, __file__, *(argv if argv is not None
                                                    else sys.argv[1:])]).returncode

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from txsink.spark import target, targets

    work = Path(tempfile.mkdtemp(prefix="txsink-lake-bench-"))
    wh = work / "wh"
    spark = session(found, wh, "txsink-lake-bench", args.partitions)
    try:
        df = rows_frame(spark, args.rows, args.partitions)
        df.count()
        source = work / "source"
        df.repartition(STREAM_BATCHES).write.parquet(str(source))
        schema = df.schema
        print(f"{found.describe()}\n{args.rows:,} rows x 5 columns, {args.partitions} "
              f"partitions, {args.runs} runs each (after one warm-up); streams: "
              f"{STREAM_BATCHES} micro-batches", flush=True)

        def delta_target(tag: str) -> Any:
            return target("t", "delta", path=str(work / f"delta-{tag}"))

        def iceberg_target(tag: str) -> Any:
            return target("t", "iceberg", warehouse=str(wh), table=f"db.tx_{tag}",
                          catalog_name="bench")

        def stream_source() -> Any:
            return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(
                str(source))

        def run_stream(writer: Any) -> None:
            query = writer.trigger(availableNow=True).start()
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))

        def delta_foreach(i: int) -> None:
            i += 1  # the warm-up is run -1
            path, app = str(work / f"delta-fb-{i}"), f"bench-{i}"

            def batch(frame: Any, batch_id: int) -> None:
                (frame.write.format("delta").mode("append").option("txnAppId", app)
                 .option("txnVersion", batch_id).save(path))
            run_stream(stream_source().writeStream.foreachBatch(batch)
                       .option("checkpointLocation", str(work / f"chk-delta-fb-{i}")))

        def txsink_stream(kind: str, i: int) -> None:
            i += 1
            item = delta_target(f"s{i}") if kind == "delta" else iceberg_target(f"s{i}")
            group = targets(f"bench-{kind}-s{i}", [item],
                            checkpoint_location=str(work / f"chk-tx-{kind}-{i}"))
            run_stream(group.write_stream(stream_source()))

        def iceberg_stream(i: int) -> None:
            i += 1
            spark.sql(f"CREATE TABLE IF NOT EXISTS bench.db.ice_s{i} "
                      f"({', '.join(f'{f.name} {f.dataType.simpleString()}' for f in schema)})"
                      " USING iceberg")
            query = (stream_source().writeStream.format("iceberg").outputMode("append")
                     .option("checkpointLocation", str(work / f"chk-ice-{i}"))
                     .trigger(availableNow=True).toTable(f"bench.db.ice_s{i}"))
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))

        ratios: dict[str, float] = {}
        ratios.update(compare("Delta append", {
            "spark": lambda i: df.write.format("delta").mode("append").save(
                str(work / "delta-own")),
            "txsink": lambda i: targets("bench-delta-append", [delta_target("append")],
                                        state_location=str(work / "state-da")).write(df),
        }, args.runs, args.rows))
        ratios.update(compare("Delta stream (foreachBatch with txnAppId/txnVersion)", {
            "spark": delta_foreach,
            "txsink": lambda i: txsink_stream("delta", i),
        }, args.runs, args.rows))
        ratios.update(compare("Iceberg append", {
            "spark": lambda i: df.writeTo("bench.db.own").createOrReplace() if i == -1
            else df.writeTo("bench.db.own").append(),
            "txsink": lambda i: targets("bench-iceberg-append", [iceberg_target("append")],
                                        state_location=str(work / "state-ia")).write(df),
        }, args.runs, args.rows))
        ratios.update(compare("Iceberg stream (its streaming sink)", {
            "spark": iceberg_stream,
            "txsink": lambda i: txsink_stream("iceberg", i),
        }, args.runs, args.rows))

        commits: dict[str, dict[str, float]] = {}
        for parts in (8, 128):
            frame = df.repartition(parts).cache()
            frame.count()
            for kind in ("delta", "iceberg"):
                item = delta_target(f"p{parts}") if kind == "delta" else iceberg_target(
                    f"p{parts}")
                group = targets(f"bench-{kind}-p{parts}", [item],
                                state_location=str(work / f"state-{kind}-p{parts}"))
                for _ in range(args.commit_epochs):
                    group.write(frame)
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

    import pyspark

    result: dict[str, Any] = {
        "rows": args.rows, "runs": args.runs, "partitions": args.partitions,
        "quick": args.quick, "spark": pyspark.__version__,
        "baseline": f"the connectors' own Spark writers ({found.describe()})",
        "ratios": ratios, "target_ratio": TARGET_RATIO, "commit": commits,
    }
    for name, value in ratios.items():
        print(f"  {name}: {value:.2f} (goal >= {TARGET_RATIO})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
