"""An in-memory real-time target (Real-time Mode) that keeps PostgreSQL's protocol.

It stands for :mod:`txsink_postgres.realtime`, step for step, without a server, so that
the engine side of Real-time Mode (:mod:`txsink.realtime`, the Spark adapter's writer)
can be driven through thousands of sequences by a model: a progress row per (sink id,
source topic, source partition) holding the highest offset, the source topic's id and
the destination it was counted in, and a ``generation``. A claim inserts the row
(offset -1) or takes a new generation for it, from one sequence (never from the row: a
deleted row made again never hands out a generation a zombie session holds), and reads
the position; every transaction first checks that the row is there with its own
generation (PostgreSQL: ``SELECT ... FOR UPDATE``), else it is fenced and nothing of it
becomes visible; a commit moves the offset only forward, records the topic id and the
destination, and makes the rows visible together with it. ``prepare`` draws the run's
generation from the same sequence; ``delete_positions`` (``txsink reset``) deletes the
progress rows and records a generation from it too (PostgreSQL: the sink's reset row), and
a claim of a run prepared before that is refused.

What it does not stand for: the server's own failure modes (connections lost, a
commit whose outcome is unknown), the COPY of real column types, and the Kafka target
(fenced by ``transactional.id``, its positions in a compacted topic). Systems are
looked up by name, as two processes share one database.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from txsink.errors import FencedError, TxsinkError
from txsink.realtime import (
    NOTHING,
    PositionTarget,
    RealtimeTargetSpec,
    SourcePartition,
    StoredPosition,
    older_run_refusal,
)


@dataclass
class ProgressRow:
    offset: int
    generation: int
    topic_id: str | None = None
    destination: dict[str, str] | None = None

    def position(self) -> StoredPosition:
        return StoredPosition(self.offset, self.topic_id, self.destination)


@dataclass
class RealtimeSystem:
    """The "database": committed rows per table, and the progress table."""

    #: table -> committed rows, in commit order.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: (sink id, source topic, source partition) -> progress row.
    progress: dict[tuple[str, str, int], ProgressRow] = field(default_factory=dict)
    #: The generation sequence (PostgreSQL: ``<progress table>_generation``).
    generations: int = 0
    #: sink id -> the generation of its last ``delete_positions`` (PostgreSQL: the reset
    #: row, source partition -1).
    resets: dict[str, int] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def next_generation(self) -> int:
        with self.lock:
            self.generations += 1
            return self.generations

    def rows(self, table: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.tables.get(table, ()))

    def truncate(self, table: str) -> None:
        """``TRUNCATE`` (an operator empties the target for a start-over)."""
        with self.lock:
            self.tables[table] = []


SYSTEMS: dict[str, RealtimeSystem] = {}


def realtime_system(name: str) -> RealtimeSystem:
    return SYSTEMS.setdefault(name, RealtimeSystem())


class MemoryRealtimeSpec(RealtimeTargetSpec):
    """A real-time target writing table ``table`` of the in-memory system ``system``."""

    def __init__(self, sink_id: str, system: str, table: str) -> None:
        self.sink_id = sink_id
        self.system_name = system
        self.table = table

    @property
    def system(self) -> RealtimeSystem:
        return realtime_system(self.system_name)

    def prepare(self) -> None:
        self.system.tables.setdefault(self.table, [])
        self.run = self.system.next_generation()

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return MemoryPositionTarget(self, source)

    def describe(self) -> str:
        return f"memory table {self.table} in {self.system_name}"

    def stored(self) -> dict[SourcePartition, StoredPosition]:
        with self.system.lock:
            return {SourcePartition(t, p): row.position()
                    for (s, t, p), row in self.system.progress.items() if s == self.sink_id}

    def delete_positions(self, topics: Sequence[str] | None = None) -> list[str]:
        """Delete this sink id's progress rows (of ``topics`` only, if given): a session
        that held one is fenced at its next transaction, and a claim of a run prepared
        before this is refused."""
        system = self.system
        with system.lock:
            system.resets[self.sink_id] = system.next_generation()
            gone = sorted(k for k in system.progress
                          if k[0] == self.sink_id and (topics is None or k[1] in topics))
            lines = [f"{SourcePartition(t, p)}: offset {system.progress[(s, t, p)].offset}"
                     for s, t, p in gone]
            for k in gone:
                del system.progress[k]
        return lines


class MemoryPositionTarget(PositionTarget):
    """One source partition's session (PostgreSQL: one connection)."""

    reusable = True

    def __init__(self, spec: MemoryRealtimeSpec, source: SourcePartition) -> None:
        self.spec = spec
        self.source = source
        self.key = (spec.sink_id, source.topic, source.partition)
        self.generation = -1
        self.pending: list[dict[str, Any]] = []

    def identity(self) -> tuple[str, Mapping[str, str]]:
        return self.spec.sink_id, self.spec.destination()

    def claim(self) -> StoredPosition:
        system = self.spec.system
        with system.lock:
            refusal = older_run_refusal(self.spec.sink_id, self.source, self.spec.run,
                                        system.resets.get(self.spec.sink_id))
            if refusal is not None:
                raise refusal
            generation = system.next_generation()
            row = system.progress.get(self.key)
            if row is None:
                row = system.progress[self.key] = ProgressRow(
                    NOTHING, generation, self.source.topic_id, self.spec.destination())
            else:
                row.generation = generation
            self.generation = generation
            return row.position()

    def _check(self) -> ProgressRow:
        row = self.spec.system.progress.get(self.key)
        if row is None or row.generation != self.generation:
            self.pending = []
            raise FencedError(
                f"sink {self.spec.sink_id}: source partition {self.source} was claimed by a "
                f"newer writer (generation {row.generation if row else 'gone'}, this one "
                f"{self.generation}); this writer stops without writing",
                sink_id=self.spec.sink_id)
        return row

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        with self.spec.system.lock:
            self._check()
        self.pending.extend(dict(r) for r in rows)

    def commit(self, offset: int) -> None:
        system = self.spec.system
        with system.lock:
            row = self._check()
            if row.offset >= offset:
                self.pending = []
                raise TxsinkError(f"sink {self.spec.sink_id}: progress of {self.source} did "
                                  f"not move to {offset} (fenced or already past it); nothing "
                                  "of this transaction was committed", sink_id=self.spec.sink_id)
            system.tables.setdefault(self.spec.table, []).extend(self.pending)
            row.offset = offset
            row.topic_id = self.source.topic_id or row.topic_id
            row.destination = self.spec.destination()
            self.pending = []

    def abort(self) -> None:
        self.pending = []

    def close(self) -> None:
        self.pending = []


__all__ = [
    "SYSTEMS",
    "MemoryPositionTarget",
    "MemoryRealtimeSpec",
    "ProgressRow",
    "RealtimeSystem",
    "realtime_system",
]
