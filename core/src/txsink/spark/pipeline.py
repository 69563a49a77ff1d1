"""Run a validated :class:`~txsink.config.PipelineConfig` on Spark (``txsink run``).

Builds the session, the source, the SQL transform and the ``txsink`` write, then
reports progress per batch (Spark's input rows, and txsink's committed rows and
commit latency read from the coordinator's state) until a bounded mode says stop.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txsink.config import SOURCE_VIEW, PipelineConfig
from txsink.errors import ConfigError, TxsinkError
from txsink.plugins import get_plugins
from txsink.state import EpochRecord, EpochState, StateStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

Printer = Callable[[str], None]


@dataclass
class RunResult:
    """What one ``run`` did, for the summary line and for tests."""

    batches: list[int] = field(default_factory=list)
    committed_epochs: list[int] = field(default_factory=list)
    rows: int = 0
    stopped_because: str = ""


def prepare_environment(master: str) -> None:
    """Point Spark's Python workers at this interpreter; keep local mode on loopback."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def build_session(cfg: PipelineConfig) -> SparkSession:
    from pyspark.sql import SparkSession

    from txsink.spark import register

    prepare_environment(cfg.spark.master)
    builder = SparkSession.builder.master(cfg.spark.master).appName(cfg.spark.app_name)
    # Spark logs failures with JVM stack traces; `txsink run` reports them itself.
    builder = builder.config("spark.log.level", "ERROR")
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    for key, value in cfg.spark.conf.items():
        builder = builder.config(key, value)
    if cfg.source.type == "files" and not cfg.source.schema:
        builder = builder.config("spark.sql.streaming.schemaInference", "true")
    spark = builder.getOrCreate()
    register(spark)
    return spark


def build_source(spark: SparkSession, cfg: PipelineConfig) -> DataFrame:
    src = cfg.source
    reader: Any = spark.readStream if cfg.mode == "streaming" else spark.read
    reader = reader.format("rate") if src.type == "rate" else reader.format(src.format)
    if src.schema:
        reader = reader.schema(src.schema)
    reader = reader.options(**src.options)
    df: DataFrame = reader.load(src.path) if src.path else reader.load()
    return df


def build_frame(spark: SparkSession, cfg: PipelineConfig) -> DataFrame:
    df = build_source(spark, cfg)
    if not cfg.transform:
        return df
    df.createOrReplaceTempView(SOURCE_VIEW)
    return spark.sql(cfg.transform)


def run_pipeline(
    cfg: PipelineConfig,
    *,
    max_batches: int | None = None,
    until_idle: bool = False,
    timeout_s: float | None = None,
    out: Printer = print,
    poll_s: float = 0.5,
) -> RunResult:
    """Run ``cfg`` until it ends, a bound is reached, or Ctrl-C. Preflight runs first."""
    plugins = get_plugins()
    backend = plugins.create_backend(cfg.sink.backend, cfg.sink.options)
    try:
        backend.preflight(cfg.sink.sink_id)
        target = backend.describe()
    except ConfigError as exc:
        where = f"sink.options.{exc.field}" if exc.field else "sink"
        raise ConfigError(f"{where}: {exc}", field=where, sink_id=cfg.sink.sink_id) from None
    finally:
        backend.close()
    store = plugins.state_store(f"{cfg.checkpoint.rstrip('/')}/txsink")
    out(cfg.summary())
    out(f"delivery: {cfg.sink.guarantee.reader_note()}")
    spark = build_session(cfg)
    try:
        frame = build_frame(spark, cfg)
        if cfg.mode == "batch":
            result = _run_batch(frame, cfg, store, out)
        else:
            result = _run_stream(frame, cfg, store, out, max_batches=max_batches,
                                 until_idle=until_idle, timeout_s=timeout_s, poll_s=poll_s)
    finally:
        spark.stop()
    epochs = result.committed_epochs
    span = f"epochs {epochs[0]}-{epochs[-1]}" if len(epochs) > 1 else (
        f"epoch {epochs[0]}" if epochs else "no epoch")
    out(f"done ({result.stopped_because}): committed {span}, {result.rows} row(s) exactly "
        f"once to {target}")
    if cfg.sink.backend == "files" and result.rows:
        for line in preview_files(cfg.sink.options.get("path", "")):
            out(line)
    return result


def preview_files(path: str, rows: int = 3) -> list[str]:
    """A few committed rows of a files sink, so a demo run shows what it wrote."""
    base = Path(path)
    finals = sorted((p for p in base.glob("part-*") if p.is_file()), reverse=True)
    for f in finals:
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            sample = pq.read_table(f).slice(0, rows).to_pylist()
        else:
            with f.open(encoding="utf-8") as fh:
                sample = [json.loads(line) for line in itertools.islice(fh, rows)]
        if sample:
            lines = [f"sample of {f}:"]
            lines += [f"  {json.dumps(r, default=str)}" for r in sample]
            return lines
    return []


