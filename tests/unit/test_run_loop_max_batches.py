"""``--max-batches N`` says how many batches ran past N, when Spark ran more.

Before: "done (--max-batches 3 reached): committed epochs 0-5" - Spark starts the next
batch as soon as one ends, and on a loaded machine several end between two polls of the
run loop, so the bound stops the query after more than N batches. The summary now says
how many more had already started and finished; a run that stops at N says nothing more.
"""

from __future__ import annotations

from typing import Any

import pytest
from txsink.config import parse_pipeline
from txsink.model import Committable
from txsink.spark.run_stream import run_stream
from txsink.state import EpochRecord, EpochState


class _State:
    def __init__(self) -> None:
        self.records: dict[int, EpochRecord] = {}

    def commit(self, epoch: int) -> None:
        c = Committable("files", "s1", epoch, 0, 0, f"s1-e{epoch}-p0-a0", {}, rows=10)
        self.records[epoch] = EpochRecord(epoch, EpochState.COMMITTED, (c,), 1.0, 1.002)

    def states(self) -> dict[int, EpochState]:
        return {e: r.state for e, r in self.records.items()}

    def get(self, epoch: int) -> EpochRecord | None:
        return self.records.get(epoch)

    def read_meta(self) -> None:
        return None


class _Query:
    """Spark under load: ``per_poll`` batches end between two polls of the loop."""

    def __init__(self, state: _State, per_poll: int) -> None:
        self.state = state
        self.per_poll = per_poll
        self.batch = -1
        self.recent: list[dict[str, Any]] = []
        self.isActive = True
        self.status = {"isDataAvailable": True, "isTriggerActive": False}

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        if self.isActive:
            for _ in range(self.per_poll):
                self.batch += 1
                self.state.commit(self.batch)
                self.recent.append({"batchId": self.batch, "numInputRows": 10,
                                    "durationMs": {"triggerExecution": 5}})
        return list(self.recent)

    def stop(self) -> None:
        self.isActive = False

    def exception(self) -> None:
        return None


class _Frame:
    def __init__(self, query: _Query) -> None:
        self.query = query
        self.writeStream = self

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


@pytest.mark.parametrize(("per_poll", "said"), [
    (1, "--max-batches 3 reached"),
    (2, "--max-batches 3 reached; 1 more batch had already started and ran to the end "
        "before the query stopped"),
    (6, "--max-batches 3 reached; 3 more batches had already started and ran to the end "
        "before the query stopped"),
])
def test_the_summary_says_how_many_batches_ran_past_the_bound(per_poll: int,
                                                             said: str) -> None:
    cfg = parse_pipeline({
        "name": "bounded", "source": {"type": "rate"},
        "sink": {"backend": "files", "sink_id": "s1",
                 "options": {"path": "/nonexistent", "format": "jsonl"}},
        "checkpoint": "/nonexistent/chk", "trigger": {"processing_time": "1 second"}})
    state = _State()
    lines: list[str] = []
    result = run_stream(_Frame(_Query(state, per_poll)), cfg, state,  # type: ignore[arg-type]
                        lines.append, max_batches=3, until_idle=False, timeout_s=None,
                        poll_s=0)
    assert result.stopped_because == said
    assert result.epochs == result.batches == max(3, per_poll * -(-3 // per_poll))
    assert len(lines) == result.epochs
