"""The run loop of a Real-time Mode pipeline (``trigger: {real_time: ...}``).

It has no epochs in txsink's state: each target stores the source positions it
holds (docs/realtime.md), so the loop reports Spark's batches and stops at
``--timeout`` or a signal; stopping in the middle of a batch is safe.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from txsink.config import PipelineConfig
from txsink.errors import ConfigError, TxsinkError
from txsink.spark.console import default_log_path, spark_output_to
from txsink.spark.frames import build_frame
from txsink.spark.report import Printer, RunResult
from txsink.spark.session import build_session
from txsink.spark.signals import (
    Interrupted,
    interrupts_as_exceptions,
    stop_within,
    take_back_sigint,
)

log = logging.getLogger(__name__)


def run_realtime(cfg: PipelineConfig, *, timeout_s: float | None, out: Printer,
                 poll_s: float = 0.5, log_path: Path | None = None,
                 remote: str | None = None) -> RunResult:
    """``txsink run`` of a pipeline file with ``trigger: {real_time: ...}``.

    Runs until the query ends, ``timeout_s`` passes, or SIGINT/SIGTERM; stopping in the
    middle of a real-time batch is safe (the next run replays it and skips what the
    target holds).
    """
    from txsink.realtime import DEFAULT_COMMIT_INTERVAL_S
    from txsink.realtime.config import COMMIT_INTERVAL
    from txsink.spark.realtime import (
        local_slots,
        parse_seconds,
        release_hold,
        start_realtime,
        unread_error,
        unread_partitions,
    )

    if remote is not None:
        raise ConfigError("real-time mode runs its query in a local driver; remove --remote "
                          "(Spark Connect is not supported for it yet)", field="remote")
    options = dict(cfg.sink.options)
    interval = options.pop(COMMIT_INTERVAL, None)
    log_path = log_path or default_log_path(cfg.checkpoint, cfg.name)
    into = (f"{len(cfg.sink.targets)} targets ({', '.join(t.name for t in cfg.sink.targets)}"
            "), each by its own stored positions" if cfg.sink.targets else cfg.sink.backend)
    out(f"pipeline {cfg.name}: real-time mode (batches of {cfg.trigger.interval}), exactly "
        f"once by source position into {into} as sink {cfg.sink.sink_id}")
    out(f"spark log: {log_path}")
    result = RunResult()
    batches: set[int] = set()
    with interrupts_as_exceptions(), spark_output_to(log_path):
        spark = build_session(cfg)
        take_back_sigint()
        query = None
        try:
            frame = build_frame(spark, cfg)
            where: dict[str, Any] = (
                {"targets": cfg.sink.targets, "field_prefix": "sink.targets"}
                if cfg.sink.targets else {"backend": cfg.sink.backend, "options": options,
                                          "field_prefix": "sink.targets"})
            query = start_realtime(
                frame, sink_id=cfg.sink.sink_id, checkpoint_location=cfg.checkpoint,
                trigger=cfg.trigger.interval or "5 seconds",
                commit_interval=(parse_seconds(interval, "sink.options.commit_interval")
                                 if interval else DEFAULT_COMMIT_INTERVAL_S),
                query_name=cfg.name.replace("-", "_"), **where)
            started = time.monotonic()
            while query.isActive:
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    result.stopped_because = f"--timeout {timeout_s:g}s reached"
                    break
                query.awaitTermination(max(1, round(poll_s)))
                for progress in query.recentProgress:
                    # Spark's numInputRows reads 0 for real-time batches (PySpark 4.3):
                    # only the batch ids are worth showing.
                    batch = int(progress.get("batchId", -1))
                    if batch >= 0 and batch not in batches:
                        batches.add(batch)
                        out(f"real-time batch {batch} completed (Spark's checkpoint moved "
                            "past it)")
                unread = unread_partitions(query.recentProgress,
                                           local_slots(cfg.spark.master))
                if unread:
                    raise unread_error(unread, cfg.sink.sink_id)
            else:
                result.stopped_because = "query finished"
        except KeyboardInterrupt as exc:
            result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
        finally:
            error = None
            if query is not None and result.signal is not None:
                # Rows committed so far stay; the next run skips them by position.
                stop_within(query.stop, spark, "stopping the real-time query", out)
            elif query is not None:
                try:
                    query.stop()
                    error = query.exception()
                except Exception as exc:
                    log.warning("stopping the real-time query: %s", exc)
            if query is not None:
                release_hold(query)  # its heartbeat says it ended (txsink status, reset)
            if result.signal is not None:
                stop_within(spark.stop, spark, "stopping Spark", out)
            else:
                spark.stop()
    if error is not None:
        raise TxsinkError(f"the real-time query failed: {str(error).strip().splitlines()[0]}",
                          sink_id=cfg.sink.sink_id)
    result.batches = len(batches)
    out(f"done ({result.stopped_because}): {result.batches} real-time batch(es) completed; "
        "rows committed since the last completed batch are in the target too, and the "
        "next run skips them")
    return result
