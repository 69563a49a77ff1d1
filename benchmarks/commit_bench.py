"""Driver commit latency per epoch vs participants and vs epochs (a script, not a test).

    uv run python benchmarks/commit_bench.py [--only files postgres s3] [--quick]
        [--json PATH]

For each backend (files, postgres, s3) with the directory state store:

* participants: for N in 2, 32, 128, every epoch prepares N participants of one
  small row batch each with the real backend, then times
  ``Coordinator.commit_epoch`` (decision, commits, COMMITTED mark, orphan scan,
  prune): p50/p95 over the epochs after a warm-up one;
* epochs: 500 epochs of 8 participants (default 100 retained epochs), and the p50
  over epochs 10-30 against the p50 over the last 20 epochs, with their ratio
  (target: within 20%, i.e. a ratio <= 1.2).

Spark builds a new coordinator for every epoch's commit, often in a new Python
process, so each epoch gets a fresh ``Coordinator`` and a fresh
``DirectoryStateStore`` object (no cache survives between epochs); the backend
object is reused, so connection set-up is not counted. Before each commit the
coordinator is started with recovery up to the previous epoch, as the streaming
writer does; that start is timed apart (printed, not in the JSON rows).

PostgreSQL: ``TXSINK_POSTGRES_DSN`` (+ ``TXSINK_POSTGRES_PASSWORD``) or a local
server (fsync on, ``max_prepared_transactions`` above the participants). S3:
``TXSINK_S3_ENDPOINT`` (+ ``TXSINK_S3_BUCKET``, credentials from the AWS chain)
or a local SeaweedFS. Local servers are stopped at the end. The figures are from
one machine at one moment; the load average is printed next to them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from txsink.backend import Backend
from txsink.coordinator import Coordinator
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore, new_owner_token
from txsink.writer import write_participant

BACKENDS = ("files", "postgres", "s3", "s3-native")
PARTICIPANTS = (2, 32, 128)
ROWS = 10

#: Makes a backend for a new sink: (sink_id) -> Backend, already preflighted.
Factory = Callable[[str], Backend]
#: Prepares one epoch's participants: (backend, sink_id, epoch, participants).
Prepare = Callable[[Backend, str, int, int], list[Committable]]


def prepare_each(backend: Backend, sink: str, epoch: int, participants: int
                 ) -> list[Committable]:
    """txsink's own writer: one participant per partition, one small batch each."""
    return [write_participant(backend, TransactionContext(sink, epoch, p, 0),
                              iter([batch(epoch, p)]))
            for p in range(participants)]


def prepare_native(backend: Backend, sink: str, epoch: int, participants: int
                   ) -> list[Committable]:
    """The S3 native path (``writer: spark``): what Spark's writer leaves for one job of
    ``participants`` tasks (:func:`txsink_s3.testing.spark_native_job`), read into one
    participant per pending upload as the driver reads it."""
    from txsink_s3.testing import spark_native_job

    ctx = TransactionContext(sink, epoch, 0, 1)
    path, dirname = backend.native_staging(ctx)
    tasks = [pa.Table.from_batches([batch(epoch, p)]) for p in range(participants)]
    spark_native_job(backend, path, tasks, first_attempt=epoch * 1000 + 1)
    return backend.committables_for_directory(ctx, dirname)


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    base = (epoch * 1000 + partition) * ROWS
    ids = list(range(base, base + ROWS))
    return pa.record_batch({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([f"row-{i}" for i in ids], pa.string()),
        "amount": pa.array([i * 0.5 for i in ids], pa.float64()),
    })


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def run_epochs(factory: Factory, work: Path, participants: int,
               epochs: int, prepare: Prepare = prepare_each
               ) -> tuple[list[float], list[float]]:
    """Commit ``epochs`` epochs of ``participants`` each: the seconds each commit took,
    and the seconds each coordinator's start (with recovery) took before it."""
    sink = f"bench-{uuid.uuid4().hex[:8]}"
    backend = factory(sink)
    state = work / f"state-{sink}"
    owner = new_owner_token()
    plugins = get_plugins()
    latencies: list[float] = []
    starts: list[float] = []
    try:
        for epoch in range(epochs):
            coordinator = Coordinator(backend, DirectoryStateStore(state), sink,
                                      owner=owner, plugins=plugins)
            started = time.perf_counter()
            # What the streaming writer does before each commit.
            coordinator.start(recover=True, up_to_epoch=epoch - 1)
            starts.append(time.perf_counter() - started)
            committables = prepare(backend, sink, epoch, participants)
            started = time.perf_counter()
            coordinator.commit_epoch(epoch, committables)
            latencies.append(time.perf_counter() - started)
    finally:
        backend.close()
    return latencies, starts


@contextmanager
def files_target(work: Path) -> Iterator[Factory]:
    def make(sink: str) -> Backend:
        backend = get_plugins().create_backend(
            "files", {"path": str(work / f"out-{sink}"), "format": "parquet"})
        backend.preflight(sink)
        return backend

    yield make


@contextmanager
def postgres_target(work: Path, max_participants: int) -> Iterator[Factory]:
    import psycopg
    from txsink_postgres import testing as pgtesting

    with ExitStack() as stack:
        dsn = os.environ.get("TXSINK_POSTGRES_DSN")
        password = os.environ.get("TXSINK_POSTGRES_PASSWORD")
        if not dsn:
            server = pgtesting.LocalPostgres(
                fsync=True, max_prepared_transactions=max(64, 2 * max_participants))
            stack.enter_context(server)
            dsn, password = server.dsn, server.password
            print(f"started local PostgreSQL on 127.0.0.1:{server.port} (fsync on)",
                  flush=True)
        conn = stack.enter_context(psycopg.connect(dsn, password=password, autocommit=True))

        def make(sink: str) -> Backend:
            table = f"bench_{sink.replace('-', '_')}"
            # Schema-qualified: the backend creates a schema named like the user,
            # which an unqualified name would then land in.
            conn.execute(f"CREATE TABLE public.{table} (id bigint, name text, "
                         "amount double precision)")
            options = {"dsn": dsn, "table": table}
            if password is not None:
                options["password"] = password
            backend = get_plugins().create_backend("postgres", options)
            backend.preflight(sink)
            return backend

        yield make


