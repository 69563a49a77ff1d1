"""The position writer of Real-time Mode, against an in-memory target (no JVM)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from txsink.errors import FencedError
from txsink.realtime import (
    NOTHING,
    PositionOrderError,
    PositionTarget,
    PositionWriter,
    SessionPool,
)
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


@pytest.mark.promise("realtime-replay-skipped", "realtime")
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


@pytest.mark.promise("realtime-out-of-order-stops", "realtime")
def test_offsets_going_backwards_are_refused_loudly() -> None:
    store, clock = Store(), Clock()
    w = writer(store, clock)
    w.add(A, 4, {"id": 4})
    with pytest.raises(PositionOrderError, match="offset 3 came after 4"):
        w.add(A, 3, {"id": 3})
    w.close(PositionOrderError("x"))
    assert store.rows == []


@pytest.mark.promise("realtime-record-rows-one-commit", "realtime")
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


@pytest.mark.promise("realtime-two-drivers-fenced", "realtime")
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


class KeptTarget(MemoryTarget):
    reusable = True
    claims = 0

    def claim(self) -> int:
        KeptTarget.claims += 1
        return super().claim()


def kept_writer(store: Store, clock: Clock, pool: SessionPool, run: str = "run-1",
                **kw: Any) -> PositionWriter:
    return PositionWriter(lambda s: KeptTarget(store, s), clock=clock, run=run, pool=pool,
                          **kw)


def test_a_kept_session_serves_the_next_batch_without_claiming_again() -> None:
    store, clock = Store(), Clock()
    pool = SessionPool(clock=clock)
    KeptTarget.claims = 0
    w = kept_writer(store, clock, pool)
    for off in range(3):
        w.add(A, off, {"id": off})
    w.close()
    assert len(pool) == 1 and KeptTarget.claims == 1
    w2 = kept_writer(store, clock, pool)  # the next batch in the same worker
    for off in range(3, 6):
        w2.add(A, off, {"id": off})
    w2.close()
    assert KeptTarget.claims == 1 and [r["id"] for r in store.rows] == list(range(6))
    # Another run (a restarted query) never takes this run's sessions.
    w3 = kept_writer(store, clock, pool, run="run-2")
    w3.add(A, 6, {"id": 6})
    w3.close()
    assert KeptTarget.claims == 2 and len(pool) == 2


@pytest.mark.promise("realtime-kept-producer-fenced-reclaims", "realtime")
def test_a_kept_session_fenced_while_idle_claims_again_and_skips_what_is_held() -> None:
    store, clock = Store(), Clock()
    pool = SessionPool(clock=clock)
    w = kept_writer(store, clock, pool)
    for off in range(3):
        w.add(A, off, {"id": off})
    w.close()
    # Meanwhile another worker process takes source partition A and commits 3..5.
    other = kept_writer(store, clock, SessionPool(clock=clock))
    for off in range(3, 6):
        other.add(A, off, {"id": off})
    other.close()
    # The replayed batch reaches the kept (now fenced) session from offset 3 on: its
    # stale stored offset (2) lets 3..5 through until the commit is refused.
    w2 = kept_writer(store, clock, pool)
    for off in range(3, 8):
        w2.add(A, off, {"id": off})
    w2.close()
    assert sorted(r["id"] for r in store.rows) == list(range(8))
    assert store.offsets[A] == 7 and w2.stats.skipped == 3


def test_a_session_is_kept_only_after_a_clean_end_and_idle_ones_expire() -> None:
    store, clock = Store(), Clock()
    pool = SessionPool(idle_s=30, clock=clock)
    w = kept_writer(store, clock, pool)
    w.add(A, 0, {"id": 0})
    w.close(RuntimeError("task killed"))
    assert len(pool) == 0 and store.rows == []
    w = kept_writer(store, clock, pool)
    w.add(A, 0, {"id": 0})
    w.close()
    assert len(pool) == 1
    clock.now = 31.0
    assert pool.take("run-1", B) is None and len(pool) == 0  # expired at the access
    # A fenced session that was not kept still fails loudly.
    w = kept_writer(store, clock, pool)
    w.add(A, 1, {"id": 1})
    kept_writer(store, clock, SessionPool(clock=clock)).add(A, 1, {"id": 1})
    with pytest.raises(FencedError):
        w.close()


@pytest.mark.promise("realtime-deleted-position-is-no-position", "realtime")
def test_a_kept_session_whose_positions_were_deleted_while_idle_stops_without_writing() -> None:
    """A kept session fenced while idle is claimed again and goes on; but when the new
    claim finds a lower position than the session knew, the positions were deleted
    (``txsink reset``, which fences first): the kept session belongs to the run being
    reset, and must not write into the new start."""

    class Kept(MemoryTarget):
        reusable = True

    store, pool = Store(), SessionPool()
    first = PositionWriter(lambda s: Kept(store, s), commit_interval_s=0.0, run="r",
                           pool=pool)
    for off in range(3):
        first.add(SP("t", 0), off, {"id": off})
    first.close()
    assert len(pool) == 1
    del store.offsets[SP("t", 0)]  # the reset: positions deleted ...
    store.generation[SP("t", 0)] += 1  # ... after fencing every writer
    again = PositionWriter(lambda s: Kept(store, s), commit_interval_s=0.0, run="r",
                           pool=pool)
    with pytest.raises(FencedError, match="its positions were deleted"):
        again.add(SP("t", 0), 3, {"id": 3})
    again.close(RuntimeError("task failed"))
    assert [r["id"] for r in store.rows] == [0, 1, 2]
    pool.clear()


def test_batch_ids_tell_a_kept_session_that_another_worker_wrote_since() -> None:
    """Spark's Real-time Mode runs a task of every source partition in every batch, on
    whichever Python worker is free. A session kept by the batch just before is the
    newest claim (taken as it is); one kept by an older batch was passed by another
    worker's claim, and is claimed again when the task takes it: no rows are handed to
    the fenced session, so no commit interval is lost to a refused commit."""

    class Counting(MemoryTarget):
        reusable = True
        writes: list[str] = []

        def write(self, rows: Sequence[Mapping[str, Any]]) -> None:
            Counting.writes.append(self.name)
            super().write(rows)

    store, clock = Store(), Clock()
    workers = {"A": SessionPool(clock=clock), "B": SessionPool(clock=clock)}
    claims: list[str] = []

    def task(worker: str, batch: int, offsets: range) -> PositionWriter:
        def factory(source: SP) -> Counting:
            claims.append(f"{worker}{batch}")
            target = Counting(store, source)
            target.name = f"{worker}{batch}"  # type: ignore[attr-defined]
            return target
        w = PositionWriter(factory, commit_interval_s=60, clock=clock, run="run-1",
                           pool=workers[worker], batch=batch)
        for off in offsets:
            w.add(A, off, {"id": off})
        w.close()
        return w

    task("A", 0, range(0, 3))
    task("A", 1, range(3, 6))  # kept by batch 0, the batch just before: no claim
    task("B", 2, range(6, 9))  # another worker: claims, fencing A's kept session
    last = task("A", 3, range(9, 12))  # A's session is from batch 1: claimed again at once
    assert claims == ["A0", "B2", "A3"]
    assert Counting.writes == ["A0", "A0", "B2", "A3"]  # no write into the fenced session
    assert last.stats.commits == 1
    assert sorted(r["id"] for r in store.rows) == list(range(12))
    for pool in workers.values():
        pool.clear()
