"""What ``txsink run`` prints and counts: one line per committed epoch, the notes
of a resumed run, a sample of a files sink's output, and the run's result.

Everything here reads the txsink state; nothing keeps one entry per epoch, since a
streaming run may last months.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txsink.config import PipelineConfig
from txsink.state import EpochRecord, EpochState, StateStore

Printer = Callable[[str], None]


@dataclass
class RunResult:
    """What one ``run`` did, for the summary line and for tests.

    Counts and bounds only, never one entry per epoch: a streaming run may last months.
    """

    #: Micro-batches of this run that Spark reported as complete.
    batches: int = 0
    #: Epochs committed during this run, and the first and last of them.
    epochs: int = 0
    first_epoch: int | None = None
    last_epoch: int | None = None
    rows: int = 0
    #: A group's rows per target (``rows`` is their sum).
    rows_by_target: dict[str, int] = field(default_factory=dict)
    stopped_because: str = ""
    #: The signal that interrupted the run (SIGINT, SIGTERM), if one did.
    signal: int | None = None
    #: False when stopping the query failed after an interrupt (a Spark Connect server
    #: that no longer answers may still run it).
    query_stopped: bool = True

    def add(self, record: EpochRecord) -> None:
        """Count one newly committed epoch."""
        self.epochs += 1
        self.rows += record.rows
        if self.first_epoch is None:
            self.first_epoch = record.epoch
        self.last_epoch = record.epoch
        for c in record.committables:
            if c.target:
                self.rows_by_target[c.target] = self.rows_by_target.get(c.target, 0) + c.rows

    @property
    def exit_status(self) -> int:
        """0, or the shell's 128 + signal number for an interrupted run (130, 143)."""
        return 128 + self.signal if self.signal else 0


def resume_notes(cfg: PipelineConfig, store: StateStore) -> list[str]:
    """Say that a run continues an earlier one, where, and what it replays first."""
    checkpoint = Path(cfg.checkpoint.removeprefix("file://"))
    if cfg.mode != "streaming" or (
            "://" in cfg.checkpoint and not cfg.checkpoint.startswith("file://")):
        return []  # a batch write is one new epoch; remote checkpoints are not read here

    def batch_ids(sub: str) -> list[int]:
        folder = checkpoint / sub
        if not folder.is_dir():
            return []
        return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())

    offsets, commits = batch_ids("offsets"), batch_ids("commits")
    records = store.records()
    if not offsets and not records:
        return []
    meta = store.read_meta()
    in_doubt = sorted(e for e, r in records.items() if r.state is EpochState.DECIDED)
    # Micro-batch b is epoch stream_from + b (above a backfill's epochs, if one came first).
    base = meta.stream_from if meta is not None and meta.stream_from is not None else 0
    last_offset = offsets[-1] + base if offsets else -1
    last_commit = commits[-1] + base if commits else -1
    replay = last_offset if last_offset > last_commit else None
    next_epoch = (last_offset + 1 if offsets else base) if replay is None else replay
    line = f"resuming sink {cfg.sink.sink_id!r} at epoch {next_epoch} from {cfg.checkpoint}"
    if replay is not None:
        line += (f"; replaying epoch {replay} (planned before the last stop but not finished "
                 "in Spark)")
    notes = [line]
    if in_doubt:
        notes.append(f"epoch(s) {', '.join(map(str, in_doubt))} were decided but not fully "
                     "committed: txsink commits them first")
    if (meta is not None and meta.committed_watermark >= 0) or any(
            r.state is EpochState.COMMITTED for r in records.values()):
        notes.append("the first batch also reads what the source produced while the "
                     "pipeline was stopped (catch-up rows): expect it to be larger")
    return notes


def committed_into(result: RunResult, store: StateStore, seen: set[int]) -> None:
    for record in committed_since(store, seen):
        result.add(record)


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


def committed_since(store: StateStore, seen: set[int]) -> list[EpochRecord]:
    """Epochs committed since ``seen``: polled while the query runs, so only the new
    records are read. ``seen`` keeps only epochs the state still holds (the coordinator
    prunes old ones), so it stays as small as the state however long the run."""
    fresh = []
    states = store.states()
    for epoch, state in sorted(states.items()):
        if state is EpochState.COMMITTED and epoch not in seen:
            record = store.get(epoch)
            if record is not None:
                fresh.append(record)
    seen.update(r.epoch for r in fresh)
    seen.intersection_update(states)
    return fresh


def epoch_line(record: EpochRecord, progress: Mapping[str, Any] | None) -> str:
    latency = ""
    if record.committed_at is not None:
        latency = f", commit {1000 * (record.committed_at - record.decided_at):.0f} ms"
    spark_part = ""
    if progress:
        took = progress.get("durationMs", {}).get("triggerExecution")
        spark_part = f" (input {progress.get('numInputRows', '?')} rows" + (
            f", batch {took / 1000:.1f} s)" if took is not None else ")")
    targets: dict[str, int] = {}
    for c in record.committables:
        if c.target:
            targets[c.target] = targets.get(c.target, 0) + c.rows
    rows = (", ".join(f"{n} {r}" for n, r in targets.items()) + " row(s)" if targets
            else f"{record.rows} row(s)")
    return (f"batch {record.epoch}: {rows} in {len(record.committables)} "
            f"participant(s){latency}{spark_part}")
