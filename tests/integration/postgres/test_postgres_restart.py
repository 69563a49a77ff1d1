"""PostgreSQL restarts between PREPARE and COMMIT PREPARED: recovery must commit.

Prepared transactions are written to disk and survive a restart (clean or crash).
The coordinator's decision is durable too, so a coordinator started after the
restart re-commits the decided epoch, aborts the orphan, and the table then holds
every input row exactly once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer, local_or_skip
from txsink.coordinator import Coordinator, RetryPolicy
from txsink.errors import FatalCommitError
from txsink.faults import AFTER_DECIDE, FaultInjector, FaultRule, InjectedFault
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore, EpochState
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

pytestmark = [pytest.mark.integration, pytest.mark.fault]

TABLE = "public.events"
ROWS_PER_PARTITION = 2_000
PARTITIONS = 3


@pytest.fixture(scope="module")
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


def batches(partition: int) -> Iterator[pa.RecordBatch]:
    start = partition * ROWS_PER_PARTITION
    for lo in range(start, start + ROWS_PER_PARTITION, 500):
        ids = range(lo, lo + 500)
        yield pa.record_batch({"id": pa.array(ids, pa.int64()),
                               "name": pa.array([f"n{i}" for i in ids]),
                               "amount": pa.array([i / 4 for i in ids])})


def prepare(backend: PostgresBackend, sink: str, epoch: int, partition: int,
            attempt: int = 0) -> Committable:
    return write_participant(backend, TransactionContext(sink, epoch, partition, attempt),
                             batches(partition))


def coordinator(backend: PostgresBackend, state: Path, sink: str,
                faults: FaultInjector | None = None) -> Coordinator:
    return Coordinator(backend, DirectoryStateStore(state), sink, plugins=build_plugins(),
                       faults=faults or FaultInjector(),
                       retry=RetryPolicy(attempts=5, initial_backoff_s=0.1))


def table_summary(pg: PgServer) -> tuple[int, int, int]:
    with pg.connect() as conn:
        row = conn.execute(f"SELECT count(*), count(DISTINCT id), coalesce(sum(id), 0) "
                           f"FROM {TABLE}").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_between_prepare_and_commit(server: pgtesting.LocalPostgres, tmp_path: Path,
                                            mode: str) -> None:
    pg = PgServer.local(server)
    sink = f"restart-{mode}-{uuid.uuid4().hex[:6]}"
    backend = get_plugins().create_backend("postgres", pg.options(TABLE))
    assert isinstance(backend, PostgresBackend)
    backend.preflight(sink)
    before = table_summary(pg)
    state = tmp_path / "state"
    crashing = coordinator(backend, state, sink,
                           FaultInjector([FaultRule(AFTER_DECIDE, 0, "raise")]))
    crashing.start()
    messages = [prepare(backend, sink, 0, p) for p in range(PARTITIONS)]
    # A failed first attempt of partition 1 that prepared too: an orphan.
    orphan = prepare(backend, sink, 0, 1, attempt=7)
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(0, messages)
    assert table_summary(pg) == before  # decided, but nothing visible yet

    server.restart(mode=mode)

    gids = set(pg.prepared_gids(sink))
    assert gids == {m.payload["gid"] for m in [*messages, orphan]}, "prepared txns survive"
    # The same backend instance recovers: its cached connection died with the server.
    report = coordinator(backend, state, sink).start()
    assert report.recommitted_epochs == [0]
    assert report.aborted_orphans == [orphan.participant]
    n = PARTITIONS * ROWS_PER_PARTITION
    count, distinct, total = table_summary(pg)
    assert (count - before[0], distinct - before[1], total - before[2]) == (
        n, n, n * (n - 1) // 2)
    assert pg.prepared_gids(sink) == []
    record = DirectoryStateStore(state).get(0)
    assert record is not None and record.state is EpochState.COMMITTED
    # Committing again (a second recovery) is a no-op that the markers prove.
    assert all(backend.commit(m).value == "already-committed" for m in messages)
    backend.close()
    with pg.connect() as conn:
        conn.execute(f"DELETE FROM {TABLE}")


@pytest.mark.promise("postgres-lost-participant-reported", "backend")
def test_participant_rolled_back_by_hand_is_reported_not_dropped(
    server: pgtesting.LocalPostgres, tmp_path: Path
) -> None:
    pg = PgServer.local(server)
    sink = f"lost-{uuid.uuid4().hex[:6]}"
    backend = get_plugins().create_backend("postgres", pg.options(TABLE))
    assert isinstance(backend, PostgresBackend)
    backend.preflight(sink)
    state = tmp_path / "state"
    crashing = coordinator(backend, state, sink,
                           FaultInjector([FaultRule(AFTER_DECIDE, 4, "raise")]))
    crashing.start()
    messages = [prepare(backend, sink, 4, p) for p in range(2)]
    with pytest.raises(InjectedFault):
        crashing.commit_epoch(4, messages)
    lost = messages[1]
    with pg.connect() as conn:  # an operator rolls one participant back
        conn.execute(f"ROLLBACK PREPARED '{lost.payload['gid']}'")
    server.restart()
    with pytest.raises(FatalCommitError) as err:
        coordinator(backend, state, sink).start()
    assert lost.participant in str(err.value)
    assert err.value.participant == lost.participant
    record = DirectoryStateStore(state).get(4)
    assert record is not None and record.state is EpochState.DECIDED  # kept for an operator
    backend.close()
    with pg.connect() as conn:
        conn.execute(f"DELETE FROM {TABLE}")
