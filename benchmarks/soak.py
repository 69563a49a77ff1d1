"""Months of epochs in minutes: does anything grow with every epoch? (a script, not a test)

    uv run python benchmarks/soak.py [--backends files,postgres,s3,kafka]
        [--states directory,s3] [--epochs 20000] [--sample 500]
        [--spark-epochs 3000] [--jobs 2] [--json PATH] [--render DOCS_DIR]

A streaming query with a 10-second trigger makes 260,000 epochs a month. Two kinds of
run, each per backend:

* **core** (per state store, directory and S3): ``--epochs`` epochs of small
  participants through the real backend, the real coordinator and the real state
  store, the way the Spark adapter drives them: a fresh ``Coordinator`` per epoch,
  started with recovery up to the previous epoch, then ``commit_epoch``. Every tenth
  epoch a *baseline* sink, written alongside on the same servers, commits one epoch
  too: latency is judged as the soaked sink's p50 over the baseline's in the same
  window, so a machine shared with other work does not read as growth.
* **spark** (``--spark-epochs``, directory state store): ``txsink run`` of a pipeline
  file (``rate-micro-batch`` source, a ``0 seconds`` trigger, two partitions) with
  ``--metrics-port``, read line by line; the metrics endpoint is scraped every 15 s as
  Prometheus would, and a baseline sink is committed from this process once a second.

Every ``--sample`` epochs a run records commit latency p50/p95 over the window, RSS
and open descriptors (core: this process; spark: the ``txsink run`` process, the
driver JVM and its Python workers), the state store's size (records, files or
objects, bytes; its archive of decided names apart), what the target keeps per epoch
(files under the output's ``_txsink/``, S3 manifest objects, PostgreSQL marker rows,
records in Kafka's marker and claim topics) and, for Spark, the metrics directory's
files, Spark's checkpoint files and its log.

Verdicts compare each series from the first sample at or after epoch 1,000 to the
end: flat means within 20% (with a small absolute slack for counts and
milliseconds), or at or under the bound its documented retention gives
(:data:`BOUNDS`). Exit status 1 when a series grows. ``--json`` keeps the samples;
``--render DOCS`` draws ``soak.png`` and the soak section of ``performance.md``
through ``report.py``. The short form runs in CI (``tests/integration/test_soak.py``:
500 epochs per backend, no Spark); ``tox -e soak`` runs the long one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from txsink.backend import Backend
from txsink.coordinator import Coordinator
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.state import StateStore, new_owner_token
from txsink.writer import write_participant

BACKENDS = ("files", "postgres", "s3", "kafka")
STATES = ("directory", "s3")
PARTICIPANTS = 2
ROWS = 5
#: From this epoch on a series must stay flat (the first 1,000 epochs fill what the
#: retentions keep: 100 state records, 1,000 markers).
STEADY_FROM = 1000
FLAT = 1.2
#: The baseline sink commits one epoch per this many epochs of the soaked one.
BASELINE_EVERY = 10
#: Seconds between two scrapes of a Spark run's metrics endpoint (Prometheus: 15 s).
SCRAPE_S = 15.0
#: ``orphan.scan.records`` of the Kafka sinks (the default is 20,000).
SCAN_WINDOW = 500
#: ``manifest_retention_epochs`` of the soaked S3 sinks (the default is 10,000): a run of a
#: few thousand epochs then prunes manifests as a months-long one does.
S3_MANIFEST_RETENTION = 1000
#: Seconds between two commits of a Spark run's baseline sink (written in-process).
BASELINE_PERIOD_S = 1.0

Bound = Callable[["Soak"], float]

#: Series with a documented retention: name -> (bound for a run, where it comes from).
BOUNDS: dict[str, tuple[Bound, str]] = {
    "state_records": (lambda s: 100 + 10 + 3,
                      "100 retained epochs, pruned ten at a time, + reserved/decided ones"),
    "archive_chunks": (lambda s: s.last_epoch // 1000 + 1,
                       "one chunk per 1,000 epochs, deleted after 14 days"),
    "output_txsink_files": (lambda s: 1000 + 100 + 8 + 3 * s.participants,
                            "files: marker_retention_epochs (1,000) + one prune step"),
    "s3_manifests": (lambda s: min(s.last_epoch, S3_MANIFEST_RETENTION + 100),
                     "s3: manifest_retention_epochs (1,000 in the soak, 10,000 by default) "
                     "+ one prune step"),
    "pg_marker_rows": (lambda s: s.participants * (1000 + 1),
                       "postgres: marker_retention_epochs (1,000) per participant"),
    "kafka_marker_records": (lambda s: 4000,
                             "kafka: compaction keeps one record per pooled transactional "
                             "id once a segment rolls (segment.ms; 10 s in the soak, 7 days "
                             "by default)"),
    "kafka_scan_epochs": (lambda s: SCAN_WINDOW + SCAN_WINDOW // 10,
                          "kafka: the committed epochs of orphan.scan.records (500 in the "
                          "soak) marker records"),
    "driver_rss_mb": (lambda s: 1024 + 1024,
                      "the driver JVM: spark.driver.memory (1g in the soak) for its heap, "
                      "which it fills lazily, plus metaspace, code cache and threads; what "
                      "the heap holds after a full GC is driver_heap_mb, judged flat"),
    "spark_checkpoint_files": (lambda s: 2 * 4 * (100 + 10) + 20,
                               "Spark: spark.sql.streaming.minBatchesToRetain (100) offsets "
                               "and commits, with their .crc files"),
}
#: Series reported but not judged on their own: raw latencies (judged through the p50's
#: ratio to the baseline sink in the same window: on a machine shared with the other
#: soak runs a raw millisecond figure follows the load), the machine's load, time.
INFO = ("load_avg", "elapsed_s", "commit_p50_ms", "commit_p95_ms", "baseline_p50_ms",
        "baseline_p95_ms", "commit_p95_ratio")
#: Absolute slack on top of the 20% band: counts that move by a few, milliseconds
#: that are noise at a 3 ms figure, ratios of two noisy medians.
SLACK = {"open_fds": 8, "cli_fds": 8, "driver_fds": 16, "python_workers": 2,
         "state_files": 4, "metrics_files": 24, "kafka_claim_records": 2,
         "commit_p50_ratio": 0.15, "spark_log_kb": 64}


def slack(name: str) -> float:
    if name in SLACK:
        return SLACK[name]
    return 3.0 if name.endswith("_ms") else 0.0


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    base = (epoch * 1000 + partition) * ROWS
    return pa.record_batch({"id": pa.array(range(base, base + ROWS), pa.int64()),
                            "key": pa.array([b"k%d" % i for i in range(ROWS)], pa.binary()),
                            "value": pa.array([b"v%d" % i for i in range(ROWS)],
                                              pa.binary())})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- processes ----------------------------------------------------------------------------


def rss_mb(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def open_fds(pid: int | str = "self") -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def process_tree(root: int) -> list[tuple[int, str]]:
    """``(pid, comm)`` of every live descendant of ``root``."""
    children: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        end = text.rfind(")")
        comm = text[text.find("(") + 1:end]
        fields = text[end + 2:].split()
        if fields[0] in ("Z", "X"):
            continue
        children.setdefault(int(fields[1]), []).append((int(name), comm))
    out: list[tuple[int, str]] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


# -- results ------------------------------------------------------------------------------


@dataclass
class Soak:
    """One run's samples and their verdicts."""

    backend: str
    state: str
    epochs: int
    kind: str = "core"
    samples: list[dict[str, float]] = field(default_factory=list)
    participants: int = PARTICIPANTS
    #: The epoch from which series must stay flat, and how flat.
    steady_from: int = STEADY_FROM
    flat: float = FLAT
    #: Set when the run itself failed (a server, Spark): the verdict says so.
    error: str = ""

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.state}" + (" (Spark)" if self.kind == "spark" else "")

    @property
    def last_epoch(self) -> int:
        return int(self.samples[-1]["epoch"]) if self.samples else 0

    def steady(self) -> list[dict[str, float]]:
        return [s for s in self.samples if s["epoch"] >= self.steady_from]

    def verdicts(self) -> dict[str, str]:
        """Per series: ``flat (...)``, ``bounded (...)``, ``info`` or ``GROWS ...``."""
        if self.error:
            return {"run": f"FAILED: {self.error}"}
        steady = self.steady()
        if len(steady) < 2:
            return {"all": f"too short: fewer than two samples from epoch {self.steady_from}"}
        first, last = steady[0], steady[-1]
        out: dict[str, str] = {}
        for name in last:
            if name == "epoch":
                continue
            value = last[name]
            if name in INFO:
                out[name] = f"info ({first.get(name, value):g} -> {value:g})"
                continue
            if name in BOUNDS:
                bound, why = BOUNDS[name]
                limit = bound(self)
                peak = max(s.get(name, 0) for s in steady)
                out[name] = (f"bounded (max {peak:g} <= {limit:g}: {why})" if peak <= limit
                             else f"GROWS past its bound ({peak:g} > {limit:g}: {why})")
                continue
            start, end = first.get(name, value), value
            if name.endswith(("_ms", "_ratio")) and len(steady) >= 6:
                # Latencies: the median of three samples at each end, not one window.
                start = statistics.median(s[name] for s in steady[:3] if name in s)
                end = statistics.median(s[name] for s in steady[-3:] if name in s)
            band = self.flat if name.endswith(("_ms", "_ratio")) else FLAT
            limit = start * band + slack(name)
            out[name] = (f"flat ({start:g} -> {end:g})" if end <= limit
                         else f"GROWS ({start:g} -> {end:g}, limit {limit:g})")
        return out

    def grows(self) -> list[str]:
        return [f"{k}: {v}" for k, v in self.verdicts().items()
                if v.startswith(("GROWS", "too short", "FAILED"))]

    def ok(self) -> bool:
        return not self.grows()

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "state": self.state, "kind": self.kind,
                "epochs": self.epochs, "participants": self.participants,
                "steady_from": self.steady_from, "flat": self.flat, "error": self.error,
                "samples": self.samples, "verdicts": self.verdicts(), "ok": self.ok()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Soak:
        return cls(data["backend"], data["state"], int(data["epochs"]), data.get("kind", "core"),
                   list(data["samples"]), int(data.get("participants", PARTICIPANTS)),
                   int(data.get("steady_from", STEADY_FROM)), float(data.get("flat", FLAT)),
                   str(data.get("error", "")))


