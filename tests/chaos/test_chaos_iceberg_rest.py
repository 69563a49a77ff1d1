"""Chaos on an Iceberg table behind Iceberg's own REST catalog server: a crash at every
protocol step (the driver SIGKILLed at each coordinator point, writers killed, a
speculative twin, the catalog's server restarted or SIGKILLed with a decided epoch,
another writer appending and compacting before txsink's commit, a catalog write
failing after it took effect), then 20 random faults. Every record exactly once, no
orphan data file, one snapshot per epoch. ``tox -e iceberg-rest``."""

from __future__ import annotations

import os

import pytest
from txsink.faults import POINTS

from tests.chaos.runner import EPOCHS, TASK_KINDS, kinds_of, run_backend, table
from tests.long_runs import iceberg_rest_run

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
FAULTS = int(os.environ.get("TXSINK_CHAOS_FAULTS", "20"))
BACKEND = "iceberg-rest"

pytestmark = [pytest.mark.fault, pytest.mark.slow, iceberg_rest_run]


def _check(report: object, capsys: pytest.CaptureFixture[str]) -> None:
    with capsys.disabled():
        print(f"\n{table([report], kinds_of(BACKEND))}")  # type: ignore[list-item]
    if report.skipped:  # type: ignore[attr-defined]
        pytest.skip(f"chaos on {BACKEND}: {report.skipped}")  # type: ignore[attr-defined]


def test_a_crash_at_every_protocol_step_behind_a_rest_catalog(
        capsys: pytest.CaptureFixture[str]) -> None:
    report = run_backend(BACKEND, faults=len(POINTS) + len(TASK_KINDS), seed=SEED,
                         every_point=True)
    _check(report, capsys)
    assert report.failures == []
    assert sorted(report.points) == sorted({*POINTS, *TASK_KINDS}), report.points
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0)
    assert report.records > 0
    assert report.faults["server-kill"] + report.faults["server-restart"] == 1
    lake_kinds = ("concurrent-append", "concurrent-compact", "commit-unknown")
    assert {k: report.faults[k] for k in lake_kinds} == dict.fromkeys(lake_kinds, 1)
    assert report.orphans == 0
    assert report.entries == report.epochs == EPOCHS


def test_random_chaos_behind_a_rest_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    report = run_backend(BACKEND, faults=FAULTS, seed=SEED)
    _check(report, capsys)
    assert report.failures == []
    assert sum(report.faults.values()) >= FAULTS
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0), (
        f"reproduce with: python -m tests.chaos --backends {BACKEND} --seed {SEED}")
    assert report.orphans == 0 and report.entries == report.epochs
    assert report.faults["server-kill"] + report.faults["server-restart"] >= 1
