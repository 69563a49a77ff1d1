"""The run loop of a streaming pipeline: start the query, print each committed
epoch beside Spark's progress of its batch, stop at a bound (``--max-batches``,
``--until-idle``, ``--timeout``) between batches, or at a signal.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from txsink.config import PipelineConfig
from txsink.errors import TxsinkError
from txsink.spark.connect import is_remote
from txsink.spark.frames import native_targets, sink_targets
from txsink.spark.group import refuse_feedback
from txsink.spark.messages import first_lines
from txsink.spark.report import Printer, RunResult, committed_since, epoch_line
from txsink.spark.signals import Interrupted, quietly, stop_within
from txsink.state import EpochRecord, EpochState, StateStore

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def run_stream(frame: DataFrame, cfg: PipelineConfig, store: StateStore, out: Printer, *,
               max_batches: int | None, until_idle: bool, timeout_s: float | None,
               poll_s: float, extra_options: dict[str, str] | None = None) -> RunResult:
    native = native_targets(cfg, extra_options, stream=True)
    if native is not None:
        writer = native.write_stream(frame)
    else:
        sink = sink_targets(cfg)
        refuse_feedback(frame, sink.backend(), sink.sink_id,
                        field="sink" if sink.single else "targets")
        options = {**cfg.sink_write_options(), **(extra_options or {})}
        writer = frame.writeStream.format("txsink").options(**options)
    trig = cfg.trigger
    if trig.kind == "processing_time" and trig.interval:
        writer = writer.trigger(processingTime=trig.interval)
    elif trig.kind == "once":
        writer = writer.trigger(once=True)
    elif trig.kind == "available_now":
        writer = writer.trigger(availableNow=True)
    seen = {e for e, state in store.states().items() if state is EpochState.COMMITTED}
    query = writer.queryName(cfg.name.replace("-", "_")).start()
    result = RunResult()
    progress = _Progress()
    pending: list[EpochRecord] = []

    stream_from: list[int] = []  # read once the stream fixed it (its first planning)

    def report(final: bool = False) -> None:
        result.batches += progress.update(query.recentProgress)
        pending.extend(committed_since(store, seen))
        if pending and not stream_from:
            meta = store.read_meta()
            if meta is not None and meta.stream_from is not None:
                stream_from.append(meta.stream_from)
        # Spark's progress is by batch id; micro-batch b is epoch stream_from + b.
        base = stream_from[0] if stream_from else 0
        for record in list(pending):
            # Wait for Spark's progress of the batch so the line shows both sides.
            if progress.has(record.epoch - base) or final:
                out(epoch_line(record, progress.pop(record.epoch - base)))
                result.add(record)
                pending.remove(record)
        progress.forget_up_to(min((r.epoch - base for r in pending), default=None))

    started = time.monotonic()
    idle_polls = 0
    bounded = False
    try:
        while True:
            report()
            if not query.isActive:
                result.stopped_because = "query finished"
                break
            if max_batches is not None and result.batches >= max_batches:
                result.stopped_because = f"--max-batches {max_batches} reached"
                bounded = True
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
    except KeyboardInterrupt as exc:
        result.signal = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        result.stopped_because = f"interrupted by {signal.Signals(result.signal).name}"
    finally:
        interrupted = result.signal is not None
        stop = lambda: query.stop() if query.isActive else None  # noqa: E731
        result.query_stopped = (
            stop_within(stop, frame.sparkSession, "stopping the query", out)
            if interrupted and not is_remote(frame) else quietly(stop, interrupted=interrupted))
    if result.signal is not None:
        # SIGTERM to the process group stops Spark's JVM too: count from the state alone.
        for record in pending:
            out(epoch_line(record, progress.pop(record.epoch)))
            result.add(record)
        for record in committed_since(store, seen):
            out(epoch_line(record, None))
            result.add(record)
        return result
    error = query.exception()
    if error is not None:
        raise TxsinkError(f"the streaming query failed: {first_lines(str(error))}")
    report(final=True)
    if bounded and max_batches is not None and result.batches > max_batches:
        # Spark starts the next batch as soon as one ends (and several can end between
        # two polls of a loaded machine): the bound stops the query, never a batch it
        # already started. Said, so "3 reached" does not stand beside "epochs 0-5".
        more = result.batches - max_batches
        result.stopped_because += (
            f"; {more} more batch{'es' if more > 1 else ''} had already started and "
            "ran to the end before the query stopped")
    return result


class _Progress:
    """Spark's progress of the batches not yet printed, and which batch ids were counted.

    Spark's ``recentProgress`` repeats its last 100 entries at every poll; a batch is
    counted once, by its id (ids only grow within a run). Entries are dropped once
    their epoch's line is printed, or once no pending epoch can use them, so a run of
    months keeps a few entries, not one per batch.
    """

    #: Entries kept at most, whatever happens to the epochs they belong to.
    KEEP = 200

    def __init__(self) -> None:
        self._by_batch: dict[int, Mapping[str, Any]] = {}
        self._highest = -1

    def update(self, entries: Sequence[Mapping[str, Any]]) -> int:
        """Take the entries of one poll; returns how many batches are new."""
        new = 0
        for p in entries:
            batch = int(p["batchId"])
            if batch > self._highest:
                self._highest = batch
                self._by_batch[batch] = p
                new += 1
            elif batch == self._highest and batch in self._by_batch:
                # A later report of the same batch (Spark reports an idle trigger
                # under the id of the batch that runs next): keep the latest.
                self._by_batch[batch] = p
        while len(self._by_batch) > self.KEEP:
            del self._by_batch[min(self._by_batch)]
        return new

    def has(self, batch: int) -> bool:
        return batch in self._by_batch or batch < self._highest - self.KEEP

    def pop(self, batch: int) -> Mapping[str, Any] | None:
        return self._by_batch.pop(batch, None)

    def forget_up_to(self, oldest_pending: int | None) -> None:
        """Drop entries older than every epoch still waiting for its line (the newest
        one stays: its epoch may not be committed yet)."""
        limit = self._highest - 1 if oldest_pending is None else oldest_pending - 1
        for batch in [b for b in self._by_batch if b <= limit]:
            del self._by_batch[batch]

    def __len__(self) -> int:
        return len(self._by_batch)


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