# -- the core run -------------------------------------------------------------------------


@dataclass
class Target:
    """One backend, ready to write a sink, and how to measure what it keeps."""

    name: str
    make: Callable[[str], Backend]
    #: What the target keeps for ``sink``; the backend when it is in this process.
    measure: Callable[[str, Backend | None], dict[str, float]] = lambda sink, backend: {}
    #: The sink options of a pipeline file writing ``sink`` (the Spark run).
    pipeline_options: Callable[[str], dict[str, str]] = lambda sink: {}
    #: Where the output of ``sink`` is, for the files measure of a Spark run.
    out_dir: Path | None = None


class _Sink:
    """A sink the core run writes: backend, state store, owner, epochs so far."""

    def __init__(self, target: Target, store: Callable[[str], StateStore], prefix: str) -> None:
        self.name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.backend = target.make(self.name)
        self.store = store(self.name)
        self.owner = new_owner_token()
        self.epoch = 0

    def commit_one(self, participants: int, plugins: Any) -> float:
        """Write and commit the next epoch; the milliseconds a micro-batch's commit takes
        (coordinator start with recovery, then commit)."""
        epoch = self.epoch
        committables = [write_participant(self.backend, TransactionContext(self.name, epoch, p, 0),
                                          iter([batch(epoch, p)]))
                        for p in range(participants)]
        t0 = time.perf_counter()
        coordinator = Coordinator(self.backend, self.store, self.name, owner=self.owner,
                                  plugins=plugins)
        coordinator.start(recover=True, up_to_epoch=epoch - 1)
        coordinator.commit_epoch(epoch, committables)
        self.epoch += 1
        return (time.perf_counter() - t0) * 1000


