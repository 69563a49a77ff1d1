"""A reader of the SQLite catalog during a commit (Spark's Iceberg JDBC catalog on the
same file, in the interop tests): the catalog write fails with "database is locked".

Seen there: SQLite keeps a transaction whose COMMIT failed open on the connection, the
pool hands that connection out again, and the commit's retry read the table through
it: it saw its own uncommitted snapshot and answered "already committed" for an epoch
the table did not hold (caught only by the check after the commit). The backend now
drops its catalog connections after such a failure, so every retry reads what the
database holds.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.model import TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_iceberg.backend import CATALOG_FILE, IcebergBackend

pytestmark = pytest.mark.integration


def _prepare(backend: IcebergBackend, epoch: int) -> object:
    rows = pa.record_batch({"id": pa.array(range(epoch * 10, epoch * 10 + 10), pa.int64())})
    return write_participant(backend, TransactionContext("s", epoch, 0, 0), [rows])


def test_a_reader_holding_the_catalog_during_a_commit_never_makes_it_look_done(
        tmp_path: Path) -> None:
    wh = tmp_path / "wh"
    backend = IcebergBackend("db.t", str(wh))
    backend.preflight("s")
    coord = Coordinator(backend, DirectoryStateStore(tmp_path / "state"), "s",
                        plugins=build_plugins())
    coord.start()
    assert coord.commit_epoch(0, [_prepare(backend, 0)]) is EpochOutcome.COMMITTED

    # A reader's open transaction (a SHARED lock) for longer than SQLite's busy timeout
    # (5 s): the commit's COMMIT fails with "database is locked".
    reader = sqlite3.connect(wh / CATALOG_FILE, isolation_level=None, check_same_thread=False)
    reader.execute("BEGIN")
    reader.execute("SELECT * FROM iceberg_tables").fetchall()
    released = threading.Timer(7.0, lambda: reader.execute("COMMIT"))
    released.start()
    try:
        outcome = coord.commit_epoch(1, [_prepare(backend, 1)])
    finally:
        released.join()
        reader.close()
    assert outcome is EpochOutcome.COMMITTED
    fresh = IcebergBackend("db.t", str(wh))
    assert fresh.table_epoch("s", 1) is not None, "epoch 1 reported committed, not in table"
    ids = sorted(fresh._load().scan().to_arrow().column("id").to_pylist())
    assert ids == list(range(20))
