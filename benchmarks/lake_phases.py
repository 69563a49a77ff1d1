"""Where the time of a txsink Iceberg write goes, beside Iceberg's own Spark writer.

Not a test: a diagnostic for ``lake_bench.py``'s Iceberg rows. On the bench's data
shape and session it times, per run, one txsink append (``targets(...).write``) and
Iceberg's ``writeTo(...).append()``, then a stream of each (the bench's micro-batches).
The driver's work is split by wrapping txsink's and pyiceberg's functions (inclusive
times, nested as they call each other); Spark's jobs by Spark's own status store
(submission to completion of the jobs an operation ran). A stream's micro-batch is
split by Spark's progress report (``addBatch``, ``walCommit``, ``commitOffsets``...).
Medians over ``--runs``.

    uv run python benchmarks/lake_phases.py [--rows 200000] [--runs 3]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

#: What is timed: "module:Class.method" or "module:function", with a short label.
PHASES: dict[str, str] = {
    "txsink.spark.group:TargetSet.check_state": "check_state",
    "txsink.spark.group:TargetSet.check_no_stream": "check_no_stream",
    "txsink.spark.group:TargetSet.check_native_filesystems": "check_native_filesystems",
    "txsink.spark.group:GroupEpoch.__enter__": "open (enter)",
    "txsink.spark.group:driving_query": "driving_query",
    "txsink_iceberg.backend:IcebergBackend.preflight": "preflight",
    "txsink.gate:Gate.open_write": "gate.open_write",
    "txsink.gate:Gate.open_stream_batch": "gate.open_stream_batch",
    "txsink.spark.group:GroupEpoch._write_native": "write (native)",
    "txsink.lakehouse:TableBackend.native_staging": "native_staging",
    "txsink_iceberg.backend:IcebergBackend.native_frame": "native_frame",
    "txsink.spark.group:write_parquet": "spark write job (+observation)",
    "txsink_iceberg.backend:IcebergBackend.committable_for_directory": "committable_for_directory",
    "txsink_iceberg.backend:IcebergBackend._write_with_ids": "field-id check per file",
    "txsink.lakehouse:TableBackend._describe_files": "list + footers",
    "txsink.lakehouse:TableBackend._make_durable": "fsync",
    "txsink.gate:Gate.check_reported": "check_reported",
    "txsink.spark.group:record_prepared": "record_prepared (state)",
    "txsink.spark.group:GroupEpoch.__exit__": "decide+commit (exit)",
    "txsink.gate:Gate.reserved": "gate.reserved",
    "txsink.gate:Gate.decide": "gate.decide",
    "txsink_iceberg.backend:IcebergBackend.check_prepared": "check_prepared",
    "txsink.coordinator.decision:Decision.commit_epoch": "commit_epoch",
    "txsink.lakehouse:TableBackend._commit_epoch": "table commit",
    "txsink_iceberg.backend:IcebergBackend.table_epoch": "marker read (table_epoch)",
    "txsink_iceberg.backend:IcebergBackend.append_to": "append_to",
    "pyiceberg.table:Transaction.add_files": "pyiceberg add_files (footers)",
    "pyiceberg.table:Transaction.commit_transaction": "pyiceberg commit (manifests+catalog)",
    "pyiceberg.catalog.sql:SqlCatalog.commit_table": "catalog commit_table",
    "pyiceberg.catalog.sql:SqlCatalog.load_table": "catalog load_table",
    "txsink.lakehouse:TableBackend.epoch_committed": "_committed.json",
    "txsink.state:DirectoryStateStore.put": "state put",
    "txsink.state:DirectoryStateStore.put_new": "state put_new",
    "txsink.state:DirectoryStateStore.write_meta": "state write_meta",
    "txsink.state:DirectoryStateStore.acquire": "state lease",
    "txsink.coordinator:Coordinator.start": "coordinator.start",
    "txsink.spark.group:GroupEpoch._batch_source": "offset log digest (batch_source)",
    "txsink.lakehouse:TableBackend.note_epoch_source": "note_epoch_source",
    "txsink.gate:Gate.refuse_replanned": "refuse_replanned",
    "txsink.coordinator.recovery:Recovery.recover": "recover",
    "txsink_iceberg.backend:IcebergBackend.claim_sink": "claim_sink",
    "txsink_iceberg.backend:IcebergBackend.check_identity": "check_identity",
    "txsink_iceberg.backend:IcebergBackend._other_tables_at": "other tables at location",
    "txsink_iceberg.backend:IcebergBackend.refuse_behind": "refuse_behind",
    "txsink_iceberg.backend:IcebergBackend.bound_uuid": "bound_uuid",
    "pyspark.sql.readwriter:DataFrameWriter.parquet": "df.write.parquet",
    "pyspark.sql.classic.dataframe:DataFrame.observe": "df.observe",
    "pyspark.sql.observation:Observation.get": "observation.get",
    "pyspark.sql.conf:RuntimeConfig.set": "spark.conf.set",
    "pyspark.sql.conf:RuntimeConfig.unset": "spark.conf.unset",
}

_local = threading.local()
#: (operation, path of labels) -> durations in seconds, one per call.
TIMES: dict[tuple[str, ...], list[float]] = defaultdict(list)
#: The operation running (foreachBatch runs on a Py4J thread, file work on a pool's).
_CURRENT: list[str] = [""]


def _stack() -> list[str]:
    if not hasattr(_local, "stack"):
        _local.stack = []
    stack: list[str] = _local.stack
    return stack


def _wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        stack = _stack()
        stack.append(label)
        key = (_CURRENT[0], *stack)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[key].append(time.perf_counter() - start)
            stack.pop()
    return timed


def instrument() -> None:
    for where, label in PHASES.items():
        module_name, attr = where.split(":")
        module = importlib.import_module(module_name)
        owner: Any = module
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part)
        if name not in vars(owner):
            raise SystemExit(f"lake_phases: {where} not found")
        found = vars(owner)[name]
        if isinstance(found, property):
            setattr(owner, name, property(_wrap(label, found.fget)))  # type: ignore[arg-type]
        else:
            setattr(owner, name, _wrap(label, getattr(owner, name)))


@contextmanager
def operation(name: str) -> Iterator[None]:
    _CURRENT[0] = name
    start = time.perf_counter()
    try:
        yield
    finally:
        TIMES[(name,)].append(time.perf_counter() - start)
        _CURRENT[0] = ""


def job_ms(spark: Any, since: int) -> tuple[int, float]:
    """(newest job id, summed submission-to-completion ms of jobs after ``since``)."""
    store = spark.sparkContext._jsc.sc().statusStore()
    jobs = store.jobsList(None)
    total, newest = 0.0, since
    for i in range(jobs.size()):
        job = jobs.apply(i)
        jid = job.jobId()
        newest = max(newest, jid)
        if jid <= since:
            continue
        sub, done = job.submissionTime(), job.completionTime()
        if sub.isDefined() and done.isDefined():
            total += done.get().getTime() - sub.get().getTime()
    return newest, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--no-stream", action="store_true")
    args = parser.parse_args(argv)

    import lake_bench

    found = lake_bench._connectors()
    if found is None:
        python = lake_bench._fallback_python()
        return subprocess.run([python, __file__, *(argv if argv is not None
                                                    else sys.argv[1:])]).returncode
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from txsink.spark import target, targets

    instrument()
    work = Path(tempfile.mkdtemp(prefix="txsink-lake-phases-"))
    wh = work / "wh"
    spark = lake_bench.session(found, wh, "txsink-lake-phases", args.partitions)
    jobs: dict[str, list[float]] = defaultdict(list)
    progress: dict[str, list[dict[str, float]]] = defaultdict(list)
    try:
        df = lake_bench.rows_frame(spark, args.rows, args.partitions)
        df.count()
        source = work / "source"
        df.repartition(args.batches).write.parquet(str(source))
        schema = df.schema
        newest, _ = job_ms(spark, -1)

        def timed(name: str, fn: Callable[[], Any], run: int) -> None:
            nonlocal newest
            op = name if run >= 0 else f"warm-up {name}"
            with operation(op):
                fn()
            newest, ms = job_ms(spark, newest)
            jobs[op].append(ms)

        def stream_source() -> Any:
            return spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(
                str(source))

        def run_stream(start: Callable[[], Any], name: str) -> None:
            query = start()
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            for p in query.recentProgress:
                if p.numInputRows:
                    progress[name].append({k: float(v) for k, v in p.durationMs.items()})

        columns = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema)
        for run in range(-1, args.runs):
            tag = f"r{run + 1}"
            ia = targets("bench-iceberg-append", [target(
                "t", "iceberg", warehouse=str(wh), table="db.tx_append",
                catalog_name="bench")], state_location=str(work / "state-ia"))
            timed("txsink append", lambda ia=ia: ia.write(df), run)
            timed("iceberg append", lambda run=run: df.writeTo("bench.db.own")
                  .createOrReplace() if run == -1 else df.writeTo("bench.db.own").append(),
                  run)
            if args.no_stream:
                continue
            group = targets(f"bench-iceberg-s{tag}", [target(
                "t", "iceberg", warehouse=str(wh), table=f"db.tx_s{tag}",
                catalog_name="bench")], checkpoint_location=str(work / f"chk-tx-{tag}"))
            name = "txsink stream" if run >= 0 else "warm-up txsink stream"
            timed("txsink stream", lambda g=group, n=name: run_stream(
                lambda: g.write_stream(stream_source()).trigger(availableNow=True).start(),
                n), run)
            spark.sql(f"CREATE TABLE IF NOT EXISTS bench.db.ice_s{tag} ({columns}) "
                      "USING iceberg")
            name = "iceberg stream" if run >= 0 else "warm-up iceberg stream"
            timed("iceberg stream", lambda t=tag, n=name: run_stream(
                lambda: stream_source().writeStream.format("iceberg").outputMode("append")
                .option("checkpointLocation", str(work / f"chk-ice-{t}"))
                .trigger(availableNow=True).toTable(f"bench.db.ice_s{t}"), n), run)
        df.unpersist()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(args, jobs, progress)
    return 0


def report(args: Any, jobs: dict[str, list[float]],
           progress: dict[str, list[dict[str, float]]]) -> None:
    print(f"\n{args.rows:,} rows, {args.partitions} partitions, {args.runs} runs (medians; "
          f"loadavg {Path('/proc/loadavg').read_text().split()[:3]})")
    ops = [k[0] for k in TIMES if len(k) == 1 and not k[0].startswith("warm-up")]
    for op in dict.fromkeys(ops):
        total = statistics.median(TIMES[(op,)]) * 1000
        spark_jobs = statistics.median(jobs[op]) if jobs.get(op) else float("nan")
        print(f"\n{op}: {total:.0f} ms total; Spark jobs {spark_jobs:.0f} ms "
              f"({100 * spark_jobs / total:.0f}%), outside Spark's jobs "
              f"{total - spark_jobs:.0f} ms")
        calls = args.runs * (args.batches if "stream" in op else 1)
        rows = sorted((k, v) for k, v in TIMES.items() if k[0] == op and len(k) > 1)
        for key, values in rows:
            per = sum(values) / calls * 1000
            print(f"  {'  ' * (len(key) - 2)}{key[-1]:<{44 - 2 * (len(key) - 2)}} "
                  f"{per:8.1f} ms/{'batch' if 'stream' in op else 'write'} "
                  f"{100 * sum(values) / args.runs / (total / 1000):5.1f}%  "
                  f"({len(values) / args.runs:.0f} calls)")
    for name, batches in progress.items():
        if name.startswith("warm-up"):
            continue
        keys = sorted({k for b in batches for k in b})
        print(f"\n{name}, per micro-batch (median of {len(batches)}): " + ", ".join(
            f"{k} {statistics.median(b.get(k, 0.0) for b in batches):.0f}" for k in keys))


if __name__ == "__main__":
    sys.exit(main())
