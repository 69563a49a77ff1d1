"""What the Delta backend promises beyond the conformance kit: one log entry per epoch
with Delta's own txn record, a commit whose outcome was unknown never adds files twice,
and another writer's commits in between are neither lost nor fatal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.coordinator import EpochOutcome
from txsink.errors import ConfigError
from txsink.model import TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend

from tests.lake_tables import coordinator, delta_log, table_ids

pytestmark = pytest.mark.integration


def batch(ids: range) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(list(ids), pa.int64())})


def txn_actions(path: Path) -> list[dict[str, object]]:
    return [json.loads(line)["txn"] for name in sorted(os.listdir(path / "_delta_log"))
            if name.endswith(".json")
            for line in (path / "_delta_log" / name).read_text().splitlines()
            if "txn" in json.loads(line)]


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return tmp_path / "table"


@pytest.fixture
def backend(table: Path) -> DeltaBackend:
    b = get_plugins().create_backend("delta", {"path": str(table)})
    assert isinstance(b, DeltaBackend)
    return b


def prepare(backend: DeltaBackend, epoch: int, partition: int, ids: range, attempt: int = 0):
    return write_participant(backend, TransactionContext("orders", epoch, partition, attempt),
                             [batch(ids)])


def test_an_epoch_of_many_participants_is_one_log_entry_with_the_txn(
        backend: DeltaBackend, table: Path, tmp_path: Path) -> None:
    coord = coordinator(backend, tmp_path / "state", "orders")
    for epoch in range(3):
        msgs = [prepare(backend, epoch, p, range(epoch * 1000 + p * 100,
                                                 epoch * 1000 + p * 100 + 100))
                for p in range(8)]
        assert coord.commit_epoch(epoch, msgs) is EpochOutcome.COMMITTED
    entries = [e for e in delta_log(table) if e.get("txsink.sink") == "orders"]
    assert [e["txsink.epoch"] for e in entries] == ["0", "1", "2"]
    assert [t["version"] for t in txn_actions(table)] == [0, 1, 2]
    assert {t["appId"] for t in txn_actions(table)} == {"txsink:orders"}
    assert table_ids(DeltaBackend(str(table))) == sorted(
        e * 1000 + i for e in range(3) for i in range(800))
    assert backend.highest_epoch("orders") == 2
    assert backend.holds_epoch("orders", 1) and not backend.holds_epoch("orders", 3)


@pytest.mark.promise("delta-commit-never-twice", "backend")
def test_a_commit_whose_outcome_was_unknown_is_not_added_twice(
        backend: DeltaBackend, table: Path) -> None:
    """The first commit landed but its caller saw an error (a timeout after success):
    committing the same participants again reads the log and adds nothing."""
    msgs = [prepare(backend, 0, p, range(p * 10, p * 10 + 10)) for p in range(3)]
    assert backend.commit_all(msgs) == [CommitOutcome.COMMITTED] * 3
    before = len(delta_log(table))
    again = DeltaBackend.from_options({"path": str(table)})  # another process's view
    assert again.commit_all(msgs) == [CommitOutcome.ALREADY_COMMITTED] * 3
    assert len(delta_log(table)) == before
    assert table_ids(DeltaBackend(str(table))) == list(range(30))


def test_another_writer_in_between_is_kept_and_the_epoch_commits(
        backend: DeltaBackend, table: Path) -> None:
    from deltalake import write_deltalake

    prepare_first = prepare(backend, 0, 0, range(10))
    backend.commit(prepare_first)
    c = prepare(backend, 1, 0, range(10, 20))
    # A compaction job or another pipeline appends between prepare and commit.
    write_deltalake(str(table), pa.table({"id": pa.array([-1], pa.int64())}), mode="append")
    assert backend.commit(c) is CommitOutcome.COMMITTED
    assert table_ids(DeltaBackend(str(table))) == [-1, *range(20)]
    assert backend.highest_epoch("orders") == 1


def test_orphans_and_second_attempts_are_deleted_committed_files_never(
        backend: DeltaBackend, table: Path) -> None:
    winner = prepare(backend, 0, 0, range(10), attempt=1)
    loser = prepare(backend, 0, 0, range(10), attempt=0)
    backend.commit_all([winner])
    backend.epoch_committed("orders", 0, [winner])
    # A restarted Spark reuses the winner's attempt number: a second directory.
    twin = prepare(backend, 0, 0, range(10), attempt=1)
    assert twin.payload["dir"] != winner.payload["dir"]
    assert {c.participant for c in backend.list_prepared("orders")} == {loser.participant}
    assert [c.participant for c in backend.abort_orphans("orders", set())] == [
        loser.participant]
    epoch_dir = table / "txsink" / "orders" / "e0000000000"
    assert sorted(p.name for p in epoch_dir.iterdir()) == sorted(
        ["_committed.json", winner.payload["dir"]])
    assert table_ids(DeltaBackend(str(table))) == list(range(10))


def test_bad_options_are_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'path'"):
        DeltaBackend.from_options({})
    with pytest.raises(ConfigError, match="local directory or s3://"):
        DeltaBackend.from_options({"path": "gs://bucket/t"})
    with pytest.raises(ConfigError, match="pathh"):
        DeltaBackend.from_options({"path": str(tmp_path), "pathh": "x"})
    with pytest.raises(ConfigError, match="create=false"):
        DeltaBackend.from_options({"path": str(tmp_path / "t"), "create": "false"}
                                  ).preflight("orders")


def test_epochs_committed_out_of_order_are_each_recognised(
        backend: DeltaBackend, table: Path) -> None:
    """Two batch writes of one sink reserve epochs 0 and 1 (concurrent writers, or
    nested ``epoch()`` blocks); 1 commits first, then 0. Epoch 1 must still be seen as
    in the table: a commit of it whose outcome was unknown, retried after 0 landed,
    adds nothing (it added every row a second time), and ``holds_epoch`` /
    ``highest_epoch`` (the cut, stream numbering) still see it."""
    low = [prepare(backend, 0, p, range(p * 10, p * 10 + 10)) for p in range(2)]
    high = [prepare(backend, 1, p, range(100 + p * 10, 110 + p * 10)) for p in range(2)]
    assert backend.commit_all(high) == [CommitOutcome.COMMITTED] * 2
    assert backend.commit_all(low) == [CommitOutcome.COMMITTED] * 2
    again = DeltaBackend.from_options({"path": str(table)})  # the retry, after a restart
    assert again.holds_epoch("orders", 1) and again.holds_epoch("orders", 0)
    assert again.highest_epoch("orders") == 1
    again.epoch_committed("orders", 1, high)  # the table names it: no error
    assert again.commit_all(high) == [CommitOutcome.ALREADY_COMMITTED] * 2
    assert again.commit_all(low) == [CommitOutcome.ALREADY_COMMITTED] * 2
    assert table_ids(DeltaBackend(str(table))) == [*range(20), *range(100, 120)]


@pytest.mark.promise("delta-not-null-checked", "backend")
@pytest.mark.promise("delta-schema-checked-before-decision", "backend")
def test_nulls_for_a_not_null_column_are_refused_before_the_decision(
        backend: DeltaBackend, table: Path) -> None:
    """The table's column is NOT NULL (its owner made it so); a frame is nullable. Rows
    without nulls go in; a null is refused naming the column, before the decision and
    again at commit, where it went in and left a NOT NULL column holding a null."""
    from deltalake import DeltaTable
    from txsink.errors import FatalCommitError

    required = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    optional = pa.schema([pa.field("id", pa.int64())])

    def prepared(epoch: int, ids: list[int | None], schema: pa.Schema):
        return write_participant(backend, TransactionContext("orders", epoch, 0, 0),
                                 [pa.record_batch([pa.array(ids, pa.int64())], schema=schema)])

    DeltaTable.create(str(table), schema=required)
    first = [prepared(0, [1, 2], required)]
    assert backend.commit_all(first) == [CommitOutcome.COMMITTED]
    no_nulls = [prepared(1, [3], optional)]
    backend.check_prepared(no_nulls)
    assert backend.commit_all(no_nulls) == [CommitOutcome.COMMITTED]
    with_null = [prepared(2, [4, None], optional)]
    with pytest.raises(ConfigError, match="NOT NULL") as refused:
        backend.check_prepared(with_null)
    assert refused.value.field == "id"
    assert isinstance(backend.commit_all(with_null)[0], FatalCommitError)
    assert table_ids(DeltaBackend(str(table))) == [1, 2, 3]


@pytest.mark.promise("delta-constraints-refused", "backend")
def test_a_table_with_a_check_constraint_is_refused(backend: DeltaBackend, table: Path) -> None:
    """txsink adds files without reading their rows: a CHECK constraint (which delta-rs's
    own writer enforces) would be broken by the first row that fails it. Refused at
    start, and before an epoch is decided when the constraint came since."""
    from deltalake import DeltaTable, write_deltalake

    first = [prepare(backend, 0, 0, range(1, 3))]
    assert backend.commit_all(first) == [CommitOutcome.COMMITTED]
    DeltaTable(str(table)).alter.add_constraint({"id_positive": "id > 0"})
    breaking = write_participant(backend, TransactionContext("orders", 1, 0, 0),
                                 [pa.record_batch({"id": pa.array([-5], pa.int64())})])
    with pytest.raises(ConfigError, match="id_positive"):
        backend.check_prepared([breaking])
    with pytest.raises(ConfigError, match="id_positive"):
        DeltaBackend.from_options({"path": str(table)}).preflight("orders")
    with pytest.raises(Exception, match="failed validation"):  # what delta-rs does
        write_deltalake(str(table), pa.table({"id": pa.array([-6], pa.int64())}),
                        mode="append")
    assert table_ids(DeltaBackend(str(table))) == [1, 2]


def test_an_aborted_epochs_empty_folder_does_not_stop_the_orphan_scan_after_log_cleanup(
        backend: DeltaBackend, table: Path) -> None:
    """An epoch given up (its batch write failed, or its rows were refused) leaves an
    empty folder. Once log cleanup removed the entries around it, the orphan scan asked
    the table about it on every commit and start, and stopped with 'its log no longer
    reaches back': a pipeline wedged by a folder holding nothing."""
    import glob

    from deltalake import DeltaTable

    for epoch in range(8):
        msgs = [prepare(backend, epoch, 0, range(epoch * 10, epoch * 10 + 3))]
        if epoch == 2:
            backend.abort(msgs[0])
            continue
        backend.commit_all(msgs)
        backend.epoch_committed("orders", epoch, msgs)
    assert os.listdir(table / "txsink" / "orders" / "e0000000002") == []
    DeltaTable(str(table)).create_checkpoint()
    for name in sorted(glob.glob(str(table / "_delta_log" / "0000*.json")))[:4]:
        os.unlink(name)  # delta.logRetentionDuration cleaned the oldest entries
    again = DeltaBackend.from_options({"path": str(table)})
    assert again.abort_orphans("orders", set(), None) == []
    assert table_ids(DeltaBackend(str(table))) == [e * 10 + i for e in range(8) if e != 2
                                                 for i in range(3)]
