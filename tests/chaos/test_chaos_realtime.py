"""Chaos short mode for Spark Real-time Mode: driver and executor kills, broker and
database restarts while records are appended; zero lost, zero duplicated.

Each fault waits for the query to move on (a driver restart is a JVM start), so even
the short mode takes minutes: it runs in ``tox -e chaos-realtime``; the long mode
(100 faults per target) is ``tox -e chaos-realtime-long``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.realtime import KINDS, SHORT, run_target
from tests.long_runs import long_run

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))


@long_run
@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.integration
@pytest.mark.parametrize("target", sorted(KINDS))
def test_chaos_realtime_short(target: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    report = run_target(target, SHORT, SEED, tmp_path)
    with capsys.disabled():
        print(f"\n{report.line()}")
    assert report.failures == []
    assert sum(report.faults.values()) == SHORT
    assert report.appended > 0 and report.visible == report.appended
    assert (report.lost, report.duplicated) == (0, 0), (
        f"reproduce with: python -m tests.chaos.realtime --targets {target} --seed {SEED}")
