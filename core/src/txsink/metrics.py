"""Prometheus metrics of every sink, recorded from the coordinator's lifecycle hooks.

A built-in plugin (entry point ``metrics``) observes the hooks; it costs nothing
until metrics are enabled. Under Spark the coordinator runs in short-lived Python
workers that the driver JVM starts, not in the process that serves ``/metrics``, so
the values travel through ``prometheus_client``'s multiprocess mode: every process
writes its samples into the directory named by ``PROMETHEUS_MULTIPROC_DIR`` and the
serving process adds them up. :func:`enable` sets that variable before Spark starts
(children inherit it); without it, metrics stay in this process's
:func:`registry`, which is what a library user driving a coordinator directly wants.

Requires the ``metrics`` extra (``pip install 'txsink[metrics]'``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from txsink import procfs
from txsink.errors import ConfigError
from txsink.hookspecs import hookimpl

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from txsink.model import Committable, RecoveryReport

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Set by :func:`enable`, so the hooks know metrics are wanted in child processes.
ENABLED_ENV = "TXSINK_METRICS"

#: Commit latency buckets (seconds): a local commit takes milliseconds, a slow
#: remote one seconds; retries with backoff can take a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _import_prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigError(
            "metrics need the prometheus_client package: pip install 'txsink[metrics]'",
            field="metrics") from exc
    return prometheus_client


@dataclass
class _Metrics:
    epochs_committed: Any
    epochs_aborted: Any
    rows_committed: Any
    participants_committed: Any
    participants_aborted: Any
    epoch_rows: Any
    epoch_participants: Any
    last_committed_epoch: Any
    commit_latency: Any
    recommitted_epochs: Any
    orphans_aborted: Any
    salvaged: Any
    in_doubt: Any
    oldest_prepared: Any
    participant_timeout: Any


_lock = threading.Lock()
_metrics: _Metrics | None = None
_registry: CollectorRegistry | None = None
#: Epochs prepared and not yet committed or aborted, per sink: epoch -> prepared at.
_in_flight: dict[str, dict[int, float]] = {}
_aborted_epochs: set[tuple[str, int]] = set()


def _wanted() -> bool:
    return _metrics is not None or bool(os.environ.get(ENABLED_ENV))


def _get() -> _Metrics | None:
    """The metric objects, created on first use in this process (None when disabled)."""
    global _metrics, _registry
    if _metrics is not None:
        return _metrics
    if not os.environ.get(ENABLED_ENV):
        return None
    with _lock:
        if _metrics is None:
            _create()
    return _metrics


def _create() -> None:
    global _metrics, _registry
    prom = _import_prometheus()
    multiprocess = bool(os.environ.get(MULTIPROC_ENV))
    # In multiprocess mode samples go to files and the server's collector reads them;
    # registering them here as well would export them twice.
    reg = None if multiprocess else (_registry or prom.CollectorRegistry())
    if not multiprocess:
        _registry = reg
    sink = ["sink"]

    def gauge(name: str, doc: str, mode: str) -> Any:
        kw = {"multiprocess_mode": mode} if multiprocess else {}
        return prom.Gauge(name, doc, sink, registry=reg, **kw)

    _metrics = _Metrics(
        epochs_committed=prom.Counter(
            "txsink_epochs_committed", "Epochs committed (decided and every participant "
            "committed).", sink, registry=reg),
        epochs_aborted=prom.Counter(
            "txsink_epochs_aborted", "Epochs rolled back: Spark aborted the batch, or the "
            "batch replayed an epoch already committed.", [*sink, "reason"], registry=reg),
        rows_committed=prom.Counter(
            "txsink_rows_committed", "Rows made visible by committed epochs.", sink,
            registry=reg),
        participants_committed=prom.Counter(
            "txsink_participants_committed", "Participants committed.", sink, registry=reg),
        participants_aborted=prom.Counter(
            "txsink_participants_aborted", "Participants rolled back, by reason (aborted, "
            "replayed, orphan).", [*sink, "reason"], registry=reg),
        epoch_rows=gauge("txsink_last_epoch_rows", "Rows of the last committed epoch.",
                         "mostrecent"),
        epoch_participants=gauge("txsink_last_epoch_participants",
                                 "Participants of the last committed epoch.", "mostrecent"),
        last_committed_epoch=gauge("txsink_last_committed_epoch",
                                   "The highest epoch committed.", "max"),
        commit_latency=prom.Histogram(
            "txsink_commit_latency_seconds", "From the durable decision to the epoch's "
            "COMMITTED mark.", sink, buckets=LATENCY_BUCKETS, registry=reg),
        recommitted_epochs=prom.Counter(
            "txsink_recovery_recommitted_epochs", "Decided epochs committed again by "
            "recovery after a crash.", sink, registry=reg),
        orphans_aborted=prom.Counter(
            "txsink_recovery_aborted_orphans", "Prepared participants no decided epoch held, "
            "aborted by recovery or the orphan scan.", sink, registry=reg),
        salvaged=prom.Counter(
            "txsink_participants_salvaged", "Decided participants the target aborted on its "
            "own (Kafka: transaction.timeout.ms expired) whose data was written again from "
            "what the target kept.", sink, registry=reg),
        in_doubt=gauge("txsink_participants_in_doubt", "Participants of decided epochs not "
                       "yet committed.", "mostrecent"),
        oldest_prepared=gauge(
            "txsink_oldest_prepared_timestamp_seconds", "Unix time the oldest participant "
            "still prepared (not committed or aborted) was prepared; 0 when none.",
            "mostrecent"),
        participant_timeout=gauge(
            "txsink_participant_timeout_seconds", "How long the target keeps a prepared "
            "participant before aborting it on its own (Kafka transaction.timeout.ms); "
            "0 when it never does.", "mostrecent"),
    )


def _set_oldest(m: _Metrics, sink_id: str) -> None:
    flight = _in_flight.get(sink_id) or {}
    m.oldest_prepared.labels(sink_id).set(min(flight.values()) if flight else 0)


# -- hook implementations (the plugin) ----------------------------------------------------


@hookimpl
def txsink_coordinator_started(sink_id: str, participant_timeout_s: float | None) -> None:
    m = _get()
    if m is not None:
        m.participant_timeout.labels(sink_id).set(participant_timeout_s or 0)


@hookimpl
def txsink_epoch_prepared(sink_id: str, epoch: int) -> None:
    m = _get()
    if m is None:
        return
    _in_flight.setdefault(sink_id, {}).setdefault(epoch, time.time())
    _set_oldest(m, sink_id)


@hookimpl
def txsink_epoch_decided(sink_id: str, committables: Sequence[Committable]) -> None:
    m = _get()
    if m is not None:
        m.in_doubt.labels(sink_id).set(len(committables))


@hookimpl
def txsink_epoch_committed(sink_id: str, epoch: int, committables: Sequence[Committable],
                           duration_s: float) -> None:
    m = _get()
    if m is None:
        return
    rows = sum(c.rows for c in committables)
    m.epochs_committed.labels(sink_id).inc()
    m.rows_committed.labels(sink_id).inc(rows)
    m.participants_committed.labels(sink_id).inc(len(committables))
    m.epoch_rows.labels(sink_id).set(rows)
    m.epoch_participants.labels(sink_id).set(len(committables))
    m.last_committed_epoch.labels(sink_id).set(epoch)
    m.commit_latency.labels(sink_id).observe(duration_s)
    m.in_doubt.labels(sink_id).set(0)
    _in_flight.get(sink_id, {}).pop(epoch, None)
    _set_oldest(m, sink_id)


@hookimpl
def txsink_epoch_aborted(sink_id: str, epoch: int, committables: Sequence[Committable],
                         reason: str) -> None:
    m = _get()
    if m is None:
        return
    m.participants_aborted.labels(sink_id, reason).inc(len(committables))
    if reason == "orphan":
        m.orphans_aborted.labels(sink_id).inc(len(committables))
    elif (sink_id, epoch) not in _aborted_epochs:
        _aborted_epochs.add((sink_id, epoch))
        m.epochs_aborted.labels(sink_id, reason).inc()
    if reason != "orphan" and _in_flight.get(sink_id, {}).pop(epoch, None) is not None:
        _set_oldest(m, sink_id)


@hookimpl
def txsink_participant_salvaged(sink_id: str) -> None:
    m = _get()
    if m is not None:
        m.salvaged.labels(sink_id).inc()


@hookimpl
def txsink_recovered(sink_id: str, report: RecoveryReport) -> None:
    m = _get()
    if m is not None and report.recommitted_epochs:
        m.recommitted_epochs.labels(sink_id).inc(len(report.recommitted_epochs))


# -- enabling and serving ------------------------------------------------------------------


def registry() -> CollectorRegistry:
    """This process's metrics registry (single-process mode), enabling metrics.

    For a library user who drives a :class:`~txsink.coordinator.Coordinator` in this
    process; under Spark use :func:`enable` and :func:`serve` instead.
    """
    global _registry
    prom = _import_prometheus()
    os.environ[ENABLED_ENV] = "1"
    with _lock:
        if _registry is None:
            _registry = prom.CollectorRegistry()
        if _metrics is None and not os.environ.get(MULTIPROC_ENV):
            _create()
    assert _registry is not None
    return _registry


@dataclass
class MetricsServer:
    """The ``/metrics`` endpoint of one run; :meth:`close` stops it and removes its files."""

    host: str
    port: int
    directory: str
    _server: Any
    _thread: Any
    _own_directory: bool

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
        if self._own_directory:
            shutil.rmtree(self.directory, ignore_errors=True)


def enable(directory: str | None = None) -> str:
    """Turn metrics on for this process and every process it starts afterwards.

    Must run before the SparkSession is created: Spark's Python workers inherit the
    environment of the driver JVM, which inherits this process's. Returns the
    multiprocess directory (a new empty one unless given).
    """
    _import_prometheus()
    path = directory or tempfile.mkdtemp(prefix="txsink-metrics-")
    os.makedirs(path, exist_ok=True)
    os.environ[MULTIPROC_ENV] = path
    os.environ[ENABLED_ENV] = "1"
    return path


#: Dead workers' sample files are folded into ``<kind>_archive.db`` (see :func:`compact`).
ARCHIVE_PID = "archive"
#: How each kind of sample file adds up across processes (prometheus_client's modes).
_FOLD = {"counter": "sum", "histogram": "sum", "gauge_sum": "sum", "gauge_max": "max",
         "gauge_min": "min", "gauge_mostrecent": "latest"}
#: Seconds between two compactions of the multiprocess directory while serving.
COMPACT_INTERVAL_S = 30.0


def compact(directory: str) -> int:
    """Fold the sample files of processes that ended into one archive file per kind.

    Spark starts a Python worker per micro-batch to plan it, and each writes its own
    files into the multiprocess directory: without this the directory, and the time
    every scrape takes to read it, grows with every batch. Counters and histograms of
    dead workers are added into the archive (totals never go down), ``max``/``min``
    gauges keep their extreme, ``mostrecent`` ones their latest value; ``live*`` gauges
    of dead workers are dropped, as ``mark_process_dead`` does. Returns the number of
    files removed. Only the serving process may call it, between two scrapes.
    """
    from prometheus_client import mmap_dict

    MmapedDict: Any = mmap_dict.MmapedDict  # untyped in prometheus_client
    folds: dict[str, list[str]] = {}
    removed = 0
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".db"):
            continue
        kind, _, pid = name[:-3].rpartition("_")
        if not pid.isdigit() or not procfs.ended(int(pid)):
            continue
        path = os.path.join(directory, name)
        if kind.startswith("gauge_live"):
            os.unlink(path)
            removed += 1
        elif kind in _FOLD:
            folds.setdefault(kind, []).append(path)
    for kind, paths in folds.items():
        archive = os.path.join(directory, f"{kind}_{ARCHIVE_PID}.db")
        merged: dict[str, tuple[float, float]] = {}
        how = _FOLD[kind]
        for path in ([archive] if os.path.exists(archive) else []) + paths:
            for key, value, stamp, _ in MmapedDict.read_all_values_from_file(path):
                old = merged.get(key)
                if old is None:
                    merged[key] = (value, stamp)
                elif how == "sum":
                    merged[key] = (old[0] + value, max(old[1], stamp))
                elif how == "max":
                    merged[key] = max(old, (value, stamp))
                elif how == "min":
                    merged[key] = min(old, (value, stamp))
                else:
                    merged[key] = max(old, (value, stamp), key=lambda vs: vs[1])
        tmp = os.path.join(directory, f".{kind}_{ARCHIVE_PID}.tmp")
        out = MmapedDict(tmp)
        try:
            for key, (value, stamp) in merged.items():
                out.write_value(key, value, stamp)
        finally:
            out.close()
        os.replace(tmp, archive)
        for path in paths:
            os.unlink(path)
        removed += len(paths)
    return removed


class _CompactingCollector:
    """The multiprocess collector, compacting the directory (at most every
    :data:`COMPACT_INTERVAL_S`) under the same lock a scrape holds: no scrape sees a
    dead worker's samples both in its own file and in the archive."""

    def __init__(self, collector: Any, directory: str) -> None:
        self.collector = collector
        self.directory = directory
        self._lock = threading.Lock()
        self._last = 0.0

    def collect(self) -> Iterator[Any]:
        with self._lock:
            if time.monotonic() - self._last >= COMPACT_INTERVAL_S:
                self._last = time.monotonic()
                try:
                    compact(self.directory)
                except Exception:  # metrics must never take the pipeline down
                    log.warning("could not compact the metrics directory %s", self.directory,
                                exc_info=True)
            return iter(list(self.collector.collect()))


