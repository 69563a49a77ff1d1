"""Bounds follow the load (tests/timeouts.py): at load average 25-30 on 2 cores, four
e2e tests failed on a fixed 240-second driver bound that they meet alone."""

from __future__ import annotations

import os

import pytest

from tests import timeouts


def test_an_idle_machine_keeps_the_measured_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert timeouts.scaled(240) == 240


def test_a_loaded_machine_stretches_it_within_a_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))
    assert timeouts.scaled(240) == 960
    monkeypatch.setattr(os, "getloadavg", lambda: (90.0, 9.0, 9.0))
    assert timeouts.scaled(240) == 240 * timeouts.MAX_FACTOR
