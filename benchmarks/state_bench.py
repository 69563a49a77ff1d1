"""State-store overhead per epoch (a script, not a test): ``python benchmarks/state_bench.py``.

Runs the coordinator's whole per-epoch protocol (read the epoch's record, decide,
commit the participants, mark COMMITTED, orphan scan, prune) with the in-memory
backend, so that the only I/O is the state store's, once on the directory store
(a local directory) and once on the S3 state store (conditional writes on a head
object), and prints the commit latency per epoch (p50, p95) of both and their
ratio. Both runs keep the default 100 retained epochs, so the S3 head object grows
to its steady size during the run.

Uses ``TXSINK_S3_ENDPOINT`` (+ ``TXSINK_S3_BUCKET``, credentials from the usual AWS
chain) when set, else starts a local SeaweedFS and stops it at the end. The numbers
are from one machine at one moment: on a loaded machine both stores slow down, so
read the ratio, not the absolute figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from txsink.coordinator import Coordinator
from txsink.model import TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore, StateStore
from txsink.testing.memory import MemoryBackend


class _NoHooks:
    """No observers: only the store's cost is measured."""


def measure(store: StateStore, epochs: int, participants: int) -> list[float]:
    system = f"bench-{uuid.uuid4().hex[:8]}"
    backend = MemoryBackend(system)
    plugins = build_plugins(entry_points=[], extra_plugins=[("bench", _NoHooks())])
    coordinator = Coordinator(backend, store, "bench", plugins=plugins)
    coordinator.start()
    latencies = []
    for epoch in range(epochs):
        committables = []
        for p in range(participants):
            txn = backend.begin_transaction(TransactionContext("bench", epoch, p, p))
            committables.append(backend.pre_commit(txn))
        started = time.perf_counter()
        coordinator.commit_epoch(epoch, committables)
        latencies.append(time.perf_counter() - started)
    return latencies


def cold_reads(open_store: Any, times: int) -> list[float]:
    """``records()`` of a store object that has read nothing yet: what a new Python
    worker pays (Spark starts one to plan each micro-batch)."""
    out = []
    for _ in range(times):
        store = open_store()
        started = time.perf_counter()
        store.records()
        out.append(time.perf_counter() - started)
    return out


def quantiles(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=20)
    return statistics.median(values), cuts[18]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--participants", type=int, default=4)
    args = ap.parse_args()
    server: Any = None
    endpoint = os.environ.get("TXSINK_S3_ENDPOINT")
    bucket = os.environ.get("TXSINK_S3_BUCKET", "txsink-bench")
    if endpoint is None:
        from txsink_s3.testing import LocalSeaweedFS

        server = LocalSeaweedFS()
        server.start()
        server.client().create_bucket(Bucket=bucket)
    try:
        from txsink_s3.state import S3StateStore

        client = server.client() if server is not None else None
        if client is None:
            import boto3  # type: ignore[import-untyped]

            client = boto3.client("s3", endpoint_url=endpoint)
        load = os.getloadavg()[0]
        location = f"s3://{bucket}/bench-{uuid.uuid4().hex[:8]}/txsink"
        with tempfile.TemporaryDirectory(prefix="txsink-state-bench-") as tmp:
            directory = measure(DirectoryStateStore(tmp), args.epochs, args.participants)
            directory_cold = cold_reads(lambda: DirectoryStateStore(tmp), 20)
        s3 = measure(S3StateStore(location, client=client), args.epochs, args.participants)
        s3_cold = cold_reads(lambda: S3StateStore(location, client=client), 20)
        print(f"{args.epochs} epochs x {args.participants} participants, in-memory backend "
              f"(only the state store does I/O), 100 epochs retained; 1-min load average "
              f"{load:.1f} on {os.cpu_count()} CPUs")
        print(f"{'':<40}{'directory':>12}{'s3':>12}{'s3/dir':>8}")
        for label, d, s in (("commit latency per epoch", directory, s3),
                            ("cold read of the state (new proc.)", directory_cold, s3_cold)):
            d50, d95 = quantiles(d)
            s50, s95 = quantiles(s)
            print(f"{label + ' p50':<40}{d50 * 1000:>10.1f}ms{s50 * 1000:>10.1f}ms"
                  f"{s50 / d50:>7.1f}x")
            print(f"{label + ' p95':<40}{d95 * 1000:>10.1f}ms{s95 * 1000:>10.1f}ms"
                  f"{s95 / d95:>7.1f}x")
    finally:
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
