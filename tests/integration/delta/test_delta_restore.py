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
from txsink.plugins import get_plugins
from txsink_delta.backend import DeltaBackend

from tests.lake_tables import coordinator, prepare

pytestmark = pytest.mark.integration


def _setup(tmp_path: Path) -> tuple[DeltaBackend, Coordinator, Path]:
    path = tmp_path / "t"
    backend = get_plugins().create_backend("delta", {"path": str(path)})
    assert isinstance(backend, DeltaBackend)
    backend.preflight("s")
    coord = coordinator(backend, tmp_path / "state")
    for epoch in range(3):
        assert coord.commit_epoch(epoch, [prepare(backend, epoch)]) is EpochOutcome.COMMITTED
    return backend, coord, path


@pytest.mark.promise("delta-restore-stops", "backend")
def test_a_restore_before_an_epoch_stops_the_pipeline_naming_it(tmp_path: Path) -> None:
    backend, coord, path = _setup(tmp_path)
    prepared_before = prepare(backend, 3)
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
        again.commit(prepare(again, 4))


def test_a_restore_that_keeps_every_epoch_goes_through(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    backend, coord, path = _setup(tmp_path)
    write_deltalake(str(path), pa.table({"id": pa.array([-1], pa.int64())}), mode="append")
    DeltaTable(str(path)).restore(3)  # the sink's last entry: only the other append out
    backend.preflight("s")
    assert coord.commit_epoch(3, [prepare(backend, 3)]) is EpochOutcome.COMMITTED
    ids = sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())
    assert ids == list(range(40))


@pytest.mark.promise("delta-older-log-stops", "backend")
def test_a_log_put_back_to_an_older_copy_stops_the_start_naming_it(tmp_path: Path) -> None:
    """The table's _delta_log is put back to a copy made after epoch 0 (a backup
    restored): the log lacks epochs 1 and 2, and its txn says 0. Before the fix the next
    epoch was written on top of it, and epochs 1 and 2 were gone for good."""
    import shutil

    path = tmp_path / "t"
    backend = get_plugins().create_backend("delta", {"path": str(path)})
    backend.preflight("s")
    coord = coordinator(backend, tmp_path / "state")
    coord.commit_epoch(0, [prepare(backend, 0)])
    shutil.copytree(path / "_delta_log", tmp_path / "log-copy")
    for epoch in (1, 2):
        coord.commit_epoch(epoch, [prepare(backend, epoch)])
    newer = {p.name: p.read_bytes() for p in (path / "_delta_log").glob("*.json")
             if not (tmp_path / "log-copy" / p.name).exists()}
    shutil.rmtree(path / "_delta_log")
    shutil.copytree(tmp_path / "log-copy", path / "_delta_log")
    again = get_plugins().create_backend("delta", {"path": str(path)})
    with pytest.raises(TxsinkError, match="older copy") as refused:
        again.preflight("s")
    assert "epochs 1 to 2" in str(refused.value)
    with pytest.raises(TxsinkError, match="older copy"):
        coordinator(again, tmp_path / "state")
    ids = sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())
    assert ids == list(range(10))  # nothing written
    # The way out, literally: the log's newer entries put back.
    for name, data in newer.items():
        (path / "_delta_log" / name).write_bytes(data)
    back = get_plugins().create_backend("delta", {"path": str(path)})
    back.preflight("s")
    coordinator(back, tmp_path / "state").commit_epoch(3, [prepare(back, 3)])
    ids = sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())
    assert ids == list(range(40))
