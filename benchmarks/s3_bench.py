"""S3 backend benchmark (a script, not a test): run ``uv run python benchmarks/s3_bench.py``.

Measures, in one run on the same data:

1. throughput: txsink streaming Parquet into S3 (encode + multipart upload +
   commit) vs boto3's managed upload (``upload_fileobj``) of the very same Parquet
   bytes, in MB/s of object bytes, and their ratio (target >= 0.8);
2. commit latency per epoch through the coordinator (decide, complete every
   upload, write the manifest, mark COMMITTED): median and p95;
3. peak memory of a fresh Python worker streaming one partition ten times the
   part size (RSS growth over the worker's baseline, vs the part size);
4. with Spark (``--spark``, on unless ``--no-spark``): the native path (``writer:
   spark``: Spark's own Parquet writer, each task's file a pending multipart upload that
   txsink completes at commit) and txsink's data source, against Spark's Parquet writer
   through ``s3a://`` with its default commit protocol, on one cached DataFrame, the
   writers in turn each round; records/s and the median of the per-round ratios
   (target for the native path: >= 1.0).

``--json PATH`` writes every figure as JSON (``run_all.py`` puts it on the performance
page); ``--quick`` is a smoke run with small sizes.

Uses ``TXSINK_S3_ENDPOINT`` (+ ``TXSINK_S3_BUCKET``, credentials from the usual AWS
chain) when set, else starts a local SeaweedFS and stops it at the end.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from proc_cpu import read_stat

MIB = 1024 * 1024

_WORKER = r"""
import json, os, sys
import pyarrow as pa
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
spec = json.loads(sys.stdin.read())
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def batches():
    n = spec["rows_per_batch"]
    for b in range(spec["batches"]):
        ids = range(b * n, (b + 1) * n)
        yield pa.record_batch({"id": pa.array(ids, pa.int64()),
                               "name": pa.array([f"customer-{i % 5000}" for i in ids]),
                               "amount": pa.array([i * 0.25 for i in ids]),
                               "note": pa.array([f"order note {i}" for i in ids])})
backend = get_plugins().create_backend("s3", spec["options"])
backend.preflight(spec["sink"])
# Warm up the encoder and the client on a small partition, then measure a big one.
backend.abort(write_participant(backend, TransactionContext(spec["sink"], 0, 0),
                                iter([next(batches())])))
def hwm():
    # VmHWM belongs to this process image; ru_maxrss would include the parent's
    # peak from before exec.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
base = rss()
c = write_participant(backend, TransactionContext(spec["sink"], 0, 1), batches())
peak = hwm()
backend.abort(c)
print(json.dumps({"base": base, "peak": peak, "object_bytes": c.payload["size"],
                  "parts": len(c.payload["parts"]), "rows": c.rows}))