def run(target: Target, store: Callable[[str], StateStore], state_name: str, epochs: int,
        sample: int, progress: Callable[[str], None] = print, *,
        participants: int = PARTICIPANTS, baseline_every: int = BASELINE_EVERY) -> Soak:
    """Drive ``epochs`` epochs through ``target`` and a state store; sample as it goes."""
    plugins = get_plugins()
    soaked = _Sink(target, store, "soak")
    base = _Sink(target, store, "base")
    soak = Soak(target.name, state_name, epochs, participants=participants)
    window: list[float] = []
    base_window: list[float] = []
    started = time.monotonic()
    try:
        for epoch in range(epochs):
            window.append(soaked.commit_one(participants, plugins))
            if epoch % baseline_every == 0:
                base_window.append(base.commit_one(participants, plugins))
            if (epoch + 1) % sample == 0:
                p50 = statistics.median(window)
                b50 = statistics.median(base_window)
                point: dict[str, float] = {
                    "epoch": epoch + 1,
                    "commit_p50_ms": round(p50, 2),
                    "commit_p95_ms": round(percentile(window, 0.95), 2),
                    "baseline_p50_ms": round(b50, 2),
                    "baseline_p95_ms": round(percentile(base_window, 0.95), 2),
                    "commit_p50_ratio": round(p50 / b50, 3),
                    "commit_p95_ratio": round(percentile(window, 0.95)
                                              / percentile(base_window, 0.95), 3),
                    "rss_mb": round(rss_mb(), 1), "open_fds": open_fds(),
                    **state_size(soaked.store), **target.measure(soaked.name, soaked.backend),
                    "load_avg": round(os.getloadavg()[0], 2),
                    "elapsed_s": round(time.monotonic() - started, 1)}
                soak.samples.append(point)
                window, base_window = [], []
                progress(f"{target.name}/{state_name} epoch {epoch + 1}/{epochs}: " + ", ".join(
                    f"{k}={v:g}" for k, v in point.items() if k != "epoch"))
    finally:
        soaked.backend.close()
        base.backend.close()
    return soak


