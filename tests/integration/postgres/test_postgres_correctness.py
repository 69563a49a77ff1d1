"""A restored (older) state never commits an epoch twice; a restarting server is waited for.

* Restored state: the coordinator's state is copied (a backup), more epochs are
  committed, the backup is put back and an epoch it does not know is replayed. The
  commit-marker rows show PostgreSQL already holds it: the replay is aborted, the
  table keeps every row once.
* Restarts: with the server down, preflight, the sink claim and a writer's
  connection wait for it to come back (logged, bounded), instead of failing with a
  configuration error; a wrong password or host name still fails at once.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer, local_or_skip
from txsink.coordinator import Coordinator, EpochOutcome
from txsink.errors import ConfigError
from txsink.model import Committable, TransactionContext
from txsink.plugins import get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

pytestmark = [pytest.mark.integration]


def batch(epoch: int, partition: int) -> pa.RecordBatch:
    ids = range(epoch * 1000 + partition * 100, epoch * 1000 + partition * 100 + 50)
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "name": pa.array([f"n{i}" for i in ids]),
                            "amount": pa.array([i / 2 for i in ids])})


def prepare(backend: PostgresBackend, sink: str, epoch: int, partition: int,
            attempt: int = 0) -> Committable:
    return write_participant(backend, TransactionContext(sink, epoch, partition, attempt),
                             [batch(epoch, partition)])


def test_restored_state_does_not_commit_an_epoch_postgres_already_holds(
    pg_server: PgServer, table_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    sink = f"restore-{uuid.uuid4().hex[:6]}"
    options = pg_server.options(table_name)
    backend = get_plugins().create_backend("postgres", options)
    assert isinstance(backend, PostgresBackend)
    state, backup = tmp_path / "state", tmp_path / "backup"
    try:
        backend.preflight(sink)
        coord = Coordinator(backend, DirectoryStateStore(state), sink, backend_options=options)
        coord.start()
        coord.commit_epoch(0, [prepare(backend, sink, 0, p) for p in range(2)])
        shutil.copytree(state, backup)
        for epoch in (1, 2):
            coord.commit_epoch(epoch, [prepare(backend, sink, epoch, p) for p in range(2)])
        assert len(pg_server.ids(table_name)) == 3 * 2 * 50

        # The backup comes back; Spark replays epochs 1 and 2 with new task attempts.
        shutil.rmtree(state)
        shutil.copytree(backup, state)
        restored = Coordinator(backend, DirectoryStateStore(state), sink,
                               backend_options=options)
        restored.start()
        for epoch in (1, 2):
            replay = [prepare(backend, sink, epoch, p, attempt=7) for p in range(2)]
            assert restored.commit_epoch(epoch, replay) is EpochOutcome.REPLAYED
        assert "already holds this epoch" in caplog.text
        ids = pg_server.ids(table_name)
        assert len(ids) == len(set(ids)) == 3 * 2 * 50
        assert pg_server.prepared_gids(sink) == []

        # A batch write is given an epoch above every one the target holds, though the
        # restored state knows epoch 0 only: no number means two sets of rows.
        epoch = restored.reserve_epoch()
        assert epoch == 3
        assert restored.commit_epoch(epoch, [prepare(backend, sink, epoch, 0, attempt=9)]) \
            is EpochOutcome.COMMITTED
        ids = pg_server.ids(table_name)
        assert len(ids) == len(set(ids)) == 3 * 2 * 50 + 50
        assert pg_server.prepared_gids(sink) == []
    finally:
        backend.close()


# -- a server that restarts ----------------------------------------------------------------


@pytest.fixture(scope="module")
def restartable() -> Iterator[pgtesting.LocalPostgres]:
    local_or_skip()
    pg = pgtesting.LocalPostgres(max_prepared_transactions=8)
    pg.start()
    try:
        with PgServer.local(pg).connect(autocommit=True) as conn:
            conn.execute("CREATE TABLE public.restarts (id bigint, name text, amount float8)")
        yield pg
    finally:
        pg.stop()


def _while_down(pg: pgtesting.LocalPostgres, action: str, backend: PostgresBackend,
                sink: str) -> object:
    """Stop PostgreSQL, start ``action`` and bring the server back while it waits."""
    pg.down(mode="fast")
    up = threading.Timer(2.0, pg.up)
    up.start()
    try:
        if action == "preflight":
            backend.preflight(sink)
            return None
        if action == "claim":
            backend.claim_sink(sink, "state-1", "/somewhere")
            return None
        return prepare(backend, sink, 0, 0)
    finally:
        up.join()


@pytest.mark.promise("target-restart-retried", "backend")
@pytest.mark.fault
@pytest.mark.parametrize("action", ["preflight", "claim", "writer"])
def test_postgres_restart_is_waited_for_not_reported_as_config_error(
    restartable: pgtesting.LocalPostgres, action: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="txsink_postgres")
    sink = f"rs-{action}"
    options = {"dsn": restartable.dsn, "password": restartable.password,
               "table": "public.restarts"}  # connect_retry_s: 30 s by default
    backend = get_plugins().create_backend("postgres", options)
    assert isinstance(backend, PostgresBackend)
    try:
        backend.preflight(sink)  # the marker tables exist before the restart
        result = _while_down(restartable, action, backend, sink)
        assert "retrying in" in caplog.text  # the wait was logged
        if isinstance(result, Committable):
            assert backend.commit(result).value == "committed"
    finally:
        backend.close()


@pytest.mark.promise("wrong-credentials-fail-at-once", "backend")
@pytest.mark.parametrize("what", ["password", "host"])
def test_wrong_password_or_host_is_an_immediate_config_error(
    restartable: pgtesting.LocalPostgres, what: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="txsink_postgres")
    options = {"dsn": restartable.dsn, "password": restartable.password,
               "table": "public.restarts"}
    if what == "password":
        options["password"] = "not-the-password"
    else:
        options["dsn"] = restartable.dsn.replace("127.0.0.1", "no-such-host.invalid")
    backend = get_plugins().create_backend("postgres", options)
    with pytest.raises(ConfigError) as info:
        backend.preflight("wrong")
    assert info.value.field == ("password" if what == "password" else "dsn")
    assert "retrying" not in caplog.text  # not taken for a restart
