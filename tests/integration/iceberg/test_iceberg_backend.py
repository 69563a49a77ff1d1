"""What the Iceberg backend promises beyond the conformance kit: one snapshot per epoch
marked in its summary, a commit whose outcome was unknown never adds files twice, and
another writer's snapshots in between are neither lost nor fatal."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import ConfigError
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_iceberg.backend import IcebergBackend

from tests.integration.iceberg.test_iceberg_conformance import read_table_ids

pytestmark = pytest.mark.integration


@pytest.fixture
def backend(tmp_path: Path) -> IcebergBackend:
    b = get_plugins().create_backend(
        "iceberg", {"warehouse": str(tmp_path / "wh"), "table": "db.orders"})
    assert isinstance(b, IcebergBackend)
    b.preflight("orders")
    return b


def prepare(backend: IcebergBackend, epoch: int, partition: int, ids: range,
            attempt: int = 0) -> Committable:
    rows = pa.record_batch({"id": pa.array(list(ids), pa.int64()),
                            "at": pa.array(list(ids), pa.timestamp("us", tz="UTC"))})
    return write_participant(backend, TransactionContext("orders", epoch, partition, attempt),
                             [rows] if len(ids) else [])


def summaries(backend: IcebergBackend) -> list[dict[str, str]]:
    table = backend._load()
    return [dict(s.summary.additional_properties) for s in table.snapshots()]


def test_an_epoch_of_many_participants_is_one_snapshot_marked_in_its_summary(
        backend: IcebergBackend, tmp_path: Path) -> None:
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "orders",
                        plugins=build_plugins())
    coord.start()
    for epoch in range(3):
        msgs = [prepare(backend, epoch, p, range(epoch * 1000 + p * 100,
                                                 epoch * 1000 + p * 100 + 100))
                for p in range(8)]
        assert coord.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
    marked = [s for s in summaries(backend) if s.get("txsink.sink") == "orders"]
    assert [s["txsink.epoch"] for s in marked] == ["0", "1", "2"]
    assert len(summaries(backend)) == 3
    assert sorted(read_table_ids(backend)) == sorted(
        e * 1000 + i for e in range(3) for i in range(800))
    assert backend.highest_epoch("orders") == 2
    assert backend.holds_epoch("orders", 1) and not backend.holds_epoch("orders", 3)


def test_a_commit_whose_outcome_was_unknown_is_not_added_twice(
        backend: IcebergBackend) -> None:
    msgs = [prepare(backend, 0, p, range(p * 10, p * 10 + 10)) for p in range(3)]
    assert backend.commit_all(msgs) == [CommitOutcome.COMMITTED] * 3
    again = IcebergBackend(backend.table, backend.warehouse)  # another process's view
    assert again.commit_all(msgs) == [CommitOutcome.ALREADY_COMMITTED] * 3
    assert len(summaries(backend)) == 1
    assert sorted(read_table_ids(backend)) == list(range(30))


def test_another_writer_in_between_is_kept_and_the_epoch_commits(
        backend: IcebergBackend) -> None:
    backend.commit(prepare(backend, 0, 0, range(10)))
    c = prepare(backend, 1, 0, range(10, 20))
    other = backend._load()  # another pipeline appends between prepare and commit
    other.append(pa.table({"id": pa.array([-1], pa.int64()),
                           "at": pa.array([0], pa.timestamp("us", tz="UTC"))}))
    assert backend.commit(c) is CommitOutcome.COMMITTED
    assert sorted(read_table_ids(backend)) == [-1, *range(20)]
    assert backend.highest_epoch("orders") == 1


def test_an_empty_epoch_still_makes_its_marked_snapshot(backend: IcebergBackend) -> None:
    backend.commit(prepare(backend, 0, 0, range(5)))
    assert backend.commit(prepare(backend, 1, 0, range(0))) is CommitOutcome.COMMITTED
    assert backend.holds_epoch("orders", 1)
    assert sorted(read_table_ids(backend)) == list(range(5))


def test_bad_options_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'table'"):
        IcebergBackend.from_options({"warehouse": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"namespace\.name"):
        IcebergBackend.from_options({"warehouse": str(tmp_path), "table": "orders"})
    with pytest.raises(ConfigError, match="local directory or s3://"):
        IcebergBackend.from_options({"warehouse": "gs://bucket/w", "table": "db.t"})
    secret = "postgresql+psycopg://u:hunter2@127.0.0.1/db"
    with pytest.raises(ConfigError) as err:
        IcebergBackend.from_options({"warehouse": str(tmp_path), "table": "db.t",
                                     "catalog_uri": secret, "bogus": "1"})
    assert "hunter2" not in str(err.value)


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
