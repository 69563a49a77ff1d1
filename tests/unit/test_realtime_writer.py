"""The position writer of Real-time Mode, against an in-memory target (no JVM)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from txsink.errors import FencedError
from txsink.realtime import NOTHING, PositionOrderError, PositionTarget, PositionWriter
from txsink.realtime import SourcePartition as SP


class Store:
    """What a transactional target holds: committed rows and highest offsets."""

    def __init__(self) -> None:
        self.rows: list[Mapping[str, Any]] = []
        self.offsets: dict[SP, int] = {}
        self.generation: dict[SP, int] = {}


class MemoryTarget(PositionTarget):
    def __init__(self, store: Store, source: SP) -> None:
        self.store, self.source = store, source
        self.open: list[Mapping[str, Any]] = []
        self.mine = -1

    def claim(self) -> int:
        self.mine = self.store.generation.get(self.source, 0) + 1
        self.store.generation[self.source] = self.mine
        return self.store.offsets.get(self.source, NOTHING)

    def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
        self.open.extend(rows)

    def commit(self, offset: int) -> None:
        if self.store.generation[self.source] != self.mine:
            self.open.clear()
            raise FencedError("fenced")
        self.store.rows.extend(self.open)
        self.store.offsets[self.source] = offset
        self.open.clear()

    def abort(self) -> None:
        self.open.clear()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def writer(store: Store, clock: Clock, **kw: Any) -> PositionWriter:
    return PositionWriter(lambda s: MemoryTarget(store, s), clock=clock, **kw)


A, B = SP("in", 0), SP("in", 1)


def test_commits_every_interval_and_a_replay_skips_what_the_target_holds() -> None:
    store, clock = Store(), Clock()
    w = writer(store, clock, commit_interval_s=0.25)
    for off in range(5):
        w.add(A, off, {"id": off})
    assert store.rows == []  # within the interval: nothing visible yet
    clock.now = 0.3
    w.add(A, 5, {"id": 5})
    assert [r["id"] for r in store.rows] == [0, 1, 2, 3, 4, 5]
    w.add(A, 6, {"id": 6})
    w.close(RuntimeError("task killed"))  # offset 6 never committed
    assert store.offsets[A] == 5

    # The replay (SPARK-28650: maybe other rows per epoch) starts before what is held.
    w2 = writer(store, clock)
    for off in range(3, 9):
        w2.add(A, off, {"id": off})
    w2.add(B, 0, {"id": 100})
    w2.close()
    assert sorted(r["id"] for r in store.rows) == [*range(9), 100]
    assert w2.stats.skipped == 3 and store.offsets == {A: 8, B: 0}


def test_offsets_going_backwards_are_refused_loudly() -> None:
    store, clock = Store(), Clock()
    w = writer(store, clock)
    w.add(A, 4, {"id": 4})
    with pytest.raises(PositionOrderError, match="offset 3 came after 4"):
        w.add(A, 3, {"id": 3})
    w.close(PositionOrderError("x"))
    assert store.rows == []


def test_rows_of_one_record_never_split_across_commits() -> None:
    store, clock = Store(), Clock()
    w = writer(store, clock, commit_interval_s=0.0, rows_per_record="many")
    w.add(A, 0, {"id": "0a"})
    w.add(A, 0, {"id": "0b"})
    assert store.rows == []  # record 0 may still have rows to come
    w.add(A, 1, {"id": "1a"})
    assert [r["id"] for r in store.rows] == ["0a", "0b"] and store.offsets[A] == 0
    w.close()
    assert [r["id"] for r in store.rows] == ["0a", "0b", "1a"] and store.offsets[A] == 1


def test_a_fenced_writer_commits_nothing_and_says_so() -> None:
    store, clock = Store(), Clock()
    old = writer(store, clock)
    old.add(A, 0, {"id": 0})
    new = writer(store, clock)
    new.add(A, 0, {"id": 0})  # claims A: the old writer is fenced
    with pytest.raises(FencedError):
        old.close()
    new.close()
    assert store.rows == [{"id": 0}]


def test_flush_due_commits_rows_that_arrived_before_a_pause() -> None:
    store, clock = Store(), Clock()
    w = writer(store, clock, commit_interval_s=0.25)
    w.add(A, 0, {"id": 0})
    w.flush_due()
    assert store.rows == []
    clock.now = 0.5
    w.flush_due()  # what a timer thread calls while no row arrives
    assert store.rows == [{"id": 0}]
    w.close()