@contextmanager
def s3_target(work: Path, **extra: str) -> Iterator[Factory]:
    server: Any = None
    endpoint = os.environ.get("TXSINK_S3_ENDPOINT")
    bucket = os.environ.get("TXSINK_S3_BUCKET", "txsink-bench")
    creds: dict[str, str] = {}
    if endpoint is None:
        from txsink_s3.testing import LocalSeaweedFS

        server = LocalSeaweedFS(work / f"weed-{uuid.uuid4().hex[:6]}")
        server.start()
        print(f"started local SeaweedFS at {server.endpoint_url}", flush=True)
        endpoint = server.endpoint_url
        creds = {"access_key_id": server.access_key, "secret_access_key": server.secret_key}
        server.client().create_bucket(Bucket=bucket)
    try:
        def make(sink: str) -> Backend:
            backend = get_plugins().create_backend("s3", {
                "bucket": bucket, "prefix": sink, "endpoint_url": str(endpoint),
                "region": "us-east-1", **creds, **extra})
            backend.preflight(sink)
            return backend

        yield make
    finally:
        if server is not None:
            server.stop()


def measure(backends: list[str], work: Path, per_count: int, long_epochs: int,
            long_participants: int, windows: tuple[tuple[int, int], ...],
            loads: list[tuple[float, float, float]]) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for name in backends:
        with ExitStack() as stack:
            if name == "files":
                factory = stack.enter_context(files_target(work))
            elif name == "postgres":
                factory = stack.enter_context(postgres_target(work, max(PARTICIPANTS)))
            elif name == "s3":
                factory = stack.enter_context(s3_target(work))
            else:
                factory = stack.enter_context(s3_target(work, writer="spark"))
            prepare = prepare_native if name == "s3-native" else prepare_each
            for n in PARTICIPANTS:
                # Epoch 0 warms up (first files, first statements): not counted.
                commits, starts = run_epochs(factory, work, n, per_count + 1, prepare)
                ms = [s * 1000 for s in commits[1:]]
                row = {"backend": name, "participants": n, "epoch": None,
                       "p50_ms": statistics.median(ms), "p95_ms": percentile(ms, 0.95)}
                results.append(row)
                print(f"{name:<9} {n:>4} participants: p50 {row['p50_ms']:7.1f} ms  "
                      f"p95 {row['p95_ms']:7.1f} ms  (start+recover p50 "
                      f"{statistics.median(starts[1:]) * 1000:.1f} ms)", flush=True)
            commits, starts = run_epochs(factory, work, long_participants, long_epochs,
                                         prepare)
            ms = [s * 1000 for s in commits]
            for lo, hi in windows:
                window = ms[lo:hi]
                row = {"backend": name, "participants": long_participants,
                       "epoch": f"{lo}-{hi}", "p50_ms": statistics.median(window),
                       "p95_ms": percentile(window, 0.95)}
                results.append(row)
                print(f"{name:<9} {long_participants:>4} participants, epochs {lo}-{hi}: "
                      f"p50 {row['p50_ms']:7.1f} ms  p95 {row['p95_ms']:7.1f} ms  "
                      f"(start+recover p50 {statistics.median(starts[lo:hi]) * 1000:.1f} ms)",
                      flush=True)
        loads.append(os.getloadavg())
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    ap.add_argument("--quick", action="store_true",
                    help="fewer epochs: 4 per participant count, 150 for the epochs run")
    ap.add_argument("--epochs", type=int, default=None,
                    help="measured epochs per participant count (default 10, quick 4)")
    ap.add_argument("--long-epochs", type=int, default=None,
                    help="epochs of the epochs run (default 500, quick 150)")
    ap.add_argument("--long-participants", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = ap.parse_args(argv)
    # Stopped with SIGTERM, still stop the local servers and remove the work dir.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    per_count = args.epochs or (4 if args.quick else 10)
    long_epochs = args.long_epochs or (150 if args.quick else 500)
    if long_epochs < 60:
        ap.error("--long-epochs must be at least 60")
    early, late = (10, 30), (long_epochs - 20, long_epochs)

    loads = [os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="txsink-commit-bench-"))
    print(f"{os.cpu_count()} CPUs, 1-min load average {loads[0][0]:.1f}", flush=True)
    try:
        results = measure(args.only, work, per_count, long_epochs, args.long_participants,
                          (early, late), loads)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'backend':<10}{'participants':>13}{'epochs':>10}{'p50 ms':>10}{'p95 ms':>10}")
    for row in results:
        print(f"{row['backend']:<10}{row['participants']:>13}{row['epoch'] or '':>10}"
              f"{row['p50_ms']:>10.1f}{row['p95_ms']:>10.1f}")
    for name in args.only:
        a, b = (r["p50_ms"] for r in results if r["backend"] == name and r["epoch"])
        print(f"{name}: p50 epochs {late[0]}-{late[1]} / epochs {early[0]}-{early[1]} = "
              f"{b / a:.2f} (target <= 1.2)")
    print("1-min load average: " + ", ".join(f"{load[0]:.1f}" for load in loads)
          + f" on {os.cpu_count()} CPUs (start, then after each backend)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
