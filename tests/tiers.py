"""Fast tiers first, and lines saying what the run is doing and roughly how long is left.

Loaded by ``tests/conftest.py``. The run is ordered unit → integration → e2e → chaos →
cluster (the order inside a tier is kept, so module and session fixtures still group;
with ``-n`` the files are handed to the workers in that order). When a tier's first
test reports, and then every :data:`EVERY_S` seconds, the run prints a line:

    == tier e2e: 41 tests, about 5 min; about 7 min left in the run

The estimate comes from ``tests/durations.json`` (seconds per test, measured in a
run without ``-n``; a test not in it counts as its tier's median, a unit test as one
second), scaled by how fast this run has gone so far compared with the stored figures:
a loaded machine gets a longer estimate, two workers a shorter one.
``TXSINK_STORE_DURATIONS=path`` writes this run's durations there (refresh the file
with it, from a run with ``-n 0``, after adding slow tests).
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
#: Seconds between two progress lines inside a long tier.
EVERY_S = 120.0


def tier_of(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "unit"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class Progress:
    """Driven by test reports only, so it works the same in a plain run and in the
    controller of an ``-n`` run (where no test runs in this process)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        try:
            self.stored: dict[str, float] = json.loads(DURATIONS.read_text())
        except (OSError, ValueError):
            self.stored = {}
        self.estimate: dict[str, float] = {}
        self.started = 0.0
        self.last_line = 0.0
        self.announced: set[str] = set()
        self.finished_ids: set[str] = set()
        self.done_estimate = 0.0
        self.measured: dict[str, float] = {}

    def plan(self, nodeids: list[str]) -> None:
        by_tier: dict[str, list[float]] = {}
        for nodeid, seconds in self.stored.items():
            by_tier.setdefault(tier_of(nodeid), []).append(seconds)
        median = {t: statistics.median(v) for t, v in by_tier.items()}
        # The file lists the slow unit tests; any other unit test takes about a second.
        median["unit"] = 1.0
        self.estimate = {n: self.stored.get(n, median.get(tier_of(n), 1.0))
                         for n in nodeids}

    def scale(self, now: float) -> float:
        """Wall seconds per stored second so far: > 1 on a loaded machine, < 1 with
        workers side by side."""
        elapsed = now - self.started
        if self.done_estimate < 30 or elapsed < 30:
            return 1.0
        return max(0.1, min(8.0, elapsed / self.done_estimate))

    def _line(self, text: str, now: float) -> None:
        self.last_line = now
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        reporter.ensure_newline()
        reporter.write_line(text, bold=True)

    def report(self, report: pytest.TestReport) -> None:
        now = time.monotonic()
        if not self.started:
            self.started = self.last_line = now
        nodeid = report.nodeid
        self.measured[nodeid] = self.measured.get(nodeid, 0.0) + report.duration
        if report.when == "teardown" and nodeid not in self.finished_ids:
            self.finished_ids.add(nodeid)
            self.done_estimate += self.estimate.get(nodeid, 0.0)
        if nodeid not in self.estimate:
            return
        tier = tier_of(nodeid)
        scale = self.scale(now)
        left = sum(s for n, s in self.estimate.items() if n not in self.finished_ids) * scale
        if tier not in self.announced:
            self.announced.add(tier)
            ids = [n for n in self.estimate if tier_of(n) == tier
                   and n not in self.finished_ids]
            in_tier = sum(self.estimate[n] for n in ids) * scale
            self._line(f"== tier {tier}: {len(ids)} tests, about {_minutes(in_tier)}; "
                       f"about {_minutes(left)} left in the run", now)
        elif now - self.last_line >= EVERY_S:
            self._line(f"== {len(self.finished_ids)} of {len(self.estimate)} tests done, "
                       f"tier {tier}; about {_minutes(left)} left in the run", now)

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
    config.stash[_KEY].plan([item.nodeid for item in items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """The controller of an ``-n`` run collects nothing itself: the workers' list."""
    progress = _progress
    if progress is not None and not progress.estimate:
        progress.plan(list(ids))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    progress = _progress
    if progress is not None:
        progress.report(report)


_progress: Progress | None = None


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    global _progress
    # An ``-n`` worker's reports reach the controller, which prints and stores.
    if not hasattr(session.config, "workerinput"):
        _progress = session.config.stash[_KEY]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _progress is not None:
        _progress.store()
