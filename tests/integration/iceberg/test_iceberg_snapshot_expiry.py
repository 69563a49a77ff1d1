"""Snapshot expiry and rollback against the Iceberg backend's markers: an epoch whose
marked snapshot expired is refused, never added twice; a rolled-back epoch is written
again. (A module of its own, after the conformance kit: its memory-bound test measures
this process's growth, which earlier tables' allocations shift.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from txsink.backend import CommitOutcome
from txsink.errors import StateError
from txsink_iceberg.backend import IcebergBackend

from tests.integration.iceberg.test_iceberg_backend import backend, prepare
from tests.integration.iceberg.test_iceberg_conformance import read_table_ids

pytestmark = pytest.mark.integration
__all__ = ["backend"]  # the fixture


def _other_append(backend: IcebergBackend) -> None:
    IcebergBackend(backend.table, backend.warehouse)._load().append(pa.table({
        "id": pa.array([-1], pa.int64()), "at": pa.array([0], pa.timestamp("us", tz="UTC"))}))


@pytest.mark.promise("iceberg-expired-snapshot-refused", "backend")
def test_an_epoch_whose_snapshot_expired_is_refused_not_added_twice(
        backend: IcebergBackend) -> None:
    """Seen: epoch 1 committed, another writer appended, snapshot expiry kept only the
    current snapshot; a commit of epoch 1 whose outcome was unknown then found no marker
    and added the epoch a second time (rows 10-19 twice), and ``highest_epoch`` said -1.
    The epoch's own commit now records the sink's epoch in a table property, which
    expiry keeps: the backend refuses to guess."""
    backend.commit(prepare(backend, 0, 0, range(10)))
    c = prepare(backend, 1, 0, range(10, 20))
    assert backend.commit(c) is CommitOutcome.COMMITTED
    _other_append(backend)
    table = backend._load()
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current]).commit()
    assert len(backend._load().metadata.snapshots) == 1
    again = IcebergBackend(backend.table, backend.warehouse)
    assert again.highest_epoch("orders") == 1
    with pytest.raises(StateError, match="no snapshot marks it any more"):
        again.commit(c)
    assert sorted(read_table_ids(backend)) == [-1, *range(20)]
    assert again.commit(prepare(backend, 2, 0, range(20, 30))) is CommitOutcome.COMMITTED
    assert backend._load().properties["txsink.epoch.orders"] == "2"


def test_a_rolled_back_epoch_is_written_again(backend: IcebergBackend) -> None:
    """A rollback (the snapshot stays in the metadata, off the branch) takes the epoch
    out of the table: txsink treats it as not written, as documented."""
    backend.commit(prepare(backend, 0, 0, range(10)))
    first = backend._load().current_snapshot().snapshot_id
    c = prepare(backend, 1, 0, range(10, 20))
    assert backend.commit(c) is CommitOutcome.COMMITTED
    backend._load().manage_snapshots().rollback_to_snapshot(first).commit()
    assert sorted(read_table_ids(backend)) == list(range(10))
    assert backend.highest_epoch("orders") == 0
    assert backend.commit(c) is CommitOutcome.COMMITTED
    assert sorted(read_table_ids(backend)) == list(range(20))



@pytest.mark.promise("iceberg-orphan-removal-stops", "backend")
def test_orphan_file_removal_and_expiry_leave_committed_epochs_alone(
        backend: IcebergBackend, tmp_path: Path) -> None:
    """Routine maintenance: orphan-file removal deletes each epoch's ``_committed.json``
    (no snapshot names it), snapshot expiry drops the old snapshots (pyiceberg's leaves
    the kept one without a parent). The next start asked the table about the old epoch
    folders, read the cut-short ancestry as "not there", and rolled epochs 0-2 forward:
    their rows added a second time (24 rows, 15 distinct), logged as "visible once";
    past the archive's 14 days it would have deleted their files. Undecidable folders
    are left alone now."""
    import glob
    import os

    from txsink.coordinator import Coordinator, EpochOutcome
    from txsink.plugins import build_plugins
    from txsink.state import DirectoryStateStore

    def coordinator(b: IcebergBackend) -> Coordinator:
        coord = Coordinator(b, DirectoryStateStore(tmp_path / "state"), "orders",
                            plugins=build_plugins())
        coord.start()
        return coord

    coord = coordinator(backend)
    for epoch in range(4):
        assert coord.commit_epoch(epoch, [prepare(backend, epoch, 0, range(
            epoch * 10, epoch * 10 + 3))]) is EpochOutcome.COMMITTED
    markers = glob.glob(f"{backend.data_root()}/txsink/orders/*/_committed.json")
    assert len(markers) == 4
    for name in markers:
        os.unlink(name)  # remove_orphan_files
    table = backend._load()
    current = table.current_snapshot().snapshot_id
    table.maintenance.expire_snapshots().by_ids(
        [s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current]).commit()
    again = IcebergBackend(backend.table, backend.warehouse)
    coord = coordinator(again)
    assert coord.commit_epoch(4, [prepare(again, 4, 0, range(40, 43))]
                              ) is EpochOutcome.COMMITTED
    assert sorted(read_table_ids(backend)) == [e * 10 + i for e in range(5) for i in range(3)]
