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


@pytest.mark.promise("iceberg-commit-never-twice", "backend")
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


@pytest.mark.promise("iceberg-secrets-never-stored", "backend")
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

