"""PostgreSQL failed over to a standby, or restored from a backup, between PREPARE and
COMMIT PREPARED of an epoch that txsink has COMMITTED (operations issue, hole 2).

The standby (or the backup) holds the epoch's participants prepared but not
committed. Their decision is durable in the txsink state, so the next start must
roll them forward — commit them — and never abort them as orphans, which is what it
did: rows of a committed epoch vanished with an INFO line. Both ways a real
deployment gets there are tested: a copy of the stopped data directory put back
(a restore, or a standby's disk), and a real streaming replica (``pg_basebackup -R``)
cut off before the commit and promoted. The epoch's record is either still retained
or already pruned into the state's archive of decided names.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer, local_or_skip
from txsink.coordinator import Coordinator, RetryPolicy
from txsink.faults import FaultInjector
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

pytestmark = [pytest.mark.integration, pytest.mark.fault]

TABLE = "public.orders"
ROWS = 100
PARTITIONS = 3


@pytest.fixture
def server() -> Iterator[pgtesting.LocalPostgres]:
    local_or_skip()
    pg = pgtesting.LocalPostgres(max_prepared_transactions=16)
    pg.start()
    try:
        with PgServer.local(pg).connect() as conn:
            conn.execute(f"CREATE TABLE {TABLE} (id bigint, name text, amount float8)")
        yield pg
    finally:
        pg.stop()


def _batch(epoch: int, partition: int) -> pa.RecordBatch:
    base = epoch * 1_000_000 + partition * 10_000
    ids = range(base, base + ROWS)
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "name": pa.array([f"n{i}" for i in ids]),
                            "amount": pa.array([i / 4 for i in ids])})


class Sink:
    def __init__(self, pg: pgtesting.LocalPostgres, state: Path) -> None:
        self.sink = f"fo{uuid.uuid4().hex[:8]}"
        self.state = state
        self.options = PgServer.local(pg).options(TABLE)
        self.backend = PostgresBackend.from_options(self.options)

    def point_at(self, pg: pgtesting.LocalPostgres) -> None:
        """After a failover the pipeline's DSN names the new primary."""
        self.backend.close()
        self.options = PgServer.local(pg).options(TABLE)
        self.backend = PostgresBackend.from_options(self.options)

    def coordinator(self, owner: str) -> Coordinator:
        return Coordinator(self.backend, DirectoryStateStore(self.state), self.sink,
                           backend_options=self.options, plugins=build_plugins(),
                           faults=FaultInjector(), owner=owner, retain_epochs=2,
                           retry=RetryPolicy(attempts=5, initial_backoff_s=0.1))

    def prepare(self, epoch: int, partition: int, attempt: int = 0) -> Committable:
        ctx = TransactionContext(self.sink, epoch, partition, attempt)
        return write_participant(self.backend, ctx, [_batch(epoch, partition)])


def _ids(pg: pgtesting.LocalPostgres) -> list[int]:
    return sorted(PgServer.local(pg).ids(TABLE))


def _expected(epochs: range) -> list[int]:
    return sorted(e * 1_000_000 + p * 10_000 + i
                  for e in epochs for p in range(PARTITIONS) for i in range(ROWS))


@pytest.mark.promise("decided-rolled-forward", "backend")
@pytest.mark.parametrize("pruned", [False, True], ids=["record-retained", "record-pruned"])
def test_restored_data_directory_rolls_the_committed_epoch_forward(
        server: pgtesting.LocalPostgres, tmp_path: Path, pruned: bool,
        caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(server, tmp_path / "state")
    coord = sink.coordinator("run-1")
    coord.start()
    coord.commit_epoch(0, [sink.prepare(0, p) for p in range(PARTITIONS)])
    msgs = [sink.prepare(1, p) for p in range(PARTITIONS)]
    stale = sink.prepare(1, 0, attempt=9)  # a failed attempt: an orphan either way
    sink.backend.close()
    server.down()
    backup = server.backup()  # between PREPARE and COMMIT PREPARED of epoch 1
    server.up()
    coord = sink.coordinator("run-1")
    coord.commit_epoch(1, msgs)
    for epoch in range(2, 7 if pruned else 3):
        coord.commit_epoch(epoch, [sink.prepare(epoch, p) for p in range(PARTITIONS)])
    assert (1 in DirectoryStateStore(sink.state).records()) is not pruned
    assert _ids(server) == _expected(range(7 if pruned else 3))

    sink.backend.close()
    server.down()
    server.restore(backup)  # the restore: epoch 1 prepared again, later epochs gone
    server.up()
    gids = PgServer.local(server).prepared_gids(sink.sink)
    assert len(gids) == PARTITIONS + 1
    with caplog.at_level(logging.INFO):
        report = sink.coordinator("run-2").start()
    assert report.aborted_orphans == [stale.participant]
    assert PgServer.local(server).prepared_gids(sink.sink) == []
    # Epoch 1 is back, once. The epochs after the backup are not in it at all: no
    # database restore brings those back, and no txsink decision can.
    assert _ids(server) == _expected(range(2))
    forward = [r for r in caplog.records if "rolled forward" in r.getMessage()]
    assert len(forward) == PARTITIONS
    assert all(r.levelno == logging.WARNING for r in forward)
    sink.backend.close()


@pytest.mark.promise("decided-rolled-forward", "backend")
def test_promoted_streaming_replica_rolls_the_committed_epoch_forward(
        server: pgtesting.LocalPostgres, tmp_path: Path) -> None:
    standby = server.start_standby()
    try:
        sink = Sink(server, tmp_path / "state")
        coord = sink.coordinator("run-1")
        coord.start()
        coord.commit_epoch(0, [sink.prepare(0, p) for p in range(PARTITIONS)])
        msgs = [sink.prepare(1, p) for p in range(PARTITIONS)]
        # Wait until the standby replayed the PREPAREs (a standby in recovery does not
        # list prepared transactions: compare WAL positions), then cut it off: an
        # async standby lagging behind at the moment of the commit.
        with PgServer.local(server).connect() as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        deadline = time.monotonic() + 60
        with PgServer.local(standby).connect() as conn:
            while not conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                   (row[0],)).fetchone()[0]:  # type: ignore[index]
                assert time.monotonic() < deadline, "the standby never replayed the PREPAREs"
                time.sleep(0.1)
        standby.down()
        coord.commit_epoch(1, msgs)
        assert _ids(server) == _expected(range(2))
        # The primary is lost; the standby is promoted and the pipeline points at it.
        sink.backend.close()
        server.down(mode="immediate")
        standby.up()
        standby.promote()
        sink.point_at(standby)
        assert len(PgServer.local(standby).prepared_gids(sink.sink)) == PARTITIONS
        sink.coordinator("run-2").start()
        assert PgServer.local(standby).prepared_gids(sink.sink) == []
        assert _ids(standby) == _expected(range(2))
        sink.backend.close()
    finally:
        standby.stop()
