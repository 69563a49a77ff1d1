"""Session-wide reporting shared by every test directory."""

from __future__ import annotations

import sys

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Say once how exactly-once was checked when a Kafka broker does not filter
    read_committed itself (Tansu): the skips it used to cause are now log checks."""
    kafka_testing = sys.modules.get("txsink_kafka.testing")
    notes = kafka_testing.log_view_notes() if kafka_testing is not None else []
    for note in notes:
        terminalreporter.write_line(note)
