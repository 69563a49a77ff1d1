"""Chaos short mode: at least 20 random faults per backend, zero loss, zero duplicates.

The seed is fixed for CI (``TXSINK_CHAOS_SEED`` overrides it); the long mode is
``python -m tests.chaos --long``. The three-node Kafka cluster's failover chaos has
its own module (``test_chaos_kafka_cluster.py``).
"""

from __future__ import annotations

import os

import pytest

from tests.chaos.runner import run_backend, table
from tests.chaos.targets import DEFAULT_TARGETS, TARGETS

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
FAULTS = int(os.environ.get("TXSINK_CHAOS_FAULTS", "20"))


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.parametrize("backend", sorted(DEFAULT_TARGETS))
def test_chaos_short_mode(backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_backend(backend, faults=FAULTS, seed=SEED)
    with capsys.disabled():
        print(f"\n{table([report])}")
    if report.skipped:
        pytest.skip(f"chaos on {backend}: {report.skipped}")
    assert report.failures == []
    assert sum(report.faults.values()) >= FAULTS
    assert (report.lost, report.duplicated, report.leftovers) == (0, 0, 0), (
        f"reproduce with: python -m tests.chaos --backends {backend} --seed {SEED}")
    assert report.records > 0
    if TARGETS[backend].can_kill_server and not os.environ.get("TXSINK_KAFKA_BOOTSTRAP"):
        assert report.faults["server-kill"] >= 1  # SIGKILLed mid-protocol, at least once
