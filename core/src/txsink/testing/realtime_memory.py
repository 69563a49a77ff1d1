"""An in-memory real-time target (Real-time Mode) that keeps PostgreSQL's protocol.

It stands for :mod:`txsink_postgres.realtime`, step for step, without a server, so that
the engine side of Real-time Mode (:mod:`txsink.realtime`, the Spark adapter's writer)
can be driven through thousands of sequences by a model: a progress row per (sink id,
source topic, source partition) holding the highest offset and a ``generation``; a
claim inserts the row (offset -1, generation 1) or bumps its generation and reads the
offset; every transaction first checks that the row is there with its own generation
(PostgreSQL: ``SELECT ... FOR UPDATE``), else it is fenced and nothing of it becomes
visible; a commit moves the offset only forward and makes the rows visible together
with it. A deleted progress row (an operator's ``DELETE FROM txsink_progress``) is
made again by the next claim, at generation 1, as PostgreSQL's upsert does.

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
from txsink.realtime import NOTHING, PositionTarget, RealtimeTargetSpec, SourcePartition


@dataclass
class ProgressRow:
    offset: int
    generation: int


@dataclass
class RealtimeSystem:
    """The "database": committed rows per table, and the progress table."""

    #: table -> committed rows, in commit order.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: (sink id, source topic, source partition) -> progress row.
    progress: dict[tuple[str, str, int], ProgressRow] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)

    def rows(self, table: str) -> list[dict[str, Any]]:
        with self.lock:
            return list(self.tables.get(table, ()))

    def delete_positions(self, sink_id: str, topic: str | None = None) -> int:
        """``DELETE FROM txsink_progress WHERE sink_id = ... [AND source_topic = ...]``."""
        with self.lock:
            gone = [k for k in self.progress if k[0] == sink_id and topic in (None, k[1])]
            for k in gone:
                del self.progress[k]
            return len(gone)

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

    def __call__(self, source: SourcePartition) -> PositionTarget:
        return MemoryPositionTarget(self, source)

    def describe(self) -> str:
        return f"memory table {self.table} in {self.system_name}"

    def stored_positions(self) -> dict[SourcePartition, int]:
        with self.system.lock:
            return {SourcePartition(t, p): row.offset
                    for (s, t, p), row in self.system.progress.items() if s == self.sink_id}


class MemoryPositionTarget(PositionTarget):
    """One source partition's session (PostgreSQL: one connection)."""

    reusable = True

    def __init__(self, spec: MemoryRealtimeSpec, source: SourcePartition) -> None:
        self.spec = spec
        self.source = source
        self.key = (spec.sink_id, source.topic, source.partition)
        self.generation = -1
        self.pending: list[dict[str, Any]] = []

    def claim(self) -> int:
        system = self.spec.system
        with system.lock:
            row = system.progress.get(self.key)
            if row is None:
                row = system.progress[self.key] = ProgressRow(NOTHING, 1)
            else:
                row.generation += 1
            self.generation = row.generation
            return row.offset

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