class _AgeCollector:
    """Derives the oldest prepared participant's age at scrape time, in the server."""

    def __init__(self, source: Any) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        age = GaugeMetricFamily(
            "txsink_oldest_prepared_age_seconds", "Seconds the oldest participant still "
            "prepared has waited for its commit; 0 when none.", labels=["sink"])
        now = time.time()
        for family in self.source.collect():
            if family.name != "txsink_oldest_prepared_timestamp_seconds":
                continue
            for sample in family.samples:
                value = sample.value
                age.add_metric([sample.labels.get("sink", "")],
                               max(0.0, now - value) if value > 0 else 0.0)
        yield age


def serve(port: int, host: str = "127.0.0.1", directory: str | None = None) -> MetricsServer:
    """Serve the metrics of this process and its children in the Prometheus text format.

    Binds to 127.0.0.1 unless told otherwise: metrics name sinks and epochs, which an
    operator may not want on every interface.
    """
    prom = _import_prometheus()
    from prometheus_client import multiprocess

    own = directory is None and not os.environ.get(MULTIPROC_ENV)
    path = enable(directory or os.environ.get(MULTIPROC_ENV))
    reg = prom.CollectorRegistry()
    collector = _CompactingCollector(
        multiprocess.MultiProcessCollector(None, path=path),  # type: ignore[no-untyped-call]
        path)
    reg.register(collector)
    reg.register(_AgeCollector(collector))
    try:
        server, thread = prom.start_http_server(port, addr=host, registry=reg)
    except OSError as exc:
        raise ConfigError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                          "pick another --metrics-port", field="metrics_port") from exc
    bound = server.server_address[1]
    log.info("serving txsink metrics at http://%s:%d/metrics", host, bound)
    return MetricsServer(host, bound, path, server, thread, own)


def reset_for_tests() -> None:
    """Forget this process's metric objects and in-flight bookkeeping."""
    global _metrics, _registry
    with _lock:
        _metrics = None
        _registry = None
        _in_flight.clear()
        _aborted_epochs.clear()
