"""Fast tiers first, and a line per tier with roughly how long is left.

Loaded by ``tests/conftest.py``. The run is ordered unit → integration → e2e → chaos →
cluster (the order inside a tier is kept, so module and session fixtures still group),
and when a tier starts the run prints what it starts and an estimate:

    == tier e2e: 41 tests, about 5 min; about 7 min left in the run

The estimate comes from ``tests/durations.json`` (seconds per test, measured; a test
not in it counts as its tier's median, a unit test as one second), scaled by how fast
this run has gone so far compared with the stored figures: a loaded machine gets a longer estimate.
``TXSINK_STORE_DURATIONS=path`` writes this run's durations there (refresh the file
with it after adding slow tests).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "chaos", "cluster")
DURATIONS = Path(__file__).with_name("durations.json")
STORE_ENV = "TXSINK_STORE_DURATIONS"


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "unit"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class Progress:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        try:
            self.stored: dict[str, float] = json.loads(DURATIONS.read_text())
        except (OSError, ValueError):
            self.stored = {}
        self.estimate: dict[str, float] = {}
        self.order: list[str] = []
        self.tier: str | None = None
        self.started = 0.0
        self.done_estimate = 0.0
        self.measured: dict[str, float] = {}

    def plan(self, items: list[pytest.Item]) -> None:
        by_tier: dict[str, list[float]] = {}
        for nodeid, seconds in self.stored.items():
            by_tier.setdefault(tier_of(nodeid), []).append(seconds)
        median = {t: statistics.median(v) for t, v in by_tier.items()}
        # The file lists the slow unit tests; any other unit test takes about a second.
        median["unit"] = 1.0
        self.order = [item.nodeid for item in items]
        self.estimate = {n: self.stored.get(n, median.get(tier_of(n), 1.0))
                         for n in self.order}

    def left(self, position: int) -> float:
        return sum(self.estimate.get(n, 0.0) for n in self.order[position:])

    def scale(self) -> float:
        """How much slower (> 1) or faster this run goes than the stored figures."""
        elapsed = time.monotonic() - self.started
        if self.done_estimate < 30 or elapsed < 30:
            return 1.0
        return max(0.25, min(8.0, elapsed / self.done_estimate))

    def start(self, item: pytest.Item) -> None:
        if not self.started:
            self.started = time.monotonic()
        tier = tier_of(item.nodeid)
        if tier == self.tier:
            return
        self.tier = tier
        try:
            position = self.order.index(item.nodeid)
        except ValueError:
            return
        ids = [n for n in self.order[position:] if tier_of(n) == tier]
        scale = self.scale()
        in_tier = sum(self.estimate[n] for n in ids) * scale
        left = self.left(position) * scale
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        reporter.ensure_newline()
        reporter.write_line(f"== tier {tier}: {len(ids)} tests, about {_minutes(in_tier)}; "
                            f"about {_minutes(left)} left in the run", bold=True)

    def finished(self, report: pytest.TestReport) -> None:
        self.measured[report.nodeid] = self.measured.get(report.nodeid, 0.0) + report.duration
        if report.when == "teardown":
            self.done_estimate += self.estimate.get(report.nodeid, 0.0)

    def store(self) -> None:
        path = os.environ.get(STORE_ENV)
        if path:
            Path(path).write_text(json.dumps(
                {k: round(v, 2) for k, v in sorted(self.measured.items())}, indent=0) + "\n")


_KEY = pytest.StashKey[Progress]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_KEY] = Progress(config)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: TIERS.index(tier_of(item.nodeid)))  # stable: order kept
    config.stash[_KEY].plan(items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    item.config.stash[_KEY].start(item)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    progress = _progress
    if progress is not None:
        progress.finished(report)


_progress: Progress | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _progress
    _progress = session.config.stash[_KEY]


def pytest_sessionfinish(session: pytest.Session) -> None:
    session.config.stash[_KEY].store()
