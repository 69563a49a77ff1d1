"""The run loop of a Real-time Mode pipeline (``trigger: {real_time: ...}``).

It has no epochs in txsink's state: each target stores the source positions it
holds (docs/realtime.md), so the loop reports Spark's batches with what the writers
did in them, and stops at ``--timeout`` (counted from the start, Spark's included) or
a signal; stopping in the middle of a batch is safe.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import Any

from txsink.config import PipelineConfig
from txsink.errors import ConfigError, TxsinkError
from txsink.realtime.stats import RealtimeStats, stats_line
from txsink.spark.console import default_log_path, spark_output_to
from txsink.spark.frames import build_frame
from txsink.spark.report import Printer, RunResult
from txsink.spark.session import build_session
from txsink.spark.signals import (
    STOP_BOUND_S,
    DeadlineReached,
    Interrupted,
    deadline_alarm,
    interrupts_as_exceptions,
    stop_within,
    take_back_sigint,
)

log = logging.getLogger(__name__)


#: At most one progress line this often (a real-time batch may last a second).
PROGRESS_EVERY_S = 5.0
#: After ``--timeout``, how long stopping the query and then Spark may take each before
#: the driver's JVM is killed (rows committed stay; the next run skips them).
TIMEOUT_STOP_S = 5.0
#: After a bounded stop, how long the query's heartbeat gets to say it ended.
RELEASE_WAIT_S = 2.0
#: The timeout's alarm fires this long after the deadline if a step is still busy then
#: (Spark starting, the query starting); the loop itself stops at the deadline.
ALARM_GRACE_S = 0.5


#: ``--until-idle``: this many completed real-time batches in a row that moved no source
#: offset and brought the writers no row end the run.
IDLE_BATCHES = 3


def run_realtime(cfg: PipelineConfig, *, timeout_s: float | None, out: Printer,
                 poll_s: float = 0.5, log_path: Path | None = None,
                 remote: str | None = None, until_idle: bool = False) -> RunResult:
    """``txsink run`` of a pipeline file with ``trigger: {real_time: ...}``.

    Runs until the query ends, ``timeout_s`` passes (counted from this call: Spark's
    start is part of it, and the stop after it is bounded), the source is idle
    (``until_idle``: :data:`IDLE_BATCHES` batches without input), or SIGINT/SIGTERM;
    stopping in the middle of a real-time batch is safe (the next run replays it and
    skips what the target holds). Prints what the writers did at most every
    :data:`PROGRESS_EVERY_S` and in the end: rows and commits per target and how long
    rows took from reaching the writer to visible.
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

    started = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
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
    lines = ProgressLines(out)
    timed_out = False
    error = None
    with interrupts_as_exceptions(), spark_output_to(log_path):
        spark: Any = None
        query: Any = None
        try:
            with deadline_alarm(None if deadline is None else deadline + ALARM_GRACE_S):
                spark = build_session(cfg)
                take_back_sigint()
                frame = build_frame(spark, cfg)
                where: dict[str, Any] = (
                    {"targets": cfg.sink.targets, "field_prefix": "sink.targets"}
                    if cfg.sink.targets else {"backend": cfg.sink.backend,
                                              "options": options,
                                              "field_prefix": "sink.targets"})
                query = start_realtime(
                    frame, sink_id=cfg.sink.sink_id, checkpoint_location=cfg.checkpoint,
                    trigger=cfg.trigger.interval or "5 seconds",
                    commit_interval=(parse_seconds(interval, "sink.options.commit_interval")
                                     if interval else DEFAULT_COMMIT_INTERVAL_S),
                    query_name=cfg.name.replace("-", "_"), **where)
                slots = local_slots(cfg.spark.master)
                while True:
                    lines.poll(query)
                    unread = unread_partitions(query.recentProgress, slots)
                    if unread:
                        raise unread_error(unread, cfg.sink.sink_id)
                    if not query.isActive:
                        result.stopped_because = "query finished"
                        break
                    if until_idle and lines.quiet >= IDLE_BATCHES:
                        result.stopped_because = (f"idle: {lines.quiet} real-time batches "
                                                  "in a row without new input")
                        break
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        timed_out = True
                        break
                    query.awaitTermination(poll_s if left is None else
                                           max(0.01, min(poll_s, left)))
        except DeadlineReached:
            timed_out = True
        except KeyboardInterrupt as exc:
            result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
            result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
        finally:
            if timed_out:
                result.stopped_because = f"--timeout {timeout_s:g}s reached"
            bounded = result.signal is not None or timed_out
            bound = TIMEOUT_STOP_S if timed_out else STOP_BOUND_S
            if query is not None and bounded:
                # Rows committed so far stay; the next run skips them by position.
                stopped = stop_within(query.stop, spark, "stopping the real-time query", out,
                                      bound_s=bound)
                if stopped and result.signal is None:
                    error = quiet_exception(query)
            elif query is not None:
                try:
                    query.stop()
                    error = query.exception()
                except Exception as exc:
                    log.warning("stopping the real-time query: %s", exc)
            if query is not None:
                # Its heartbeat says it ended (txsink status, reset).
                release_hold(query, timeout_s=RELEASE_WAIT_S if bounded else 10.0)
                lines.poll(query, final=True)
            if spark is not None and bounded:
                stop_within(spark.stop, spark, "stopping Spark", out, bound_s=bound)
            elif spark is not None:
                spark.stop()
    if error is not None and not (timed_out and STOP_RACE in str(error)):
        raise TxsinkError(f"the real-time query failed: {str(error).strip().splitlines()[0]}",
                          sink_id=cfg.sink.sink_id)
    result.batches = lines.batches
    total = lines.total
    result.rows = total.rows
    if cfg.sink.targets:
        result.rows_by_target = {n: s.rows for n, s in total.targets.items()}
    out(f"done ({result.stopped_because}): {result.batches} real-time batch(es) completed: "
        f"{stats_line(total)}; rows committed after the last completed batch are in the "
        "target too (their numbers come with a batch's end), and the next run skips them")
    return result


