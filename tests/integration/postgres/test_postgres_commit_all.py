"""commit_all on a real PostgreSQL: one lookup for the epoch, COMMIT PREPARED over a
small bounded set of connections, each participant decided as commit() decides it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from postgres_support import PgServer
from psycopg import sql
from txsink.backend import CommitOutcome
from txsink.errors import ConfigError, ParticipantLostError
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend

pytestmark = pytest.mark.integration

#: Below the session server's max_prepared_transactions (64), with room to spare.
PARTICIPANTS = 40


def make(pg_server: PgServer, table: str, **extra: str) -> PostgresBackend:
    backend = get_plugins().create_backend("postgres", pg_server.options(table, **extra))
    assert isinstance(backend, PostgresBackend)
    return backend


def prepare_epoch(backend: PostgresBackend, sink: str, epoch: int,
                  n: int) -> list[Committable]:
    backend.preflight(sink)
    return [write_participant(backend, TransactionContext(sink, epoch, p),
                              [pa.record_batch({"id": pa.array([p], pa.int64())})])
            for p in range(n)]


def sessions(pg_server: PgServer) -> int:
    """Open connections named txsink (the backend's application_name), but this one's."""
    with pg_server.connect(application_name="txsink-test") as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE application_name = 'txsink'").fetchone()
    assert row is not None
    return int(row[0])


def test_an_epoch_commits_exactly_once_over_bounded_connections(
        pg_server: PgServer, table_name: str) -> None:
    backend = make(pg_server, table_name, commit_connections="3")
    committables = prepare_epoch(backend, "many", 0, PARTICIPANTS)
    before = sessions(pg_server)
    assert backend.commit_all(committables) == [CommitOutcome.COMMITTED] * PARTICIPANTS
    assert sorted(pg_server.ids(table_name)) == list(range(PARTICIPANTS))
    assert pg_server.prepared_gids("many") == []
    # The driver's connection plus at most three kept for the next epoch.
    assert sessions(pg_server) - before <= 4
    assert len(backend._idle) <= 3
    # Again, as after a driver crash before the epoch was marked committed.
    assert backend.commit_all(committables) == (
        [CommitOutcome.ALREADY_COMMITTED] * PARTICIPANTS)
    assert sorted(pg_server.ids(table_name)) == list(range(PARTICIPANTS))
    backend.close()
    assert sessions(pg_server) <= before


def test_each_participant_is_decided_on_its_own(pg_server: PgServer,
                                                table_name: str) -> None:
    backend = make(pg_server, table_name)
    committables = prepare_epoch(backend, "mixed", 0, 8)
    # One committed before (a lost reply), one rolled back by an operator.
    assert backend.commit(committables[2]) is CommitOutcome.COMMITTED
    lost = committables[5]
    with pg_server.connect() as conn:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(
            sql.Literal(lost.payload["gid"])))
    results = backend.commit_all(committables)
    error = results[5]
    assert isinstance(error, ParticipantLostError)
    assert error.participant == lost.participant and lost.payload["gid"] in str(error)
    assert pg_server.password is None or pg_server.password not in str(error)
    expected = [CommitOutcome.COMMITTED] * 8
    expected[2] = CommitOutcome.ALREADY_COMMITTED
    assert results[:5] + results[6:] == expected[:5] + expected[6:]
    assert sorted(pg_server.ids(table_name)) == [0, 1, 2, 3, 4, 6, 7]
    assert pg_server.prepared_gids("mixed") == []
    backend.close()


def test_a_gid_prepared_again_by_another_transaction_is_not_committed(
        pg_server: PgServer, table_name: str) -> None:
    """The xid in the committable, not the gid alone, names what to commit."""
    import dataclasses

    backend = make(pg_server, table_name)
    committables = prepare_epoch(backend, "xid", 0, 3)
    stale = dataclasses.replace(committables[1], payload={
        **committables[1].payload, "xid": int(committables[1].payload["xid"]) + 1_000_000})
    results = backend.commit_all([committables[0], stale, committables[2]])
    assert results[0] is CommitOutcome.COMMITTED and results[2] is CommitOutcome.COMMITTED
    assert isinstance(results[1], ParticipantLostError)
    assert pg_server.prepared_gids("xid") == [committables[1].payload["gid"]]
    backend.abort(committables[1])
    backend.close()


@pytest.mark.parametrize("value", ["0", "33", "few"])
def test_commit_connections_is_validated(pg_server: PgServer, table_name: str,
                                         value: str) -> None:
    with pytest.raises(ConfigError, match="commit_connections") as info:
        make(pg_server, table_name, commit_connections=value)
    assert info.value.field == "commit_connections"


def test_pickled_backend_keeps_no_connections(pg_server: PgServer, table_name: str) -> None:
    import pickle

    backend = make(pg_server, table_name)
    committables = prepare_epoch(backend, "pickle", 0, 4)
    assert set(backend.commit_all(committables)) == {CommitOutcome.COMMITTED}
    assert backend._idle
    copy = pickle.loads(pickle.dumps(backend))
    assert copy._idle == [] and copy.commit_connections == backend.commit_connections
    assert copy.commit_all(committables) == [CommitOutcome.ALREADY_COMMITTED] * 4
    copy.close()
    backend.close()
    assert backend._idle == []
