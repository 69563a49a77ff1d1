"""RESTORE beside a pipeline: a RESTORE to a version before some of the sink's epochs
takes their rows out of the table but leaves their ``txn`` action and commit info in
the log, so the table still looked as if it held them (a replay answered "already
committed", the cut passed them). The pipeline now stops, naming the RESTORE, before
its next epoch is decided, at its next start, and at the commit of an epoch decided
before the RESTORE. A RESTORE that keeps every epoch (to a version after the sink's
last entry) is harmless and goes through. (Spark's own RESTORE: tests/e2e/interop.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import TxsinkError
from txsink.model import TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_delta.backend import DeltaBackend

pytestmark = pytest.mark.integration


def _prepare(backend: DeltaBackend, epoch: int) -> object:
    rows = pa.record_batch({"id": pa.array(range(epoch * 10, epoch * 10 + 10), pa.int64())})
    return write_participant(backend, TransactionContext("s", epoch, 0, 0), [rows])


def _setup(tmp_path: Path) -> tuple[DeltaBackend, Coordinator, Path]:
    path = tmp_path / "t"
    backend = get_plugins().create_backend("delta", {"path": str(path)})
    assert isinstance(backend, DeltaBackend)
    backend.preflight("s")
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "s",
                        plugins=build_plugins())
    coord.start()
    for epoch in range(3):
        assert coord.commit_epoch(epoch, [_prepare(backend, epoch)]) is EpochOutcome.COMMITTED
    return backend, coord, path


@pytest.mark.promise("delta-restore-stops", "backend")
def test_a_restore_before_an_epoch_stops_the_pipeline_naming_it(tmp_path: Path) -> None:
    backend, coord, path = _setup(tmp_path)
    prepared_before = _prepare(backend, 3)
    DeltaTable(str(path)).restore(1)  # version 1 holds epoch 0 only (0: create)
    ids = sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())
    assert ids == list(range(10))
    with pytest.raises(TxsinkError, match=r"restored \(RESTORE.* before epoch 2") as refused:
        coord.commit_epoch(3, [prepared_before])
    assert "new sink_id" in str(refused.value)
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist()) == ids
    again = get_plugins().create_backend("delta", {"path": str(path)})
    with pytest.raises(TxsinkError, match="RESTORE"):
        again.preflight("s")
    with pytest.raises(TxsinkError, match="RESTORE"):  # a decided epoch's commit too
        again.commit(_prepare(again, 4))


def test_a_restore_that_keeps_every_epoch_goes_through(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    backend, coord, path = _setup(tmp_path)
    write_deltalake(str(path), pa.table({"id": pa.array([-1], pa.int64())}), mode="append")
    DeltaTable(str(path)).restore(3)  # the sink's last entry: only the other append out
    backend.preflight("s")
    assert coord.commit_epoch(3, [_prepare(backend, 3)]) is EpochOutcome.COMMITTED
    ids = sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())
    assert ids == list(range(40))