"""


def make_batches(total_rows: int, rows_per_batch: int) -> list[pa.RecordBatch]:
    out = []
    for start in range(0, total_rows, rows_per_batch):
        ids = range(start, min(total_rows, start + rows_per_batch))
        out.append(pa.record_batch({
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"customer-{i % 5000}" for i in ids]),
            "amount": pa.array([i * 0.25 for i in ids]),
            "note": pa.array([f"order note {i}" for i in ids]),
        }))
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Target:
    def __init__(self) -> None:
        self.local: Any = None
        endpoint = os.environ.get("TXSINK_S3_ENDPOINT")
        if endpoint:
            self.endpoint = endpoint
            self.bucket = os.environ.get("TXSINK_S3_BUCKET", "txsink-bench")
            self.creds: dict[str, str] = {}
        else:
            from txsink_s3.testing import LocalSeaweedFS

            self.local = LocalSeaweedFS()
            self.local.start()
            self.endpoint = self.local.endpoint_url
            self.bucket = "txsink-bench"
            self.creds = {"access_key_id": self.local.access_key,
                          "secret_access_key": self.local.secret_key}
            self.client().create_bucket(Bucket=self.bucket)

    def client(self) -> Any:
        import boto3

        kw = {}
        if self.creds:
            kw = {"aws_access_key_id": self.creds["access_key_id"],
                  "aws_secret_access_key": self.creds["secret_access_key"]}
        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", **kw)

    def options(self, prefix: str, **extra: str) -> dict[str, str]:
        opts = {"bucket": self.bucket, "prefix": prefix, "endpoint_url": self.endpoint,
                "region": "us-east-1", **self.creds}
        opts.update(extra)
        return opts

    def close(self) -> None:
        if self.local is not None:
            self.local.cleanup()


class CpuClock:
    """CPU seconds of this process (all threads) and, when local, of the S3 server.

    On a small machine the encoder, the upload threads and the server share the
    cores, so the wall-clock ratio is bounded by the CPU each side needs: printing
    both tells a slow path from a busy machine.
    """

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def _server(self) -> float:
        stat = None if self.server_pid is None else read_stat(self.server_pid)
        return 0.0 if stat is None else stat[1]

    def read(self) -> tuple[float, float]:
        return time.process_time(), self._server()


def throughput(target: Target, args: argparse.Namespace) -> dict[str, float]:
    from boto3.s3.transfer import TransferConfig
    from txsink.model import TransactionContext
    from txsink.plugins import get_plugins
    from txsink.writer import write_participant
    from txsink_s3.formats import PartBuffer, make_encoder

    part = args.part_mib * MIB
    data = make_batches(args.rows, 10_000)
    arrow_bytes = sum(b.nbytes for b in data)
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    backend = get_plugins().create_backend("s3", target.options(
        prefix, part_size=str(part), upload_concurrency=str(args.concurrency)))
    backend.preflight("tput")
    client = target.client()
    transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part)
    ours: list[float] = []
    theirs: list[float] = []
    naive: list[float] = []
    clock = CpuClock(target.local.process.pid if target.local is not None else None)
    cpu: dict[str, list[tuple[float, float]]] = {"txsink": [], "boto3": []}

    def spent(before: tuple[float, float]) -> tuple[float, float]:
        after = clock.read()
        return after[0] - before[0], after[1] - before[1]
    size = 0
    row_group = backend.row_group_bytes  # type: ignore[attr-defined]
    for rep in range(args.repeats):
        # txsink: encode + upload parts + complete, from Arrow batches.
        before = clock.read()
        started = time.perf_counter()
        c = write_participant(backend, TransactionContext("tput", rep, 0), iter(data))
        backend.commit(c)
        ours.append(time.perf_counter() - started)
        cpu["txsink"].append(spent(before))
        size = int(c.payload["size"])
        # boto3's managed upload of the same bytes (already encoded, in memory).
        body = client.get_object(Bucket=target.bucket, Key=c.payload["key"])["Body"].read()
        assert len(body) == size
        assert pq.read_metadata(io.BytesIO(body)).num_rows == args.rows
        before = clock.read()
        started = time.perf_counter()
        client.upload_fileobj(io.BytesIO(body), target.bucket, f"{prefix}/baseline-{rep}",
                              Config=transfer)
        theirs.append(time.perf_counter() - started)
        cpu["boto3"].append(spent(before))
        del body
        # What one would write without txsink: encode the partition into memory with
        # the same row groups, then hand it to boto3's managed upload.
        started = time.perf_counter()
        buf = io.BytesIO()
        with pq.ParquetWriter(buf, data[0].schema, compression="snappy") as writer:
            pending: list[pa.RecordBatch] = []
            for b in data:
                pending.append(b)
                if sum(p.nbytes for p in pending) >= row_group:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=10**9)
                    pending = []
            if pending:
                writer.write_table(pa.Table.from_batches(pending), row_group_size=10**9)
        buf.seek(0)
        client.upload_fileobj(buf, target.bucket, f"{prefix}/naive-{rep}", Config=transfer)
        naive.append(time.perf_counter() - started)
        del buf
    backend.close()
    ours_mbs = size / 1e6 / statistics.median(ours)
    theirs_mbs = size / 1e6 / statistics.median(theirs)
    # Encoding alone, into memory: the part of txsink's work the baseline skips.
    encode: list[float] = []
    for _ in range(args.repeats):
        before_cpu = time.process_time()
        out = PartBuffer()
        enc = make_encoder("parquet", out, row_group_bytes=row_group,
                           compression=backend.compression,  # type: ignore[attr-defined]
                           dictionary=backend.dictionary)  # type: ignore[attr-defined]
        for b in data:
            enc.write(b)
            if len(out) >= part:
                out.take()
        enc.finish()
        encode.append(time.process_time() - before_cpu)
    for label in ("txsink", "boto3"):
        client_cpu = statistics.median(c for c, _ in cpu[label])
        server_cpu = statistics.median(s for _, s in cpu[label])
        wall = statistics.median(ours if label == "txsink" else theirs)
        print(f"  cpu {label:<6} client {client_cpu:.2f}s + server {server_cpu:.2f}s = "
              f"{client_cpu + server_cpu:.2f} CPU-s in {wall:.2f}s wall "
              f"({(client_cpu + server_cpu) / wall:.2f} of {os.cpu_count()} cores busy)")
    print(f"  cpu of Parquet encoding alone (into memory): {statistics.median(encode):.2f}s")
    return {"object_mib": size / MIB, "arrow_mib": arrow_bytes / MIB,
            "txsink_mb_s": ours_mbs, "boto3_mb_s": theirs_mbs, "ratio": ours_mbs / theirs_mbs,
            "txsink_s": statistics.median(ours), "boto3_s": statistics.median(theirs),
            "naive_s": statistics.median(naive),
            "naive_ratio": statistics.median(naive) / statistics.median(ours)}


def commit_latency(target: Target, args: argparse.Namespace) -> dict[str, float]:
    from txsink.coordinator import Coordinator
    from txsink.model import TransactionContext
    from txsink.plugins import get_plugins
    from txsink.state import DirectoryStateStore
    from txsink.writer import write_participant

    backend = get_plugins().create_backend("s3", target.options(
        f"bench-{uuid.uuid4().hex[:8]}", part_size=str(5 * MIB)))
    backend.preflight("lat")
    latencies = []
    with tempfile.TemporaryDirectory() as state:
        coord = Coordinator(backend, DirectoryStateStore(state), "lat")
        coord.start()
        for epoch in range(args.epochs):
            msgs = [write_participant(backend, TransactionContext("lat", epoch, p),
                                      iter(make_batches(2_000, 2_000)))
                    for p in range(args.partitions)]
            started = time.perf_counter()
            coord.commit_epoch(epoch, msgs)
            latencies.append(time.perf_counter() - started)
    backend.close()
    return {"median_ms": statistics.median(latencies) * 1000,
            "p95_ms": pct(latencies, 0.95) * 1000, "epochs": args.epochs,
            "partitions": args.partitions}


def worker_memory(target: Target, args: argparse.Namespace) -> dict[str, float]:
    part = args.part_mib * MIB
    # ~14 Parquet bytes per row of this data: ten parts' worth of encoded output.
    rows_per_batch = 10_000
    batches = max(1, (10 * part) // (13 * rows_per_batch)) + 1
    spec = {"options": target.options(f"bench-{uuid.uuid4().hex[:8]}", part_size=str(part),
                                      upload_concurrency=str(args.concurrency)),
            "sink": "mem", "batches": batches, "rows_per_batch": rows_per_batch}
    done = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps(spec),
                          capture_output=True, text=True, check=True, timeout=600)
    out = json.loads(done.stdout)
    growth = out["peak"] - out["base"]
    return {"part_mib": args.part_mib, "object_mib": out["object_bytes"] / MIB,
            "parts": out["parts"], "peak_growth_mib": growth / MIB,
            "growth_over_part": growth / part}


def spark_writers(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Spark's s3a Parquet writer vs txsink's native path and data source, in turn."""
    import pyspark
    from pyspark.sql import SparkSession
    from txsink.spark import register, targets
    from txsink.spark import target as tx_target
    from txsink.testing.s3a import s3a_classpath, s3a_conf
    from txsink_s3.jvm import build

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    jars = [*s3a_classpath(), str(build())]
    creds = target.creds
    conf = s3a_conf(jars, endpoint_url=target.endpoint,
                    access_key=creds.get("access_key_id"),
                    secret_key=creds.get("secret_access_key"))
    # S3A keeps the magic committer's pending uploads in the task's memory, not as
    # objects beside the output (what txsink's docs advise for the native path).
    conf["spark.hadoop.fs.s3a.committer.magic.track.commits.in.memory.enabled"] = "true"
    builder = (SparkSession.builder.master("local[2]").appName("txsink-s3-bench")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.log.level", "ERROR")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.memory", "3g"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    rows = args.spark_rows
    run = uuid.uuid4().hex[:6]
    work = tempfile.mkdtemp(prefix="txsink-s3-bench-")
    try:
        df = (spark.range(0, rows, 1, args.spark_partitions)
              .selectExpr("id", "CAST(id % 1000 AS INT) AS key",
                          "CAST(id AS DOUBLE) * 0.5 AS amount",
                          "concat('customer-', CAST(id % 50000 AS STRING)) AS name").cache())
        assert df.count() == rows
        opts = target.options(f"{run}/native", writer="spark")
        native = targets("bench-native", [tx_target("s3", "s3", **opts)],
                         checkpoint_location=f"{work}/native-chk")
        ds_opts = target.options(f"{run}/datasource")

        def spark_s3a(i: int) -> None:
            df.write.mode("overwrite").parquet(f"s3a://{target.bucket}/{run}/spark/{i}")

        def datasource(i: int) -> None:
            (df.write.format("txsink").mode("append").option("backend", "s3")
             .option("sink_id", "bench-ds").options(**ds_opts)
             .option("checkpointLocation", f"{work}/ds-chk").save())

        writers = {"spark": spark_s3a, "txsink-native": lambda i: native.write(df),
                   "txsink": datasource}
        seconds: dict[str, list[float]] = {k: [] for k in writers}
        for r in range(-1, args.spark_rounds):
            order = list(writers)
            order = order[r % len(order):] + order[:r % len(order)]
            took = {}
            for key in order:
                started = time.perf_counter()
                writers[key](r + 1)
                took[key] = time.perf_counter() - started
                if r >= 0:
                    seconds[key].append(took[key])
            label = "warm-up" if r < 0 else f"round {r + 1}/{args.spark_rounds}"
            print(f"  {label}: " + ", ".join(f"{k} {v:.2f}s" for k, v in took.items())
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)
        writes = args.spark_rounds + 1
        got = spark.read.parquet(f"s3a://{target.bucket}/{run}/native/bench-native--s3").count()
        assert got == rows * writes, (got, rows * writes)
        ratios = {k: statistics.median(spark_s / s for spark_s, s in
                                       zip(seconds["spark"], seconds[k], strict=True))
                  for k in writers if k != "spark"}
        return {"rows": rows, "partitions": args.spark_partitions, "rounds": args.spark_rounds,
                "pyspark": pyspark.__version__, "seconds": seconds,
                "records_per_s": {k: rows / statistics.median(v) for k, v in seconds.items()},
                "ratio_vs_spark": ratios, "target_native_vs_spark": 1.0}
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8_000_000,
                        help="rows in the throughput partition")
    parser.add_argument("--part-mib", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=2, help="upload_concurrency")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--spark", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the native path and the data source against "
                             "Spark's s3a Parquet writer")
    parser.add_argument("--spark-rows", type=int, default=3_000_000)
    parser.add_argument("--spark-partitions", type=int, default=2)
    parser.add_argument("--spark-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args()
    if args.quick:
        args.rows, args.repeats, args.epochs = 1_000_000, 1, 5
        args.spark_rows, args.spark_rounds = 300_000, 1
    target = Target()
    results: dict[str, Any] = {"benchmark": "s3", "cores": os.cpu_count(),
                               "load_before": list(os.getloadavg())}
    try:
        print(f"server: {target.endpoint} bucket={target.bucket} part_size={args.part_mib} MiB "
              f"upload_concurrency={args.concurrency}")
        t = throughput(target, args)
        print(f"throughput ({t['object_mib']:.1f} MiB Parquet from {t['arrow_mib']:.1f} MiB "
              f"Arrow, median of {args.repeats}): txsink {t['txsink_mb_s']:.1f} MB/s "
              f"({t['txsink_s']:.2f}s), boto3 upload_fileobj {t['boto3_mb_s']:.1f} MB/s "
              f"({t['boto3_s']:.2f}s), ratio {t['ratio']:.2f} (target >= 0.8)")
        print(f"  vs encoding the same partition into memory then upload_fileobj: "
              f"{t['naive_s']:.2f}s, ratio {t['naive_ratio']:.2f}")
        lat = commit_latency(target, args)
        print(f"commit latency per epoch ({lat['epochs']:.0f} epochs x "
              f"{lat['partitions']:.0f} participants): median {lat['median_ms']:.1f} ms, "
              f"p95 {lat['p95_ms']:.1f} ms")
        mem = worker_memory(target, args)
        print(f"worker peak memory, one partition of {mem['object_mib']:.0f} MiB Parquet "
              f"({mem['parts']:.0f} parts of {mem['part_mib']:.0f} MiB): RSS grew "
              f"{mem['peak_growth_mib']:.1f} MiB = {mem['growth_over_part']:.1f} x part size")
        results.update(throughput=t, commit=lat, memory=mem)
        if args.spark:
            print(f"with Spark: {args.spark_rows:,} rows per write, {args.spark_partitions} "
                  f"partitions, {args.spark_rounds} round(s) after a warm-up", flush=True)
            sp = spark_writers(target, args)
            for key, rate in sp["records_per_s"].items():
                ratio = sp["ratio_vs_spark"].get(key)
                print(f"  {key:<14} {rate:>12,.0f} records/s"
                      + (f"  {ratio:.2f} of Spark's s3a writer" if ratio else "  (baseline)"))
            print(f"native path / Spark's s3a Parquet writer = "
                  f"{sp['ratio_vs_spark']['txsink-native']:.2f} (target >= 1.0)")
            results["spark"] = sp
    finally:
        target.close()
    results["load_after"] = list(os.getloadavg())
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
