"""What real-time writers did: rows, commits and how long rows waited, per target.

A real-time engine runs one writer per task and source partition; the driver prints
what they did together (``txsink run``'s progress lines). Each writer counts into a
:class:`RealtimeStats`, which is a plain mergeable value: Spark carries it from the
tasks to the driver in an accumulator, and the driver subtracts the totals of its last
line from the new ones to print "since the last line".

Latency here is what txsink adds: from the moment a row reached the writer to the end
of the commit that made it visible. The time before (the source's append, Spark's read
and its hand-over to the Python writer) is not seen by the writer; the benchmark
measures the whole way (``benchmarks/realtime_bench.py``). Latencies are kept as
counts per logarithmic bucket (8 % wide), so a percentile of any number of rows costs
a few hundred integers, and two histograms add and subtract exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Each latency bucket is this much wider than the one below it.
BUCKET_GROWTH = 1.08


def bucket_of(seconds: float) -> int:
    """The bucket of a latency: 0 holds everything up to a millisecond."""
    ms = seconds * 1000.0
    if ms <= 1.0:
        return 0
    return 1 + int(math.log(ms) / math.log(BUCKET_GROWTH))


def bucket_top(bucket: int) -> float:
    """The upper edge of a bucket, in seconds (what a percentile reports: never less
    than the latency it stands for)."""
    return 0.001 * BUCKET_GROWTH ** bucket


@dataclass
class TargetStats:
    """One target's rows written and skipped, its commits, and its rows' latencies."""

    rows: int = 0
    skipped: int = 0
    commits: int = 0
    #: bucket -> rows (see :func:`bucket_of`)
    latency: dict[int, int] = field(default_factory=dict)

    def committed(self, arrivals: Iterable[float], ended: float) -> None:
        """One commit, ended at ``ended``, of rows that reached the writer at
        ``arrivals`` (the same clock)."""
        self.commits += 1
        for arrived in arrivals:
            self.rows += 1
            b = bucket_of(ended - arrived)
            self.latency[b] = self.latency.get(b, 0) + 1

    def add(self, other: TargetStats) -> None:
        self.rows += other.rows
        self.skipped += other.skipped
        self.commits += other.commits
        for b, n in other.latency.items():
            self.latency[b] = self.latency.get(b, 0) + n

    def since(self, before: TargetStats | None) -> TargetStats:
        """What happened after ``before`` (an earlier copy of these totals)."""
        if before is None:
            return self.copy()
        out = TargetStats(self.rows - before.rows, self.skipped - before.skipped,
                          self.commits - before.commits)
        for b, n in self.latency.items():
            left = n - before.latency.get(b, 0)
            if left > 0:
                out.latency[b] = left
        return out

    def copy(self) -> TargetStats:
        return TargetStats(self.rows, self.skipped, self.commits, dict(self.latency))

    def percentile(self, q: float) -> float | None:
        """The latency (seconds) ``q`` (0-1) of the rows are at or under; ``None``
        without rows."""
        total = sum(self.latency.values())
        if total == 0:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for b in sorted(self.latency):
            seen += self.latency[b]
            if seen >= rank:
                return bucket_top(b)
        return bucket_top(max(self.latency))  # pragma: no cover - rank <= total

    def to_plain(self) -> dict[str, Any]:
        return {"rows": self.rows, "skipped": self.skipped, "commits": self.commits,
                "latency": dict(self.latency)}

    @classmethod
    def from_plain(cls, data: Mapping[str, Any]) -> TargetStats:
        return cls(int(data.get("rows", 0)), int(data.get("skipped", 0)),
                   int(data.get("commits", 0)),
                   {int(b): int(n) for b, n in dict(data.get("latency", {})).items()})


class RealtimeStats:
    """:class:`TargetStats` per target name (``""`` for a single sink)."""

    def __init__(self, targets: Mapping[str, TargetStats] | None = None) -> None:
        self.targets: dict[str, TargetStats] = dict(targets or {})

    def target(self, name: str) -> TargetStats:
        found = self.targets.get(name)
        if found is None:
            found = self.targets[name] = TargetStats()
        return found

    def add(self, other: RealtimeStats) -> None:
        for name, stats in other.targets.items():
            self.target(name).add(stats)

    def since(self, before: RealtimeStats | None) -> RealtimeStats:
        return RealtimeStats({name: stats.since(before.targets.get(name) if before else None)
                              for name, stats in self.targets.items()})

    def copy(self) -> RealtimeStats:
        return RealtimeStats({name: s.copy() for name, s in self.targets.items()})

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.targets.values())

    def to_plain(self) -> dict[str, dict[str, Any]]:
        """Plain dicts and ints (what travels in an accumulator)."""
        return {name: s.to_plain() for name, s in self.targets.items()}

    @classmethod
    def from_plain(cls, data: Mapping[str, Mapping[str, Any]] | None) -> RealtimeStats:
        return cls({str(n): TargetStats.from_plain(s) for n, s in (data or {}).items()})


def merge_plain(a: dict[str, dict[str, Any]],
                b: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``a`` plus ``b`` (both as :meth:`RealtimeStats.to_plain` makes them), into ``a``."""
    total = RealtimeStats.from_plain(a)
    total.add(RealtimeStats.from_plain(b))
    a.clear()
    a.update(total.to_plain())
    return a


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def stats_line(stats: RealtimeStats) -> str:
    """``events 1,204 row(s) in 40 commit(s) (visible p50 120 ms, p99 260 ms after
    reaching the writer)`` per target, ``; `` between targets; a single sink's without
    its name."""
    parts = []
    for name in sorted(stats.targets):
        s = stats.targets[name]
        text = f"{s.rows:,} row(s) in {s.commits:,} commit(s)"
        if s.rows:
            text += (f" (visible p50 {_seconds(s.percentile(0.5))}, "
                     f"p99 {_seconds(s.percentile(0.99))} after reaching the writer)")
        if s.skipped:
            text += f", {s.skipped:,} skipped (the target held them)"
        parts.append(f"{name} {text}" if name else text)
    return "; ".join(parts) if parts else "no rows"


__all__ = ["BUCKET_GROWTH", "RealtimeStats", "TargetStats", "bucket_of", "bucket_top",
           "merge_plain", "stats_line"]