def state_size(store: StateStore) -> dict[str, float]:
    """Records, files (objects) and bytes of a state store; archive chunks apart."""
    records = len(store.states())
    chunks = len(store.archive_chunks())
    size = files = 0
    root = getattr(store, "root", None)
    if root is not None:
        for p in Path(root).rglob("*"):
            if p.is_file() and "archive" not in p.relative_to(root).parts:
                files += 1
                size += p.stat().st_size
    else:  # S3: records are objects of their own
        client, bucket, prefix = store.client, store.bucket, store.prefix  # type: ignore[attr-defined]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix + "/"):
            for o in page.get("Contents", []) or []:
                if "/archive/" not in o["Key"]:
                    files += 1
                    size += o["Size"]
    return {"state_records": records, "state_files": files, "state_bytes": size,
            "archive_chunks": chunks}


# -- targets ------------------------------------------------------------------------------


@contextmanager
def targets(names: list[str], work: Path, *, s3_state: bool = False) -> Iterator[dict[str, Target]]:
    """Local servers for the backends asked for (and S3 for the S3 state store),
    stopped at the end."""
    with ExitStack() as stack:
        out: dict[str, Target] = {}
        if "files" in names:
            out["files"] = _files(work)
        if "postgres" in names:
            out["postgres"] = _postgres(stack)
        if "s3" in names or s3_state:
            stack.enter_context(_weed(work))
            if "s3" in names:
                out["s3"] = _s3()
        if "kafka" in names:
            out["kafka"] = _kafka(stack)
        yield out


def _files(work: Path) -> Target:
    def make(sink: str) -> Backend:
        b = get_plugins().create_backend("files", {"path": str(work / f"out-{sink}"),
                                                   "format": "jsonl"})
        b.preflight(sink)
        return b

    def kept(sink: str, backend: Backend | None) -> dict[str, float]:
        meta = work / f"out-{sink}" / "_txsink"
        return {"output_txsink_files": sum(1 for p in meta.rglob("*") if p.is_file())}

    return Target("files", make, kept, lambda sink: {"path": str(work / f"out-{sink}"),
                                                      "format": "jsonl"})


#: Set by :func:`_weed`: the local S3 server's endpoint, bucket and credentials.
S3_SERVER: dict[str, str] = {}


@contextmanager
def _weed(work: Path) -> Iterator[None]:
    from txsink_s3.testing import LocalSeaweedFS

    server = LocalSeaweedFS(work / "weed")
    server.start()
    try:
        server.client().create_bucket(Bucket="txsink-soak")
        S3_SERVER.update(endpoint=server.endpoint_url, bucket="txsink-soak",
                         key=server.access_key, secret=server.secret_key or "")
        yield
    finally:
        server.cleanup()


def s3_client() -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=S3_SERVER["endpoint"], region_name="us-east-1",
                        aws_access_key_id=S3_SERVER["key"],
                        aws_secret_access_key=S3_SERVER["secret"])


def _s3() -> Target:
    def options(sink: str) -> dict[str, str]:
        return {"bucket": S3_SERVER["bucket"], "prefix": sink, "format": "jsonl",
                "endpoint_url": S3_SERVER["endpoint"], "region": "us-east-1",
                "access_key_id": S3_SERVER["key"], "secret_access_key": S3_SERVER["secret"],
                "manifest_retention_epochs": str(S3_MANIFEST_RETENTION)}

    def make(sink: str) -> Backend:
        b = get_plugins().create_backend("s3", options(sink))
        b.preflight(sink)
        return b

    def kept(sink: str, backend: Backend | None) -> dict[str, float]:
        prefix = f"{sink}/{sink}/_txsink/manifests/"
        count = 0
        for page in s3_client().get_paginator("list_objects_v2").paginate(
                Bucket=S3_SERVER["bucket"], Prefix=prefix):
            count += len(page.get("Contents", []) or [])
        return {"s3_manifests": count}

    return Target("s3", make, kept, options)