#: Spark's own race when a real-time batch ends while ``query.stop()`` interrupts the
#: query thread (``RejectedExecutionException: Producer interrupted`` from its async
#: commit log): the batch is replayed by the next run, nothing of txsink's is involved.
STOP_RACE = "Producer interrupted"


def quiet_exception(query: Any) -> Any:
    try:
        return query.exception()
    except Exception as exc:  # Spark stopping under it
        log.debug("reading the stopped query's error: %s", exc)
        return None


class ProgressLines:
    """The real-time run's lines: the batches Spark completed since the last line, and
    what the writers did in them (their numbers reach the driver when a batch's tasks
    end), at most one line every :data:`PROGRESS_EVERY_S`."""

    def __init__(self, out: Printer, every_s: float = PROGRESS_EVERY_S,
                 clock: Any = time.monotonic) -> None:
        self._out = out
        self._every = every_s
        self._clock = clock
        self._highest = -1
        self._unprinted: list[int] = []
        self._printed: RealtimeStats | None = None
        self._last = clock()
        self._seen_rows = 0
        self.batches = 0
        self.total = RealtimeStats()
        #: Completed batches in a row that moved no source offset (where Spark's progress
        #: says) and brought the writers no row (written or skipped).
        self.quiet = 0

    def poll(self, query: Any, final: bool = False) -> None:
        from txsink.spark.realtime import query_stats

        try:
            progress = list(query.recentProgress)
        except Exception as exc:  # Spark stopping
            log.debug("reading the query's progress: %s", exc)
            progress = []
        new = []
        for entry in progress:
            # Spark's numInputRows reads 0 for real-time batches (PySpark 4.3): the rows
            # come from the writers' own counts.
            batch = int(entry.get("batchId", -1))
            if batch > self._highest:
                self._highest = batch
                self._unprinted.append(batch)
                self.batches += 1
                new.append(entry)
        try:
            self.total = query_stats(query)
        except Exception as exc:
            log.debug("reading the writers' numbers: %s", exc)
        if new:
            rows = sum(s.rows + s.skipped for s in self.total.targets.values())
            if rows == self._seen_rows and not any(_moved(e) for e in new):
                self.quiet += len(new)
            else:
                self.quiet = 0
            self._seen_rows = rows
        if not self._unprinted:
            return
        if not final and self._clock() - self._last < self._every:
            return
        first, last = self._unprinted[0], self._unprinted[-1]
        which = f"batch {first}" if first == last else f"batches {first}-{last}"
        self._out(f"real-time {which} completed: {stats_line(self.total.since(self._printed))}")
        self._printed = self.total.copy()
        self._unprinted.clear()
        self._last = self._clock()


def _moved(progress: Any) -> bool:
    """Whether a batch's progress shows a source offset that moved (unknown: no)."""
    from txsink.spark.realtime import source_offsets

    for source in progress.get("sources") or []:
        start, end = (source_offsets(source.get(k)) for k in ("startOffset", "endOffset"))
        if any(end.get(tp, offset) != offset for tp, offset in start.items()):
            return True
    return False
