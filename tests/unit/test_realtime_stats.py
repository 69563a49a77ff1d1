"""What real-time writers count, and the lines ``txsink run`` prints from it (no JVM)."""

from __future__ import annotations

import pickle
from typing import Any

from txsink.realtime import NOTHING, PositionTarget, PositionWriter
from txsink.realtime import SourcePartition as SP
from txsink.realtime.stats import (
    RealtimeStats,
    TargetStats,
    bucket_of,
    bucket_top,
    stats_line,
)
from txsink.spark.realtime import StatsParam
from txsink.spark.run_realtime import ProgressLines


def test_a_percentile_is_never_below_the_latencies_it_stands_for() -> None:
    stats = TargetStats()
    latencies = [0.0005, *[0.01 * i for i in range(1, 100)], 2.0]
    stats.committed([10.0 - lat for lat in latencies], ended=10.0)
    assert stats.rows == 101 and stats.commits == 1
    p50, p99 = stats.percentile(0.5), stats.percentile(0.99)
    assert p50 is not None and p99 is not None
    assert 0.50 <= p50 <= 0.50 * 1.09  # one bucket (8 %) above at most
    assert 0.99 <= p99 <= 0.99 * 1.09
    assert stats.percentile(1.0) == bucket_top(bucket_of(2.0)) >= 2.0
    assert TargetStats().percentile(0.5) is None


def test_totals_add_and_subtract_exactly_and_travel_as_plain_values() -> None:
    first, second = RealtimeStats(), RealtimeStats()
    first.target("events").committed([0.0, 0.5], ended=1.0)
    first.target("totals").skipped = 3
    second.target("events").committed([1.9], ended=2.0)
    total = RealtimeStats.from_plain(StatsParam().addInPlace(
        StatsParam().zero(None), first.to_plain()))
    total = RealtimeStats.from_plain(StatsParam().addInPlace(total.to_plain(),
                                                             second.to_plain()))
    assert total.targets["events"].rows == 3 and total.targets["events"].commits == 2
    assert total.targets["totals"].skipped == 3
    since = total.since(first)
    assert since.targets["events"].rows == 1 and since.targets["events"].commits == 1
    assert since.targets["events"].percentile(1.0) == bucket_top(bucket_of(0.1))
    assert since.targets["totals"].skipped == 0
    assert pickle.loads(pickle.dumps(StatsParam())).zero(None) == {}


def test_a_line_names_each_target_its_rows_commits_and_latency() -> None:
    stats = RealtimeStats()
    stats.target("events").committed([0.9] * 1200, ended=1.0)
    stats.target("events").skipped = 5
    stats.target("totals")
    line = stats_line(stats)
    assert line.startswith("events 1,200 row(s) in 1 commit(s) (visible p50 ")
    assert "p99 " in line and "after reaching the writer), 5 skipped" in line
    assert line.endswith("; totals 0 row(s) in 0 commit(s)")
    single = RealtimeStats()
    single.target("").committed([0.5], ended=2.0)
    assert stats_line(single).startswith("1 row(s) in 1 commit(s) (visible p50 1.6")


class Held(PositionTarget):
    def __init__(self) -> None:
        self.committed: list[int] = []

    def claim(self) -> int:
        return 4  # offsets up to 4 are held

    def write(self, rows: Any) -> None:
        pass

    def commit(self, offset: int) -> None:
        self.committed.append(offset)

    def abort(self) -> None:
        pass


def test_the_writer_counts_rows_commits_skips_and_each_rows_wait() -> None:
    traced: list[dict[str, Any]] = []
    w = PositionWriter(lambda s: Held(), commit_interval_s=60, trace=traced.append)
    for offset in range(10):
        w.add(SP("in", 0), offset, {"id": offset} if offset != 7 else None)
    w.close()
    assert w.progress.skipped == 5  # 0-4 are held
    assert w.progress.rows == 4 and w.progress.commits == 1  # 5, 6, 8, 9 (7: no row)
    assert sum(w.progress.latency.values()) == 4
    claim, commit = traced
    assert claim["claim"] == "in-0" and claim["kept"] is False
    assert commit["offsets"] == [5, 6, 8, 9] and len(commit["arrivals"]) == 4
    assert commit["began"] <= commit["ended"]
    assert NOTHING < 0


class Query:
    def __init__(self) -> None:
        self.recentProgress: list[dict[str, Any]] = []
        self.runId = "no-such-run"


def test_progress_lines_come_at_most_every_few_seconds_and_cover_every_batch() -> None:
    printed: list[str] = []
    now = [0.0]
    lines = ProgressLines(printed.append, every_s=5.0, clock=lambda: now[0])
    query = Query()
    lines.poll(query)
    assert printed == []  # no batch yet
    query.recentProgress = [{"batchId": 0}, {"batchId": 1}]
    now[0] = 2.0
    lines.poll(query)
    assert printed == []  # within 5 s of the start
    now[0] = 6.0
    query.recentProgress = [{"batchId": 0}, {"batchId": 1}, {"batchId": 2}]
    lines.poll(query)
    assert printed == ["real-time batches 0-2 completed: no rows"]
    query.recentProgress = [{"batchId": 2}, {"batchId": 3}]  # Spark keeps the last 100
    lines.poll(query, final=True)
    assert printed[-1] == "real-time batch 3 completed: no rows"
    assert lines.batches == 4