def _postgres(stack: ExitStack) -> Target:
    import psycopg
    from txsink_postgres import testing as pgtesting

    server = stack.enter_context(pgtesting.LocalPostgres(fsync=True))
    conn = stack.enter_context(psycopg.connect(server.dsn, password=server.password,
                                               autocommit=True))

    def options(sink: str) -> dict[str, str]:
        table = f"soak_{sink.replace('-', '_')}"
        conn.execute(f"CREATE TABLE IF NOT EXISTS public.{table} "
                     "(id bigint, key bytea, value bytea)")
        return {"dsn": server.dsn, "table": table, "password": server.password}

    def make(sink: str) -> Backend:
        b = get_plugins().create_backend("postgres", options(sink))
        b.preflight(sink)
        return b

    def kept(sink: str, backend: Backend | None) -> dict[str, float]:
        row = conn.execute("SELECT count(*) FROM txsink.txsink_commits WHERE sink_id = %s",
                           (sink,)).fetchone()
        return {"pg_marker_rows": int(row[0]) if row else -1}

    def spark_options(sink: str) -> dict[str, str]:
        table = f"soak_{sink.replace('-', '_')}"
        conn.execute(f"CREATE TABLE IF NOT EXISTS public.{table} "
                     "(id bigint, key text, value text)")
        return {"dsn": server.dsn, "table": table, "password": server.password}

    return Target("postgres", make, kept, spark_options)


def _kafka(stack: ExitStack) -> Target:
    import confluent_kafka.admin as kadmin
    from confluent_kafka import Consumer
    from txsink_kafka import testing as kt
    from txsink_kafka.backend import close_shared_clients
    from txsink_kafka.local_broker import LocalKafka

    # The log cleaner compacts the marker and claim topics once a segment rolls: small
    # segments, so that a soak of minutes sees what weeks of the default (segment.ms
    # 7 days) would.
    kafka = LocalKafka(properties={"log.cleaner.backoff.ms": "2000"})
    stack.callback(kafka.close)
    stack.callback(close_shared_clients)
    kafka.start()
    topic = f"soak-{uuid.uuid4().hex[:6]}"
    kt.create_topic(kafka.bootstrap, topic, partitions=2)
    markers = f"soak-markers-{uuid.uuid4().hex[:6]}"
    claims = f"soak-claims-{uuid.uuid4().hex[:6]}"
    admin = kadmin.AdminClient({"bootstrap.servers": kafka.bootstrap})
    compacted = {"cleanup.policy": "compact", "segment.ms": "10000",
                 "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "1000"}
    new = [kadmin.NewTopic(name, 1, 1, config=compacted)  # type: ignore[attr-defined]
           for name in (markers, claims)]
    for future in admin.create_topics(new).values():
        future.result(30)
    watch = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "soak",
                      "enable.partition.eof": True, "enable.auto.commit": False})
    stack.callback(watch.close)

    def options(sink: str) -> dict[str, str]:
        # A scan window of 500 records (20,000 by default), so that what a driver
        # remembers of the scans reaches its bound within a short soak.
        return {"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                "marker.topic": markers, "claim.topic": claims,
                "orphan.scan.records": str(SCAN_WINDOW)}

    def make(sink: str) -> Backend:
        b = get_plugins().create_backend("kafka", options(sink))
        b.preflight(sink)
        return b

    def kept(sink: str, backend: Backend | None) -> dict[str, float]:
        out = {"kafka_marker_records": _records(watch, markers),
               "kafka_claim_records": _records(watch, claims)}
        if backend is not None:  # what this process keeps of its marker scans
            scans = backend.recovery.scan_state(sink)  # type: ignore[attr-defined]
            out["kafka_scan_epochs"] = float(len(scans.committed_epochs))
        return out

    return Target("kafka", make, kept, options)


def _records(watch: Any, topic: str) -> float:
    """Records a one-partition topic holds now: compaction removes records, not offsets,
    so they are counted by reading them."""
    from confluent_kafka import KafkaError, TopicPartition

    low, high = watch.get_watermark_offsets(TopicPartition(topic, 0), 30, cached=False)
    if high <= low:
        return 0.0
    watch.assign([TopicPartition(topic, 0, low)])
    count, deadline = 0, time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msgs = watch.consume(10_000, 0.5)
            data = [m for m in msgs if m.error() is None]
            count += len(data)
            if any(m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF
                   for m in msgs) or (data and (data[-1].offset() or 0) >= high - 1):
                break
    finally:
        watch.unassign()
    return float(count)


def store_factory(kind: str, work: Path) -> Callable[[str], StateStore]:
    if kind == "directory":
        from txsink.state import DirectoryStateStore

        return lambda sink: DirectoryStateStore(work / f"state-{sink}")
    from txsink_s3.state import S3StateStore

    return lambda sink: S3StateStore(f"s3://{S3_SERVER['bucket']}/{sink}/state",
                                     client=s3_client())


# -- the Spark run ------------------------------------------------------------------------

_BATCH_LINE = re.compile(r"^batch (\d+): .*?commit (\d+) ms")
_METRICS_LINE = re.compile(r"^metrics: (http://\S+)")


