"""The Iceberg backend when the table's history is not one epoch after the other:
epochs committed out of order, a rollback, a table partitioned by another writer
while the pipeline runs. (A module after the conformance kit: its memory-bound test
measures this process's growth, which earlier tables' allocations shift.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from txsink.backend import CommitOutcome
from txsink.errors import ConfigError
from txsink_iceberg.backend import IcebergBackend

if TYPE_CHECKING:
    from pathlib import Path

from tests.integration.iceberg.test_iceberg_backend import backend, prepare
from tests.integration.iceberg.test_iceberg_conformance import read_table_ids

pytestmark = pytest.mark.integration
__all__ = ["backend"]  # the fixture


def test_epochs_committed_out_of_order_are_each_recognised(backend: IcebergBackend) -> None:
    """Two batch writes of one sink reserve epochs 0 and 1; 1 commits first, then 0.
    Epoch 1 must still be seen as in the table: a retried commit of it adds nothing
    (it added every row a second time), and ``holds_epoch`` / ``highest_epoch`` see it."""
    low = [prepare(backend, 0, p, range(p * 10, p * 10 + 10)) for p in range(2)]
    high = [prepare(backend, 1, p, range(100 + p * 10, 110 + p * 10)) for p in range(2)]
    assert backend.commit_all(high) == [CommitOutcome.COMMITTED] * 2
    assert backend.commit_all(low) == [CommitOutcome.COMMITTED] * 2
    again = IcebergBackend(backend.table, backend.warehouse, backend.catalog_uri)
    assert again.holds_epoch("orders", 1) and again.holds_epoch("orders", 0)
    assert again.highest_epoch("orders") == 1
    again.epoch_committed("orders", 1, high)  # the table names it: no error
    assert again.commit_all(high) == [CommitOutcome.ALREADY_COMMITTED] * 2
    assert again.commit_all(low) == [CommitOutcome.ALREADY_COMMITTED] * 2
    assert sorted(read_table_ids(backend)) == [*range(20), *range(100, 120)]


@pytest.mark.promise("iceberg-partitioned-refused", "backend")
def test_a_table_partitioned_since_the_start_is_refused_before_the_decision(
        backend: IcebergBackend) -> None:
    """Another writer partitions the table while the pipeline runs: add_files refused
    the epoch's files at commit, after the decision (the epoch stuck DECIDED, a group's
    other targets holding it). Refused before the decision instead."""
    assert backend.commit_all([prepare(backend, 0, 0, range(2))]) == [CommitOutcome.COMMITTED]
    with backend._load().update_spec() as spec:
        spec.add_identity("id")
    with pytest.raises(ConfigError, match="partitioned now") as refused:
        backend.check_prepared([prepare(backend, 1, 0, range(2, 4))])
    assert refused.value.field == "table"
    assert sorted(read_table_ids(backend)) == [0, 1]


def test_a_rollback_takes_epochs_out_of_the_highest_the_next_commit_records(
        backend: IcebergBackend) -> None:
    """Epoch 2 commits before epoch 1 (two batch writes); the owner rolls the table back
    to epoch 0's snapshot; epoch 1, still decided, is committed then. The table holds
    0 and 1: its highest epoch is 1, not the rolled-back 2 (the cut would name 2)."""
    assert backend.commit_all([prepare(backend, 0, 0, range(2))]) == [CommitOutcome.COMMITTED]
    first = backend._load().current_snapshot().snapshot_id
    one = [prepare(backend, 1, 0, range(10, 12))]
    assert backend.commit_all([prepare(backend, 2, 0, range(20, 22))]) == [
        CommitOutcome.COMMITTED]
    backend._load().manage_snapshots().rollback_to_snapshot(first).commit()
    assert backend.highest_epoch("orders") == 0
    assert backend.commit_all(one) == [CommitOutcome.COMMITTED]
    assert backend.highest_epoch("orders") == 1
    assert not backend.holds_epoch("orders", 2) and backend.holds_epoch("orders", 1)
    assert sorted(read_table_ids(backend)) == [0, 1, 10, 11]


@pytest.mark.promise("iceberg-rollback-stops", "backend")
def test_a_rollback_past_committed_epochs_stops_the_pipeline_naming_it(
        backend: IcebergBackend, tmp_path: Path) -> None:
    """A rollback past epochs the sink committed takes their rows out for good if the
    pipeline goes on: it stops before the next decision and at its next start, naming
    the rollback; setting the current snapshot back lets it go on, exactly once."""
    from txsink.coordinator import Coordinator, EpochOutcome
    from txsink.errors import TxsinkError
    from txsink.plugins import build_plugins
    from txsink.state import DirectoryStateStore

    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "orders",
                        plugins=build_plugins())
    coord.start()
    for epoch in range(3):
        assert coord.commit_epoch(epoch, [prepare(backend, epoch, 0, range(
            epoch * 10, epoch * 10 + 2))]) is EpochOutcome.COMMITTED
    newest = backend._load().current_snapshot().snapshot_id
    first = backend._load().snapshots()[0].snapshot_id
    backend._load().manage_snapshots().rollback_to_snapshot(first).commit()
    with pytest.raises(TxsinkError, match="rolled back past epochs") as refused:
        coord.commit_epoch(3, [prepare(backend, 3, 0, range(30, 32))])
    assert "set_current_snapshot" in str(refused.value)
    assert sorted(read_table_ids(backend)) == [0, 1]
    with pytest.raises(TxsinkError, match="rolled back past epochs"):
        backend.preflight("orders")
    backend._load().manage_snapshots().set_current_snapshot(newest).commit()
    backend.preflight("orders")
    assert coord.commit_epoch(3, [prepare(backend, 3, 0, range(30, 32))]) is (
        EpochOutcome.COMMITTED)
    assert sorted(read_table_ids(backend)) == [0, 1, 10, 11, 20, 21, 30, 31]

