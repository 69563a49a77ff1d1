"""Session-wide reporting shared by every test directory."""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from hypothesis import settings

#: The default run's property and model-based tests draw the same sequences each run
#: (seeded from each test), so the run that gates a change fails only on what the change
#: broke, and a failure there reproduces on any clone. New sequences are explored by
#: ``tox -e operations-long`` and by any run with ``TXSINK_HYPOTHESIS=explore`` or an
#: examples count set (``TXSINK_OPERATIONS_EXAMPLES``, ``..._NATIVE_EXAMPLES``); each
#: failure found there becomes a regression test.
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
_EXPLORE = os.environ.get("TXSINK_HYPOTHESIS") == "explore" or any(
    os.environ.get(name) for name in ("TXSINK_OPERATIONS_EXAMPLES",
                                      "TXSINK_OPERATIONS_NATIVE_EXAMPLES"))
settings.load_profile("explore" if _EXPLORE else "repeatable")

#: Signals stop the run within seconds and nothing it started outlives it; fast tiers
#: run first, with a line per tier saying roughly how long is left.
pytest_plugins = ["tests.process_guard", "tests.tiers"]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test's report names the log of every local Kafka broker still up, with
    its last warnings: the broker's side of the story is usually there."""
    report = yield
    if not report.failed:
        return report
    local_broker = sys.modules.get("txsink_kafka.local_broker")
    for kafka in local_broker.started_brokers() if local_broker is not None else []:
        tail = kafka.log_tail()
        report.sections.append((
            f"Kafka broker log: {kafka.log_path}",
            f"{kafka.describe()}\n"
            + (f"last warnings and errors:\n{tail}" if tail else "no warnings or errors")))
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say once how exactly-once was checked when a Kafka broker does not filter
    read_committed itself (Tansu): the skips it used to cause are now log checks."""
    kafka_testing = sys.modules.get("txsink_kafka.testing")
    notes = kafka_testing.log_view_notes() if kafka_testing is not None else []
    for note in notes:
        terminalreporter.write_line(note)
    model = sys.modules.get("tests.operations_model")
    if model is not None and model.FIRED:
        terminalreporter.write_line("operations model, rules fired: " + ", ".join(
            f"{name} {count}" for name, count in sorted(model.FIRED.items())))


@pytest.fixture(scope="session")
def multi_group() -> Iterator[Any]:
    """Kafka, PostgreSQL, S3 and a files directory for the tests of a group of targets
    (the multi chaos run and the Spark end-to-end test share them: starting them costs
    more than either test's own work)."""
    from tests.chaos.multi import Group

    group = Group()
    if group.unavailable:
        pytest.skip(f"a server of the group cannot run here: {group.unavailable}")
    group.start()
    try:
        if group.unavailable:
            pytest.skip(f"a server of the group cannot run here: {group.unavailable}")
        yield group
    finally:
        group.stop()