def pipeline_file(target: Target, sink: str, work: Path) -> Path:
    """A streaming pipeline: rate-micro-batch (10 rows, 2 partitions) -> ``target``."""
    spec = {
        "name": sink, "mode": "streaming",
        "source": {"type": "spark", "format": "rate-micro-batch",
                   "options": {"rowsPerBatch": "10", "numPartitions": "2"}},
        "transform": "SELECT value AS id, CAST(value % 7 AS STRING) AS key, "
                     "CAST(timestamp AS STRING) AS value FROM source",
        "sink": {"backend": target.name, "sink_id": sink,
                 "options": target.pipeline_options(sink)},
        "checkpoint": str(work / f"chk-{sink}"),
        "trigger": {"processing_time": "0 seconds"},
        "spark": {"master": "local[2]", "conf": {
            "spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
            "spark.driver.memory": "1g"}}}
    path = work / f"{sink}.json"
    path.write_text(json.dumps(spec, indent=1))
    return path


def run_spark(target: Target, work: Path, epochs: int, sample: int,
              progress: Callable[[str], None] = print, *, timeout_s: float | None = None) -> Soak:
    """``txsink run`` for ``epochs`` micro-batches; sample driver, workers and the target."""
    from txsink.state import DirectoryStateStore

    sink = f"spark-{target.name}-{uuid.uuid4().hex[:6]}"
    path = pipeline_file(target, sink, work)
    metrics_dir = work / f"metrics-{sink}"
    metrics_dir.mkdir()
    checkpoint = work / f"chk-{sink}"
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
           "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-c", "import sys; from txsink.cli import main; sys.exit(main())",
           "run", str(path), "--max-batches", str(epochs), "--metrics-port", "0"]
    soak = Soak(target.name, "directory", epochs, kind="spark", participants=2)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1, start_new_session=True)
    stop_scrapes = threading.Event()
    scrapes: list[str] = []
    window: list[float] = []
    tail: list[str] = []
    started = time.monotonic()
    store = DirectoryStateStore(checkpoint / "txsink")
    committed = 0

    def scrape(url: str) -> None:
        while not stop_scrapes.wait(SCRAPE_S):
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(url, timeout=10) as r:
                    r.read()
                scrapes.append(url)

    # The baseline: a sink of the same backend committed from this process about once
    # a second while the pipeline runs, so each window has the machine's own pace.
    base = _Sink(target, store_factory("directory", work), "spark-base")
    base_window: list[float] = []
    base_lock = threading.Lock()

    def baseline() -> None:
        plugins = get_plugins()
        while not stop_scrapes.wait(BASELINE_PERIOD_S):
            took = base.commit_one(1, plugins)
            with base_lock:
                base_window.append(took)

    threading.Thread(target=baseline, daemon=True).start()

    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-40:], line.rstrip()]
            m = _METRICS_LINE.match(line)
            if m:
                threading.Thread(target=scrape, args=(m.group(1),), daemon=True).start()
            m = _BATCH_LINE.match(line)
            if not m:
                continue
            committed += 1
            window.append(float(m.group(2)))
            if committed % sample == 0:
                with base_lock:
                    b50 = statistics.median(base_window) if base_window else float("nan")
                    base_window.clear()
                p50 = statistics.median(window)
                point = {"epoch": committed,
                         "commit_p50_ms": p50,
                         "commit_p95_ms": percentile(window, 0.95),
                         "baseline_p50_ms": round(b50, 2),
                         "commit_p50_ratio": round(p50 / b50, 3),
                         **spark_processes(proc.pid), **state_size(store),
                         **target.measure(sink, None),
                         "metrics_files": len(os.listdir(metrics_dir)),
                         **spark_files(checkpoint),
                         "load_avg": round(os.getloadavg()[0], 2),
                         "elapsed_s": round(time.monotonic() - started, 1)}
                soak.samples.append(point)
                window = []
                progress(f"{soak.label} epoch {committed}/{epochs}: " + ", ".join(
                    f"{k}={v:g}" for k, v in point.items() if k != "epoch"))
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                soak.error = f"stopped after {timeout_s:g}s at epoch {committed}"
                break
        code = proc.wait(timeout=300)
        if code != 0 and not soak.error:
            soak.error = f"txsink run exited {code}: " + " | ".join(tail[-5:])
    finally:
        stop_scrapes.set()
        base.backend.close()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
    if not scrapes and not soak.error and soak.samples:
        soak.error = "the metrics endpoint was never scraped"
    return soak


