"""The test run's "about N min left" follows the pace of the machine it runs on.

Before: the estimate was scaled by the pace of the whole run so far. The unit tier's
hundreds of fast tests (counted at a second each, taking a tenth) kept that pace low
long after, so a loaded machine was told "2 min left" with 3.5 minutes to go. Driven
here by made-up reports on a made-up clock: no test is run.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests import tiers

UNIT = [f"tests/unit/test_u.py::t{i}" for i in range(600)]
E2E = [f"tests/e2e/test_e.py::t{i}" for i in range(10)]
STORED_E2E_S = 60.0


class _Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def ensure_newline(self) -> None:
        pass

    def write_line(self, text: str, **_: Any) -> None:
        self.lines.append(text)


class _Config:
    def __init__(self, reporter: _Reporter) -> None:
        self.pluginmanager = self
        self.reporter = reporter

    def get_plugin(self, name: str) -> _Reporter:
        assert name == "terminalreporter"
        return self.reporter


class _Report:
    def __init__(self, nodeid: str, when: str, duration: float) -> None:
        self.nodeid, self.when, self.duration = nodeid, when, duration


def _seconds(text: str) -> float:
    value, unit = re.search(r"about (\d+) (min|s) left", text).groups()  # type: ignore[union-attr]
    return float(value) * (60 if unit == "min" else 1)


@pytest.mark.parametrize("load", [1.0, 3.0, 0.5])
def test_the_time_left_follows_the_pace_of_the_last_minutes(
        monkeypatch: pytest.MonkeyPatch, load: float) -> None:
    """600 unit tests not in durations.json (a second each by the file, 0.1 s here), then
    ten e2e tests stored at 60 s that take ``load`` times that here."""
    now = [1000.0]
    monkeypatch.setattr(tiers.time, "monotonic", lambda: now[0])
    reporter = _Reporter()
    progress = tiers.Progress(_Config(reporter))  # type: ignore[arg-type]
    progress.stored = {n: STORED_E2E_S for n in E2E}
    progress.plan(UNIT + E2E)

    def finish(nodeid: str, took: float) -> None:
        progress.report(_Report(nodeid, "setup", 0.0))  # type: ignore[arg-type]
        now[0] += took
        progress.report(_Report(nodeid, "call", took))  # type: ignore[arg-type]
        progress.report(_Report(nodeid, "teardown", 0.0))  # type: ignore[arg-type]

    for nodeid in UNIT:
        finish(nodeid, 0.1)
    for done, nodeid in enumerate(E2E, 1):
        finish(nodeid, STORED_E2E_S * load)
        if done == 6:
            break
    reporter.lines.clear()
    now[0] += tiers.EVERY_S  # the next report prints a line
    progress.report(_Report(E2E[6], "setup", 0.0))  # type: ignore[arg-type]
    assert reporter.lines, "no progress line"
    truth = 4 * STORED_E2E_S * load
    said = _seconds(reporter.lines[-1])
    assert 0.7 * truth <= said <= 1.3 * truth, (reporter.lines[-1], truth)


def test_a_new_test_counts_as_its_tiers_tests_that_ran_not_the_skipped_ones() -> None:
    """The default run skips most Spark tests, stored at about 0 s: their median made a
    new e2e test count as 0 s ("tier e2e: 2 tests, about 0 s")."""
    progress = tiers.Progress(_Config(_Reporter()))  # type: ignore[arg-type]
    progress.stored = {**{f"tests/e2e/test_long.py::t{i}": 0.0 for i in range(9)},
                       "tests/e2e/test_a.py::t": 20.0, "tests/e2e/test_b.py::t": 40.0}
    progress.plan(["tests/e2e/test_new.py::t"])
    assert progress.estimate == {"tests/e2e/test_new.py::t": 30.0}
