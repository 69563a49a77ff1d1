"""Chaos short mode for groups of targets (Kafka, PostgreSQL, S3, files; Kafka,
PostgreSQL, a Delta table, an Iceberg table): zero loss, zero duplicates, nothing left
prepared, no target ever shows an undecided epoch, and a table holds no orphan data
file and one entry per epoch.

The seed is fixed for CI (``TXSINK_CHAOS_SEED`` overrides it, ``TXSINK_CHAOS_MULTI_FAULTS``
the number of faults per group); the long mode is ``tox -e chaos-multi-long``
(``python -m tests.chaos.multi --long``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chaos.multi import DEFAULT_GROUP, GROUPS, Group, run_multi
from tests.long_runs import chaos_run

SEED = int(os.environ.get("TXSINK_CHAOS_SEED", "2026"))
FAULTS = int(os.environ.get("TXSINK_CHAOS_MULTI_FAULTS", "8"))


@pytest.fixture
def group(request: pytest.FixtureRequest, multi_group: Any) -> Iterator[Group]:
    """The session's group (tests/conftest.py), or a group sharing its Kafka and
    PostgreSQL with its own tables."""
    if request.param == DEFAULT_GROUP:
        yield multi_group
        return
    other = Group(request.param, share=multi_group)
    other.start()
    try:
        yield other
    finally:
        other.stop()


@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.integration
@chaos_run
@pytest.mark.parametrize("group", sorted(GROUPS), indirect=True)
def test_chaos_multi_short_mode(group: Group, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_multi(faults=FAULTS, seed=SEED, group=group)
    with capsys.disabled():
        print(f"\n{report.table()}")
    if report.skipped:
        pytest.skip(f"multi chaos: {report.skipped}")
    assert report.failures == [], (
        f"reproduce with: python -m tests.chaos.multi --groups {group.name} --seed {SEED} "
        f"--faults {FAULTS}")
    assert sum(report.faults.values()) >= FAULTS
    assert report.samples > 0
    for t in report.targets.values():
        assert (t.lost, t.duplicated, t.leftovers, t.undecided_visible) == (0, 0, 0, 0), t
        assert t.records > 0 and t.epochs_checked == report.epochs
        if t.backend in ("delta", "iceberg"):
            assert t.orphans == 0 and t.entries == report.epochs, t