def spark_processes(cli_pid: int) -> dict[str, float]:
    """RSS and descriptors of ``txsink run``, its driver JVM and that JVM's Python workers,
    and the JVM's heap after a full GC (what it holds on to)."""
    tree = process_tree(cli_pid)
    jvms = [pid for pid, comm in tree if comm == "java"]
    jvm = jvms[0] if jvms else None
    workers = ([pid for pid, comm in process_tree(jvm) if comm.startswith("python")]
               if jvm is not None else [])
    out = {"cli_rss_mb": round(rss_mb(cli_pid), 1), "cli_fds": open_fds(cli_pid),
           "driver_rss_mb": round(rss_mb(jvm), 1) if jvm else 0.0,
           "driver_fds": open_fds(jvm) if jvm else 0,
           "worker_rss_mb": round(sum(rss_mb(p) for p in workers), 1),
           "python_workers": len(workers)}
    heap = jvm_heap_after_gc(jvm) if jvm else None
    if heap is not None:
        out["driver_heap_mb"] = heap
    return out


_HEAP_USED = re.compile(r"heap\s+total \d+K, used (\d+)K")


def jvm_heap_after_gc(pid: int) -> float | None:
    """MB the JVM's heap holds right after a full GC (``jcmd GC.run``, then
    ``GC.heap_info``): a JVM's RSS follows its heap's lazy growth toward the limit,
    this follows what it keeps. None without ``jcmd``."""
    java = shutil.which("java")
    jcmd = shutil.which("jcmd") or (str(Path(os.path.realpath(java)).with_name("jcmd"))
                                    if java else None)
    if not jcmd or not os.path.exists(jcmd):
        return None
    try:
        subprocess.run([jcmd, str(pid), "GC.run"], capture_output=True, timeout=60, check=True)
        info = subprocess.run([jcmd, str(pid), "GC.heap_info"], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _HEAP_USED.search(info)
    return round(int(found.group(1)) / 1024, 1) if found else None


def spark_files(checkpoint: Path) -> dict[str, float]:
    """Files in Spark's own checkpoint (offsets, commits, ...; the txsink state apart)
    and the size of the Spark log ``txsink run`` writes beside it."""
    files = sum(1 for p in checkpoint.rglob("*")
                if p.is_file() and "txsink" not in p.relative_to(checkpoint).parts)
    log = checkpoint.with_name(f"{checkpoint.name}-spark.log")
    size = log.stat().st_size if log.exists() else 0
    return {"spark_checkpoint_files": files, "spark_log_kb": round(size / 1024, 1)}


# -- main ---------------------------------------------------------------------------------


def table(soaks: list[Soak]) -> str:
    """The markdown table of a set of runs (the report's table is :func:`report.soak_table`)."""
    lines = ["| run | epochs | commit p50 ms (first -> last) | p50 / baseline | RSS MB | "
             "state records / files / bytes | target keeps | verdict |",
             "|---|---:|---|---|---|---|---|---|"]
    for s in soaks:
        if not s.samples:
            lines.append(f"| {s.label} | 0 | | | | | | {s.error or 'no sample'} |")
            continue
        steady = (s.steady() or s.samples)[0]
        last = s.samples[-1]
        kept = ", ".join(f"{k.replace('_', ' ')} {last[k]:g}" for k in (
            "output_txsink_files", "s3_manifests", "pg_marker_rows", "kafka_marker_records",
            "kafka_claim_records", "metrics_files") if k in last)
        rss = "rss_mb" if "rss_mb" in last else "driver_rss_mb"
        ratio = (f"{steady['commit_p50_ratio']:g} -> {last['commit_p50_ratio']:g}"
                 if "commit_p50_ratio" in last else "")
        verdict = "flat or bounded" if s.ok() else "; ".join(s.grows())
        lines.append(f"| {s.label} | {s.last_epoch:,} | {steady['commit_p50_ms']:g} -> "
                     f"{last['commit_p50_ms']:g} | {ratio} | {steady[rss]:g} -> {last[rss]:g} | "
                     f"{last['state_records']:g} / {last['state_files']:g} / "
                     f"{last['state_bytes']:,.0f} B | {kept} | {verdict} |")
    return "\n".join(lines)


def soak_all(backends: list[str], states: list[str], epochs: int, sample: int,
             work: Path, progress: Callable[[str], None] = print, *,
             spark_epochs: int = 0, participants: int = PARTICIPANTS,
             steady_from: int = STEADY_FROM, flat: float = FLAT) -> list[Soak]:
    """Every run asked for, one after the other, in this process."""
    soaks: list[Soak] = []
    with targets(backends, work, s3_state="s3" in states) as ready:
        for name in backends:
            for state in states if epochs else []:
                soaks.append(run(ready[name], store_factory(state, work), state, epochs,
                                 sample, progress, participants=participants))
            if spark_epochs:
                soaks.append(run_spark(ready[name], work, spark_epochs, sample, progress))
    for s in soaks:
        s.steady_from, s.flat = steady_from, flat
    return soaks


def soak_parallel(jobs: list[list[str]], at_once: int,
                  progress: Callable[[str], None]) -> list[Soak]:
    """Run each job (this script's arguments) in a process of its own, ``at_once`` at a
    time, in the order given."""
    from concurrent.futures import ThreadPoolExecutor

    def one(args: list[str]) -> list[Soak]:
        fd, name = tempfile.mkstemp(prefix="txsink-soak-", suffix=".json")
        os.close(fd)
        out = Path(name)
        try:
            p = subprocess.Popen([sys.executable, __file__, *args, "--json", str(out)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 bufsize=1)
            assert p.stdout is not None
            for line in p.stdout:
                progress(line.rstrip())
            p.wait()
            try:
                return [Soak.from_dict(d) for d in json.loads(out.read_text())["runs"]]
            except (ValueError, KeyError):
                return [Soak(args[1], args[3], 0, error=f"exited {p.returncode}")]
        finally:
            out.unlink(missing_ok=True)

    with ThreadPoolExecutor(at_once) as pool:
        return [s for done in pool.map(one, jobs) for s in done]


def rejudge(source: Path, out: Path | None, render: Path | None) -> int:
    """Judge the samples of an earlier run again (bounds and bands as they are now):
    hours of epochs need not be run again to render them or to fix a verdict."""
    result = json.loads(source.read_text())
    soaks = [Soak.from_dict(d) for d in result["runs"]]
    result["runs"] = [s.to_dict() for s in soaks]
    return publish(soaks, result, out, render)


def publish(soaks: list[Soak], result: dict[str, Any], out: Path | None,
            render: Path | None) -> int:
    """Print the table, keep ``result`` as JSON and render it; the exit status of a soak."""
    print(table(soaks))
    if out:
        out.write_text(json.dumps(result, indent=1))
    if render:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import report

        report.render_soak(result, render)
        print(f"wrote {render / 'soak.png'} and the soak section of "
              f"{render / 'performance.md'}")
    return 0 if all(s.ok() for s in soaks) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--states", default=",".join(STATES))
    parser.add_argument("--epochs", type=int, default=20_000,
                        help="epochs per core run (0: no core run)")
    parser.add_argument("--spark-epochs", type=int, default=0,
                        help="micro-batches of the txsink run per backend (0: no Spark run)")
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--participants", type=int, default=PARTICIPANTS,
                        help="participants per epoch of the core runs")
    parser.add_argument("--steady-from", type=int, default=STEADY_FROM,
                        help="the epoch from which every series must stay flat")
    parser.add_argument("--flat", type=float, default=FLAT,
                        help="how flat latency ratios must stay (1.2: within 20%%)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once, each in a process of its own with its own servers")
    parser.add_argument("--json", type=Path, help="write the samples and verdicts here")
    parser.add_argument("--render", type=Path, metavar="DOCS_DIR",
                        help="draw soak.png and the soak section of performance.md there")
    parser.add_argument("--from-json", type=Path, metavar="PATH",
                        help="run nothing: judge the samples an earlier --json kept with "
                             "this script's verdicts, print the table and --render them")
    args = parser.parse_args(argv)
    if args.from_json:
        return rejudge(args.from_json, args.json, args.render)
    backends = [b for b in args.backends.split(",") if b]
    states = [s for s in args.states.split(",") if s]
    started = time.time()
    if args.jobs > 1:
        common = ["--sample", str(args.sample), "--participants", str(args.participants),
                  "--steady-from", str(args.steady_from), "--flat", str(args.flat)]
        jobs = [["--backends", b, "--states", s, "--epochs", str(args.epochs),
                 "--spark-epochs", "0", *common]
                for b in backends for s in states if args.epochs]
        jobs += [["--backends", b, "--states", "directory", "--epochs", "0",
                  "--spark-epochs", str(args.spark_epochs), *common]
                 for b in backends if args.spark_epochs]
        # Longest first: Spark's runs, then Kafka's (the most time per epoch).
        jobs.sort(key=lambda j: (j[7] == "0", j[1] != "kafka"))
        soaks = soak_parallel(jobs, args.jobs, lambda m: print(m, flush=True))
    else:
        work = Path(tempfile.mkdtemp(prefix="txsink-soak-"))
        try:
            soaks = soak_all(backends, states, args.epochs, args.sample, work,
                             progress=lambda m: print(m, flush=True),
                             spark_epochs=args.spark_epochs, participants=args.participants,
                             steady_from=args.steady_from, flat=args.flat)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
              "hours": round((time.time() - started) / 3600, 2), "cores": os.cpu_count(),
              "command": " ".join(["python benchmarks/soak.py", *(argv or sys.argv[1:])]),
              "runs": [s.to_dict() for s in soaks]}
    return publish(soaks, result, args.json, args.render)


if __name__ == "__main__":
    # SIGTERM (kill PID, a job's time limit) unwinds like ^C: the servers it started stop.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    sys.exit(main())
