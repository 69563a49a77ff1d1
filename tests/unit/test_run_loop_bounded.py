"""`txsink run`'s loop over a streaming query keeps what it remembers bounded.

A query with a 10-second trigger makes 260,000 micro-batches a month; the loop that
prints each committed batch must not keep one entry per batch (it kept Spark's
progress report of every batch, and the ids of every batch and epoch in lists it
searched at every poll). Driven here by a stand-in query that commits one epoch per
poll into a state that prunes old records the way the coordinator does.
"""

from __future__ import annotations

import re
import tracemalloc
from collections.abc import Iterable
from typing import Any

from txsink.config import parse_pipeline
from txsink.model import Committable
from txsink.spark.run_stream import run_stream
from txsink.state import EpochRecord, EpochState

RETAINED = 100


class _State:
    """What the run loop reads of a state store (``states``, ``get``, ``read_meta``), pruned to the
    last :data:`RETAINED` epochs like the coordinator's."""

    def __init__(self) -> None:
        self.records: dict[int, EpochRecord] = {}

    def commit(self, epoch: int) -> None:
        c = Committable("files", "s1", epoch, 0, 0, f"s1-e{epoch}-p0-a0", {}, rows=10)
        self.records[epoch] = EpochRecord(epoch, EpochState.COMMITTED, (c,), 1.0, 1.002)
        for old in [e for e in self.records if e <= epoch - RETAINED]:
            del self.records[old]

    def states(self) -> dict[int, EpochState]:
        return {e: r.state for e, r in self.records.items()}

    def get(self, epoch: int) -> EpochRecord | None:
        return self.records.get(epoch)

    def read_meta(self) -> None:
        return None  # no metadata: micro-batch b is epoch b


class _Query:
    """Commits one epoch per poll of ``recentProgress`` and reports it like Spark: the
    last 100 progress entries, each a few kilobytes of nested dicts."""

    def __init__(self, state: _State, memory_at: Iterable[int]) -> None:
        self.state = state
        self.batch = -1
        self.recent: list[dict[str, Any]] = []
        self.isActive = True
        self.status = {"isDataAvailable": True, "isTriggerActive": False}
        self.memory_at = set(memory_at)
        self.memory: dict[int, int] = {}

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        if not self.isActive:
            return list(self.recent)
        self.batch += 1
        self.state.commit(self.batch)
        entry = {"batchId": self.batch, "numInputRows": 10,
                 "durationMs": {"triggerExecution": 5, "addBatch": 3},
                 "sources": [{"description": f"RateStream[{i}]", "startOffset": self.batch,
                              "endOffset": self.batch + 1, "metrics": {"x": "y" * 40}}
                             for i in range(8)]}
        self.recent = [*self.recent[-99:], entry]
        if self.batch in self.memory_at:
            self.memory[self.batch] = tracemalloc.get_traced_memory()[0]
        return list(self.recent)

    def stop(self) -> None:
        self.isActive = False

    def exception(self) -> None:
        return None


class _Frame:
    def __init__(self, query: _Query) -> None:
        self.query = query

    @property
    def writeStream(self) -> _Frame:
        return self

    def format(self, _: str) -> _Frame:
        return self

    def options(self, **_: str) -> _Frame:
        return self

    def trigger(self, **_: str) -> _Frame:
        return self

    def queryName(self, _: str) -> _Frame:
        return self

    def start(self) -> _Query:
        return self.query


def test_a_long_run_prints_every_batch_once_and_keeps_nothing_per_batch() -> None:
    cfg = parse_pipeline({
        "name": "long", "source": {"type": "rate"},
        # JSON lines: the data source's stream (Parquet takes Spark's own writer through
        # foreachBatch; the loop under test is the same for both).
        "sink": {"backend": "files", "sink_id": "s1",
                 "options": {"path": "/nonexistent", "format": "jsonl"}},
        "checkpoint": "/nonexistent/chk", "trigger": {"processing_time": "1 second"}})
    batches = 1500
    state = _State()
    query = _Query(state, memory_at=(300, batches - 1))
    printed = 0
    pattern = re.compile(r"batch (\d+): 10 row\(s\) in 1 participant\(s\), commit 2 ms "
                         r"\(input 10 rows, batch 0\.0 s\)")

    def out(line: str) -> None:
        nonlocal printed
        match = pattern.fullmatch(line)
        assert match is not None, line
        assert int(match.group(1)) == printed  # each batch once, in order
        printed += 1

    tracemalloc.start()
    try:
        result = run_stream(_Frame(query), cfg, state, out,  # type: ignore[arg-type]
                            max_batches=batches, until_idle=False, timeout_s=None, poll_s=0)
    finally:
        tracemalloc.stop()
    # 1,200 batches later the loop holds no more than before (the progress reports of
    # those batches alone are megabytes).
    grown = query.memory[batches - 1] - query.memory[300]
    assert grown < 150_000, f"the run loop grew by {grown:,} bytes over 1,200 batches"
    assert printed == batches
    assert result.batches == batches
    assert (result.epochs, result.first_epoch, result.last_epoch) == (batches, 0, batches - 1)
    assert result.rows == 10 * batches
