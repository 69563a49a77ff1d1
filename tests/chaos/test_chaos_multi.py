"""Chaos short mode for a group of targets (Kafka, PostgreSQL, S3, files): zero loss,
zero duplicates, nothing left prepared, and no target ever shows an undecided epoch.

The seed is fixed for CI (``TXSINK_CHAOS_SEED`` overrides it, ``TXSINK_CHAOS_MULTI_FAULTS``
the number of faults); the long mode is ``tox -e chaos-multi-long``
(``python -m tests.chaos.multi --long``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.chaos.multi import run_multi
from tests.long_runs import chaos_run

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
FAULTS = int(os.environ.get("TXSINK_CHAOS_MULTI_FAULTS", "8"))


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.integration
@chaos_run
def test_chaos_multi_short_mode(multi_group: Any, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_multi(faults=FAULTS, seed=SEED, group=multi_group)
    with capsys.disabled():
        print(f"\n{report.table()}")
    if report.skipped:
        pytest.skip(f"multi chaos: {report.skipped}")
    assert report.failures == [], (
        f"reproduce with: python -m tests.chaos.multi --seed {SEED} --faults {FAULTS}")
    assert sum(report.faults.values()) >= FAULTS
    assert report.samples > 0
    for t in report.targets.values():
        assert (t.lost, t.duplicated, t.leftovers, t.undecided_visible) == (0, 0, 0, 0), t
        assert t.records > 0 and t.epochs_checked == report.epochs
