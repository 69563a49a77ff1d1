"""Chaos per backend. The default run keeps one crash at every protocol step of every
backend (one run each, :func:`tests.chaos.runner.plan_every_point`); the short mode,
at least 20 random faults per backend, runs in ``tox -e chaos`` (``TXSINK_CHAOS=1``).

The seed is fixed for CI (``TXSINK_CHAOS_SEED`` overrides it); the long mode is
``python -m tests.chaos --long``. The three-node Kafka cluster's failover chaos has
its own module (``test_chaos_kafka_cluster.py``).
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.runner import EPOCHS, TASK_KINDS, kinds_of, run_backend, table
from tests.chaos.targets import DEFAULT_TARGETS, TARGETS
from tests.long_runs import chaos_run

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
FAULTS = int(os.environ.get("TXSINK_CHAOS_FAULTS", "20"))


@pytest.mark.fault
@pytest.mark.parametrize("backend", sorted(DEFAULT_TARGETS))
def test_a_crash_at_every_protocol_step(backend: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The driver SIGKILLed at each coordinator point, a writer killed before and after
    its prepare, a speculative twin, and the server down with a decided epoch (a table
    format: another writer appending and compacting before our commit, and a log write
    failing after it took effect): then every record exactly once and nothing left
    prepared (a table: no orphan data file, one entry per epoch)."""
    report = run_backend(backend, faults=len(TARGETS[backend].points) + len(TASK_KINDS),
                         seed=SEED, every_point=True)
    with capsys.disabled():
        print(f"\n{table([report], kinds_of(backend))}")
    if report.skipped:
        pytest.skip(f"chaos on {backend}: {report.skipped}")
    assert report.failures == []
    assert report.runs == 1
    assert sorted(report.points) == sorted({*TARGETS[backend].points, *TASK_KINDS}), (
        report.points)
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0)
    assert report.records > 0
    if TARGETS[backend].can_restart:
        assert report.faults["server-kill"] + report.faults["server-restart"] == 1
    lake_kinds = getattr(TARGETS[backend], "lake_kinds", ())
    if lake_kinds:  # a table: its own faults fired, one entry per epoch, no orphan file
        assert {k: report.faults[k] for k in lake_kinds} == dict.fromkeys(lake_kinds, 1)
        assert report.orphans == 0
        assert report.entries == report.epochs == EPOCHS


@pytest.mark.fault
@pytest.mark.slow
@chaos_run
@pytest.mark.parametrize("backend", sorted(DEFAULT_TARGETS))
def test_chaos_short_mode(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_backend(backend, faults=FAULTS, seed=SEED)
    with capsys.disabled():
        print(f"\n{table([report], kinds_of(backend))}")
    if report.skipped:
        pytest.skip(f"chaos on {backend}: {report.skipped}")
    assert report.failures == []
    assert sum(report.faults.values()) >= FAULTS
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0), (
        f"reproduce with: python -m tests.chaos --backends {backend} --seed {SEED}")
    assert report.records > 0
    assert report.orphans == 0 and report.entries == report.epochs
    if TARGETS[backend].can_kill_server and not os.environ.get("TXSINK_KAFKA_BOOTSTRAP"):
        assert report.faults["server-kill"] >= 1  # SIGKILLed mid-protocol, at least once