def _committed_since(store: StateStore, seen: set[int]) -> list[EpochRecord]:
    fresh = [r for e, r in sorted(store.records().items())
             if r.state is EpochState.COMMITTED and e not in seen]
    seen.update(r.epoch for r in fresh)
    return fresh


def _epoch_line(record: EpochRecord, progress: dict[str, Any] | None) -> str:
    latency = ""
    if record.committed_at is not None:
        latency = f", commit {1000 * (record.committed_at - record.decided_at):.0f} ms"
    spark_part = ""
    if progress:
        took = progress.get("durationMs", {}).get("triggerExecution")
        spark_part = f" (input {progress.get('numInputRows', '?')} rows" + (
            f", batch {took / 1000:.1f} s)" if took is not None else ")")
    return (f"batch {record.epoch}: {record.rows} row(s) in {len(record.committables)} "
            f"participant(s){latency}{spark_part}")


def _run_batch(frame: DataFrame, cfg: PipelineConfig, store: StateStore,
               out: Printer) -> RunResult:
    seen = {e for e, r in store.records().items() if r.state is EpochState.COMMITTED}
    frame.write.format("txsink").mode("append").options(**cfg.sink_write_options()).save()
    result = RunResult(stopped_because="batch write finished")
    for record in _committed_since(store, seen):
        out(_epoch_line(record, None))
        result.committed_epochs.append(record.epoch)
        result.rows += record.rows
    return result


def _run_stream(frame: DataFrame, cfg: PipelineConfig, store: StateStore, out: Printer, *,
                max_batches: int | None, until_idle: bool, timeout_s: float | None,
                poll_s: float) -> RunResult:
    writer = frame.writeStream.format("txsink").options(**cfg.sink_write_options())
    trig = cfg.trigger
    if trig.kind == "processing_time" and trig.interval:
        writer = writer.trigger(processingTime=trig.interval)
    elif trig.kind == "once":
        writer = writer.trigger(once=True)
    elif trig.kind == "available_now":
        writer = writer.trigger(availableNow=True)
    seen = {e for e, r in store.records().items() if r.state is EpochState.COMMITTED}
    query = writer.queryName(cfg.name.replace("-", "_")).start()
    result = RunResult()
    progress: dict[int, dict[str, Any]] = {}
    pending: list[EpochRecord] = []

    def report(final: bool = False) -> None:
        for p in query.recentProgress:
            progress.setdefault(int(p["batchId"]), p)
        for b in sorted(progress):
            if b not in result.batches:
                result.batches.append(b)
        pending.extend(_committed_since(store, seen))
        for record in list(pending):
            # Wait for Spark's progress of the batch so the line shows both sides.
            if record.epoch in progress or final:
                out(_epoch_line(record, progress.get(record.epoch)))
                result.committed_epochs.append(record.epoch)
                result.rows += record.rows
                pending.remove(record)

    started = time.monotonic()
    idle_polls = 0
    try:
        while True:
            report()
            if not query.isActive:
                result.stopped_because = "query finished"
                break
            if max_batches is not None and len(result.batches) >= max_batches:
                result.stopped_because = f"--max-batches {max_batches} reached"
                break
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                result.stopped_because = f"--timeout {timeout_s:g}s reached"
                break
            if until_idle and result.batches:
                status = query.status
                idle = not status.get("isDataAvailable") and not status.get("isTriggerActive")
                idle_polls = idle_polls + 1 if idle else 0
                if idle_polls >= 3:
                    result.stopped_because = "idle: no new input"
                    break
            time.sleep(poll_s)
        _stop_between_batches(query, poll_s)
    except KeyboardInterrupt:
        result.stopped_because = "interrupted"
    finally:
        if query.isActive:
            query.stop()
    error = query.exception()
    if error is not None:
        raise TxsinkError(f"the streaming query failed: {_first_lines(str(error))}")
    report(final=True)
    return result


def _stop_between_batches(query: Any, poll_s: float, wait_s: float = 5.0) -> None:
    """Stop when no batch is running, so a bounded run leaves no half-written epoch.

    A batch stopped mid-way is safe too (aborted now, its late participants aborted
    at the next start), just noisier.
    """
    deadline = time.monotonic() + wait_s
    while query.isActive and time.monotonic() < deadline:
        if not query.status.get("isTriggerActive"):
            query.stop()
            return
        time.sleep(min(poll_s, 0.05))


_TXSINK_ERROR = re.compile(r"txsink\.errors\.(?P<kind>\w+): (?P<message>.+)")


def _first_lines(text: str, n: int = 12) -> str:
    """The txsink error inside a Spark/Python traceback, else the first lines of it."""
    found = _TXSINK_ERROR.search(text)
    if found:
        return f"{found['kind']}: {found['message'].strip()}"
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("at ")]
    return "\n".join(lines[:n])
