"""Bad input fails early and clearly, writes nothing and leaves no prepared transaction."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from postgres_support import PgServer, drop_table, local_or_skip
from txsink.coordinator import Coordinator
from txsink.errors import ConfigError, RetriableCommitError, TxsinkError
from txsink.model import Committable, TransactionContext
from txsink.plugins import build_plugins, get_plugins
from txsink.state import DirectoryStateStore
from txsink.writer import write_participant
from txsink_postgres import PostgresBackend
from txsink_postgres import testing as pgtesting

pytestmark = pytest.mark.integration


def batch(n: int = 10) -> pa.RecordBatch:
    return pa.record_batch({"id": pa.array(range(n), pa.int64()),
                            "name": pa.array([f"r{i}" for i in range(n)]),
                            "amount": pa.array([i * 0.5 for i in range(n)])})


def make(options: dict[str, str]) -> PostgresBackend:
    backend = get_plugins().create_backend("postgres", options)
    assert isinstance(backend, PostgresBackend)
    return backend


@pytest.fixture
def sink_id() -> str:
    return f"bad-{uuid.uuid4().hex[:8]}"


def assert_nothing_left(server: PgServer, sink_id: str) -> None:
    assert server.prepared_gids(sink_id) == []


def test_missing_table_without_create(pg_server: PgServer, sink_id: str) -> None:
    backend = make(pg_server.options("public.no_such_table_x"))
    with pytest.raises(ConfigError) as err:
        backend.preflight(sink_id)
    assert err.value.field == "table"
    assert "public.no_such_table_x" in str(err.value)
    assert "create_table=true" in str(err.value)
    # A writer that skipped preflight fails before preparing anything.
    with pytest.raises(ConfigError, match="does not exist"):
        write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
    assert_nothing_left(pg_server, sink_id)
    backend.close()


def test_missing_schema_with_create(pg_server: PgServer, sink_id: str) -> None:
    backend = make(pg_server.options("nosuchschema.t", create_table="true"))
    with pytest.raises(ConfigError, match="schema 'nosuchschema'") as err:
        backend.preflight(sink_id)
    assert err.value.field == "table"


def test_type_mismatch_names_the_column(pg_server: PgServer, sink_id: str) -> None:
    table = f"public.mismatch_{uuid.uuid4().hex[:8]}"
    with pg_server.connect() as conn:
        conn.execute(f"CREATE TABLE {table} (id integer, name text, amount text)")
    try:
        backend = make(pg_server.options(table))
        backend.preflight(sink_id)
        with pytest.raises(ConfigError) as err:
            write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
        message = str(err.value)
        assert err.value.field == "table"
        assert "'id' is int64" in message and "integer" in message and "bigint" in message
        assert "'amount' is double" in message and "double precision" in message
        assert pg_server.ids(table) == []
        assert_nothing_left(pg_server, sink_id)
        backend.close()
    finally:
        drop_table(pg_server, table)


def test_missing_column_is_named(pg_server: PgServer, table_name: str, sink_id: str) -> None:
    backend = make(pg_server.options(table_name))
    extra = batch().append_column("colour", pa.array(["red"] * 10))
    with pytest.raises(ConfigError, match="no column\\(s\\) 'colour'"):
        write_participant(backend, TransactionContext(sink_id, 0, 0), [extra])
    assert pg_server.ids(table_name) == []
    assert_nothing_left(pg_server, sink_id)
    backend.close()


def test_wrong_password_is_clear_and_not_echoed(pg_server: PgServer, table_name: str,
                                                sink_id: str) -> None:
    if pg_server.password is None:
        pytest.skip("the server named by TXSINK_POSTGRES_DSN has no password to get wrong")
    wrong = "Wr0ng-" + uuid.uuid4().hex
    backend = make(pg_server.options(table_name) | {"password": wrong})
    with pytest.raises(ConfigError) as err:
        backend.preflight(sink_id)
    assert err.value.field == "password"
    assert "password authentication failed" in str(err.value)
    for exc in (err.value, err.value.__cause__, err.value.__context__):
        if exc is not None:
            assert wrong not in str(exc) and wrong not in repr(exc)
    with pytest.raises(TxsinkError) as err2:
        write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
    assert wrong not in str(err2.value)
    assert pg_server.ids(table_name) == []
    assert_nothing_left(pg_server, sink_id)


@pytest.mark.promise("postgres-secrets-never-stored", "backend")
def test_password_never_in_logs_state_or_committables(
    pg_server: PgServer, table_name: str, sink_id: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    if pg_server.password is None:
        pytest.skip("the server named by TXSINK_POSTGRES_DSN has no password")
    monkeypatch.setenv("TXSINK_TEST_PG_PASSWORD", pg_server.password)
    options = {"dsn": pg_server.dsn, "table": table_name,
               "password_env": "TXSINK_TEST_PG_PASSWORD"}
    caplog.set_level(logging.DEBUG)
    backend = make(options)
    backend.preflight(sink_id)
    state = tmp_path / "state"
    coord = Coordinator(backend, DirectoryStateStore(state), sink_id, backend_options=options,
                        plugins=build_plugins())
    coord.start()
    c = write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
    assert pg_server.password not in c.to_bytes().decode()
    coord.commit_epoch(0, [c])
    backend.close()
    assert sorted(pg_server.ids(table_name)) == list(range(10))
    assert pg_server.password not in caplog.text
    for f in state.rglob("*"):
        if f.is_file():
            assert pg_server.password.encode() not in f.read_bytes(), f


@pytest.fixture(scope="module")
def no_prepared_server() -> Iterator[PgServer]:
    local_or_skip()
    server = pgtesting.LocalPostgres(max_prepared_transactions=0)
    server.start()
    try:
        with PgServer.local(server).connect() as conn:
            conn.execute("CREATE TABLE public.t (id bigint, name text, amount float8)")
        yield PgServer.local(server)
    finally:
        server.stop()


@pytest.mark.promise("postgres-max-prepared-checked", "backend")
def test_max_prepared_transactions_zero(no_prepared_server: PgServer, sink_id: str) -> None:
    backend = make(no_prepared_server.options("public.t"))
    with pytest.raises(ConfigError) as err:
        backend.preflight(sink_id)
    message = str(err.value)
    assert "max_prepared_transactions = 0" in message
    assert "postgresql.conf" in message and "restart" in message
    # Without preflight, PREPARE itself fails with the same advice; nothing is written.
    with pytest.raises(TxsinkError, match="commit-marker table"):
        write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
    with no_prepared_server.connect() as conn:
        conn.execute(backend.marker_ddl(conn))
    with pytest.raises(TxsinkError, match=r"postgresql\.conf"):
        write_participant(backend, TransactionContext(sink_id, 0, 0), [batch()])
    assert no_prepared_server.ids("public.t") == []
    assert_nothing_left(no_prepared_server, sink_id)
    backend.close()


def test_unreachable_server(sink_id: str) -> None:
    backend = make({"dsn": "host=127.0.0.1 port=1 dbname=x user=u connect_timeout=2",
                    "table": "t", "connect_retry_s": "0"})
    with pytest.raises(ConfigError, match="cannot connect") as err:
        backend.preflight(sink_id)
    assert err.value.field == "dsn"


def test_bad_data_mid_copy_leaves_nothing(pg_server: PgServer, table_name: str,
                                          sink_id: str) -> None:
    backend = make(pg_server.options(table_name))
    backend.preflight(sink_id)
    bad = pa.record_batch({"id": pa.array([1], pa.int64()),
                           "name": pa.array(["nul\x00byte"]),  # text cannot hold NUL
                           "amount": pa.array([1.0])})
    with pytest.raises(TxsinkError, match=sink_id):
        write_participant(backend, TransactionContext(sink_id, 0, 0), [batch(), bad, batch()])
    assert pg_server.ids(table_name) == []
    assert_nothing_left(pg_server, sink_id)
    # The backend is still usable afterwards.
    c = write_participant(backend, TransactionContext(sink_id, 0, 0, 1), [batch()])
    backend.commit(c)
    assert sorted(pg_server.ids(table_name)) == list(range(10))
    backend.close()


@pytest.mark.promise("postgres-sink-owner", "backend")
def test_second_query_on_the_same_sink_id_is_refused(
    pg_server: PgServer, table_name: str, sink_id: str, tmp_path: Path
) -> None:
    backend = make(pg_server.options(table_name))
    backend.preflight(sink_id)
    first = Coordinator(backend, DirectoryStateStore(tmp_path / "one"), sink_id,
                        plugins=build_plugins())
    first.start()
    first.start()  # the same state again: fine
    second = Coordinator(backend, DirectoryStateStore(tmp_path / "two"), sink_id,
                         plugins=build_plugins())
    with pytest.raises(ConfigError) as err:
        second.start()
    assert err.value.field == "sink_id"
    assert str(tmp_path / "one") in str(err.value)
    backend.close()


def test_driver_calls_on_an_unreachable_server_fail_cleanly(sink_id: str) -> None:
    backend = make({"dsn": "host=127.0.0.1 port=1 dbname=x user=u", "table": "t",
                    "connect_timeout": "2", "password": "Unreachable-Pw-123",
                    "connect_retry_s": "0"})
    c = Committable.for_context("postgres", TransactionContext(sink_id, 3, 0),
                                {"gid": f"txsink:{sink_id}-e3-p0-a0", "xid": 1})
    with pytest.raises(RetriableCommitError, match="cannot connect") as err:
        backend.commit(c)
    assert err.value.participant == c.participant
    with pytest.raises(RetriableCommitError):
        backend.abort(c)
    with pytest.raises(TxsinkError, match="cannot connect") as err2:
        list(backend.list_prepared(sink_id))
    for e in (err.value, err2.value):
        assert "Unreachable-Pw-123" not in str(e)
