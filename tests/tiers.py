"""Fast tiers first, and lines saying what the run is doing and roughly how long is left.

Loaded by ``tests/conftest.py``. The run is ordered unit → integration → e2e → chaos →
cluster (the order inside a tier is kept, so module and session fixtures still group;
with ``-n`` the files are handed to the workers in that order). When a tier's first
test reports, and then every :data:`EVERY_S` seconds, the run prints a line:

    == tier e2e: 41 tests, about 5 min; about 7 min left in the run

The estimate comes from ``tests/durations.json`` (seconds per test, measured in a
run without ``-n``; a test not in it counts as its tier's median, a unit test as one
second), scaled by the pace of the last few minutes of this run (wall seconds per
stored second of the tests that finished in them): a loaded machine gets a longer
estimate, two workers a shorter one, and the estimate follows load that comes or goes.
The pace of the whole run so far would not: the unit tier's fast tests, counted at a
second each, kept it low long after, and the run said "2 min left" with 3.5 to go.
``TXSINK_STORE_DURATIONS=path`` writes this run's durations there (refresh the file
with it, from a run with ``-n 0``, after adding slow tests).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import deque
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "e2e", "chaos", "cluster")
DURATIONS = Path(__file__).with_name("durations.json")
STORE_ENV = "TXSINK_STORE_DURATIONS"
#: Seconds between two progress lines inside a long tier.
EVERY_S = 120.0
#: The pace is measured over the tests that finished in about this many last seconds.
WINDOW_S = 240.0
#: Stored seconds a pace needs behind it before it is trusted.
MIN_MEASURED_S = 30.0


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
        #: (wall time, ``done_estimate``) when tests finished, over the last WINDOW_S.
        self.finished_at: deque[tuple[float, float]] = deque()
        #: What the finished tests the file does not list took, per tier.
        self.guessed_took: dict[str, list[float]] = {}

    def plan(self, nodeids: list[str]) -> None:
        by_tier: dict[str, list[float]] = {}
        for nodeid, seconds in self.stored.items():
            # Tests the default run skips are stored at about 0 s: a new test runs.
            if seconds >= 0.1:
                by_tier.setdefault(tier_of(nodeid), []).append(seconds)
        median = {t: statistics.median(v) for t, v in by_tier.items()}
        # The file lists the slow unit tests; any other unit test takes about a second.
        median["unit"] = 1.0
        self.estimate = {n: self.stored.get(n, median.get(tier_of(n), 1.0))
                         for n in nodeids}

    def scale(self, now: float) -> float:
        """Wall seconds per stored second, over the tests that finished in the last
        :data:`WINDOW_S` (the whole run while that is too little to go by): > 1 on a
        loaded machine, < 1 with workers side by side."""
        if self.finished_at:
            last, done = self.finished_at[-1]
            since, done_then = self.finished_at[0]
            if done - done_then >= MIN_MEASURED_S and last - since >= MIN_MEASURED_S:
                return max(0.1, min(8.0, (last - since) / (done - done_then)))
        elapsed = now - self.started
        if self.done_estimate < 30 or elapsed < 30:
            return 1.0
        return max(0.1, min(8.0, elapsed / self.done_estimate))

    def _finished(self, now: float) -> None:
        """Remember when the run got this far; forget what left the window (the newest
        sample before it stays, as the window's start)."""
        if not self.finished_at:
            self.finished_at.append((self.started, 0.0))
        self.finished_at.append((now, self.done_estimate))
        while len(self.finished_at) > 2 and self.finished_at[1][0] <= now - WINDOW_S:
            self.finished_at.popleft()

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
            if nodeid in self.estimate and nodeid not in self.stored:
                # A guess (a second, the tier's median) is often off by ten times: what
                # the test took counts instead, and tells the guess for its tier's others.
                took = self.measured[nodeid]
                self.guessed_took.setdefault(tier_of(nodeid), []).append(took)
                self.done_estimate += took
            else:
                self.done_estimate += self.estimate.get(nodeid, 0.0)
            self._finished(now)
        if nodeid not in self.estimate:
            return
        tier = tier_of(nodeid)
        if tier not in self.announced or now - self.last_line >= EVERY_S:
            self._report_line(tier, now)

    def _still(self, tier: str | None = None) -> float:
        """Stored seconds of the tests not finished yet (of ``tier``, or all); a test the
        file does not list counts as what those of its tier took so far (their median,
        once there are enough), else as its guess."""
        guess = {t: statistics.median(v) for t, v in self.guessed_took.items() if len(v) >= 20}
        return sum(guess.get(tier_of(n), s) if n not in self.stored else s
                   for n, s in self.estimate.items()
                   if n not in self.finished_ids and (tier is None or tier_of(n) == tier))

    def _report_line(self, tier: str, now: float) -> None:
        scale = self.scale(now)
        left = self._still() * scale
        if tier not in self.announced:
            self.announced.add(tier)
            ids = [n for n in self.estimate if tier_of(n) == tier
                   and n not in self.finished_ids]
            in_tier = self._still(tier) * scale
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
